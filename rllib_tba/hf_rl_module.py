"""An RLlib (new API stack) RLModule wrapping a Hugging Face causal LM.

Token-level use (any RLlib algorithm, e.g. PPO): the observation is the token ids so far, right-padded with -1
(``envs.PAD``); the action distribution inputs are the LM's next-token logits divided by ``temperature``; an
optional linear value head on the last hidden state implements ``ValueFunctionAPI``.

Sequence-level use (TBA's learner): :func:`rllib_tba.tba_rl_module.response_logprobs` on ``module.lm``.

``model_config`` keys: ``model`` (embedded name, HF id or path; required), ``temperature`` (1.0),
``value_head`` (True), ``lora`` (None, or a dict of ``peft.LoraConfig`` arguments, e.g. ``{"r": 8}``),
``gradient_checkpointing`` (False). Weights are fp32 (master weights); the searchers' vLLM copies may be bf16.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from envs.models import resolve_model

LM_PREFIX = "lm."  # state-dict prefix of the HF model's parameters inside this module


class HFCausalLMRLModule(TorchRLModule, ValueFunctionAPI):
    def setup(self):
        from transformers import AutoModelForCausalLM

        cfg = dict(self.model_config or {})
        if "model" not in cfg:
            raise ValueError("HFCausalLMRLModule needs model_config['model'] (an embedded name, HF id or path)")
        self.temperature = float(cfg.get("temperature", 1.0))
        if not self.temperature > 0:
            raise ValueError(f"model_config['temperature'] must be > 0, got {self.temperature}")
        self.model_path = resolve_model(cfg["model"])
        self.lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if cfg.get("gradient_checkpointing"):
            self.lm.gradient_checkpointing_enable()
        self.lora = cfg.get("lora")
        if self.lora:
            from peft import LoraConfig, get_peft_model

            get_peft_model(self.lm, LoraConfig(task_type="CAUSAL_LM", **self.lora))  # injects adapters in place
        self.value_head = torch.nn.Linear(self.lm.config.hidden_size, 1) if cfg.get("value_head", True) else None

    # ---- token-level (one action per forward) ----------------------------------------------------------------
    def _last_hidden(self, obs: torch.Tensor) -> torch.Tensor:
        """Final hidden state at each row's last real token. ``obs``: (B, L) int, right-padded with -1."""
        obs = obs.long()
        mask = obs >= 0
        lengths = mask.sum(-1)
        width = int(lengths.max().clamp(min=1))
        ids, mask = obs[:, :width].clamp(min=0), mask[:, :width]
        hidden = self.lm.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return hidden[torch.arange(len(obs), device=obs.device), (lengths - 1).clamp(min=0)]

    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        hidden = self._last_hidden(batch[Columns.OBS])
        out = {Columns.ACTION_DIST_INPUTS: self.lm.get_output_embeddings()(hidden).float() / self.temperature}
        if self.value_head is not None:
            out[Columns.EMBEDDINGS] = hidden
        return out

    def compute_values(self, batch: Dict[str, Any], embeddings=None) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("this module was built with model_config['value_head']=False")
        if embeddings is None:
            embeddings = self._last_hidden(batch[Columns.OBS])
        return self.value_head(embeddings).squeeze(-1)
