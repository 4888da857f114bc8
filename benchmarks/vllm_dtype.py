"""vLLM generation speed by weight dtype on this machine, side by side: why `"auto"` means bf16 only where native.

    .venv/bin/python benchmarks/vllm_dtype.py [--model smollm2-135m-instruct] [--threads 1]

Samples 32 × 20-token responses to the red-team instruction three times per dtype (one engine per dtype, one
process) and prints tokens/s. On an AVX2-only CPU bf16 is emulated (docs/cpu_gpu.md).
"""

from __future__ import annotations

import argparse
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args(argv)

    from envs.llm_runtime import chat_prompt, configure_vllm_env, generate_from_ids, get_engine, sampling_params

    configure_vllm_env(num_threads=args.threads)
    from transformers import AutoTokenizer

    from envs.models import resolve_model
    from envs.redteam import DEFAULT_INSTRUCTION

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(chat_prompt(tok, DEFAULT_INSTRUCTION), add_special_tokens=False)["input_ids"]
    params = sampling_params(n=32, temperature=1.0, max_tokens=20, logprobs=0)
    for dtype in args.dtypes:
        engine = get_engine(path, dtype=dtype, max_model_len=512)
        for _ in range(3):
            start = time.perf_counter()
            out = generate_from_ids(engine, [ids], params)
            seconds = time.perf_counter() - start
            tokens = sum(len(c.token_ids) for c in out[0].outputs)
            print(f"{dtype:9s} {tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
