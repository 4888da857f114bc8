"""Time one TB learner step (policy forward+backward, reference forward, AdamW) on SmolLM2-135M, seven ways.

    .venv/bin/python benchmarks/learner_step.py [--threads 1] [--batch 16] [--prompts 2] [--prompt 41] [--response 24]
        [--ways lora-fp32 lora-fp32-shared]

fp32, bf16 autocast, LoRA (r=16, all linear layers) in fp32, and LoRA + bf16 — the choices behind
``learner_precision`` and ``lora`` in the tuned examples — each running every row's prompt + response; then fp32,
LoRA fp32 and LoRA + bf16 with ``share_prompts`` (TBAConfig's ``share_prompt_forward``: each of the batch's
``--prompts`` distinct prompts once, ``--batch`` / ``--prompts`` rows each, as in a TBA batch of B prompts × K
samples). Prints seconds per step (after one warm-up step). Timings on shared machines are noisy: compare the rows
of one run.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from envs.models import resolve_model
from rllib_tba.tba_rl_module import response_logprobs


WAYS = [("fp32", False, "fp32", False), ("bf16-mixed", False, "bf16-mixed", False), ("lora-fp32", True, "fp32", False),
        ("lora-bf16-mixed", True, "bf16-mixed", False), ("fp32-shared", False, "fp32", True),
        ("lora-fp32-shared", True, "fp32", True), ("lora-bf16-mixed-shared", True, "bf16-mixed", True)]


def step_times(path, ids, resp, lora: bool, precision: str, steps: int, share: bool = False) -> list[float]:
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        get_peft_model(lm, LoraConfig(task_type="CAUSAL_LM", r=16, lora_alpha=32, target_modules="all-linear"))
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)
    attn = torch.ones_like(ids)
    times = []
    for _ in range(steps + 1):
        t = time.time()
        lp = response_logprobs(lm, ids, attn, resp, 1.0, precision=precision, share_prompts=share)
        with torch.no_grad():
            ref = response_logprobs(lm, ids, attn, resp, 1.0, precision=precision, share_prompts=share)
        ((lp - ref - 1.0) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.time() - t)
    return times[1:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=2, help="distinct prompts in the batch (TBA's B)")
    ap.add_argument("--prompt", type=int, default=41, help="prompt tokens (the red-team example's: 41)")
    ap.add_argument("--response", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--ways", nargs="+", choices=[w[0] for w in WAYS], help="only these rows (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = resolve_model(args.model)
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt + args.response))
    ids[:, :args.prompt] = torch.randint(0, vocab, (args.prompts, args.prompt)).repeat_interleave(
        -(-args.batch // args.prompts), 0)[:args.batch]  # B prompts, K = batch / B rows each
    resp = torch.zeros(ids.shape)
    resp[:, args.prompt:] = 1
    for name, lora, precision, share in WAYS:
        if args.ways and name not in args.ways:
            continue
        times = step_times(path, ids, resp, lora, precision, args.steps, share)
        print(f"{name:22s} {sum(times) / len(times):6.2f} s/step  {[round(t, 2) for t in times]}", flush=True)


if __name__ == "__main__":
    main()
