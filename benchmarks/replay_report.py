"""What a TBA run's replay buffer held at its checkpoint, and where its off-policy draws went.

    python benchmarks/replay_report.py CHECKPOINT [CHECKPOINT ...] [--inv-temp 2.0] [--near-duplicate-jaccard 0.3]
                                       [--top-reward -1.204]

Per checkpoint: the stored samples' rewards by the learner version that generated them (40 versions a band), and the
share of one off-policy draw's probability that falls on "top" samples (reward >= --top-reward; the default is
log 0.3: red-team attacks whose 5 victim answers average toxicity >= 0.3), with reward-prioritised replay as is
(softmax(inv_temp · r)) and spread over near-duplicate clusters at --near-duplicate-jaccard (clusters formed afresh,
in arrival order, as a buffer with that threshold forms them), and how far apart the two draws are: their total
variation distance ½ Σ |p − q| (0: spreading changes no draw; 1: the two never draw the same sample).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rllib_tba.checkpoint_files import read_checkpoint_state  # noqa: E402
from rllib_tba.tba_replay_buffer import TBAReplayBuffer  # noqa: E402


def report(state: dict, inv_temp: float, jaccard: float, top_reward: float, band: int = 40) -> dict:
    """The numbers of one buffer state (``TBAReplayBuffer.get_state()``)."""
    out = {"samples": len(state["samples"])}
    rows = state["samples"]
    rewards = np.asarray([row[3] for row in rows])
    versions = np.asarray([row[4] for row in rows])
    out["bands"] = [{"versions": [lo, lo + band - 1], "n": int(m.sum()), "mean_reward": float(rewards[m].mean()),
                     "top": int((rewards[m] >= top_reward).sum()), "max_reward": float(rewards[m].max())}
                    for lo in range(0, int(versions.max()) + 1, band) if (m := (versions >= lo) & (versions < lo + band)).any()]
    draws = {}
    for name, t in (("prioritised", 0.0), ("spread", jaccard)):
        buf = TBAReplayBuffer(capacity=len(rows), per_prompt_capacity=len(rows), near_duplicate_jaccard=t)
        buf.set_state({**state, "samples": [row[:9] for row in rows]})  # without any saved clusters
        top_mass, draws[name] = [], {}
        for key in sorted({row[0] for row in rows}):
            stored, p = buf.off_policy_probabilities(key, inv_temp)
            top_mass.append(float(p[np.asarray([s.reward for s in stored]) >= top_reward].sum()))
            draws[name][key] = dict(zip((s.seq for s in stored), p))
        out[f"top_mass_{name}"] = float(np.mean(top_mass))  # averaged over prompts (drawn uniformly)
        out[f"clusters_{name}"] = buf.num_clusters
    # prompts are drawn uniformly and hold disjoint samples: the draws' distance is the mean of the prompts'
    out["tv_distance"] = float(np.mean([0.5 * sum(abs(p - draws["spread"][key][seq]) for seq, p in by_seq.items())
                                        for key, by_seq in draws["prioritised"].items()]))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--inv-temp", type=float, default=2.0, help="reward_inv_temp of the draws (the red-team default)")
    ap.add_argument("--near-duplicate-jaccard", type=float, default=0.3)
    ap.add_argument("--top-reward", type=float, default=round(math.log(0.3), 3))
    args = ap.parse_args(argv)
    if not 0 < args.near_duplicate_jaccard <= 1:
        ap.error(f"--near-duplicate-jaccard {args.near_duplicate_jaccard}: give a threshold in (0, 1]")
    for ckpt in args.checkpoints:
        r = report(read_checkpoint_state(Path(ckpt))["tba"]["buffer"], args.inv_temp, args.near_duplicate_jaccard,
                   args.top_reward)
        print(f"{ckpt}\n  {r['samples']} samples; off-policy probability on reward >= {args.top_reward}: "
              f"{r['top_mass_prioritised']:.3f} prioritised ({r['clusters_prioritised']} clusters), "
              f"{r['top_mass_spread']:.3f} spread at Jaccard {args.near_duplicate_jaccard} ({r['clusters_spread']} "
              f"clusters); total variation distance between the two draws {r['tv_distance']:.3f}")
        for b in r["bands"]:
            print(f"  versions {b['versions'][0]:>3}-{b['versions'][1]:<3} {b['n']:>4} samples, mean reward "
                  f"{b['mean_reward']:.2f}, {b['top']:>3} top, best {b['max_reward']:.2f}")


if __name__ == "__main__":
    main()
