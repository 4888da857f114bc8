"""Learner connector piece: the sampling policy's action-distribution inputs, computed on the learner.

RLlib's PPO loss reads ``batch[ACTION_DIST_INPUTS]`` (the behaviour policy's logits, for its KL term). An LLM
EnvRunner that samples with vLLM (``VLLMEnvRunner``) returns the sampled tokens' log-probs (``action_logp``), not a
vocabulary-sized logit vector per token (49k floats = 192 KB per token for SmolLM2). This piece recomputes them on
the learner, before the update, with the learner's current weights: for PPO these are the weights the samples were
generated with (PPO syncs the EnvRunners after every update and samples synchronously). One LM forward per episode
(rows of the same episode share it, see ``HFCausalLMRLModule``), no gradient. Ray's own PPO learner carries a TODO to
move exactly this into a learner connector.

    config.learners(learner_connector=lambda obs_space, act_space: AddActionDistInputsFromModule())
"""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override


class AddActionDistInputsFromModule(ConnectorV2):
    def __init__(self, input_observation_space=None, input_action_space=None, *, episodes_per_forward: int = 16,
                 **kwargs):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        if episodes_per_forward < 1:
            raise ValueError(f"episodes_per_forward must be >= 1, got {episodes_per_forward}")
        self.episodes_per_forward = episodes_per_forward

    @override(ConnectorV2)
    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        if Columns.ACTION_DIST_INPUTS in batch:  # the EnvRunner already sent them
            return batch
        by_module: dict = {}
        for ep in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            by_module.setdefault(ep.module_id or DEFAULT_MODULE_ID, []).append(ep)
        for module_id, module_episodes in by_module.items():
            module = rl_module[module_id]
            device = next(module.parameters()).device
            for start in range(0, len(module_episodes), self.episodes_per_forward):
                chunk = module_episodes[start:start + self.episodes_per_forward]
                obs = np.concatenate([np.asarray(ep.get_observations(slice(0, len(ep)))) for ep in chunk])
                with torch.no_grad():
                    out = module.forward_exploration({Columns.OBS: torch.as_tensor(obs, device=device)})
                logits = out[Columns.ACTION_DIST_INPUTS].float().cpu().numpy()
                offset = 0
                for ep in chunk:
                    self.add_n_batch_items(batch, Columns.ACTION_DIST_INPUTS,
                                           items_to_add=logits[offset:offset + len(ep)], num_items=len(ep),
                                           single_agent_episode=ep)
                    offset += len(ep)
        return batch
