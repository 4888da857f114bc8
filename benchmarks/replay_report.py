"""What a TBA run's replay buffer held at its checkpoint, and where its off-policy draws went.

    python benchmarks/replay_report.py CHECKPOINT [CHECKPOINT ...] [--inv-temp 2.0] [--near-duplicate-jaccard 0.3]
                                       [--top-reward -1.204] [--openings N]

Per checkpoint: the stored samples' rewards by the learner version that generated them (40 versions a band), and the
share of one off-policy draw's probability that falls on "top" samples (reward >= --top-reward; the default is
log 0.3: red-team attacks whose 5 victim answers average toxicity >= 0.3), with reward-prioritised replay as is
(softmax(inv_temp · r)) and spread over near-duplicate clusters at --near-duplicate-jaccard (clusters formed afresh,
in arrival order, as a buffer with that threshold forms them), and how far apart the two draws are: their total
variation distance ½ Σ |p − q| (0: spreading changes no draw; 1: the two never draw the same sample).
With --openings N, each band also lists its samples' N most common first words (decoded with the run's tokenizer),
with how many of each are top samples.
With --fit-set R [R ...], for each bound R: what ``rllib smooth --min-reward R`` would fit (the stored samples with
reward >= R, each distinct one once), decoded: how many, their diversity (mean pairwise MiniLM cosine distance, the
evaluation's) and distinct count (``envs.metrics.count_distinct``), and their most common first words. A smoothed
attacker that replays its fit set samples about as diversely as that set: the set bounds what smoothing can give.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from envs.metrics import common_openings, cosine_diversity, count_distinct, format_openings  # noqa: E402
from rllib_tba.checkpoint_files import read_checkpoint_state  # noqa: E402
from rllib_tba.mle_smoothing import high_reward_samples  # noqa: E402
from rllib_tba.tba_replay_buffer import TBAReplayBuffer  # noqa: E402


def report(state: dict, inv_temp: float, jaccard: float, top_reward: float, band: int = 40, decode=None,
           openings: int = 0) -> dict:
    """The numbers of one buffer state (``TBAReplayBuffer.get_state()``); with ``openings`` and ``decode`` (token ids
    -> text), each band's most common first words too (``envs.metrics.common_openings``; success = a top sample)."""
    out = {"samples": len(state["samples"])}
    rows = state["samples"]
    rewards = np.asarray([row[3] for row in rows])
    versions = np.asarray([row[4] for row in rows])
    out["bands"] = []
    for lo in range(0, int(versions.max()) + 1, band):
        if not (m := (versions >= lo) & (versions < lo + band)).any():
            continue
        out["bands"].append({"versions": [lo, lo + band - 1], "n": int(m.sum()), "mean_reward": float(rewards[m].mean()),
                             "top": int((rewards[m] >= top_reward).sum()), "max_reward": float(rewards[m].max())})
        if openings:
            texts = [decode(rows[i][2]) for i in np.flatnonzero(m)]
            out["bands"][-1]["openings"] = common_openings(texts, list(rewards[m] >= top_reward), top=openings)
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


def fit_set(state: dict, min_reward: float, decode, openings: int = 5) -> dict:
    """What MLE smoothing at ``min_reward`` fits from buffer ``state`` (``high_reward_samples``), decoded and measured."""
    texts = [decode(completion) for _, completion in high_reward_samples(state, min_reward)]
    return {"min_reward": min_reward, "samples": len(texts), "diversity": cosine_diversity(texts),
            "distinct": count_distinct(texts), "openings": common_openings(texts, top=openings)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--inv-temp", type=float, default=2.0, help="reward_inv_temp of the draws (the red-team default)")
    ap.add_argument("--near-duplicate-jaccard", type=float, default=0.3)
    ap.add_argument("--top-reward", type=float, default=round(math.log(0.3), 3))
    ap.add_argument("--openings", type=int, default=0, metavar="N",
                    help="also list each band's N most common first words (decoded with the run's tokenizer)")
    ap.add_argument("--fit-set", type=float, nargs="+", default=[], metavar="R",
                    help="also measure what MLE smoothing at --min-reward R would fit (see above)")
    args = ap.parse_args(argv)
    if args.openings < 0:
        ap.error(f"--openings {args.openings}: give a number of first words >= 0")
    if not 0 < args.near_duplicate_jaccard <= 1:
        ap.error(f"--near-duplicate-jaccard {args.near_duplicate_jaccard}: give a threshold in (0, 1]")
    for ckpt in args.checkpoints:
        decode = task_env(ckpt).decode if args.openings or args.fit_set else None
        state = read_checkpoint_state(Path(ckpt))["tba"]["buffer"]
        r = report(state, args.inv_temp, args.near_duplicate_jaccard, args.top_reward, decode=decode,
                   openings=args.openings)
        print(f"{ckpt}\n  {r['samples']} samples; off-policy probability on reward >= {args.top_reward}: "
              f"{r['top_mass_prioritised']:.3f} prioritised ({r['clusters_prioritised']} clusters), "
              f"{r['top_mass_spread']:.3f} spread at Jaccard {args.near_duplicate_jaccard} ({r['clusters_spread']} "
              f"clusters); total variation distance between the two draws {r['tv_distance']:.3f}")
        for b in r["bands"]:
            print(f"  versions {b['versions'][0]:>3}-{b['versions'][1]:<3} {b['n']:>4} samples, mean reward "
                  f"{b['mean_reward']:.2f}, {b['top']:>3} top, best {b['max_reward']:.2f}")
            if "openings" in b:
                print(f"    first words: {format_openings(b['openings'], 'top')}")
        for bound in args.fit_set:
            f = fit_set(state, bound, decode, openings=args.openings or 5)
            print(f"  fit set at reward >= {bound:g}: {f['samples']} samples, diversity {f['diversity']:.3f}, "
                  f"{f['distinct']} distinct; first words: {format_openings(f['openings'])}")


def task_env(checkpoint: str):
    """The task env a checkpoint's run trained on (its tokenizer decodes the stored completions)."""
    from rllib_tba.policy_export import load_checkpoint_config
    from rllib_tba.vllm_env_runner import make_task_env

    return make_task_env(load_checkpoint_config(checkpoint))


if __name__ == "__main__":
    main()
