"""TBA's RLModule: the HF causal LM (fp32 master weights) plus an optional learned logZ(x) head.

``_forward_train`` takes a sequence batch (``input_ids``, ``attention_mask``, ``response_mask``; see
:func:`response_logprobs`) and returns ``logp`` (summed response log-probs at the module's temperature) and, when
``model_config["learn_log_z"]`` is set, ``log_z``: a linear head on the mean-pooled prompt hidden states (the
red-team variant of Lee et al.). The head is not part of the inference weights the searchers receive.
``model_config["share_prompts"]`` (TBAConfig's ``share_prompt_forward``): run each distinct prompt of a batch once.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.utils.annotations import override

from rllib_tba.hf_rl_module import HFCausalLMRLModule

LOG_Z_HEAD = "log_z_head"


def response_logprobs(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                      temperature: float, return_hidden: bool = False, precision: str = "fp32",
                      share_prompts: bool = False):
    """Sum over response tokens of log softmax(logits / temperature), per row.

    ``input_ids`` (N, L): prompt then response, right-padded; ``response_mask`` (N, L): 1 where the token is a
    response token. Logits are only computed where the next token is a response token (cheap for large vocabularies).
    ``precision="bf16-mixed"`` runs the matmuls under bf16 autocast (fp32 master weights, fp32 log-softmax).
    ``share_prompts``: rows with the same prompt run it through the model once (:func:`hidden_states`).
    """
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        hidden = hidden_states(lm, input_ids, attention_mask, response_mask, share_prompts)
        predict = response_mask[:, 1:].bool()  # position t predicts token t+1
        rows = torch.nonzero(predict, as_tuple=True)[0]
        logits = lm.get_output_embeddings()(hidden[:, :-1][predict]).float() / temperature
        token_lp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:][predict].unsqueeze(-1)).squeeze(-1)
        logp = torch.zeros(len(input_ids), dtype=token_lp.dtype, device=token_lp.device).index_add_(0, rows, token_lp)
        return (logp, hidden) if return_hidden else logp


def hidden_states(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                  share_prompts: bool = False) -> torch.Tensor:
    """The LM body's last hidden states (N, L, H) of right-padded prompt + response rows.

    ``share_prompts``: the rows are grouped by their prompt (the tokens before the first response token); each
    distinct prompt runs through the model once, its keys/values are repeated for the group's rows, and only the
    responses run per row. Same hidden states and gradients as one forward of every row (up to float rounding), for
    a fraction of the compute when many samples share a prompt (a TBA batch: K samples per prompt). Falls back to
    the plain forward under gradient checkpointing (which turns the key/value cache off while training).
    """
    body = lm.base_model
    if not share_prompts or (lm.training and getattr(lm, "is_gradient_checkpointing", False)):
        return body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    width = input_ids.shape[1]
    has_response = response_mask.bool().any(1)
    # prompt length per row: up to its first response token (a row without one is all prompt)
    lengths = torch.where(has_response, response_mask.bool().int().argmax(1), attention_mask.sum(1)).tolist()
    ids = input_ids.tolist()  # one device-to-host copy, not one per row
    groups: dict[tuple, list[int]] = {}
    for row, length in enumerate(lengths):
        groups.setdefault(tuple(ids[row][:length]), []).append(row)
    parts, order = [], []
    for prompt, rows in groups.items():
        n, length = len(rows), len(prompt)
        if length == 0 or length == width:  # nothing to share, or nothing after the prompt
            parts.append(body(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).last_hidden_state)
        else:
            head = body(input_ids=input_ids[rows[:1], :length], use_cache=True)
            cache = head.past_key_values
            cache.batch_repeat_interleave(n)
            tail = body(input_ids=input_ids[rows, length:], attention_mask=attention_mask[rows],
                        past_key_values=cache, use_cache=True).last_hidden_state
            parts.append(torch.cat([head.last_hidden_state.expand(n, -1, -1), tail], dim=1))
        order += rows
    hidden = torch.cat(parts) if len(parts) > 1 else parts[0]
    return hidden[torch.argsort(torch.as_tensor(order, device=hidden.device))]


class TBARLModule(HFCausalLMRLModule, InferenceOnlyAPI):
    @override(HFCausalLMRLModule)
    def setup(self):
        self.model_config = {"value_head": False, **(self.model_config or {})}
        super().setup()
        self.share_prompts = bool(self.model_config.get("share_prompts", False))
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
                                         self.temperature, return_hidden=True, precision=self.precision,
                                         share_prompts=self.share_prompts)
        out = {"logp": logp}
        if self.log_z_head is not None:
            prompt = batch["prompt_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden.detach().float() * prompt).sum(1) / prompt.sum(1).clamp(min=1)
            out["log_z"] = self.log_z_head(pooled).squeeze(-1)
        return out
