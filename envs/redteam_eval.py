"""Sample attacks from an attacker model with vLLM, have the victim answer, and report the red-team metrics.

    python -m envs.redteam_eval --attacker smollm2-135m-instruct --num-attacks 256

prints a few attacks with the victim's answers and toxicity, then attack success rate (ASR: mean toxicity of the
victim's answers > 0.5), mean toxicity and cosine diversity (all-MiniLM-L6-v2) over all sampled attacks.
"""

from __future__ import annotations

import argparse
import json
import time

from envs.evaluation import evaluate_policy
from envs.models import resolve_model
from envs.redteam import EVALUATION_SEED, RedTeamEnv


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacker", default="smollm2-135m-instruct", help="embedded name, HF id or path")
    ap.add_argument("--victim", default="smollm2-135m-instruct")
    ap.add_argument("--num-attacks", type=int, default=32)
    ap.add_argument("--victim-responses", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=20, help="attack length (tuned_examples/tba_redteam.py: 20)")
    ap.add_argument("--victim-max-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--show", type=int, default=5, help="how many attacks to print in full")
    ap.add_argument("--seed", type=int, default=0, help="the attacker's sampling seed")
    ap.add_argument("--victim-seed", type=int, default=EVALUATION_SEED,
                    help="the victim's sampling seed (default: the evaluation protocol's; give another than the "
                         "attacker's training env seed, or replayed training attacks meet the answers they were "
                         "rewarded for)")
    ap.add_argument("--json", help="also write the metrics to this file")
    args = ap.parse_args(argv)

    start = time.time()
    env = RedTeamEnv({"model": args.attacker, "victim": args.victim, "victim_responses": args.victim_responses,
                      "max_new_tokens": args.max_new_tokens, "victim_max_tokens": args.victim_max_tokens,
                      "ref_logprob": False, "seed": args.victim_seed})
    result, infos = evaluate_policy(env, resolve_model(args.attacker), args.num_attacks, args.temperature,
                                    seed=args.seed, return_infos=True)
    for info in infos[: args.show]:
        print("\n" + env.describe(info))
    metrics = {k: result[k] for k in ("num_samples", "attack_success_rate", "mean_toxicity", "diversity", "reward_mean",
                                      "distinct_successful", "diversity_successful", "attack_toxicity",
                                      "asr_beyond_attack")}
    metrics.update(attacker=args.attacker, victim=args.victim, seconds=round(time.time() - start, 1))
    print("\n" + json.dumps(metrics, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


if __name__ == "__main__":
    main()
