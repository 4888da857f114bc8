"""Ray Tune grid search over TBA's m (most-on-policy probability) and k (sync_every), CPU-sized.

    .venv/bin/python tuned_examples/tune_m_k.py                       # 4 x 3 grid on the tiny model, stand-in TL;DR
    .venv/bin/python tuned_examples/tune_m_k.py --m 0.5 0.95 --sync-every 2 --iterations 3 --seed 1 --out results/tune_seed1

Each trial trains the same budget of learner updates; the score is the searchers' mean reward over the last
iterations. Prints the best trial and writes a results table (CSV) and a plot (PNG: final reward vs m, one line
per k) into --out. The paper's TL;DR ablation (m 0.4/0.5/0.6 -> win-rate .67/.82/.80) is on a 410M model and GPUs.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import ray
from ray import tune

from rllib_tba import TBA, TBAConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tba_tiny import tiny_config  # noqa: E402


def base_config(args) -> TBAConfig:
    return tiny_config(policy_model=args.model, prompts_per_batch=4, prompts_per_generation=4, min_buffer_size=16,
                       updates_per_iteration=5, training_intensity=4.0, seed=args.seed,
                       m=tune.grid_search(args.m), sync_every=tune.grid_search(args.sync_every))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=float, nargs="+", default=[0.4, 0.5, 0.6, 0.95])
    ap.add_argument("--sync-every", type=int, nargs="+", default=[1, 2, 10], help="k: learner updates between syncs")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--model", default="tiny-test")
    ap.add_argument("--seed", type=int, default=0, help="seed of every trial (searcher sampling, buffer draws)")
    ap.add_argument("--out", default="results/tune_m_k")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    tuner = tune.Tuner(
        TBA, param_space=base_config(args),
        tune_config=tune.TuneConfig(metric="searchers/reward_mean", mode="max"),
        run_config=tune.RunConfig(name="tune_m_k", storage_path=str(out), stop={"training_iteration": args.iterations},
                                  verbose=1),
    )
    results = tuner.fit()
    rows = []
    for r in results:
        if r.error:
            raise SystemExit(f"trial failed: {r.error}")
        history = r.metrics_dataframe["searchers/reward_mean"].dropna().tolist()
        rows.append({"m": r.config["m"], "sync_every": r.config["sync_every"], "final_reward": round(sum(history[-2:]) / len(history[-2:]), 4),
                     "first_reward": round(history[0], 4), "iterations": int(r.metrics["training_iteration"]),
                     "staleness_mean": round(float(r.metrics["tba"]["staleness_mean"]), 2), "trial_dir": r.path})
    rows.sort(key=lambda row: (row["sync_every"], row["m"]))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / "reward_vs_m_k.png")
    best = max(rows, key=lambda row: row["final_reward"])
    print(json.dumps({"best": best, "table": str(out / "results.csv"), "plot": str(out / "reward_vs_m_k.png")}, indent=2))
    return rows


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in sorted({row["sync_every"] for row in rows}):
        pts = sorted((row["m"], row["final_reward"]) for row in rows if row["sync_every"] == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"k (sync_every) = {k}")
    ax.set_xlabel("m (most-on-policy probability)")
    ax.set_ylabel("final mean reward")
    ax.set_title("TBA: final reward vs m and k")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
