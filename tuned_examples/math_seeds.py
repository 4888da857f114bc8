"""The math example over training seeds: tuned_examples/tba_math.py trained with Ray Tune once per seed, then greedy
pass@1 of each trained policy and of the model it started from on the same held-out problems (`rllib evaluate
--greedy`), into benchmarks/math_seeds.json and README's math table.

    python tuned_examples/math_seeds.py --seeds 0 1 2
    python tuned_examples/math_seeds.py --quick --out /tmp/math_seeds.json   # tiny model, a few updates (the tests)

Held-out problems: the training generator with another seed (``dataset_seed`` 1, 300 problems; the training set is
dataset seed 0). Greedy decoding makes the starting model's pass@1 a single number; it is measured once per command
(on the first run's checkpoint with ``--base-model``). A run with the same seed and budget replaces the older one.
Raw Tune/TensorBoard logs go to --storage (default results/math_seeds), not into git.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tuned_examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402  (machine(), commit(), README blocks)
from redteam_frontier import evaluate, parse_run_args, start_ray, train  # noqa: E402  (one Tune run, `rllib
# evaluate` in its own process, the shared options)

DEFAULT_OUT = ROOT / "benchmarks" / "math_seeds.json"
HELD_OUT = {"dataset_seed": 1, "size": 300}
GOAL_GAIN = 0.05  # every seed's pass@1 gain over the starting model
TINY_MATH = {"model": "tiny-test", "size": 32, "max_new_tokens": 6}


def math_config(args, seed: int):
    """tba_math.py's config with the training seed, or its tiny stand-in with --quick."""
    if args.quick:
        from tba_tiny import tiny_config

        return tiny_config("tba/Math-v0", dict(TINY_MATH), updates_per_iteration=2, training_intensity=4.0, seed=seed)
    from tba_math import config

    return config.copy(copy_frozen=False).debugging(seed=seed)


def budget(args) -> dict:
    if args.quick:
        return {"tba/weights_version": 4}
    from tba_math import stop

    return dict(stop)


def pass_at_1(checkpoint: str, args, base: bool = False) -> float:
    """Greedy pass@1 on the held-out problems: of the trained policy, or (``base``) of the model the run started from."""
    extra = ["--greedy", "--env-config", json.dumps(held_out(args))] + (["--base-model"] if base else [])
    return evaluate(checkpoint, held_out(args)["size"], 0, extra, tag="_base" if base else "_heldout")["correct"]


def held_out(args) -> dict:
    return {**HELD_OUT, "size": 16} if args.quick else dict(HELD_OUT)


def summary(runs: list[dict]) -> dict:
    gains = [r["gain"] for r in runs]
    return {"runs": len(runs), "mean_gain": statistics.fmean(gains) if gains else None,
            "spread": max(gains) - min(gains) if gains else None, "min_gain": min(gains) if gains else None,
            "goal": f"every seed gains >= {GOAL_GAIN * 100:g} points, on >= 3 seeds",
            "goal_met": len(gains) >= 3 and min(gains) >= GOAL_GAIN}


def merge(path: Path, runs: list[dict], base: float | None, held: dict) -> dict:
    data = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    keep = [r for r in data["runs"] if not any(r["train_seed"] == n["train_seed"] and r["stop"] == n["stop"]
                                               for n in runs)]
    data["runs"] = sorted(keep + runs, key=lambda r: (r["train_seed"], json.dumps(r["stop"])))
    if base is not None:
        data["base_pass_at_1"] = base
    for r in data["runs"]:  # the gain is always against the one starting-model figure in the file
        r["gain"] = r["pass_at_1"] - data["base_pass_at_1"]
    data.update(machine=bench.machine_line(), commit=bench.commit(), held_out=held, decoding="greedy",
                summary=summary(data["runs"]))
    path.write_text(json.dumps(data, indent=1))
    return data


def table(data: dict) -> str:
    rows = ["| policy | training seed | learner updates | training | pass@1 | gain |", "|---|---|---|---|---|---|",
            f"| SmolLM2-135M-Instruct (start) | | | | {data['base_pass_at_1'] * 100:.1f}% | |"]
    rows += [f"| TBA | {r['train_seed']} | {r['learner_updates']} | {r['wall_clock_s'] / 60:.1f} min | "
             f"{r['pass_at_1'] * 100:.1f}% | {r['gain'] * 100:+.1f} points |" for r in data["runs"]]
    s = data["summary"]
    rows.append(f"\nGain over {s['runs']} seeds: mean {s['mean_gain'] * 100:+.1f} points, spread "
                f"{s['spread'] * 100:.1f} points, smallest {s['min_gain'] * 100:+.1f}; goal ({s['goal']}): "
                f"{'met' if s['goal_met'] else 'not met'}.")
    return "\n".join(rows)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    args, out = parse_run_args(ap, argv, DEFAULT_OUT, "math_seeds")
    start_ray(args)
    data = None
    for seed in args.seeds:
        trial = dict(method="tba", knob={"task": "math"}, train_seed=seed, stop=budget(args),
                     config=math_config(args, seed))
        result = train(trial, Path(args.storage).resolve())
        last = result.metrics_dataframe.iloc[-1]
        base = pass_at_1(result.checkpoint.path, args, base=True) if data is None else None
        run = {"train_seed": seed, "stop": trial["stop"], "commit": trial["commit"],
               "learner_updates": int(last["tba/weights_version"]), "wall_clock_s": round(float(last["time_total_s"]), 1),
               "pass_at_1": pass_at_1(result.checkpoint.path, args),
               "trial_dir": result.path.replace(str(ROOT) + os.sep, "")}
        data = merge(out, [run], base, held_out(args))  # after every run: an interrupted command keeps what it finished
        print(json.dumps({k: run[k] for k in ("train_seed", "learner_updates", "wall_clock_s", "pass_at_1")}))
    if out == DEFAULT_OUT:
        bench.replace_readme_block("math-seeds", f"{table(data)}\n\nMachine: {data['machine']}; commit "
                                                 f"`{data['commit']}`.")
    print(json.dumps({"json": str(out), **data["summary"]}))
    return data


if __name__ == "__main__":
    main()
