"""TBA asynchronous vs synchronous, side by side in one run, on the same task and budget.

    .venv/bin/python benchmarks/async_vs_sync.py                       # tiny model, stand-in TL;DR (~2 min)
    .venv/bin/python benchmarks/async_vs_sync.py --model smollm2-135m-instruct --updates 40
    .venv/bin/python benchmarks/async_vs_sync.py --example redteam --updates 30   # the red-team default (~15 min)
    .venv/bin/python benchmarks/async_vs_sync.py --example redteam --updates 30 --searchers 1   # one searcher

Each mode trains for the same number of learner updates; per iteration it prints the searchers' mean reward,
staleness (mean/max learner updates between generation and training), buffer size, learner steps/s and searcher
tokens/s; at the end the wall-clock ratio sync/async, whole and per update once warm (from the end of the first
iteration: engine start-up and the buffer's first fill left out). ``--example redteam`` runs
tuned_examples/tba_redteam.py as it is (its searchers, CPU shares, learner precision and ``training_intensity``)
against its ``async_mode=False`` twin, the pair of the red-team frontier's time-to-target runs; for the synchronous
run it also prints how an update's wall-clock splits between generation (all searchers at once) and learning.
Timings on shared CPU machines are noisy: compare the ratio within one run, not absolute numbers across runs.
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

from bench import busy_seconds  # noqa: E402  (this folder's bench.py: the same spans, counted the same way)


def build_config(mode: str, args):
    if args.example == "redteam":
        from tba_redteam import config as example

        config = example.copy(copy_frozen=False).debugging(seed=args.seed).training(async_mode=mode == "async")
        if args.searchers is not None:  # one thread each, 1/N of a CPU in Ray's count: the learner keeps one CPU
            config.env_runners(num_env_runners=args.searchers, num_cpus_per_env_runner=1 / args.searchers)
        return config
    return tiny_config(
        env=args.env, env_config=json.loads(args.env_config), num_env_runners=1 if mode == "async" else 0,
        seed=args.seed, policy_model=args.model, max_new_tokens=args.max_new_tokens, lr=args.lr, beta=args.beta,
        prompts_per_batch=4, prompts_per_generation=4, min_buffer_size=16, sync_every=args.sync_every,
        searcher_dtype=args.searcher_dtype, async_mode=mode == "async", updates_per_iteration=args.updates_per_iteration,
        training_intensity=args.training_intensity if mode == "async" else None)


def run(mode: str, args) -> dict:
    algo = build_config(mode, args).build_algo()
    rows, ends = [], []  # ends: when each iteration returned
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
            ends.append(time.time())
        first, last = rows[0], rows[-1]
        out = {"mode": mode, "seconds": ends[-1] - start, "final_reward": last["reward"],
               "first_reward": first["reward"], "updates": last["updates"],
               "samples_per_update": algo.counters["samples_received"] / algo.weights_version}
        if last["updates"] > first["updates"]:
            warm, warm_updates = ends[0], last["updates"] - first["updates"]  # from the end of the first iteration
            out["s_per_update"] = (ends[-1] - warm) / warm_updates
            if mode == "sync":  # generation and learning take turns: where an update's seconds go
                out["generation_s_per_update"] = busy_seconds(algo.timeline["samples"], warm) / warm_updates
                out["learning_s_per_update"] = busy_seconds(algo.timeline["updates"], warm) / warm_updates
        return out
    finally:
        algo.stop()


def summarize(results: list[dict]) -> dict:
    summary = {r["mode"]: {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in results}
    sync, async_ = results
    summary["sync_over_async_time"] = round(sync["seconds"] / async_["seconds"], 2)
    if "s_per_update" in sync and "s_per_update" in async_:
        summary["sync_over_async_s_per_update"] = round(sync["s_per_update"] / async_["s_per_update"], 2)
    return summary


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", choices=("tiny", "redteam"), default="tiny",
                    help="tiny: the tiny configuration with the options below; redteam: tuned_examples/tba_redteam.py "
                         "as it is (only --updates, --seed and --searchers apply)")
    ap.add_argument("--searchers", type=int, default=None, metavar="N",
                    help="redteam: N searchers of one thread (1/N CPU each) instead of the example's two; 1 is the "
                         "layout before 2026-12-06")
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
    if args.updates < 1:
        ap.error(f"--updates {args.updates}: give a number of learner updates >= 1")
    if args.searchers is not None and (args.searchers < 1 or args.example != "redteam"):
        ap.error(f"--searchers {args.searchers}: give a number of searchers >= 1, with --example redteam")
    started = not ray.is_initialized()  # a caller's Ray (the tests') is used as it is
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = summarize([run("sync", args), run("async", args)])
    finally:
        if started:
            ray.shutdown()
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
