"""TBA (Trajectory Balance with Asynchrony) as an RLlib Algorithm on the new API stack.

    from rllib_tba import TBAConfig
    config = (TBAConfig()
              .environment("tba/RedTeam-v0", env_config={...})
              .training(policy_model="smollm2-135m-instruct", m=0.5, sync_every=10, beta=0.05, lr=1e-5)
              .env_runners(num_env_runners=1))
    algo = config.build_algo(); algo.train()

Asynchronous mode (default): each searcher (``VLLMEnvRunner`` actor) always has two ``sample`` requests queued;
``training_step`` adds whatever arrived to the replay buffer and, once ``min_buffer_size`` samples are there, runs
learner updates on buffer batches without waiting for generation. Every ``sync_every`` learner updates the newest
weights are sent to the searchers fire-and-forget (a searcher loads them after the calls queued before them, or with
``pull_weights`` at its next call's start); the learner keeps going. Every sample carries the weight version that
generated it; staleness = learner version − that version.

Synchronous mode (``async_mode=False``, the speed baseline): generate → add → updates → sync (every k) per step;
with ``training_intensity`` the searchers generate again before any update that would exceed it, as the async
learner waits for samples, so both modes train on as many new samples per update.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS

from rllib_tba.checkpoint_files import CheckpointError, find_damaged_checkpoint_file, read_checkpoint_state
from rllib_tba.hf_rl_module import LEARNER_PRECISIONS
from rllib_tba.tba_learner import TBATorchLearner, build_train_batch
from rllib_tba.tba_replay_buffer import EVICTION_POLICIES, TBAReplayBuffer, TBSample
from rllib_tba.tba_rl_module import TBARLModule
from rllib_tba.vllm_env_runner import (WEIGHTS_EPOCH, WEIGHTS_VERSION, GenerationBatch, SearchError, VLLMEnvRunner,
                                       make_task_env, searcher_threads)
from rllib_tba.weights_board import WeightsBoard

logger = logging.getLogger(__name__)

SEARCHER_DTYPES = ("auto", "bfloat16", "float32", "float16")
REF_LOGP_ON = ("learner", "searchers")
_TBA_STATE = "tba"


def _finite_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float, np.number)) and math.isfinite(x)


def schedule_rule(value: str) -> str:
    """What a schedule of ``value`` over learner updates (beta_schedule, reward_temperature_schedule) must be."""
    return f"[[learner_update, {value}], ...] starting at update 0, with non-decreasing updates and finite {value} > 0"


BETA_SCHEDULE_RULE = schedule_rule("beta")
TAU_SCHEDULE_RULE = schedule_rule("tau")
LR_SCHEDULE_RULE = schedule_rule("lr")


def valid_schedule(schedule) -> bool:
    """Whether ``schedule`` is a schedule TBAConfig accepts (see schedule_rule)."""
    ok = isinstance(schedule, (list, tuple)) and len(schedule) >= 1 and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(_finite_number(x) for x in p)
        and p[0] >= 0 and p[1] > 0 for p in schedule) and schedule[0][0] == 0
    return ok and all(a[0] <= b[0] for a, b in zip(schedule, schedule[1:]))


def _lora_fields() -> set[str]:
    import dataclasses

    from peft import LoraConfig

    return {f.name for f in dataclasses.fields(LoraConfig)} - {"task_type"}


class SearcherFailure(RuntimeError):
    """The searchers cannot deliver samples: all dead and not brought back, or one raised inside ``sample()``."""


class SampleWaitTimeout(TimeoutError):
    """The learner waited ``sample_wait_timeout_s`` for samples that did not come (the message says why)."""


class TBAConfig(AlgorithmConfig):
    """TBA's configuration. Paper values (docs/method.md §4) per task: GSM8K / TL;DR / red-teaming (RT)."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or TBA)
        # --- the method (paper names in brackets) ---
        self.policy_model = "tiny-test"  # policy = reference model at start: embedded name, HF id or local path
        self.m = 0.5  # [m] P(most-on-policy draw). GSM8K .95, TL;DR .5, RT .5 (.6 Llama)
        self.sync_every = 10  # [k] learner updates between weight syncs. GSM8K 2, TL;DR 10, RT 10
        self.beta = 0.05  # [beta] KL coefficient. RT .05 fixed
        self.beta_schedule = None  # [[update, beta], ...] piecewise linear. GSM8K [[0,.012],[500,.004]]; TL;DR 1.0->.05
        self.reward_temperature_schedule = None  # [[update, tau], ...]: log R = (r/beta + log pi_ref)/tau. None: tau 1
        self.num_samples_per_prompt = 8  # [K] samples per prompt in a training batch. GSM8K/TL;DR 20
        self.generations_per_prompt = 8  # [S >= K] responses generated per prompt by a searcher
        self.prompts_per_batch = 4  # [B] prompts per training batch. GSM8K 7, TL;DR 8
        self.prompts_per_generation = 4  # prompts a searcher draws per generation call
        self.reward_inv_temp = 0.0  # off-policy draws ~ softmax(inv_temp * reward); 0 = uniform (GSM8K)
        self.buffer_capacity = 100_000  # RT 100k-150k
        self.per_prompt_capacity = 100  # reference code: 100
        self.eviction = "fifo"  # or "lowest_reward"
        self.dedup = True  # identical token sequences stored once
        self.near_duplicate_jaccard = 0.0  # > 0: off-policy draws spread over near-duplicate clusters (0 = off)
        self.min_buffer_size = 64  # train once the buffer holds this many samples. GSM8K 500, TL;DR 10k
        self.sampling_temperature = 1.0  # searcher sampling AND learner log-prob temperature (one setting)
        self.exploration_temperature = None  # (low, high): searchers sample each response at a T ~ U[low, high]. RT (0.7, 2.0)
        self.learn_log_z = False  # red-team variant: learned logZ(x) head instead of VarGrad
        self.lr_log_z = 1e-2  # its own (larger) learning rate
        self.lora = None  # dict of peft.LoraConfig args, e.g. {"r": 8, "lora_alpha": 16}
        self.max_new_tokens = None  # overrides env_config["max_new_tokens"] when set
        self.ref_logp_on = "learner"  # where log pi_ref is computed: "learner" (HF model) or "searchers" (vLLM)
        # --- the system ---
        self.async_mode = True
        self.pull_weights = False  # searchers load the newest synced weights at the start of every generation call
        # Longest wait (s) without progress: the learner waiting for samples (initial fill, training_intensity) with
        # none arriving, or every searcher down with none brought back. Then train() raises with a diagnosis.
        self.sample_wait_timeout_s = 600.0
        # Max (samples trained on) / (samples generated). None: the learner never waits (the paper's setting, right
        # when training is the bottleneck); a number caps replay when searchers are slower than the learner.
        self.training_intensity = None
        self.max_staleness = None  # None: unbounded; else samples > this many learner versions old are never drawn
        self.updates_per_iteration = 1  # learner updates per training_step() call
        self.searcher_dtype = "auto"  # vLLM weights on the searchers: bf16 where native, else fp32
        self.learner_precision = "fp32"  # or "bf16-mixed": bf16 autocast matmuls (faster on GPUs and AMX CPUs)
        self.share_prompt_forward = True  # the learner runs each distinct prompt of a batch through the model once
        # --- RLlib defaults that suit TBA ---
        self.lr = 1e-5  # GSM8K 1e-5, TL;DR 3e-6
        self.grad_clip = 1.0  # Lee et al. clip at 1.0; None = no clipping (TBA reference code)
        self.grad_clip_by = "global_norm"
        self.num_env_runners = 1
        self.env_runner_cls = VLLMEnvRunner
        # per searcher: generation requests queued (2: it starts the next call the moment one ends, even while the
        # driver is busy in a learner update) + 1 weight update
        self.max_requests_in_flight_per_env_runner = 3
        self.merge_env_runner_states = False
        self.broadcast_env_runner_states = False
        self.num_learners = 0

    @override(AlgorithmConfig)
    def training(
        self,
        *,
        policy_model=NotProvided,
        m=NotProvided,
        sync_every=NotProvided,
        beta=NotProvided,
        beta_schedule=NotProvided,
        reward_temperature_schedule=NotProvided,
        num_samples_per_prompt=NotProvided,
        generations_per_prompt=NotProvided,
        prompts_per_batch=NotProvided,
        prompts_per_generation=NotProvided,
        reward_inv_temp=NotProvided,
        buffer_capacity=NotProvided,
        per_prompt_capacity=NotProvided,
        eviction=NotProvided,
        dedup=NotProvided,
        near_duplicate_jaccard=NotProvided,
        min_buffer_size=NotProvided,
        sampling_temperature=NotProvided,
        exploration_temperature=NotProvided,
        learn_log_z=NotProvided,
        lr_log_z=NotProvided,
        lora=NotProvided,
        max_new_tokens=NotProvided,
        ref_logp_on=NotProvided,
        async_mode=NotProvided,
        pull_weights=NotProvided,
        sample_wait_timeout_s=NotProvided,
        training_intensity=NotProvided,
        max_staleness=NotProvided,
        updates_per_iteration=NotProvided,
        searcher_dtype=NotProvided,
        learner_precision=NotProvided,
        share_prompt_forward=NotProvided,
        **kwargs,
    ) -> "TBAConfig":
        """TBA's settings (paper symbols in brackets; paper values per task in docs/method.md §4).

        Args:
            policy_model: The policy LM, which is also the frozen reference model pi_ref at the start: an embedded
                name ("smollm2-135m-instruct", "tiny-test"), a Hugging Face model id or a local path. Replaces the
                task's env_config["model"], so the env tokenises with the policy's tokenizer. Default "tiny-test".
            m: [m] Probability that a batch group is drawn "most-on-policy" (a prompt whose samples arrived since the
                last weight sync, or a replay draw when none did); otherwise off-policy by `reward_inv_temp`. In
                [0, 1]. With probability m a group is at most `sync_every` − 1 learner updates staler than its samples
                arrived. GSM8K 0.95, TL;DR 0.5, RT 0.5. Default 0.5.
            sync_every: [k] Learner updates between two weight syncs to the searchers (>= 1). Larger k: fewer syncs,
                staler samples. GSM8K 2, TL;DR 10, RT 10. Default 10.
            beta: [beta] KL coefficient of the target pi_ref · exp(r / beta), > 0, applied at train time (the buffer
                stores r). RT 0.05. Default 0.05.
            beta_schedule: None (use `beta`) or [[learner_update, beta], ...] starting at update 0, linear between
                points and constant after the last, on the algorithm's weight version (= learner updates made).
                GSM8K [[0, 0.012], [500, 0.004]]. Default None.
            reward_temperature_schedule: None (tau 1) or [[learner_update, tau], ...] like `beta_schedule`: the
                learner trains towards [pi_ref · exp(r / beta)]^(1/tau), i.e. log R = (r/beta + log pi_ref)/tau —
                Lee et al.'s red-team reward temperature (tau 2 -> 1 over the first 10–20% of training; tau > 1
                flattens both the reward and the reference prior). Default None.
            num_samples_per_prompt: [K] Samples per prompt group in a training batch (>= 1); VarGrad's logZ_i is the
                mean over these K. GSM8K/TL;DR 20. Default 8.
            generations_per_prompt: [S >= K] Responses a searcher generates for each prompt it draws. Default 8.
            prompts_per_batch: [B] Prompt groups per training batch (>= 1): a batch has B·K samples. GSM8K 7,
                TL;DR 8. Default 4.
            prompts_per_generation: Prompts a searcher draws per generation call (>= 1): one call makes
                prompts_per_generation·S samples. Default 4.
            reward_inv_temp: Off-policy draws pick a group's K samples with probability softmax(reward_inv_temp · r);
                0 = uniform (GSM8K), > 0 prefers high reward (TL;DR, RT). Default 0.0.
            buffer_capacity: Samples the replay buffer holds in all (>= 1). RT 100k–150k. Default 100_000.
            per_prompt_capacity: Samples kept per prompt, oldest evicted first (>= 1). Default 100.
            eviction: Which sample leaves a full buffer: "fifo" (oldest) or "lowest_reward". Default "fifo".
            dedup: Store identical (prompt, completion) token sequences once. Default True.
            near_duplicate_jaccard: 0 (off) or a threshold in (0, 1]: each prompt's completions are clustered as they
                arrive (a completion joins the oldest cluster whose first member's token-id set has Jaccard
                similarity >= the threshold with its own), and an off-policy draw weighs a sample by
                softmax(reward_inv_temp · r) divided by its cluster's size, so each cluster counts by its mean
                weight, not by how many near-copies the searchers made of it. Task-agnostic (token ids only).
                Default 0.0.
            min_buffer_size: The learner starts once the buffer holds this many samples (<= buffer_capacity and
                reachable with per_prompt_capacity × the task's prompts; checked at build). GSM8K 500, TL;DR 10k.
                Default 64.
            sampling_temperature: The temperature searchers sample at AND the learner computes log pi_theta and
                log pi_ref at (one setting, so both sides agree). > 0. Default 1.0.
            exploration_temperature: None (searchers sample at `sampling_temperature`) or (low, high): searchers
                sample each response at its own temperature drawn uniformly from [low, high] (0 < low <= high <= 2), an
                off-policy exploration sampler; the learner still trains pi_theta at `sampling_temperature` — TB's
                loss needs no importance ratio, any sampler with full support gives valid training data. The
                paper's red-teaming: (0.7, 2.0). Default None.
            learn_log_z: Red-team variant: a learned logZ(x) head (linear on mean-pooled prompt states) instead of
                VarGrad's per-prompt mean. Default False.
            lr_log_z: Learning rate of that head's own optimizer (> 0), or a schedule like `lr`'s. Default 1e-2.
            lora: None (full fine-tuning) or a dict of peft.LoraConfig arguments, e.g. {"r": 16, "lora_alpha": 32};
                searchers receive the merged weights. Default None.
            max_new_tokens: None (use env_config["max_new_tokens"]) or the response length limit in tokens, which
                then replaces the env's. Default None.
            ref_logp_on: Where the reference log-probs log pi_ref(y|x) are computed: "learner" (a frozen fp32 copy
                of the policy on every learner, one extra forward per update) or "searchers" (a frozen fp32 vLLM
                engine on every searcher scores each response once when it is generated; the learners then hold
                no reference model). "searchers" needs sampling_temperature=1.0 (vLLM computes prompt log-probs
                from raw logits). Default "learner".
            async_mode: True: searchers generate while the learner trains (TBA). False: generate → train → sync in
                lock-step, the synchronous baseline (works with num_env_runners=0). Default True.
            pull_weights: True: every generation call of a searcher starts by loading the newest synced weights
                (from a CPU-free Ray actor that holds the last sync's object-store reference), so a sync reaches
                generation one call later at most. False: a searcher loads a sync's weights, as they were when it
                was sent, once the generation calls queued before that request are done — up to two calls later,
                which sets the staleness floor when one call spans more than `sync_every` learner updates
                (docs/data_path.md). Needs async_mode=True. Default False.
            sample_wait_timeout_s: Longest wait, in seconds, without progress: for samples (initial fill,
                training_intensity) with none arriving, or with every searcher down and none brought back. Then
                train() raises SampleWaitTimeout / SearcherFailure with a diagnosis. Also how long one searcher may
                hold generation requests without answering any (a hung reward server, a stuck engine): it is then
                killed, counted (tba/searcher_stalls) and, with restart_failed_env_runners, restarted like a failed
                one while the others go on. > 0. Default 600.
            training_intensity: None (the learner never waits for generation, the paper's setting) or the maximum
                (samples trained on) / (samples generated); the learner then waits for new samples (async_mode=False:
                the searchers generate again before the update, so both modes train on the same data per update).
                Default None.
            max_staleness: None (unbounded, the paper's setting) or the largest staleness, in learner versions, a
                sample may have when it is trained on (staleness = learner version − the version that generated it):
                older samples are evicted from the buffer, and arrivals already older are dropped (both counted,
                tba/buffer_stale_evicted and tba/samples_dropped_stale); the learner waits for newer samples when
                none is left. >= sync_every − 1 (a sample generated right after a sync is needed until the next
                one). Like TRL's max_staleness or AReaL's max_head_offpolicyness. Default None.
            updates_per_iteration: Learner updates per training_step() call (>= 1). Default 1.
            searcher_dtype: vLLM weight dtype on the searchers: "auto" (bfloat16 on GPUs and on CPUs with AMX,
                else float32: an AVX2-only CPU generates ~6x faster in fp32), "bfloat16",
                "float32" or "float16". The learner keeps fp32 master weights. Default "auto".
            learner_precision: "fp32", "bf16-mixed" (bf16 autocast matmuls, fp32 master weights and log-softmax) or
                "auto" (bf16-mixed on GPUs and on CPUs with AMX, else fp32: AVX2-only
                CPUs emulate bf16, several times slower than fp32). Default "fp32".
            share_prompt_forward: The learner (policy and reference forwards) runs each distinct prompt of a
                batch through the model once and reuses its keys/values for the prompt's K samples, instead of
                running prompt + response for every sample: the same log-probs and gradients (up to float
                rounding) for less compute, the more so the longer the prompt (docs/performance.md). Off under
                the model's gradient checkpointing. Default True.
            **kwargs: RLlib's own `AlgorithmConfig.training()` settings: `lr` (> 0; GSM8K 1e-5, TL;DR 3e-6; default
                1e-5), or RLlib's schedule form [[learner_update, lr], ...] — piecewise linear like `beta_schedule`
                and on the same clock, the weight version (RLlib's own algorithms count env steps instead),
                `grad_clip` (default 1.0 as in Lee et al.; None = no clipping), `grad_clip_by`, ...

        Returns:
            This updated TBAConfig.
        """
        super().training(**kwargs)
        if policy_model is not NotProvided:
            self.policy_model = policy_model
        if m is not NotProvided:
            self.m = m
        if sync_every is not NotProvided:
            self.sync_every = sync_every
        if beta is not NotProvided:
            self.beta = beta
        if beta_schedule is not NotProvided:
            self.beta_schedule = beta_schedule
        if reward_temperature_schedule is not NotProvided:
            self.reward_temperature_schedule = reward_temperature_schedule
        if num_samples_per_prompt is not NotProvided:
            self.num_samples_per_prompt = num_samples_per_prompt
        if generations_per_prompt is not NotProvided:
            self.generations_per_prompt = generations_per_prompt
        if prompts_per_batch is not NotProvided:
            self.prompts_per_batch = prompts_per_batch
        if prompts_per_generation is not NotProvided:
            self.prompts_per_generation = prompts_per_generation
        if reward_inv_temp is not NotProvided:
            self.reward_inv_temp = reward_inv_temp
        if buffer_capacity is not NotProvided:
            self.buffer_capacity = buffer_capacity
        if per_prompt_capacity is not NotProvided:
            self.per_prompt_capacity = per_prompt_capacity
        if eviction is not NotProvided:
            self.eviction = eviction
        if dedup is not NotProvided:
            self.dedup = dedup
        if near_duplicate_jaccard is not NotProvided:
            self.near_duplicate_jaccard = near_duplicate_jaccard
        if min_buffer_size is not NotProvided:
            self.min_buffer_size = min_buffer_size
        if sampling_temperature is not NotProvided:
            self.sampling_temperature = sampling_temperature
        if exploration_temperature is not NotProvided:
            self.exploration_temperature = exploration_temperature
        if learn_log_z is not NotProvided:
            self.learn_log_z = learn_log_z
        if lr_log_z is not NotProvided:
            self.lr_log_z = lr_log_z
        if lora is not NotProvided:
            self.lora = lora
        if max_new_tokens is not NotProvided:
            self.max_new_tokens = max_new_tokens
        if ref_logp_on is not NotProvided:
            self.ref_logp_on = ref_logp_on
        if async_mode is not NotProvided:
            self.async_mode = async_mode
        if pull_weights is not NotProvided:
            self.pull_weights = pull_weights
        if sample_wait_timeout_s is not NotProvided:
            self.sample_wait_timeout_s = sample_wait_timeout_s
        if training_intensity is not NotProvided:
            self.training_intensity = training_intensity
        if max_staleness is not NotProvided:
            self.max_staleness = max_staleness
        if updates_per_iteration is not NotProvided:
            self.updates_per_iteration = updates_per_iteration
        if searcher_dtype is not NotProvided:
            self.searcher_dtype = searcher_dtype
        if learner_precision is not NotProvided:
            self.learner_precision = learner_precision
        if share_prompt_forward is not NotProvided:
            self.share_prompt_forward = share_prompt_forward
        return self

    @override(AlgorithmConfig)
    def validate(self) -> None:
        for name in ("lr", "lr_log_z"):  # RLlib's schedule form, on the learner's clock; RLlib's own check speaks of
            schedule = getattr(self, name)  # env-step "timesteps", which TBA's schedules do not count
            if isinstance(schedule, (list, tuple)) and not (valid_schedule(schedule) and len(schedule) >= 2):
                self._value_error(f"{name} must be a number > 0 or {schedule_rule(name)} and at least 2 points, "
                                  f"got {schedule!r}")
        super().validate()
        err = self._value_error

        def number(name, low=None, high=None, low_open=False, integer=False):
            v = getattr(self, name)
            kind = "an integer" if integer else "a number"
            if isinstance(v, bool) or not isinstance(v, (int, np.integer) if integer else (int, float, np.number)) \
                    or not math.isfinite(v):
                err(f"{name} must be {kind}, got {v!r}")
            if low is not None and (v <= low if low_open else v < low):
                err(f"{name} must be {'>' if low_open else '>='} {low}, got {v!r}")
            if high is not None and v > high:
                err(f"{name} must be <= {high}, got {v!r}")

        number("m", 0, 1)
        number("sync_every", 1, integer=True)
        number("beta", 0, low_open=True)
        number("num_samples_per_prompt", 1, integer=True)
        number("generations_per_prompt", 1, integer=True)
        number("prompts_per_batch", 1, integer=True)
        number("prompts_per_generation", 1, integer=True)
        number("reward_inv_temp", 0)
        number("near_duplicate_jaccard", 0, 1)
        number("buffer_capacity", 1, integer=True)
        number("per_prompt_capacity", 1, integer=True)
        number("min_buffer_size", 1, integer=True)
        number("sampling_temperature", 0, low_open=True)
        for name in ("lr", "lr_log_z"):
            if not isinstance(getattr(self, name), (list, tuple)):  # a schedule was checked before RLlib's checks
                number(name, 0, low_open=True)
        number("updates_per_iteration", 1, integer=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):  # numpy's and vLLM's seeding take non-negative integers
            err(f"seed must be None or an integer >= 0, got {self.seed!r}")
        number("sample_wait_timeout_s", 0, low_open=True)
        for name in ("async_mode", "pull_weights", "dedup", "learn_log_z"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                err(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.training_intensity is not None:
            number("training_intensity", 0, low_open=True)
        if self.exploration_temperature is not None:
            t = self.exploration_temperature
            if not (isinstance(t, (list, tuple)) and len(t) == 2 and all(_finite_number(x) for x in t)
                    and 0 < t[0] <= t[1] <= 2):
                err(f"exploration_temperature must be None (sample at sampling_temperature) or (low, high) with "
                    f"0 < low <= high <= 2 (vLLM samples at temperatures up to 2), e.g. (0.7, 2.0), got {t!r}")
        if self.pull_weights and not self.async_mode:
            err("pull_weights=True needs async_mode=True (in lock-step mode every searcher loads each sync before it "
                "generates again); set pull_weights=False")
        if self.async_mode and self.max_requests_in_flight_per_env_runner < 2:
            err(f"max_requests_in_flight_per_env_runner must be >= 2 with async_mode=True (generation requests "
                f"queued per searcher + 1 for weight updates), got {self.max_requests_in_flight_per_env_runner}")
        if self.max_staleness is not None:
            number("max_staleness", 0, integer=True)
            if self.max_staleness < self.sync_every - 1:
                err(f"max_staleness ({self.max_staleness}) must be >= sync_every - 1 ({self.sync_every - 1}) or None: "
                    f"samples from the weights of one sync are needed until the next sync, {self.sync_every} learner "
                    f"updates later, or the learner would wait forever")
        if self.generations_per_prompt < self.num_samples_per_prompt:
            err(f"generations_per_prompt (S={self.generations_per_prompt}) must be >= num_samples_per_prompt "
                f"(K={self.num_samples_per_prompt}): a searcher generates S samples per prompt, a batch uses K of them")
        if self.min_buffer_size > self.buffer_capacity:
            err(f"min_buffer_size ({self.min_buffer_size}) must be <= buffer_capacity ({self.buffer_capacity})")
        if self.eviction not in EVICTION_POLICIES:
            err(f"eviction must be one of {EVICTION_POLICIES}, got {self.eviction!r}")
        if self.beta_schedule is not None and not valid_schedule(self.beta_schedule):
            err(f"beta_schedule must be {BETA_SCHEDULE_RULE}, got {self.beta_schedule!r}")
        if self.reward_temperature_schedule is not None and not valid_schedule(self.reward_temperature_schedule):
            err(f"reward_temperature_schedule must be {TAU_SCHEDULE_RULE}, got {self.reward_temperature_schedule!r}")
        if self.grad_clip is not None and not (_finite_number(self.grad_clip) and self.grad_clip > 0):
            err(f"grad_clip must be None (no clipping) or a number > 0, got {self.grad_clip!r}")
        if self.max_new_tokens is not None and (isinstance(self.max_new_tokens, bool)
                                                or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            err(f"max_new_tokens must be None (use env_config) or a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.policy_model, str) or not self.policy_model:
            err(f"policy_model must be an embedded model name, an HF model id or a local path, got {self.policy_model!r}")
        if self.lora is not None and not isinstance(self.lora, dict):
            err(f"lora must be None or a dict of peft.LoraConfig arguments (e.g. {{'r': 8}}), got {self.lora!r}")
        if self.lora:
            unknown = sorted(set(self.lora) - _lora_fields())
            if unknown:
                err(f"lora has unknown peft.LoraConfig argument(s) {unknown}; common ones: r, lora_alpha, "
                    f"lora_dropout, target_modules, bias")
        if self.ref_logp_on not in REF_LOGP_ON:
            err(f"ref_logp_on must be one of {REF_LOGP_ON}, got {self.ref_logp_on!r}")
        if self.ref_logp_on == "searchers" and self.sampling_temperature != 1.0:
            err(f"ref_logp_on='searchers' needs sampling_temperature=1.0 (vLLM computes reference log-probs from raw "
                f"logits), got {self.sampling_temperature}; use ref_logp_on='learner' for other temperatures")
        if self.searcher_dtype not in SEARCHER_DTYPES:
            err(f"searcher_dtype must be one of {SEARCHER_DTYPES}, got {self.searcher_dtype!r}")
        if self.learner_precision not in LEARNER_PRECISIONS:
            err(f"learner_precision must be one of {LEARNER_PRECISIONS}, got {self.learner_precision!r}")
        if not isinstance(self.share_prompt_forward, bool):
            err(f"share_prompt_forward must be True or False, got {self.share_prompt_forward!r}")
        if self.env is None:
            err("TBA needs a token-level task: config.environment('tba/RedTeam-v0' | 'tba/Math-v0' | ..., env_config=...)")
        if self.async_mode and self.num_env_runners < 1 and not self.in_evaluation:
            err("async_mode=True needs num_env_runners >= 1 (searchers run as their own actors, next to the learner); "
                "use async_mode=False for a single-process run")
        if self.num_learners > 1 and self.prompts_per_batch % self.num_learners:
            err(f"prompts_per_batch (B={self.prompts_per_batch}) must be a multiple of num_learners "
                f"({self.num_learners}): a batch is split across the learners by prompt group (VarGrad's logZ of a "
                f"group is the mean over its K samples, so a group is never cut in two), B/num_learners groups each")

    # env_config keys that a TBAConfig setting replaces when that setting is not None
    ENV_CONFIG_FIELDS = {"model": "policy_model", "max_new_tokens": "max_new_tokens"}

    @property
    def task_env_config(self) -> dict:
        """env_config with the algorithm-level overrides (``ENV_CONFIG_FIELDS``) applied."""
        overrides = {key: getattr(self, attr) for key, attr in self.ENV_CONFIG_FIELDS.items()
                     if getattr(self, attr) is not None}
        return {**dict(self.env_config or {}), **overrides}

    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=TBARLModule, model_config={
            "model": self.policy_model, "temperature": self.sampling_temperature, "learn_log_z": self.learn_log_z,
            "lora": self.lora, "value_head": False, "precision": self.learner_precision,
            "share_prompts": self.share_prompt_forward})

    @override(AlgorithmConfig)
    def get_default_learner_class(self):
        return TBATorchLearner


class TBA(Algorithm):
    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> TBAConfig:
        return TBAConfig()

    @override(Algorithm)
    def setup(self, config: TBAConfig) -> None:
        # TBA's own state exists before RLlib's setup, whose on_algorithm_init callbacks may restore a checkpoint.
        c = config
        self.buffer = TBAReplayBuffer(c.buffer_capacity, c.per_prompt_capacity, c.eviction, c.dedup, seed=c.seed,
                                      near_duplicate_jaccard=c.near_duplicate_jaccard)
        self.weights_version = 0  # learner updates done so far = version of the learner's weights
        self.counters = {"samples_received": 0, "samples_dropped_invalid": 0, "samples_dropped_stale": 0,
                         "tokens_generated": 0, "weight_syncs": 0, "updates_with_generation_in_flight": 0,
                         "searcher_restarts": 0, "searcher_env_states_not_restored": 0,
                         "searcher_env_states_handed_back": 0, "searcher_env_states_lost": 0,
                         "searcher_env_news_shared": 0, "searcher_stalls": 0}
        # wall times: learner updates (start, end) and generation calls (start, end, searcher index)
        self.timeline = {"updates": deque(maxlen=1000), "samples": deque(maxlen=1000)}
        self._step_end: float | None = None  # when the previous training_step ended (learner idle fraction)
        self._iter_staleness: list[int] = []  # staleness of every sample trained on in this iteration
        self._push_seconds: deque = deque(maxlen=20)  # how long each weight push held the learner up
        # weight syncs: every searcher must get weights at least as new as _sync_version; one weights request in
        # flight per searcher (loaded after the calls queued before it); one object-store copy per version
        self._sync_version = 0
        self._sent_versions: dict[int, deque] = {}  # searcher -> the versions sent to it, in order
        self._weights_in_flight: set[int] = set()
        self._weights_ref: tuple[tuple[int, int], ray.ObjectRef] | None = None
        # +1 at every restore: a searcher loads weights only of a later epoch, or of a higher version in its own, so
        # the board's pre-restore weights (higher versions) are never pulled after a restore
        self._weights_epoch = 0
        self._board = None  # pull_weights: the WeightsBoard actor the searchers load the newest sync from
        # searcher -> its task-env state as of its last weight sync, checkpoint or restore (a restarted one gets it)
        self._env_state_copies: dict[int, dict] = {}
        # tasks whose searchers' envs share what they learn (TokenEnv.take_news): searcher -> the others' news not yet
        # sent to it, and -> the news in its weights request now in flight (back to the outbox if it fails first)
        self._news_outbox: dict[int, dict] = {}
        self._news_sent: dict[int, dict] = {}
        self._searcher_calls: dict[int, dict] = {}  # searcher -> its counts (samples, tokens, arrival staleness)
        self._sampling: dict[int, int] = {}  # searcher -> its generation requests in flight
        self._busy_since: dict[int, float] = {}  # searcher -> its last answer, or when an idle one was given work
        self._searcher_stats = deque(maxlen=5)  # the latest searcher reports, averaged into each iteration's metrics
        self._all_down_since: float | None = None  # when the last healthy searcher was lost
        self._calls_received = 0  # generation calls that came back (even with every sample dropped)
        self.samples_trained = 0
        self.task_identity: dict | None = None
        # Build the task once here first: an env_config error inside a searcher actor would otherwise surface as
        # RLlib's "IndexError: list index out of range" (no healthy runner to read the spaces from).
        try:
            make_task_env(c)
        except Exception as e:
            raise ValueError(f"the task {c.env!r} could not be built from its env_config: {type(e).__name__}: {e}") from e
        super().setup(config)
        env = getattr(self.env_runner, "env", None)  # the local runner builds the task (and fails here, clearly)
        if env is not None:
            self.task_identity = task_identity(c, env)
            reachable = min(c.buffer_capacity, c.per_prompt_capacity * len(env.prompts))
            if c.min_buffer_size > reachable:
                raise ValueError(
                    f"min_buffer_size={c.min_buffer_size} can never be reached: the buffer holds at most "
                    f"min(buffer_capacity={c.buffer_capacity}, per_prompt_capacity={c.per_prompt_capacity} x "
                    f"{len(env.prompts)} prompt(s)) = {reachable} samples; lower min_buffer_size or raise the capacities")
        if c.async_mode and c.num_learners == 0 and self._remote():
            # The learner runs in this process next to the searcher actors: leave them their cores.
            import os

            import torch

            searcher_cpus = c.num_env_runners * searcher_threads(c.num_cpus_per_env_runner)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) - searcher_cpus))
        if c.pull_weights and self._remote():  # empty until the next push to every searcher
            self._board = WeightsBoard.remote()

    # ---- searchers -> buffer -----------------------------------------------------------------------------------
    def _remote(self) -> bool:
        return self.env_runner_group.num_remote_env_runners() > 0

    def _request_samples(self) -> None:
        """Keep ``max_requests_in_flight_per_env_runner − 1`` generation requests queued on every healthy searcher
        (the last slot is for weight updates): a searcher starts its next call the moment one ends, also while the
        driver is busy in a learner update and cannot hand out new work."""
        if not self._remote():
            return
        depth = max(1, self.config.max_requests_in_flight_per_env_runner - 1)
        healthy = set(self.env_runner_group.healthy_env_runner_ids())
        for gone in set(self._sampling) - healthy:  # a failed searcher's requests are gone (RLlib drops them)
            del self._sampling[gone]
        now = time.time()
        for i in healthy:
            if not self._sampling.get(i):  # an idle searcher's clock starts with its work
                self._busy_since[i] = now
        for level in range(depth):
            short = sorted(i for i in healthy if self._sampling.get(i, 0) <= level)
            if short:
                self.env_runner_group.foreach_env_runner_async(lambda r, b=self._board: r.sample_with_metrics(b),
                                                               tag="sample", remote_worker_ids=short)
                for i in short:
                    self._sampling[i] = self._sampling.get(i, 0) + 1

    def _fetch_samples(self, timeout_s: float = 0.0) -> int:
        results = self.env_runner_group.fetch_ready_async_reqs(tags="sample", timeout_seconds=timeout_s)
        now = time.time()
        for runner_id, reply in self.env_runner_group.fetch_ready_async_reqs(tags="weights", timeout_seconds=0.0):
            self._weights_in_flight.discard(runner_id)
            self._busy_since[runner_id] = now
            self._take_sync_reply(runner_id, reply)
        for runner_id, result in results:
            self._sampling[runner_id] = max(0, self._sampling.get(runner_id, 0) - 1)
            self._busy_since[runner_id] = now
            self._ingest(result)
        limit = self.config.sample_wait_timeout_s
        self._kill_stalled([i for i, queued in self._sampling.items()
                            if queued and now - self._busy_since.get(i, now) > limit])
        return len(results)

    def _kill_stalled(self, searchers: list[int]) -> None:
        """Searchers that held generation requests for ``sample_wait_timeout_s`` without answering any (a hung
        reward server, a stuck engine) are as good as failed, but would never fail by themselves: kill them
        (counted, logged) and mark them unhealthy, as RLlib does a failed one; ``restore_env_runners`` then brings
        them back (``restart_failed_env_runners``) with the learner's weights and their env state. Searchers already
        marked unhealthy (failed, or killed before) are skipped."""
        manager = self.env_runner_group._worker_manager  # a hung actor cannot be asked for its own handle
        healthy = set(self.env_runner_group.healthy_env_runner_ids())
        for i in (i for i in searchers if i in healthy):
            self.counters["searcher_stalls"] += 1
            logger.warning("searcher %d answered none of its generation requests for over sample_wait_timeout_s="
                           "%g s: killing it (stalls so far: %d)", i, self.config.sample_wait_timeout_s,
                           self.counters["searcher_stalls"])
            ray.kill(manager.actors()[i], no_restart=not self.config.restart_failed_env_runners)
            manager.set_actor_state(i, healthy=False)
            self._busy_since.pop(i, None)

    def _ingest(self, result) -> None:
        if isinstance(result, SearchError):  # raised inside the searcher: a bug to show, not a crash loop to hide
            raise SearcherFailure(f"searcher {result.worker_index} failed while sampling: {result.message}\n"
                                  f"searcher traceback:\n{result.traceback}")
        batch, stats, rllib_metrics = result
        self._calls_received += 1
        self.metrics.aggregate([rllib_metrics], key=ENV_RUNNER_RESULTS)  # RLlib's env_runners/* results
        samples = self.batch_to_samples(batch)
        self.counters["samples_received"] += len(samples)
        if self.config.max_staleness is not None:  # arrived already too old to be trained on: count, don't store
            oldest = self.weights_version - self.config.max_staleness
            fresh_enough = [x for x in samples if x.weights_version >= oldest]
            self.counters["samples_dropped_stale"] += len(samples) - len(fresh_enough)
            samples = fresh_enough
        self.buffer.add(samples)
        self.counters["samples_dropped_invalid"] += stats.get("num_dropped_invalid_reward", 0)
        self.counters["tokens_generated"] += stats.get("num_tokens", 0)
        who = stats.get("worker_index", 0)
        self.timeline["samples"].append((stats["sample_start"], stats["sample_end"], who))
        self._searcher_stats.append(stats)
        mine = self._searcher_calls.setdefault(who, {"samples": 0, "tokens": 0, "calls": 0, "staleness_sum": 0})
        mine.update(samples=mine["samples"] + len(batch), tokens=mine["tokens"] + stats.get("num_tokens", 0),
                    calls=mine["calls"] + 1, tokens_per_s=stats["tokens_per_s"], weights_version=batch.weights_version,
                    staleness_sum=mine["staleness_sum"] + self.weights_version - batch.weights_version)

    def _log_searcher_stats(self) -> None:
        """Averages of the last reports (so an iteration in which no generation finished still reports values)."""
        recent = list(self._searcher_stats)
        if not recent:
            return
        values = {("searchers", k): float(np.nanmean([x[k] for x in recent]))
                  for k in ("tokens_per_s", "reward_mean", "generate_s")}
        values[("searchers", "weights_version")] = recent[-1]["weights_version"]
        for who, mine in self._searcher_calls.items():  # per searcher: throughput, totals, staleness on arrival
            for key in ("samples", "tokens", "tokens_per_s", "weights_version"):
                values[("searchers", "per_searcher", str(who), key)] = mine[key]
            values[("searchers", "per_searcher", str(who), "arrival_staleness_mean")] = \
                mine["staleness_sum"] / mine["calls"]
        for key in recent[-1].get("task", {}):
            reduce = np.nanmin if key.endswith("_reached_at") else np.nanmean  # the first searcher to reach a rate
            with warnings.catch_warnings():  # all-NaN (not reached yet) is a valid answer
                warnings.simplefilter("ignore", RuntimeWarning)
                values[("task", key)] = float(reduce([x["task"].get(key, np.nan) for x in recent]))
        self.metrics.log_dict(values, window=1)

    @staticmethod
    def batch_to_samples(batch: GenerationBatch) -> list[TBSample]:
        prompts = {k: tuple(int(x) for x in ids) for k, ids in batch.prompt_ids.items()}
        logp = np.concatenate([[0.0], np.cumsum(batch.logp, dtype=np.float64)])[batch.offsets]  # per-response sums
        ref = batch.ref_logp if batch.ref_logp is not None else np.full(len(batch), np.nan)
        return [TBSample(prompt_key=int(k), prompt_ids=prompts[int(k)], completion=batch.response(i),
                         reward=float(batch.reward[i]), weights_version=batch.weights_version,
                         sampler_logp=float(logp[i + 1] - logp[i]), ref_logp=float(ref[i]))
                for i, k in enumerate(batch.prompt_index)]

    def _sample_sync(self) -> int:
        if self._remote():
            asked = self.env_runner_group.healthy_env_runner_ids()
            results = self.env_runner_group.foreach_env_runner(lambda r: r.sample_with_metrics(), local_env_runner=False,
                                                               timeout_seconds=self.config.sample_wait_timeout_s)
            answered = {r.worker_index if isinstance(r, SearchError) else r[1]["worker_index"] for r in results}
            self._kill_stalled([i for i in asked if i not in answered])
        else:
            results = [self.env_runner.sample_with_metrics()]
        for result in results:
            self._ingest(result)
        return len(results)

    # ---- searcher failures --------------------------------------------------------------------------------------
    @override(Algorithm)
    def restore_env_runners(self, env_runner_group, probe_timeout_s: float | None = None) -> list[int]:
        """Bring failed searchers back (RLlib restarts their actors) and hand them the learner's current weights
        and version; they are given a generation request again on the next ``_request_samples``."""
        if env_runner_group is not self.env_runner_group or not self._remote():
            return super().restore_env_runners(env_runner_group)
        restored = env_runner_group.probe_unhealthy_env_runners(timeout_seconds=probe_timeout_s)
        if restored:
            self._counters["total_num_restored_workers"] += len(restored)
            self.counters["searcher_restarts"] += len(restored)
            for i in restored:
                self._sampling.pop(i, None)
                self._requeue_news(i)
            self._weights_in_flight.difference_update(restored)
            self._hand_back_env_states(restored)  # first: the weights push below copies the env states it returns
            self._push_weights(block=True, to=restored, mark_sync=False)
            logger.warning("searcher(s) %s restarted and given weights version %d", restored, self.weights_version)
        healthy = env_runner_group.num_healthy_remote_workers()
        if healthy:
            self._all_down_since = None
        else:
            c = self.config
            now = time.time()
            self._all_down_since = self._all_down_since or now
            if not c.restart_failed_env_runners or now - self._all_down_since > c.sample_wait_timeout_s:
                raise SearcherFailure(
                    f"no healthy searcher: all {env_runner_group.num_remote_env_runners()} searcher(s) failed and "
                    + ("restart_failed_env_runners=False" if not c.restart_failed_env_runners else
                       f"none came back within sample_wait_timeout_s={c.sample_wait_timeout_s:g} s")
                    + f" (restarts so far: {self.counters['searcher_restarts']}, "
                    f"max_num_env_runner_restarts={c.max_num_env_runner_restarts})")
        return restored

    def _hand_back_env_states(self, restored: list[int]) -> None:
        """A restarted searcher's env starts empty: give it the task-env state its predecessor had at its last
        weight sync (or the last checkpoint / restore); what that env learned since is lost. Tasks that keep no
        state have nothing to hand back; a searcher that failed before its first sync is counted and logged."""
        if not self._local_env_state():
            return
        for i in restored:
            state = self._env_state_copies.get(i)
            if state is None:
                self.counters["searcher_env_states_lost"] += 1
                logger.warning("searcher %d restarted before its task-env state was ever copied (first weight sync or "
                               "checkpoint): its env starts empty", i)
                continue
            self.env_runner_group.foreach_env_runner(lambda r, s=state: r.env.set_state(s), local_env_runner=False,
                                                     remote_worker_ids=[i])
            self.counters["searcher_env_states_handed_back"] += 1

    def _wait_until(self, ready, what: str) -> float:
        """Fetch and request samples until ``ready()``; returns the seconds waited. Bounded: raises
        ``SampleWaitTimeout`` after ``sample_wait_timeout_s`` without a new sample, ``SearcherFailure`` when every
        searcher is down, and fails fast when the searchers' calls come back with every reward dropped."""
        c = self.config
        t0 = last_progress = time.time()
        calls0, added0, dropped0 = self._calls_received, self.buffer.stats["added"], self.counters["samples_dropped_invalid"]
        received0 = self.counters["samples_received"]
        while not ready():
            if c.async_mode:
                self.restore_env_runners(self.env_runner_group, probe_timeout_s=1.0)
                self._send_pending_weights()  # a sync not sent yet (max_staleness may be waiting on it)
                self._request_samples()
                self._fetch_samples(timeout_s=0.5)
            else:
                self._sample_sync()
            if self.buffer.stats["added"] > added0 or self.counters["samples_received"] > received0:
                added0, received0, last_progress = self.buffer.stats["added"], self.counters["samples_received"], time.time()
                calls0, dropped0 = self._calls_received, self.counters["samples_dropped_invalid"]
            calls = self._calls_received - calls0
            dropped = self.counters["samples_dropped_invalid"] - dropped0
            if calls >= 3 and dropped and self.counters["samples_received"] == received0:
                raise SampleWaitTimeout(
                    f"waiting for {what}: the last {calls} generation calls returned no usable sample — all {dropped} "
                    f"rewards were non-finite and dropped (env on_invalid_reward='drop'); check the task's reward function")
            if time.time() - last_progress > c.sample_wait_timeout_s:
                raise SampleWaitTimeout(f"waiting for {what}: no new sample for {c.sample_wait_timeout_s:g} s "
                                        f"(sample_wait_timeout_s). {self._diagnosis(calls, dropped)}")
        return time.time() - t0

    def _diagnosis(self, calls: int, dropped: int) -> str:
        c, b = self.config, self.buffer
        healthy = self.env_runner_group.num_healthy_remote_workers() if self._remote() else 1
        return (f"Searchers healthy: {healthy}/{max(1, c.num_env_runners)}; generation calls returned meanwhile: "
                f"{calls}; rewards dropped meanwhile: {dropped}; buffer: {len(b)} samples in {b.num_prompts} prompt(s) "
                f"(min_buffer_size={c.min_buffer_size}, duplicates skipped so far: {b.stats['duplicates']}, "
                f"evicted: {b.stats['evicted']}). A slow first call (model load, a large model on CPU) may need a "
                f"larger sample_wait_timeout_s.")

    # ---- learner -> searchers ----------------------------------------------------------------------------------
    def _push_weights(self, block: bool, to: list[int] | None = None, mark_sync: bool = True) -> None:
        """Send the learner's weights and version to searchers ``to`` (default: all). ``block=False`` (async sync):
        fire-and-forget, a searcher with a weights request still in flight gets the newest weights once it is done
        (``_send_pending_weights``). ``mark_sync``: from now on only newer arrivals count as most-on-policy."""
        if mark_sync:
            self._sync_version = self.weights_version
        if not self._remote():  # the local runner is the searcher (with remote searchers it never samples)
            self.env_runner.set_state(ray.get(self._weights_payload()))
        elif block:
            ref = self._weights_payload()
            ids = to if to is not None else self.env_runner_group.healthy_env_runner_ids()
            news = {i: self._news_to_send(i) for i in ids}
            for i, reply in self.env_runner_group.foreach_env_runner(
                    lambda r: (r.worker_index, r.receive_weights(ray.get(ref), news[r.worker_index])),
                    local_env_runner=False, remote_worker_ids=ids):
                self._take_sync_reply(i, reply)
            self._record_sent(ids)
        else:
            self._send_pending_weights()
        if to is None:  # (a sync, or a restore's lower version) the board's newest too
            self._publish_weights(wait=block)
        if mark_sync:
            self.buffer.mark_sync()
            self.counters["weight_syncs"] += 1

    def _publish_weights(self, wait: bool) -> None:
        """pull_weights: the learner's current weights become the board's newest, which every searcher's next
        generation call loads (``wait``: before this returns; a restored checkpoint's lower version too)."""
        if self._board is not None:
            done = self._board.publish.remote((self._weights_epoch, self.weights_version), [self._weights_payload()])
            if wait:
                ray.get(done)

    def _weights_payload(self) -> ray.ObjectRef:
        """The learner's current weights, version and epoch, in the object store once per version, shared by every
        searcher."""
        key = (self._weights_epoch, self.weights_version)
        if self._weights_ref is None or self._weights_ref[0] != key:
            state = self.learner_group.get_state(
                components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}", inference_only=True,
            )[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
            self._weights_ref = (key, ray.put({COMPONENT_RL_MODULE: state, WEIGHTS_VERSION: self.weights_version,
                                               WEIGHTS_EPOCH: self._weights_epoch}))
        return self._weights_ref[1]

    def _send_pending_weights(self) -> None:
        """Fire-and-forget the newest weights to every healthy searcher that has not got the last sync's version
        yet and has no weights request in flight."""
        if not self._remote():
            return
        healthy = self.env_runner_group.healthy_env_runner_ids()
        self._weights_in_flight &= set(healthy)
        newest = self.weights_sent
        targets = [i for i in healthy if newest.get(i, 0) < self._sync_version and i not in self._weights_in_flight]
        for i in targets:  # one request each: each carries the news of the others
            made = self.env_runner_group.foreach_env_runner_async(
                "receive_weights", tag="weights", remote_worker_ids=[i],
                kwargs={"state": self._weights_payload(), "news": self._news_outbox.get(i)})
            if made:  # (else the searcher's request queue was full: tried again next time)
                self._news_to_send(i)
                self._weights_in_flight.add(i)
                self._record_sent([i])

    def _take_sync_reply(self, searcher: int, reply: tuple[dict, dict], synced: bool = True) -> None:
        """A searcher's answer to a weight sync (``receive_weights``; ``synced=False``: to a checkpoint's question):
        keep a copy of its task-env state (handed back should it be restarted) and queue its news for every other
        searcher's next sync."""
        env_state, news = reply
        if env_state:  # {} for tasks that keep none
            self._env_state_copies[searcher] = env_state
        if synced:  # it absorbed the news its weights request carried
            self._news_sent.pop(searcher, None)
        if news:  # {} for tasks that share none
            self.counters["searcher_env_news_shared"] += 1
            for i in range(1, self.env_runner_group.num_remote_env_runners() + 1):  # RLlib's searcher indices
                if i != searcher:
                    self._news_outbox[i] = self._merge_news(self._news_outbox.get(i), news)

    def _news_to_send(self, searcher: int) -> dict | None:
        """The others' news for ``searcher``'s weights request, moved from its outbox to in flight."""
        news = self._news_outbox.pop(searcher, None)
        if news:
            self._news_sent[searcher] = self._merge_news(self._news_sent.get(searcher), news)
        return news

    def _requeue_news(self, searcher: int) -> None:
        """A restarted searcher never absorbed the news sent to its predecessor: send it again, oldest first."""
        lost = self._news_sent.pop(searcher, None)
        if lost:
            self._news_outbox[searcher] = self._merge_news(lost, self._news_outbox.get(searcher))

    def _merge_news(self, older: dict | None, newer: dict | None) -> dict:
        if not older or not newer:
            return older or newer
        return self.env_runner.env.merge_news(older, newer)  # the task says how (the local runner's env)

    def _record_sent(self, ids) -> None:
        for i in ids:
            self._sent_versions.setdefault(i, deque(maxlen=10_000)).append(self.weights_version)

    @property
    def weights_sent(self) -> dict[int, int]:
        """Searcher index -> the newest weights version sent to it."""
        return {i: v[-1] for i, v in self._sent_versions.items()}

    def versions_sent(self, searcher: int) -> list[int]:
        """Every weights version sent to one searcher, in order."""
        return list(self._sent_versions.get(searcher, ()))

    # ---- the training step -------------------------------------------------------------------------------------
    @override(Algorithm)
    def training_step(self) -> None:
        c = self.config
        waited = 0.0
        window_start = self._step_end or time.time()
        if c.async_mode:
            self._fetch_samples()
            self._request_samples()
        else:
            self._sample_sync()
        # initial fill: the learner waits only here (and for training_intensity, when set)
        waited += self._wait_until(lambda: len(self.buffer) >= c.min_buffer_size,
                                   f"the initial fill (min_buffer_size={c.min_buffer_size})")

        t_learn = time.time()
        batch_size = c.prompts_per_batch * c.num_samples_per_prompt
        for _ in range(c.updates_per_iteration):
            if c.training_intensity is not None:  # async: wait for samples; sync: _wait_until generates them
                waited += self._wait_until(
                    lambda: self.samples_trained + batch_size <= c.training_intensity * self.counters["samples_received"],
                    f"samples for training_intensity={c.training_intensity:g}")
            if c.max_staleness is not None:
                waited += self._wait_until(self._enough_fresh_samples,
                                           f"samples at most max_staleness={c.max_staleness} versions old")
            self._update_once()
            if c.async_mode:
                self._fetch_samples()
                self._request_samples()
        elapsed = time.time() - t_learn
        self.metrics.log_value(("tba", "learner_wait_s"), waited, window=1)
        self._log_searcher_stats()
        self._log_idle_and_staleness(window_start)
        self.metrics.log_value(("tba", "learner_steps_per_s"), c.updates_per_iteration / max(elapsed, 1e-9), window=1)
        self.metrics.log_dict({("tba", k): v for k, v in self.counters.items()}, window=1)
        healthy = self.env_runner_group.num_healthy_remote_workers() if self._remote() else 1
        self.metrics.log_dict({("tba", "buffer_size"): len(self.buffer), ("tba", "buffer_prompts"): self.buffer.num_prompts,
                               ("tba", "buffer_clusters"): self.buffer.num_clusters,
                               ("tba", "weights_version"): self.weights_version, ("tba", "searchers_healthy"): healthy,
                               **{("tba", f"buffer_{k}"): v for k, v in self.buffer.stats.items()}}, window=1)

    def _enough_fresh_samples(self) -> bool:
        """max_staleness: evict what has grown too old; enough left for a batch (or min_buffer_size)?"""
        c = self.config
        self.buffer.drop_older_than(self.weights_version - c.max_staleness)
        return len(self.buffer) >= min(c.min_buffer_size, c.prompts_per_batch * c.num_samples_per_prompt)

    def _update_once(self) -> None:
        c = self.config
        samples, _, on_policy = self.buffer.sample(c.prompts_per_batch, c.num_samples_per_prompt, c.m,
                                                   c.reward_inv_temp)
        self._iter_staleness += [self.weights_version - s.weights_version for s in samples]
        in_flight = any(self._sampling.values())
        self.learn_on(samples)
        self.counters["updates_with_generation_in_flight"] += int(in_flight)
        self.metrics.log_dict({("tba", "on_policy_fraction"): float(on_policy.mean()),
                               ("tba", "batch_reward_mean"): float(np.mean([s.reward for s in samples]))}, window=1)
        if self.weights_version % c.sync_every == 0:
            t_push = time.time()
            self._push_weights(block=not c.async_mode)
            self._push_seconds.append(time.time() - t_push)
        elif c.async_mode:
            self._send_pending_weights()

    def learn_on(self, samples: list[TBSample]) -> None:
        """One learner update (weight version + 1) on a buffer batch: B drawn groups of K samples, in draw order.
        Each draw is its own VarGrad group; with num_learners >= 2 learner j gets groups j·B/M ... (j+1)·B/M − 1
        (whole groups, equal shares), and DDP averages the gradients: the same update as one learner on the batch."""
        c = self.config
        k = c.num_samples_per_prompt
        groups = np.arange(len(samples)) // k
        num_shards = max(1, c.num_learners)
        per = len(samples) // num_shards
        batches = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(build_train_batch(
            samples[i * per:(i + 1) * per], groups[i * per:(i + 1) * per]))}, env_steps=per) for i in range(num_shards)]
        t0 = time.time()
        results = self.learner_group.update(
            **({"batch": batches[0]} if num_shards == 1 else {"batches": batches}),
            timesteps={WEIGHTS_VERSION: self.weights_version},  # the learner's clock (beta_schedule, lr)
        )
        self.timeline["updates"].append((t0, time.time()))
        self.weights_version += 1
        self.samples_trained += len(samples)
        self.metrics.aggregate([results] if isinstance(results, dict) else results, key=LEARNER_RESULTS)

    def _log_idle_and_staleness(self, window_start: float) -> None:
        """Per iteration: the learner's idle fraction (wall time since the previous iteration ended not spent in a
        learner update), the searchers' idle fraction (gaps between a searcher's consecutive generation calls over
        its last calls), staleness mean/max/histogram of the samples trained on, and how long a weight push held
        the learner up."""
        now = time.time()
        self._step_end = now
        busy = sum(max(0.0, min(end, now) - max(start, window_start)) for start, end in self.timeline["updates"])
        values = {("tba", "learner_idle_fraction"): 1.0 - busy / max(now - window_start, 1e-9)}
        idle = searcher_idle_fractions(self.timeline["samples"])
        if idle:
            values[("tba", "searcher_idle_fraction")] = float(np.mean(list(idle.values())))
        if self._iter_staleness:
            values[("tba", "staleness_mean")] = float(np.mean(self._iter_staleness))
            values[("tba", "staleness_max")] = int(np.max(self._iter_staleness))
            for x in self._iter_staleness:  # a list in the results: a histogram in TensorBoard
                self.metrics.log_value(("tba", "staleness_hist"), int(x), reduce="item_series")
            self._iter_staleness = []
        if self._push_seconds:
            values[("tba", "sync_stall_s")] = float(np.mean(self._push_seconds))
        self.metrics.log_dict(values, window=1)

    @override(Algorithm)
    def cleanup(self) -> None:
        """Searchers are killed, not asked to stop: RLlib's stop request would queue behind their generation calls
        (forever behind a hung one), and a searcher holds nothing a kill loses (its vLLM engines live in its
        process; what the driver keeps of it, samples and env-state copies, is already here)."""
        if getattr(self, "env_runner_group", None) is not None:
            self.env_runner_group._worker_manager.clear()
        if getattr(self, "_board", None) is not None:
            ray.kill(self._board)
            self._board = None
        super().cleanup()

    # ---- checkpoints: RLlib does not save replay buffers or our counters by itself ----------------------------
    @override(Algorithm)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._check_component(_TBA_STATE, components, not_components):
            state[_TBA_STATE] = {"buffer": self.buffer.get_state(), "weights_version": self.weights_version,
                                 "counters": dict(self.counters), "samples_trained": self.samples_trained,
                                 "task": self.task_identity, "env_states": self._searcher_env_states(),
                                 "env_news": {i: self._merge_news(self._news_sent.get(i), self._news_outbox.get(i))
                                              for i in set(self._news_sent) | set(self._news_outbox)}}
        return state

    def _searcher_env_states(self) -> dict[int, dict]:
        """Each healthy searcher's task-env state by searcher index (``TokenEnv.get_state``: what scoring learned,
        e.g. the red-team env's novelty memory); {} for tasks that keep none (the local runner's env, built from the
        same config, says so without a call to the searchers). A searcher answers once the generation calls queued
        before it are done; one that does not within ``sample_wait_timeout_s`` is killed as stalled, and the
        checkpoint holds the copy of its env state from its last weight sync."""
        local = self._local_env_state()
        if not local:
            return {}
        if not self._remote():
            return {0: local}
        asked = self.env_runner_group.healthy_env_runner_ids()
        replies = dict(self.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, (r.env.get_state(), r.env.take_news())), local_env_runner=False,
            timeout_seconds=self.config.sample_wait_timeout_s))
        for i, reply in replies.items():  # as at a sync: news queued for the others, saved beside the states
            self._take_sync_reply(i, reply, synced=False)
        self._kill_stalled([i for i in asked if i not in replies])
        return {i: self._env_state_copies[i] for i in asked if i in self._env_state_copies}

    def _local_env_state(self) -> dict:
        """The local runner's task-env state: {} for tasks that keep none (built from the searchers' config, it says
        so without a call to them; it holds the searchers' state only when it is the searcher)."""
        env = getattr(self.env_runner, "env", None)
        return env.get_state() if env is not None else {}

    def _restore_env_states(self, states: dict[int, dict], news: dict[int, dict]) -> None:
        """Hand the saved task-env states to the searchers, in index order (the same searcher when the run has as
        many as it saved), and queue the news saved for each for its next sync; states of searchers this run does
        not have are counted and logged, not restored."""
        saved = sorted(states)
        if not self._remote():  # the local runner is the searcher
            ids = [0]
            if saved:
                self.env_runner.env.set_state(states[saved[0]])
        else:
            ids = sorted(self.env_runner_group.healthy_env_runner_ids())
            self._news_outbox.clear()  # news for the envs the saved states replace
            self._news_sent.clear()
            for i, j in zip(ids, saved):
                self.env_runner_group.foreach_env_runner(lambda r, s=states[j]: r.env.set_state(s),
                                                         local_env_runner=False, remote_worker_ids=[i])
                self._env_state_copies[i] = states[j]
                if news.get(j):
                    self._news_outbox[i] = news[j]
        if len(saved) > len(ids):
            self.counters["searcher_env_states_not_restored"] += len(saved) - len(ids)
            logger.warning("checkpoint holds the task-env states of %d searchers, this run has %d: those of searchers "
                           "%s are not restored (their envs' memories are lost)", len(saved), len(ids),
                           saved[len(ids):])

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs):
        """RLlib's restore, after checking that the checkpoint is readable and from this task (nothing is
        overwritten otherwise); a damaged file is named in the error."""
        path = Path(path)
        saved = read_checkpoint_state(path)
        check_same_task(saved.get(_TBA_STATE, {}).get("task"), self.task_identity)
        try:
            return super().restore_from_path(path, *args, **kwargs)
        except Exception as e:
            damaged = find_damaged_checkpoint_file(path)
            if damaged:
                raise CheckpointError(f"damaged checkpoint {path}: {damaged}") from e
            raise

    @override(Algorithm)
    def set_state(self, state) -> None:
        if _TBA_STATE in state:  # refuse another task's checkpoint before anything is overwritten
            check_same_task(state[_TBA_STATE].get("task"), self.task_identity)
        super().set_state(state)
        if _TBA_STATE in state:
            tba = state[_TBA_STATE]
            self.buffer.set_state(tba["buffer"])
            self.weights_version = int(tba["weights_version"])
            self.samples_trained = int(tba["samples_trained"])
            # searchers resume from the restored weights and version (a new epoch: a searcher never goes back to
            # weights sent before); the buffer keeps its most-on-policy flags
            self._weights_epoch += 1
            self._sync_version = self.weights_version  # (not the pre-restore sync the searchers would chase)
            self._push_weights(block=True, mark_sync=False)
            self.counters.update(tba["counters"])
            # checkpoints before 2026-12-06 have no env states, before 2026-12-07 no env news
            self._restore_env_states(tba.get("env_states") or {}, tba.get("env_news") or {})


