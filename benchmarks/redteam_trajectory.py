"""A red-team TBA run's path through (diversity, ASR): every checkpoint the run kept (or those chosen), evaluated
with the frontier's protocol (`rllib evaluate CKPT --num-samples 256 --openings 5`, evaluation seed 0), against the PPO
runs of benchmarks/redteam_frontier.json. It answers whether the attacker passes through a point that dominates a PPO
run (ASR at most 2 points lower, diversity >= +0.05) on its way to its final ASR, or is less diverse at every ASR.

    python tuned_examples/redteam_frontier.py default --seeds 3 --checkpoint-every 20   # a run that keeps checkpoints
    python benchmarks/redteam_trajectory.py results/redteam_frontier/<run>/<trial> [--from-update 120]
    python benchmarks/redteam_trajectory.py results/redteam_frontier/<run>/<trial> --updates 100 120 150

Writes benchmarks/redteam_trajectory.json (per trial: its knob and seed, and at each checkpoint's learner update the
evaluation (with its most common first words) and the PPO runs it dominates; a trial given again keeps its earlier
points and replaces those evaluated again) and benchmarks/redteam_trajectory.png. An evaluation already made with the
first words (eval_seed0.json beside the checkpoint) is reused, so an interrupted command resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tuned_examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402
from redteam_frontier import (COLOURS, DEFAULT_OUT, DIVERSITY_AXIS, current_protocol, dominates,  # noqa: E402
                              eval_path, eval_record, evaluate, example_knob, finish_plot, run_label, tba_knob)
from rllib_tba.checkpoint_files import read_checkpoint_state  # noqa: E402
from rllib_tba.policy_export import load_checkpoint_config  # noqa: E402


def ppo_label(run: dict) -> str:
    return f"ppo {run_label(run)}, {run['attacks_generated']} attacks, seed {run['train_seed']}"


def tba_label(run: dict) -> str:
    """A trajectory's legend entry: its seed, and what its settings change from the default example's."""
    default = example_knob(argparse.Namespace(quick=False))
    changed = ", ".join(f"{k} {v}" for k, v in run["knob"].items() if default.get(k) != v)
    return f"tba seed {run['train_seed']}{', ' + changed if changed else ''}: evaluated checkpoints (learner update)"


def dominated_ppo(ev: dict, ppo: list[dict]) -> list[str]:
    """The PPO runs an evaluation dominates (ASR at most 2 points lower, diversity >= +0.05), by label."""
    return [ppo_label(p) for p in ppo if dominates(ev, p["eval"])]


def checkpoints(trial_dir: Path) -> list[tuple[int, Path]]:
    """The checkpoints of a TBA trial as (learner update of its weights, path), in update order."""
    found = []
    for path in sorted(trial_dir.glob("checkpoint_*")):
        state = read_checkpoint_state(path)
        if "tba" not in state:
            raise SystemExit(f"{path}: not a TBA checkpoint (the trajectory follows TBA's learner updates)")
        found.append((int(state["tba"]["weights_version"]), path))
    if not found:
        raise SystemExit(f"{trial_dir}: no checkpoint_* in it (train with redteam_frontier.py --checkpoint-every)")
    return sorted(found)


def evaluated(checkpoint: Path, num_eval: int) -> dict:
    """The checkpoint's evaluation with its first words: the saved one if it has them under today's protocol, else a
    fresh one."""
    saved = eval_path(checkpoint)
    if saved.is_file():
        data = json.loads(saved.read_text())
        if data.get("num_samples") == num_eval and "openings" in data and current_protocol(data):
            return {**data, "seed": 0}
    return evaluate(str(checkpoint), num_eval)  # the frontier's evaluation keeps the first words


def trajectory(trial_dir: Path, num_eval: int, from_update: int, ppo: list[dict],
               updates: list[int] | None = None) -> dict:
    """One trial's record: its knob and seed, and a point per checkpoint at or after ``from_update`` (only those of the
    learner ``updates`` when given; each must have a checkpoint, checked before anything is evaluated)."""
    found = checkpoints(trial_dir)
    kept = [update for update, _ in found]
    missing = sorted(set(updates or []) - set(kept))
    if missing:
        raise SystemExit(f"{trial_dir}: no checkpoint of learner update(s) {missing}; it kept updates {kept}")
    config = load_checkpoint_config(found[-1][1])
    points = []
    for update, path in found:
        if update < from_update or (updates and update not in updates):
            continue
        ev = eval_record(evaluated(path, num_eval))
        points.append({"update": update, "eval": ev, "dominates_ppo": dominated_ppo(ev, ppo)})
        print(f"update {update}: ASR {ev['asr']:.1%}, diversity {ev['diversity']:.3f}, first words "
              f"{ev['openings'][:3]}; dominates {points[-1]['dominates_ppo'] or 'no PPO run'}", flush=True)
    return {"trial_dir": str(trial_dir.resolve()).replace(str(ROOT) + "/", ""), "train_seed": config.seed,
            "knob": tba_knob(config), "points": points}


def merge_points(earlier: list[dict], new: list[dict]) -> list[dict]:
    """A trial's points after a new call: the earlier ones, those evaluated again replaced, in update order."""
    by_update = {p["update"]: p for p in earlier}
    by_update.update({p["update"]: p for p in new})
    return [by_update[u] for u in sorted(by_update)]


