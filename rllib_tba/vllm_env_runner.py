"""TBA's searcher as an RLlib EnvRunner: generates with an in-process vLLM engine, scores through the env.

One generation call draws ``prompts_per_generation`` prompts from the task, generates ``generations_per_prompt`` (S)
responses for each in ONE batched vLLM call and scores them all with one ``env.score()`` call. The result is a
``GenerationBatch``: what a generated token costs and nothing more (token ids, per-token sampler log-probs, one
reward, weight version and prompt row per response, each distinct prompt's ids once) — O(T) per episode, about 8
bytes per generated token on the wire. TBA's loop takes these (``sample_with_metrics``). ``sample()``, RLlib's API
that PPO and the other algorithms call, turns them into ``SingleAgentEpisode`` objects identical to stepping the
token env (same observations, actions, rewards, infos), with the per-token log-probs (``action_logp``) and the weight
version (``weights_version``) in ``extra_model_outputs``: the (T+1) × width observations are built only there.
Samples whose reward is NaN/inf (env ``on_invalid_reward="drop"``) are dropped and counted.

Any RLlib algorithm can use it (``config.env_runners(env_runner_cls=VLLMEnvRunner)``, e.g. PPO): with a TBAConfig
the knobs above come from ``training()``; with any other config one call generates ``num_envs_per_env_runner``
episodes (one prompt each) at the RLModule's ``model_config["temperature"]``, with fp32 weights so the sampler's
log-probs match the learner's. ``sample(num_episodes=..., num_timesteps=..., explore=False)`` work as in RLlib
(``explore=False``: greedy), and ``get_metrics()`` reports RLlib's standard env-runner metrics (episode return and
length, sampled steps and episodes, lifetime counts, throughput) plus the task's metrics under ``task``.

Weights arrive through ``set_state`` and are loaded into the running engine with vLLM's ``reload_weights`` followed
by ``reset_prefix_cache`` (cached KV of the old weights must not be reused); the engine is never restarted.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    EPISODE_LEN_MEAN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    WEIGHTS_SEQ_NO,
)

from envs.llm_runtime import configure_vllm_env, generate_from_ids, get_engine, sampling_params, sequence_logprobs
from envs.metrics import SuccessWindow
from envs.token_env import PAD, TokenEnv
from rllib_tba.hf_rl_module import LM_PREFIX

logger = logging.getLogger(__name__)


class _RotaryCacheNotInWeights(logging.Filter):
    """Drops the one warning vLLM's in-place ``reload_weights`` logs at every weight sync, "RotaryEmbedding: Failed
    to load weights": the rotary cos/sin cache is a buffer vLLM computes at start-up, never part of a checkpoint or
    of the learner's state, and the reload puts the engine's own copy back (the sampler's log-probs equal the
    learner's after a sync: tests/test_tba.py). The same for vLLM's rotary variants (Llama-3's, YaRN, ...); a sync
    that fails to load any other layer still warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and len(record.args) == 1 else None
        return not (record.msg == "%s: Failed to load weights" and isinstance(layer, str)
                    and layer.endswith("RotaryEmbedding"))  # Llama3RotaryEmbedding, YaRNScalingRotaryEmbedding, ...


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RotaryCacheNotInWeights())

WEIGHTS_VERSION = "weights_version"
WEIGHTS_EPOCH = "weights_epoch"  # TBA: +1 at every restore of the learner (a higher version of an older epoch is older)
ACTION_LOGP = "action_logp"


@dataclass
class SearchError:
    """What ``sample_with_metrics`` returns when sampling raised (e.g. the task's reward function): the driver
    raises it with this text, instead of RLlib restarting the actor into the same error over and over."""

    worker_index: int
    message: str
    traceback: str


@dataclass
class GenerationBatch:
    """The responses of one generation call, O(T) per response: token ids and per-token log-probs concatenated
    (response i is ``tokens[offsets[i]:offsets[i+1]]``), one reward and prompt row each, each distinct prompt's ids
    once, and the weight version that generated them all. ``infos`` (the task's final-step info per response) stay
    on the searcher unless asked for."""

    prompt_index: np.ndarray  # int32 [n]
    prompt_ids: dict  # prompt row -> int32 token ids
    tokens: np.ndarray  # int32 [sum of response lengths]
    offsets: np.ndarray  # int64 [n + 1]
    logp: np.ndarray  # float32 [sum of response lengths]
    reward: np.ndarray  # float64 [n]
    weights_version: int
    infos: list | None = None
    ref_logp: np.ndarray | None = None  # float64 [n]: summed reference log-probs (ref_logp_on="searchers")

    def __len__(self) -> int:
        return len(self.prompt_index)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def response(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def response_logp(self, i: int) -> np.ndarray:
        return self.logp[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def from_responses(cls, prompts, completions, logps, rewards, infos, weights_version) -> "GenerationBatch":
        lengths = [len(c) for c in completions]
        return cls(prompt_index=np.asarray([p.index for p in prompts], np.int32),
                   prompt_ids={p.index: np.asarray(p.token_ids, np.int32) for p in prompts},
                   tokens=np.asarray([t for c in completions for t in c], np.int32),
                   offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                   logp=np.concatenate(logps).astype(np.float32) if logps else np.zeros(0, np.float32),
                   reward=np.asarray(rewards, np.float64), weights_version=int(weights_version), infos=list(infos))

    def without_infos(self) -> "GenerationBatch":
        return dataclasses.replace(self, infos=None)


def make_task_env(config) -> TokenEnv:
    """The task env named by ``config.env`` (Ray registry id, gymnasium id or class) with ``config.env_config``."""
    import gymnasium as gym
    from ray.tune.registry import ENV_CREATOR, _global_registry

    env_spec = config.env
    env_config = dict(getattr(config, "task_env_config", None) or config.env_config or {})
    if isinstance(env_spec, str) and _global_registry.contains(ENV_CREATOR, env_spec):
        env = _global_registry.get(ENV_CREATOR, env_spec)(env_config)
    elif isinstance(env_spec, str):
        env = gym.make(env_spec, config=env_config)
    elif isinstance(env_spec, type):
        env = env_spec(env_config)
    else:
        raise ValueError(f"TBA needs config.environment(env=...) to be an env id or class, got {env_spec!r}")
    env = getattr(env, "unwrapped", env)
    if not isinstance(env, TokenEnv):
        raise TypeError(f"TBA searchers need a token-level envs.TokenEnv (batched score()), got {type(env).__name__}")
    return env


def sampler_settings(config) -> dict:
    """How a VLLMEnvRunner samples under ``config``: TBAConfig names the knobs; any other AlgorithmConfig gets
    ``num_envs_per_env_runner`` single-sample prompts per call at the RLModule's temperature, fp32 weights."""
    if hasattr(config, "generations_per_prompt"):  # TBAConfig
        return {"prompts_per_generation": config.prompts_per_generation,
                "generations_per_prompt": config.generations_per_prompt,
                "temperature": config.sampling_temperature, "dtype": config.searcher_dtype,
                "temperature_range": config.exploration_temperature, "ref_logp": config.ref_logp_on == "searchers"}
    model_config = getattr(config.rl_module_spec, "model_config", None) or config.model_config
    return {"prompts_per_generation": max(1, int(config.num_envs_per_env_runner)), "generations_per_prompt": 1,
            "temperature": float(model_config.get("temperature", 1.0)), "dtype": "float32", "temperature_range": None,
            "ref_logp": False}


def searcher_threads(num_cpus: float) -> int:
    """The threads a searcher computes with: its Ray CPUs (``num_cpus_per_env_runner``) rounded up, at least one. Two
    searchers at 0.5 CPU each fit one core's slot in Ray's count and run one thread each."""
    return max(1, math.ceil(num_cpus))


class VLLMEnvRunner(EnvRunner, Checkpointable):
    def __init__(self, *, config, **kwargs):
        cpus = config.num_cpus_per_env_runner
        configure_vllm_env(num_threads=searcher_threads(cpus) if cpus else None)  # 0 CPUs (GPU searcher): vLLM's own
        super().__init__(config=config, **kwargs)
        self.worker_index = kwargs.get("worker_index", 0) or 0
        self.env = make_task_env(self.config)
        self.settings = sampler_settings(self.config)
        self.rng = np.random.default_rng(None if self.config.seed is None else self.config.seed + self.worker_index)
        self.weights_version = 0
        self.versions_loaded: deque[int] = deque(maxlen=10_000)  # every weights version received, in order
        self.weights_epoch = 0
        self.weights_pulled = 0  # versions loaded from the weights board at a call's start (TBA's pull_weights)
        self._engine = None
        self._ref_engine = None
        self._pending_weights: dict | None = None
        self._stats: dict[str, Any] = {}
        self.num_dropped_invalid = 0
        self.success_window = SuccessWindow()  # the task's success rate over this searcher's latest episodes
        if self.worker_index > 0 or self.config.num_env_runners == 0:  # a searcher that will sample: start vLLM now,
            self.engine  # noqa: B018                                  # not inside the first sample() call

    # ---- the vLLM engine -------------------------------------------------------------------------------------
    @property
    def engine(self):
        if self._engine is None:
            c = self.config
            self._engine = get_engine(
                self.env.model_path, dtype=self.settings["dtype"], seed=(c.seed or 0) + self.worker_index,
                max_model_len=self.env.max_prompt_tokens + self.env.max_new_tokens,
                logprobs_mode="processed_logprobs",  # log-probs of the tempered distribution that was sampled
            )
            if self._pending_weights is not None:
                self._reload(self._pending_weights)
                self._pending_weights = None
        return self._engine

    @property
    def reference_engine(self):
        """The frozen reference model (the policy's initial weights) in fp32, never reloaded: reference log-probs
        on the searcher (``ref_logp_on="searchers"``). Shared with a task that loads the same reference."""
        if self._ref_engine is None:
            self._ref_engine = get_engine(self.env.model_path, dtype="float32", seed=(self.config.seed or 0),
                                          max_model_len=self.env.max_prompt_tokens + self.env.max_new_tokens)
        return self._ref_engine

    def _reload(self, weights: dict) -> None:
        self._engine.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        self._engine.reset_prefix_cache()

    def load_weights(self, module_state: dict, weights_version: int) -> None:
        """Load RLModule weights (keys ``lm.*``, numpy or torch) into the engine and stamp ``weights_version``."""
        with warnings.catch_warnings():  # arrays from the object store are read-only: vLLM copies, never writes
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            weights = {k[len(LM_PREFIX):]: torch.as_tensor(v) for k, v in module_state.items()
                       if k.startswith(LM_PREFIX)}  # no copy: vLLM's loaders copy into the engine's parameters
        if not weights:
            raise ValueError(f"no '{LM_PREFIX}*' weights in the state sent to the searcher: {list(module_state)[:5]}")
        if self._engine is None:
            self._pending_weights = weights
        else:
            self._reload(weights)
        self.weights_version = int(weights_version)
        self.versions_loaded.append(self.weights_version)

    # ---- sampling ----------------------------------------------------------------------------------------------
    @override(EnvRunner)
    def sample(self, *, num_timesteps=None, num_episodes=None, explore=None, random_actions=False, **kwargs):
        """Complete episodes: one generation call, or as many as ``num_episodes`` / ``num_timesteps`` need."""
        if random_actions:
            raise ValueError("VLLMEnvRunner samples from the policy LM; random_actions=True (uniform random tokens "
                             "over the vocabulary) is not supported")
        greedy = explore is False
        episodes, steps = [], 0
        while True:
            want = None if num_episodes is None else num_episodes - len(episodes)
            batch = self.generate(want, greedy)
            if not len(batch):  # every sample of the call was dropped (counted and logged in generate)
                return episodes
            episodes += self.to_episodes(batch)
            steps += batch.num_tokens
            if (num_episodes is None or len(episodes) >= num_episodes) and (num_timesteps is None or steps >= num_timesteps):
                return episodes

    def generate(self, num_episodes: int | None = None, greedy: bool = False) -> GenerationBatch:
        """One generation call (``num_episodes`` responses, or the configured prompts × S), scored, as a
        ``GenerationBatch`` of the responses with a valid reward."""
        s, env = self.settings, self.env
        t0 = time.time()
        per_prompt = 1 if greedy else s["generations_per_prompt"]
        num_prompts = s["prompts_per_generation"] if num_episodes is None else -(-num_episodes // per_prompt)
        indices = self.rng.integers(len(env.prompts), size=num_prompts)
        prompts = [env.prompts[int(i)] for i in indices]
        common = dict(max_tokens=env.max_new_tokens, logprobs=0, stop_token_ids=sorted(env.eos_token_ids))
        if s["temperature_range"] is not None and not greedy:
            # exploration: one request per response, each at its own temperature ~ U[low, high] (the prompt's KV is
            # shared through vLLM's prefix cache)
            prompts = [p for p in prompts for _ in range(per_prompt)]
            temperatures = self.rng.uniform(*s["temperature_range"], size=len(prompts))
            params = [sampling_params(n=1, temperature=float(t), **common) for t in temperatures]
        else:
            params = sampling_params(n=per_prompt, temperature=0.0 if greedy else s["temperature"], **common)
        weights_version = self.weights_version
        self._ref_s = 0.0
        outputs = generate_from_ids(self.engine, [p.token_ids for p in prompts], params)
        t_gen = time.time()
        flat_prompts, completions, logps = [], [], []
        for p, out in zip(prompts, outputs):
            for comp in out.outputs:
                ids = list(comp.token_ids)
                flat_prompts.append(p)
                completions.append(ids)
                logps.append(np.asarray([lp[t].logprob for t, lp in zip(ids, comp.logprobs)], np.float32))
        if num_episodes is not None:
            flat_prompts, completions, logps = flat_prompts[:num_episodes], completions[:num_episodes], logps[:num_episodes]
        scored = env.score(flat_prompts, completions)
        ok = [i for i, v in enumerate(scored.valid) if v]
        batch = GenerationBatch.from_responses([flat_prompts[i] for i in ok], [completions[i] for i in ok],
                                               [logps[i] for i in ok], scored.rewards[ok],
                                               [scored.infos[i] for i in ok], weights_version)
        if s["ref_logp"] and len(batch):
            t_ref = time.time()
            batch.ref_logp = sequence_logprobs(self.reference_engine, [flat_prompts[i].token_ids for i in ok],
                                               [completions[i] for i in ok])
            self._ref_s = time.time() - t_ref
        dropped = len(completions) - len(ok)
        self.num_dropped_invalid += dropped
        if dropped:
            logger.warning("searcher %d: dropped %d sample(s) with invalid reward (%d so far)", self.worker_index,
                           dropped, self.num_dropped_invalid)
        num_tokens = sum(len(x) for x in completions)
        self.num_env_steps_sampled_lifetime += num_tokens
        t_end = time.time()
        task = env.task_metrics(batch.infos)
        success = [env.episode_success(info) for info in batch.infos]
        if success and None not in success:
            self.success_window.add(success, t_end)
            task.update(self.success_window.metrics())
        self._stats = {
            "worker_index": self.worker_index,
            "num_samples": len(batch),
            "num_dropped_invalid_reward": dropped,
            "num_tokens": num_tokens,
            "generate_s": t_gen - t0,
            "score_s": t_end - t_gen - self._ref_s,
            "ref_logp_s": self._ref_s,
            "tokens_per_s": num_tokens / max(t_gen - t0, 1e-9),
            "sample_start": t0,
            "sample_end": t_end,
            "weights_version": weights_version,
            "reward_mean": float(np.mean(batch.reward)) if len(batch) else float("nan"),
            "task": task,
        }
        self._log_rllib_metrics(batch, task)
        return batch

    def _log_rllib_metrics(self, batch: GenerationBatch, task: dict) -> None:
        """RLlib's standard EnvRunner metrics (what Algorithm results show under ``env_runners``)."""
        m, steps = self.metrics, batch.num_tokens
        m.log_value(NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        m.log_value(NUM_EPISODES, len(batch), reduce="sum")
        m.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True)
        m.log_value(NUM_EPISODES_LIFETIME, len(batch), reduce="lifetime_sum")
        window = max(1, self.config.metrics_num_episodes_for_smoothing // max(1, self.config.num_env_runners))
        for ret, length in zip(batch.reward, np.diff(batch.offsets)):
            m.log_value(EPISODE_RETURN_MEAN, float(ret), window=window)
            m.log_value(EPISODE_LEN_MEAN, int(length), window=window)
            m.log_value(EPISODE_RETURN_MIN, float(ret), reduce="min", window=window)
            m.log_value(EPISODE_RETURN_MAX, float(ret), reduce="max", window=window)
        for key, value in task.items():
            m.log_value(("task", key), value, window=1)

    def to_episodes(self, batch: GenerationBatch) -> list[SingleAgentEpisode]:
        """The episodes stepping the token env with these actions would produce (observations materialised here)."""
        width = self.env.observation_space.shape[0]
        cols = np.arange(width)
        episodes = []
        for i in range(len(batch)):
            prompt_ids, ids = batch.prompt_ids[int(batch.prompt_index[i])], batch.response(i)
            n_prompt, n = len(prompt_ids), len(ids)
            padded = np.full(width, PAD, np.int64)
            padded[:n_prompt + n] = np.concatenate([prompt_ids, ids])
            obs = np.where(cols[None, :] < (n_prompt + np.arange(n + 1))[:, None], padded[None, :], PAD)
            rewards = np.zeros(n, np.float32)
            rewards[-1] = batch.reward[i]
            episodes.append(SingleAgentEpisode(
                observations=list(obs), actions=[int(t) for t in ids], rewards=list(rewards),
                infos=[{"prompt_index": int(batch.prompt_index[i])}] + [{}] * (n - 1) + [batch.infos[i]],
                extra_model_outputs={ACTION_LOGP: list(batch.response_logp(i)),
                                     WEIGHTS_VERSION: [batch.weights_version] * n},
                terminated=True, len_lookback_buffer=0,
                observation_space=self.env.observation_space, action_space=self.env.action_space,
            ))
        return episodes

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        """RLlib's reduced EnvRunner metrics since the last call (see ``_log_rllib_metrics``)."""
        return self.metrics.reduce()

    def sample_with_metrics(self, weights_board=None):
        """``(GenerationBatch without infos, searcher stats of this call, RLlib metrics)`` in one remote call (TBA's
        loop), or a ``SearchError`` when sampling raised. With a ``WeightsBoard`` (TBA's ``pull_weights``) the call
        first loads the newest synced weights."""
        try:
            if weights_board is not None:
                self.pull_weights(weights_board)
            batch = self.generate().without_infos()
        except Exception as e:  # noqa: BLE001 - handed to the driver, which raises it with this searcher's traceback
            logger.exception("searcher %d: sample() failed", self.worker_index)
            return SearchError(self.worker_index, f"{type(e).__name__}: {e}", traceback.format_exc())
        return batch, dict(self._stats), self.get_metrics()

    def pull_weights(self, board) -> None:
        """Load the board's newest synced weights if they are newer than the loaded ones. A board that does not
        answer within 60 s (restarting after a crash) is logged and skipped — the call waits that long first — and
        the driver's weights requests still bring every sync, only later."""
        try:
            newest = ray.get(board.newer_than.remote((self.weights_epoch, self.weights_version)), timeout=60)
            if newest is not None:
                self.set_state(ray.get(newest[1][0]))
                self.weights_pulled += 1
        except ray.exceptions.RayError as e:
            logger.warning("searcher %d: no weights from the board (%s); generating with version %d",
                           self.worker_index, type(e).__name__, self.weights_version)

    # ---- EnvRunner / Checkpointable API -----------------------------------------------------------------------
    @override(EnvRunner)
    def get_spaces(self):
        spaces = (self.env.observation_space, self.env.action_space)
        return {DEFAULT_MODULE_ID: spaces, INPUT_ENV_SPACES: spaces, INPUT_ENV_SINGLE_SPACES: spaces}

    @override(EnvRunner)
    def assert_healthy(self):
        assert self.env is not None and self.env.prompts, "searcher has no task env"

    @override(Checkpointable)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        return {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime, WEIGHTS_VERSION: self.weights_version,
                "num_dropped_invalid": self.num_dropped_invalid}

    @override(Checkpointable)
    def set_state(self, state: dict) -> None:
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = int(state[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        if COMPONENT_RL_MODULE in state:
            module_state = state[COMPONENT_RL_MODULE]
            if isinstance(module_state, ray.ObjectRef):  # EnvRunnerGroup.sync_weights puts the weights in the store
                module_state = ray.get(module_state)
            module_state = module_state.get(DEFAULT_MODULE_ID, module_state)
            # TBA stamps its learner version; other algorithms' syncs carry RLlib's weights sequence number
            weights_version = state.get(WEIGHTS_VERSION, state.get(WEIGHTS_SEQ_NO) or self.weights_version + 1)
            self.load_weights(module_state, weights_version)
            self.weights_epoch = int(state.get(WEIGHTS_EPOCH, self.weights_epoch))
        elif WEIGHTS_VERSION in state:
            self.weights_version = int(state[WEIGHTS_VERSION])

    def receive_weights(self, state: dict, news: dict | None = None) -> tuple[dict, dict]:
        """TBA's weight sync: ``set_state(state)`` unless this searcher has those weights or newer ones already (a
        later epoch, or a higher version in the same: pulled from the weights board while this request waited) and
        the other searchers' task-env news (``TokenEnv.absorb_news``);
        returns this searcher's task-env state (``TokenEnv.get_state``, {} for tasks that keep none), which the driver
        keeps to hand back should this searcher be restarted, and its own news since the last sync for the others
        (``TokenEnv.take_news``, {} for tasks that share none)."""
        if (int(state.get(WEIGHTS_EPOCH, self.weights_epoch)), int(state[WEIGHTS_VERSION])) > \
                (self.weights_epoch, self.weights_version):
            self.set_state(state)
        if news:
            self.env.absorb_news(news)
        return self.env.get_state(), self.env.take_news()

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []

    @override(EnvRunner)
    def stop(self):
        self._engine = None
