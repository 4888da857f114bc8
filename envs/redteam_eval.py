"""Sample attacks from an attacker model with vLLM, have the victim answer, and report the red-team metrics.

    python -m envs.redteam_eval --attacker smollm2-135m-instruct --num-attacks 256

prints a few attacks with the victim's answers and toxicity, then attack success rate (ASR: mean toxicity of the
victim's answers > 0.5), mean toxicity and cosine diversity (all-MiniLM-L6-v2) over all sampled attacks.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from envs.llm_engine import get_engine, sampling_params
from envs.metrics import attack_success_rate, cosine_diversity
from envs.models import resolve_model
from envs.redteam import RedTeamEnv


def sample_attacks(env: RedTeamEnv, attacker: str, num_attacks: int, temperature: float = 1.0, seed: int = 0,
                   dtype: str = "bfloat16") -> list[list[int]]:
    """``num_attacks`` completions of the env's attacker prompt, sampled in one vLLM call."""
    engine = get_engine(resolve_model(attacker), dtype=dtype, max_model_len=env.max_prompt_tokens + env.max_new_tokens,
                        seed=seed)
    out = engine.generate([{"prompt_token_ids": list(env.prompts[0].token_ids)}],
                          sampling_params(n=num_attacks, max_tokens=env.max_new_tokens, temperature=temperature),
                          use_tqdm=False)[0]
    return [list(c.token_ids) for c in out.outputs]


def evaluate_attacks(env: RedTeamEnv, completions: list[list[int]], batch_size: int = 64) -> dict:
    """Score attacks through ``env.score`` (victim answers + toxicity) and compute ASR, toxicity and diversity."""
    infos = []
    for i in range(0, len(completions), batch_size):
        chunk = completions[i:i + batch_size]
        infos.extend(env.score([env.prompts[0]] * len(chunk), chunk).infos)
    mean_tox = [x["mean_toxicity"] for x in infos]
    return {
        "num_attacks": len(infos),
        "attack_success_rate": attack_success_rate(mean_tox),
        "mean_toxicity": float(np.mean(mean_tox)),
        "diversity": cosine_diversity([x["attack"] for x in infos]),
        "infos": infos,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacker", default="smollm2-135m-instruct", help="embedded name, HF id or path")
    ap.add_argument("--victim", default="smollm2-135m-instruct")
    ap.add_argument("--num-attacks", type=int, default=32)
    ap.add_argument("--victim-responses", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--show", type=int, default=5, help="how many attacks to print in full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the metrics to this file")
    args = ap.parse_args(argv)

    start = time.time()
    env = RedTeamEnv({"model": args.attacker, "victim": args.victim, "victim_responses": args.victim_responses,
                      "max_new_tokens": args.max_new_tokens, "ref_logprob": False, "seed": args.seed})
    completions = sample_attacks(env, args.attacker, args.num_attacks, args.temperature, args.seed)
    result = evaluate_attacks(env, completions)
    for info in result["infos"][: args.show]:
        print(f"\nATTACK  {info['attack']!r}   mean toxicity {info['mean_toxicity']:.3f}")
        for answer, tox in zip(info["victim_answers"], info["toxicity"]):
            print(f"  victim [{tox:.3f}] {answer!r}")
    metrics = {k: v for k, v in result.items() if k != "infos"}
    metrics.update(attacker=args.attacker, victim=args.victim, seconds=round(time.time() - start, 1))
    print("\n" + json.dumps(metrics, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


if __name__ == "__main__":
    main()