def plot(data: dict, ppo: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 6))
    for i, run in enumerate(data["runs"]):
        xs = [p["eval"]["diversity"] for p in run["points"]]
        ys = [100 * p["eval"]["asr"] for p in run["points"]]
        ax.plot(xs, ys, "-o", c=plt.get_cmap("Blues")(0.5 + 0.5 * i / max(1, len(data["runs"]) - 1)), ms=4,
                label=tba_label(run))
        for p, x, y in zip(run["points"], xs, ys):
            ax.annotate(str(p["update"]), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    for p in ppo:
        ev = p["eval"]
        ax.scatter([ev["diversity"]], [100 * ev["asr"]], marker="s", c=COLOURS["ppo"], s=40)
        ax.annotate(ppo_label(p), (ev["diversity"], 100 * ev["asr"]), fontsize=7, xytext=(4, -9),
                    textcoords="offset points")
        # where a point would dominate this PPO run
        ax.add_patch(plt.Rectangle((ev["diversity"] + 0.05, 100 * ev["asr"] - 2), 1, 100, color=COLOURS["ppo"],
                                   alpha=0.06, lw=0))
    ax.set_xlim(min([0.3] + [p["eval"]["diversity"] - 0.02 for r in data["runs"] for p in r["points"]]), 1.0)
    ax.set_ylim(-3, 103)
    n = data["runs"][0]["points"][0]["eval"]["n"] if data["runs"] and data["runs"][0]["points"] else 256
    return finish_plot(fig, ax, path, DIVERSITY_AXIS, f"ASR (%), {n} attacks",
                       "a TBA run's path (checkpoints) against PPO's final points\n"
                       "(shaded: where a point dominates that PPO run)", fontsize=7, loc="lower left")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trial_dirs", nargs="+", type=Path, help="Tune trial folders of TBA runs (checkpoint_* inside)")
    ap.add_argument("--from-update", type=int, default=0, help="skip checkpoints of earlier learner updates")
    ap.add_argument("--updates", type=int, nargs="+", metavar="UPDATE",
                    help="evaluate only the checkpoints of these learner updates (default: every one kept)")
    ap.add_argument("--num-eval", type=int, default=256, help="attacks in each evaluation")
    ap.add_argument("--frontier", type=Path, default=DEFAULT_OUT, help="the frontier JSON whose PPO runs to compare")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "redteam_trajectory.json")
    args = ap.parse_args(argv)
    for d in args.trial_dirs:
        if not d.is_dir():
            ap.error(f"{d}: no such trial folder")
    if args.num_eval < 1:
        ap.error(f"--num-eval {args.num_eval}: give a number of attacks >= 1")
    ppo = [r for r in json.loads(args.frontier.read_text())["runs"] if r["method"] == "ppo"] \
        if args.frontier.is_file() else []
    data = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": []}
    for d in args.trial_dirs:
        record = trajectory(d, args.num_eval, args.from_update, ppo, args.updates)
        earlier = next((r["points"] for r in data["runs"] if r["trial_dir"] == record["trial_dir"]), [])
        record["points"] = merge_points([p for p in earlier if p["eval"]["n"] == args.num_eval and
                                         current_protocol(p["eval"])], record["points"])
        for p in record["points"]:  # earlier points against today's PPO runs too
            p["dominates_ppo"] = dominated_ppo(p["eval"], ppo)
        data["runs"] = [r for r in data["runs"] if r["trial_dir"] != record["trial_dir"]] + [record]
        data.update(machine=bench.machine_line(), commit=bench.commit())
        args.out.write_text(json.dumps(data, indent=1) + "\n")  # after every trial: an interrupted command keeps it
    print(plot(data, ppo, args.out.with_suffix(".png")))
    return data


if __name__ == "__main__":
    main()
