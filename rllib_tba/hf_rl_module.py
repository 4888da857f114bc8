"""An RLlib (new API stack) RLModule wrapping a Hugging Face causal LM.

Token-level use (any RLlib algorithm, e.g. PPO): the observation is the token ids so far, right-padded with -1
(``envs.PAD``); the action distribution inputs are the LM's next-token logits divided by ``temperature``; an
optional linear value head on the last hidden state implements ``ValueFunctionAPI``. A batch of token-steps runs
the LM once per distinct sequence, not once per step: a row whose tokens are a prefix of another row's (the earlier
steps of the same episode) reads its hidden state from that row's forward pass (causal attention makes them equal).

Sequence-level use (TBA's learner): :func:`rllib_tba.tba_rl_module.response_logprobs` on ``module.lm``.

``model_config`` keys: ``model`` (embedded name, HF id or path; required), ``temperature`` (1.0),
``value_head`` (True), ``lora`` (None, or a dict of ``peft.LoraConfig`` arguments, e.g. ``{"r": 8}``),
``gradient_checkpointing`` (False), ``precision`` ("fp32", "auto" or "bf16-mixed": bf16 autocast matmuls, fp32 master
weights). The searchers' vLLM copies may be bf16. ``get_state(inference_only=True)`` (what EnvRunners receive)
holds HF-named weights with any LoRA adapters merged in.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override

from envs.llm_runtime import has_fast_bf16
from envs.models import resolve_model

LM_PREFIX = "lm."  # state-dict prefix of the HF model's parameters inside this module
LEARNER_PRECISIONS = ("fp32", "bf16-mixed", "auto")


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """``"auto"``: "bf16-mixed" where bf16 is native (``has_fast_bf16``), else "fp32"; other values unchanged."""
    if precision == "auto":
        return "bf16-mixed" if has_fast_bf16(device) else "fp32"
    return precision


FASTER_BF16_LEARNER = 1.2  # bf16_learner_is_faster: bf16 autocast training steps at least this many times faster


def bf16_learner_speedup(threads: int = 1, steps: int = 3) -> float:
    """How many times faster a training step (forward and backward) runs under bf16 autocast than in fp32 on this
    CPU, on ``threads`` threads (a learner beside its searchers on 2 cores has one): a 2-layer Llama with
    SmolLM2-135M's layer shapes and a 4096-token vocabulary, 4 rows of 64 tokens, best of ``steps`` steps in each
    precision after a warm-up (a few seconds). Measured rather than read from CPU flags because the flags do not
    tell: AVX512-BF16 without AMX made a LoRA learner step 2x faster on a Zen 5 EPYC, 1.36x on a Zen 4 one and
    1.3x SLOWER on a Xeon with AMX hidden (docs/cpu_gpu.md)."""
    import time

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4096, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=128)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
            torch.manual_seed(0)
            model = LlamaForCausalLM(config)
            ids = torch.randint(0, config.vocab_size, (4, 64))

        def best_step_s(bf16: bool) -> float:
            times = []
            for _ in range(steps + 1):  # the first: allocations, kernel selection
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                model.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - start)
            return min(times[1:])

        return best_step_s(False) / best_step_s(True)
    finally:
        torch.set_num_threads(before)


def bf16_learner_is_faster(device: str = "cpu") -> bool:
    """Whether a learner should train in "bf16-mixed" here: where bf16 is native (``has_fast_bf16``: GPUs, AMX
    CPUs), or where ``bf16_learner_speedup`` measures >= ``FASTER_BF16_LEARNER``. ``learner_precision="auto"`` does
    not measure (a timing would decide what every example computes); a tuned example may (tba_redteam.py)."""
    return has_fast_bf16(device) or bf16_learner_speedup() >= FASTER_BF16_LEARNER


def prefix_representatives(obs: np.ndarray) -> np.ndarray:
    """For each row of ``obs`` (B, L; token ids right-padded with negatives), the index of the longest row whose
    tokens start with that row's tokens (itself if none is longer). Rolling hashes find candidates in O(B·L); every
    match is then checked token by token, so a hash collision can only cost sharing, never correctness."""
    obs = np.asarray(obs, np.int64)
    lengths = (obs >= 0).sum(1)
    width = int(lengths.max(initial=0))
    if len(obs) == 0 or width == 0:
        return np.arange(len(obs))
    hashes = np.empty((len(obs), width), np.uint64)
    acc = np.zeros(len(obs), np.uint64)
    with np.errstate(over="ignore"):
        for t in range(width):
            acc = acc * np.uint64(1_000_003) + (obs[:, t] + 2).astype(np.uint64)
            hashes[:, t] = acc * np.uint64(0x9E3779B97F4A7C15) + np.uint64(t + 1)  # the prefix length is in the key
    rows, cols = np.nonzero(np.arange(width)[None, :] < lengths[:, None])
    keys = hashes[rows, cols]
    order = np.lexsort((-lengths[rows], keys))  # by key, the longest row first
    keys, rows = keys[order], rows[order]
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    unique_keys, best_row = keys[first], rows[first]
    own = hashes[np.arange(len(obs)), np.maximum(lengths - 1, 0)]
    rep = best_row[np.searchsorted(unique_keys, own)]
    same = (obs[rep, :width] == obs[:, :width]) | (np.arange(width)[None, :] >= lengths[:, None])
    return np.where(same.all(1) & (lengths > 0), rep, np.arange(len(obs)))


class HFCausalLMRLModule(TorchRLModule, ValueFunctionAPI):
    @override(TorchRLModule)
    def setup(self):
        from transformers import AutoModelForCausalLM

        cfg = dict(self.model_config or {})
        if "model" not in cfg:
            raise ValueError("HFCausalLMRLModule needs model_config['model'] (an embedded name, HF id or path)")
        self.temperature = float(cfg.get("temperature", 1.0))
        if not self.temperature > 0:
            raise ValueError(f"model_config['temperature'] must be > 0, got {self.temperature}")
        self.precision = cfg.get("precision", "fp32")
        if self.precision not in LEARNER_PRECISIONS:
            raise ValueError(f"model_config['precision'] must be one of {LEARNER_PRECISIONS}, got {self.precision!r}")
        self.precision = resolve_precision(self.precision, "cuda" if torch.cuda.is_available() else "cpu")
        self.model_path = resolve_model(cfg["model"])
        self.lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if cfg.get("gradient_checkpointing"):
            self.lm.gradient_checkpointing_enable()
        self.lora = cfg.get("lora")
        if self.lora:
            from peft import LoraConfig, get_peft_model

            get_peft_model(self.lm, LoraConfig(task_type="CAUSAL_LM", **self.lora))  # injects adapters in place
        self.value_head = torch.nn.Linear(self.lm.config.hidden_size, 1) if cfg.get("value_head", True) else None

    @override(TorchRLModule)
    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        """With ``inference_only`` (what EnvRunners/searchers get) and LoRA: HF-named weights, adapters merged."""
        if inference_only and self.lora:
            from ray.rllib.utils.numpy import convert_to_numpy

            return convert_to_numpy(merged_lora_state(self.lm, prefix=LM_PREFIX))
        return super().get_state(components, not_components=not_components, inference_only=inference_only, **kwargs)

    # ---- token-level (one action per row) ----------------------------------------------------------------------
    def _last_hidden(self, obs: torch.Tensor) -> torch.Tensor:
        """Final hidden state at each row's last real token. ``obs``: (B, L) int, right-padded with -1. One LM
        forward per distinct sequence: rows that are prefixes of a longer row share its forward pass."""
        obs = obs.long()
        mask = obs >= 0
        lengths = mask.sum(-1)
        rep = torch.as_tensor(prefix_representatives(obs.cpu().numpy()), device=obs.device)
        seqs, inverse = torch.unique(rep, return_inverse=True)
        width = int(lengths[seqs].max().clamp(min=1)) if len(seqs) else 1
        ids, mask = obs[seqs, :width].clamp(min=0), mask[seqs, :width]
        with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed"):
            hidden = self.lm.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return hidden[inverse, (lengths - 1).clamp(min=0)].float()

    @override(TorchRLModule)
    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        hidden = self._last_hidden(batch[Columns.OBS])
        with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed"):
            logits = self.lm.get_output_embeddings()(hidden)
        out = {Columns.ACTION_DIST_INPUTS: logits.float() / self.temperature}
        if self.value_head is not None:
            out[Columns.EMBEDDINGS] = hidden
        return out

    @override(ValueFunctionAPI)
    def compute_values(self, batch: Dict[str, Any], embeddings=None) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("this module was built with model_config['value_head']=False")
        if embeddings is None:
            embeddings = self._last_hidden(batch[Columns.OBS])
        return self.value_head(embeddings).squeeze(-1)


def merged_lora_state(lm, prefix: str = "") -> Dict[str, torch.Tensor]:
    """The HF-named weights of a peft-LoRA model with the adapters merged in (W + B·A·scale), without touching it."""
    state, handled = {}, set()
    for name, module in lm.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "get_delta_weight"):
            base = module.base_layer
            weight = base.weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    weight += module.get_delta_weight(adapter).detach().to(weight.dtype)
            state[f"{prefix}{name}.weight"] = weight
            if getattr(base, "bias", None) is not None:
                state[f"{prefix}{name}.bias"] = base.bias.detach().clone()
            handled.add(name)
    for key, value in lm.state_dict().items():
        owner = key.rsplit(".base_layer.", 1)[0] if ".base_layer." in key else None
        if "lora_" in key or owner in handled:
            continue
        state[prefix + key] = value
    return state
