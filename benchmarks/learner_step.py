"""Time one TB learner step (policy forward+backward, reference forward, AdamW) on SmolLM2-135M, four ways.

    .venv/bin/python benchmarks/learner_step.py [--threads 1] [--batch 16] [--prompt 45] [--response 24]

fp32, bf16 autocast, LoRA (r=16, all linear layers) in fp32, and LoRA + bf16 — the choices behind
``learner_precision`` and ``lora`` in the tuned examples. Prints seconds per step (after one warm-up step).
Timings on shared machines are noisy: compare the four rows of one run.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from envs.models import resolve_model
from rllib_tba.tba_rl_module import response_logprobs


def step_times(path, ids, resp, lora: bool, precision: str, steps: int) -> list[float]:
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        get_peft_model(lm, LoraConfig(task_type="CAUSAL_LM", r=16, lora_alpha=32, target_modules="all-linear"))
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)
    attn = torch.ones_like(ids)
    times = []
    for _ in range(steps + 1):
        t = time.time()
        lp = response_logprobs(lm, ids, attn, resp, 1.0, precision=precision)
        with torch.no_grad():
            ref = response_logprobs(lm, ids, attn, resp, 1.0, precision=precision)
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
    ap.add_argument("--prompt", type=int, default=45)
    ap.add_argument("--response", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = resolve_model(args.model)
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt + args.response))
    resp = torch.zeros(ids.shape)
    resp[:, args.prompt:] = 1
    for name, lora, precision in [("fp32", False, "fp32"), ("bf16-mixed", False, "bf16-mixed"),
                                  ("lora-fp32", True, "fp32"), ("lora-bf16-mixed", True, "bf16-mixed")]:
        times = step_times(path, ids, resp, lora, precision, args.steps)
        print(f"{name:16s} {sum(times) / len(times):6.2f} s/step  {[round(t, 2) for t in times]}", flush=True)


if __name__ == "__main__":
    main()
