"""TBA's learner: the TB loss (``tb_loss``) on replay-buffer batches, with a frozen reference model.

The batch (built by :func:`build_train_batch` from buffer samples) holds whole sequences; the module returns the
summed response log-probs ``logp`` (and ``log_z`` for the learned-logZ variant); ``ref_logp`` comes with the batch
when the searchers computed it (``ref_logp_on="searchers"``), else from a frozen reference model on the learner at
the same temperature; beta follows ``config.beta_schedule`` and the reward temperature tau
``config.reward_temperature_schedule`` over learner updates.
"""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.schedules.scheduler import Scheduler

from rllib_tba.tb_loss import tb_loss
from rllib_tba.tba_rl_module import LOG_Z_HEAD, response_logprobs
from rllib_tba.vllm_env_runner import WEIGHTS_VERSION


def build_train_batch(samples, groups: np.ndarray, pad_id: int = 0) -> dict:
    """Sequence batch for the learner from buffer samples: prompt + completion, right-padded, with masks."""
    lengths = [len(s.prompt_ids) + len(s.completion) for s in samples]
    n, width = len(samples), max(lengths)
    input_ids = np.full((n, width), pad_id, np.int64)
    attention = np.zeros((n, width), np.int64)
    prompt_mask = np.zeros((n, width), np.float32)
    response_mask = np.zeros((n, width), np.float32)
    for i, s in enumerate(samples):
        p = len(s.prompt_ids)
        input_ids[i, :lengths[i]] = np.concatenate([np.asarray(s.prompt_ids, np.int64), s.completion.astype(np.int64)])
        attention[i, :lengths[i]] = 1
        prompt_mask[i, :p] = 1
        response_mask[i, p:lengths[i]] = 1
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "prompt_mask": prompt_mask,
        "response_mask": response_mask,
        "reward": np.asarray([s.reward for s in samples], np.float32),
        "group": np.asarray(groups, np.int64),
        "weights_version": np.asarray([s.weights_version for s in samples], np.int64),
    }
    ref_logp = np.asarray([s.ref_logp for s in samples], np.float32)
    if np.isfinite(ref_logp).all():  # every sample came with its searcher's reference log-probs
        batch["ref_logp"] = ref_logp
    return batch


class TBATorchLearner(TorchLearner):
    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        # beta follows config.beta_schedule over the algorithm's clock: its weight version (= learner updates made,
        # checkpointed with the algorithm), passed in with every update as timesteps[WEIGHTS_VERSION]
        self._beta = Scheduler(self.config.beta_schedule or self.config.beta, framework="torch")
        self._tau = Scheduler(self.config.reward_temperature_schedule or 1.0, framework="torch")
        self._ref_lm = None
        if self.config.ref_logp_on == "learner":  # else the searchers send each sample's reference log-probs
            from transformers import AutoModelForCausalLM

            module = self.module[next(iter(self.module.keys()))].unwrapped()
            self._ref_lm = AutoModelForCausalLM.from_pretrained(module.model_path, dtype=torch.float32).to(self._device)
            self._ref_lm.eval().requires_grad_(False)

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        module = self._module[module_id].unwrapped()
        lm_params = [p for p in module.lm.parameters() if p.requires_grad]
        self.register_optimizer(module_id=module_id, optimizer_name="lm", optimizer=torch.optim.AdamW(lm_params, weight_decay=0.0),
                                params=lm_params, lr_or_lr_schedule=config.lr)
        head = getattr(module, LOG_Z_HEAD, None)
        if head is not None:
            params = list(head.parameters())
            self.register_optimizer(module_id=module_id, optimizer_name="log_z", optimizer=torch.optim.Adam(params),
                                    params=params, lr_or_lr_schedule=config.lr_log_z)

    @override(TorchLearner)
    def before_gradient_based_update(self, *, timesteps) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        version = timesteps.get(WEIGHTS_VERSION, 0)
        for schedule in (self._beta, self._tau):
            schedule.update(version)
        # lr schedules (config.lr / lr_log_z as [[update, lr], ...]) on the same clock, set before the update they
        # apply to (RLlib sets them after each update, from the env steps sampled, which TBA does not count)
        for optimizer, schedule in self._optimizer_lr_schedules.items():
            self._set_optimizer_lr(optimizer, lr=schedule.update(timestep=version))

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps) -> None:
        # RLlib's step re-reads each lr schedule at NUM_ENV_STEPS_SAMPLED_LIFETIME (and logs the lr): the same clock
        super().after_gradient_based_update(
            timesteps={**timesteps, NUM_ENV_STEPS_SAMPLED_LIFETIME: timesteps.get(WEIGHTS_VERSION, 0)})

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        module = self.module[module_id].unwrapped()
        beta, tau = float(self._beta.get_current_value()), float(self._tau.get_current_value())
        if "ref_logp" in batch:  # computed by the searcher that generated each sample
            ref_logp = batch["ref_logp"].to(fwd_out["logp"].dtype)
        elif self._ref_lm is None:
            raise ValueError("ref_logp_on='searchers' but this batch has samples without reference log-probs (e.g. "
                             "from a checkpoint of a run with ref_logp_on='learner'); restore it with that setting")
        else:
            with torch.no_grad():
                ref_logp = response_logprobs(self._ref_lm, batch["input_ids"], batch["attention_mask"],
                                             batch["response_mask"], module.temperature, precision=module.precision,
                                             share_prompts=module.share_prompts)
        logp, reward = fwd_out["logp"], batch["reward"].to(fwd_out["logp"].dtype)
        log_z = fwd_out.get("log_z")
        loss = tb_loss(logp, ref_logp, reward, batch["group"], beta, log_z, tau)
        with torch.no_grad():
            implied = (reward / beta + ref_logp) / tau - logp  # VarGrad's per-sample logZ estimate
            self.metrics.log_dict({
                "tb_loss": loss.detach(),
                "log_z": (log_z if log_z is not None else implied).mean(),
                "log_z_vargrad": implied.mean(),
                "beta": beta,
                "reward_temperature": tau,
                "reward_mean": reward.mean(),
                "logp_mean": logp.detach().mean(),
                "ref_logp_mean": ref_logp.mean(),
                "kl_to_ref_mean": (logp.detach() - ref_logp).mean(),
                "response_tokens_mean": batch["response_mask"].sum(-1).mean(),
            }, key=module_id, window=1)
        return loss