def searcher_idle_fractions(calls, last: int = 10) -> dict[int, float]:
    """Per searcher: the share of wall time between its first and last of its ``last`` generation calls (``(start,
    end, searcher)`` tuples) that it spent outside a call (waiting for a request, loading weights)."""
    by_searcher: dict[int, list] = {}
    for start, end, who in calls:
        by_searcher.setdefault(who, []).append((start, end))
    fractions = {}
    for who, spans in by_searcher.items():
        spans = sorted(spans)[-last:]
        if len(spans) >= 2:
            total = spans[-1][1] - spans[0][0]
            gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
            fractions[who] = gaps / max(total, 1e-9)
    return fractions


def task_identity(config: TBAConfig, env) -> dict:
    """What a checkpoint's replay buffer is only valid for: the task, the policy model and the prompt set."""
    import hashlib

    digest = hashlib.sha1()
    for p in env.prompts:
        digest.update(np.asarray(p.token_ids, np.int64).tobytes() + b"|")
    env_name = config.env if isinstance(config.env, str) else getattr(config.env, "__name__", repr(config.env))
    return {"env": env_name, "policy_model": config.policy_model, "num_prompts": len(env.prompts),
            "prompts_sha1": digest.hexdigest()[:16]}


def check_same_task(saved: dict | None, current: dict | None) -> None:
    """Raise ``ValueError`` naming both when a checkpoint comes from another task, model or prompt set."""
    if not saved or not current:
        return
    for key, what in (("env", "task"), ("policy_model", "policy model"), ("prompts_sha1", "prompt set")):
        if saved.get(key) != current.get(key):
            detail = (f"{saved.get('num_prompts')} prompts, fingerprint {saved.get('prompts_sha1')}"
                      if key == "prompts_sha1" else repr(saved.get(key)))
            now = (f"{current.get('num_prompts')} prompts, fingerprint {current.get('prompts_sha1')}"
                   if key == "prompts_sha1" else repr(current.get(key)))
            raise ValueError(f"checkpoint is from another {what}: it was trained on {detail}, this run uses {now}; "
                             f"its replay buffer and weights do not fit this run (start a new run or use the matching "
                             f"config)")
