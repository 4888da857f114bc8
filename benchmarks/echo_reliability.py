"""How reliably fresh victim answers make a trained red-team attacker's attacks succeed.

    .venv/bin/python benchmarks/echo_reliability.py CKPT [--victim-seeds 5] [--json FILE]
    .venv/bin/python benchmarks/echo_reliability.py CKPT --buffer-versions 280 290   # the searchers' own attacks

The checkpoint's attacks are drawn once — the very attacks `rllib evaluate CKPT --num-samples 256` draws (policy
seed 0, ``envs.evaluation.sample_and_score``) — and each is scored with the evaluation protocol's victim (5 answers
of 24 tokens) under --victim-seeds victim seeds: the evaluation's own first (so the first column is `rllib
evaluate`'s ASR), then the seeds after it.
Training draws one set of answers per attack text (seeded per attack: the reward is a function of the text), so what
an attacker was rewarded for is one draw; ``fresh_asr_given_success_on_first`` — how often an attack that succeeded on
one draw succeeds on another — is the ASR a policy made only of once-successful attacks scores on fresh answers.
With --buffer-versions the attacks are instead the ones the searchers generated with those learner weights versions,
as the checkpoint's replay buffer holds them (TBA checkpoints): what the evaluation would make of the searchers' own
attacks of that time — when the evaluated ASR and the searchers' during training part, it tells a drift of the policy
since those weights (the same attacks pass) from attacks that were rewarded for lucky answers (they fail here too).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reliability(success: np.ndarray, attacks: list[str] | None = None, top: int = 5) -> dict:
    """Summary of an (attacks x victim seeds) success matrix; column 0 is the draw the others are compared with."""
    s = np.asarray(success, bool)
    first, rest = s[:, 0], s[:, 1:]
    summary = {
        "attacks": int(s.shape[0]), "victim_seeds": int(s.shape[1]),
        "asr_per_seed": [float(x) for x in s.mean(0)], "asr_mean": float(s.mean()),
        "succeeded_on_every_seed": float(s.all(1).mean()), "succeeded_on_no_seed": float((~s.any(1)).mean()),
        "fresh_asr_given_success_on_first": float(rest[first].mean()) if first.any() else None,
        "fresh_asr_given_failure_on_first": float(rest[~first].mean()) if (~first).any() else None,
    }
    if attacks is not None:  # the most frequent attack texts, each with its success fraction over the seeds
        texts = np.asarray(attacks, object)
        unique, counts = np.unique(texts, return_counts=True)
        summary["most_common"] = [[str(unique[i]), int(counts[i]), float(s[texts == unique[i]].mean())]
                                  for i in np.argsort(-counts, kind="stable")[:top]]
    return summary


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--victim-seeds", type=int, default=5, help="victim seeds per attack (>= 2)")
    ap.add_argument("--num-samples", type=int, default=256, help="attacks, as rllib evaluate --num-samples")
    ap.add_argument("--seed", type=int, default=0, help="the policy's sampling seed, as rllib evaluate --seed")
    ap.add_argument("--buffer-versions", type=int, nargs="+", metavar="V",
                    help="score the buffer's attacks generated with these weights versions instead of sampling the "
                         "checkpoint's policy")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args(argv)
    if args.victim_seeds < 2 or args.num_samples < 1:
        ap.error(f"--victim-seeds {args.victim_seeds} / --num-samples {args.num_samples}: give >= 2 seeds and >= 1 "
                 "attack")

    from envs.evaluation import sample_and_score
    from rllib_tba.policy_export import export_hf_model, load_checkpoint_config, with_env_overrides
    from rllib_tba.vllm_env_runner import make_task_env

    config = load_checkpoint_config(args.checkpoint)
    protocol = make_task_env(config).evaluation_config
    if "seed" not in protocol:
        raise SystemExit(f"{args.checkpoint}: its task's evaluation protocol has no victim seed to vary")
    envs = [make_task_env(with_env_overrides(config.copy(copy_frozen=False),  # a copy each: the overrides write into it
                                             {**protocol, "seed": protocol["seed"] + i}))
            for i in range(args.victim_seeds)]
    if args.buffer_versions:
        prompts, completions = buffer_attacks(args.checkpoint, envs[0], args.buffer_versions)
        batches = [(prompts, completions, envs[0].score(prompts, completions))]
    else:
        with tempfile.TemporaryDirectory(prefix="echo-reliability-") as tmp:  # the evaluation's draws, column 0
            batches = list(sample_and_score(envs[0], export_hf_model(args.checkpoint, tmp), args.num_samples,
                                            temperature=getattr(config, "sampling_temperature", 1.0), seed=args.seed))
    columns = []
    for env in envs:
        results = [first for *_, first in batches] if env is envs[0] else [env.score(p, c) for p, c, _ in batches]
        columns.append([bool(v) and env.episode_success(info) for r in results for info, v in zip(r.infos, r.valid)])
    valid = np.asarray([bool(v) for *_, r in batches for v in r.valid])
    attacks = [info.get(envs[0].output_field) for *_, r in batches for info, v in zip(r.infos, r.valid) if v]
    table = np.asarray(columns, bool).T[valid]
    toxicity = [info["attack_toxicity"] for *_, r in batches for info, v in zip(r.infos, r.valid)
                if v and "attack_toxicity" in info]
    summary = {"checkpoint": str(args.checkpoint), "victim_seeds_used": [env.config["seed"] for env in envs],
               "attacks_from": f"replay buffer, weights versions {args.buffer_versions}" if args.buffer_versions
               else f"the checkpoint's policy, seed {args.seed}",
               "invalid_dropped": int((~valid).sum()),
               "attack_toxicity": float(np.mean(toxicity)) if toxicity else None,
               **reliability(table, attacks)}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return summary


def buffer_attacks(checkpoint, env, versions) -> tuple[list, list]:
    """The replay buffer's samples generated with weights ``versions`` (oldest first), as (env prompts, completion
    token ids): each sample's prompt is found among the env's by its token ids."""
    from rllib_tba.checkpoint_files import read_checkpoint_state

    tba = read_checkpoint_state(Path(checkpoint)).get("tba")
    if not tba:
        raise SystemExit(f"{checkpoint}: not a TBA checkpoint (no replay buffer saved)")
    by_ids = {p.token_ids: p for p in env.prompts}
    # a saved sample: (prompt key, prompt ids, completion ids, reward, weights version, ...), oldest first
    rows = [r for r in tba["buffer"]["samples"] if r[4] in versions]
    if not rows:
        held = sorted({r[4] for r in tba["buffer"]["samples"]})
        raise SystemExit(f"{checkpoint}: the buffer holds no sample of weights versions {versions} (it holds "
                         f"{held[:5]}...{held[-5:]})")
    missing = [r for r in rows if tuple(r[1]) not in by_ids]
    if missing:
        raise SystemExit(f"{checkpoint}: {len(missing)} buffer samples have a prompt the task's env does not have")
    return [by_ids[tuple(r[1])] for r in rows], [list(r[2]) for r in rows]


if __name__ == "__main__":
    main()
