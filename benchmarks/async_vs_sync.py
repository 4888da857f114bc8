"""TBA asynchronous vs synchronous, side by side in one run, on the same task and budget.

    .venv/bin/python benchmarks/async_vs_sync.py                       # tiny model, stand-in TL;DR (~2 min)
    .venv/bin/python benchmarks/async_vs_sync.py --model smollm2-135m-instruct --updates 40

Each mode trains for the same number of learner updates; per iteration it prints the searchers' mean reward,
staleness (mean/max learner updates between generation and training), buffer size, learner steps/s and searcher
tokens/s; at the end the wall-clock ratio sync/async. Timings on shared CPU machines are noisy: compare the ratio
within one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuned_examples"))
from tba_tiny import tiny_config  # noqa: E402  (the tiny configuration the tests use, here with CLI overrides)


def run(mode: str, args) -> dict:
    config = tiny_config(
        env=args.env, env_config=json.loads(args.env_config), num_env_runners=1 if mode == "async" else 0,
        seed=args.seed, policy_model=args.model, max_new_tokens=args.max_new_tokens, lr=args.lr, beta=args.beta,
        prompts_per_batch=4, prompts_per_generation=4, min_buffer_size=16, sync_every=args.sync_every,
        searcher_dtype=args.searcher_dtype, async_mode=mode == "async", updates_per_iteration=args.updates_per_iteration,
        training_intensity=args.training_intensity if mode == "async" else None)
    algo = config.build_algo()
    rows = []
    try:
        start = time.time()
        while algo.weights_version < args.updates:
            r = algo.train()
            tba, searchers = r["tba"], r.get("searchers", {})
            row = {"mode": mode, "updates": int(tba["weights_version"]), "seconds": round(time.time() - start, 1),
                   "reward": round(float(searchers.get("reward_mean", float("nan"))), 3),
                   "staleness_mean": round(float(tba["staleness_mean"]), 2), "staleness_max": int(tba["staleness_max"]),
                   "buffer": int(tba["buffer_size"]), "learner_steps_per_s": round(float(tba["learner_steps_per_s"]), 2),
                   "searcher_tokens_per_s": round(float(searchers.get("tokens_per_s", float("nan"))), 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        return {"mode": mode, "seconds": time.time() - start, "final_reward": rows[-1]["reward"],
                "first_reward": rows[0]["reward"]}
    finally:
        algo.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="tba/TLDR-v0")
    ap.add_argument("--env-config", default="{}")
    ap.add_argument("--model", default="tiny-test")
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--sync-every", type=int, default=2)
    ap.add_argument("--updates", type=int, default=60, help="learner updates per mode")
    ap.add_argument("--updates-per-iteration", type=int, default=5)
    ap.add_argument("--training-intensity", type=float, default=4.0)
    ap.add_argument("--searcher-dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = [run("sync", args), run("async", args)]
    summary = {r["mode"]: {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in results}
    summary["sync_over_async_time"] = round(results[0]["seconds"] / results[1]["seconds"], 2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
