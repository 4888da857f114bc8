"""TBA's RLModule: the HF causal LM (fp32 master weights) plus an optional learned logZ(x) head.

``_forward_train`` takes a sequence batch (``input_ids``, ``attention_mask``, ``response_mask``; see
:func:`response_logprobs`) and returns ``logp`` (summed response log-probs at the module's temperature) and, when
``model_config["learn_log_z"]`` is set, ``log_z``: a linear head on the mean-pooled prompt hidden states (the
red-team variant of Lee et al.). The head is not part of the inference weights the searchers receive.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.utils.annotations import override

from rllib_tba.hf_rl_module import HFCausalLMRLModule

LOG_Z_HEAD = "log_z_head"


def response_logprobs(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                      temperature: float, return_hidden: bool = False, precision: str = "fp32"):
    """Sum over response tokens of log softmax(logits / temperature), per row.

    ``input_ids`` (N, L): prompt then response, right-padded; ``response_mask`` (N, L): 1 where the token is a
    response token. Logits are only computed where the next token is a response token (cheap for large vocabularies).
    ``precision="bf16-mixed"`` runs the matmuls under bf16 autocast (fp32 master weights, fp32 log-softmax).
    """
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        hidden = lm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        predict = response_mask[:, 1:].bool()  # position t predicts token t+1
        rows = torch.nonzero(predict, as_tuple=True)[0]
        logits = lm.get_output_embeddings()(hidden[:, :-1][predict]).float() / temperature
        token_lp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:][predict].unsqueeze(-1)).squeeze(-1)
        logp = torch.zeros(len(input_ids), dtype=token_lp.dtype, device=token_lp.device).index_add_(0, rows, token_lp)
        return (logp, hidden) if return_hidden else logp


class TBARLModule(HFCausalLMRLModule, InferenceOnlyAPI):
    @override(HFCausalLMRLModule)
    def setup(self):
        self.model_config = {"value_head": False, **(self.model_config or {})}
        super().setup()
        self.log_z_head = torch.nn.Linear(self.lm.config.hidden_size, 1) if self.model_config.get("learn_log_z") else None
        if self.log_z_head is not None:
            torch.nn.init.zeros_(self.log_z_head.weight)
            torch.nn.init.zeros_(self.log_z_head.bias)

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self):
        return [LOG_Z_HEAD, "value_head"]

    @override(HFCausalLMRLModule)
    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        logp, hidden = response_logprobs(self.lm, batch["input_ids"], batch["attention_mask"], batch["response_mask"],
                                         self.temperature, return_hidden=True, precision=self.precision)
        out = {"logp": logp}
        if self.log_z_head is not None:
            prompt = batch["prompt_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden.detach().float() * prompt).sum(1) / prompt.sum(1).clamp(min=1)
            out["log_z"] = self.log_z_head(pooled).squeeze(-1)
        return out
