"""TBA's searcher as an RLlib EnvRunner: generates with an in-process vLLM engine, scores through the env.

One generation call draws ``prompts_per_generation`` prompts from the task, generates ``generations_per_prompt`` (S)
responses for each in ONE batched vLLM call, scores them all with one ``env.score()`` call, and returns
``SingleAgentEpisode`` objects identical to stepping the token env (same observations, actions, rewards, infos),
with per-token sampler log-probs (``action_logp``) and the generating weight version (``weights_version``) in
``extra_model_outputs``. Samples whose reward is NaN/inf (env ``on_invalid_reward="drop"``) are dropped and counted.

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

import logging
import time
import traceback
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

from envs.llm_runtime import configure_vllm_env, generate_from_ids, get_engine, sampling_params
from envs.token_env import PAD, TokenEnv
from rllib_tba.hf_rl_module import LM_PREFIX

logger = logging.getLogger(__name__)

WEIGHTS_VERSION = "weights_version"
ACTION_LOGP = "action_logp"


@dataclass
class SearchError:
    """What ``sample_with_metrics`` returns when sampling raised (e.g. the task's reward function): the driver
    raises it with this text, instead of RLlib restarting the actor into the same error over and over."""

    worker_index: int
    message: str
    traceback: str


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
                "temperature": config.sampling_temperature, "dtype": config.searcher_dtype}
    model_config = getattr(config.rl_module_spec, "model_config", None) or config.model_config
    return {"prompts_per_generation": max(1, int(config.num_envs_per_env_runner)), "generations_per_prompt": 1,
            "temperature": float(model_config.get("temperature", 1.0)), "dtype": "float32"}


class VLLMEnvRunner(EnvRunner, Checkpointable):
    def __init__(self, *, config, **kwargs):
        configure_vllm_env(num_threads=int(config.num_cpus_per_env_runner) or None)
        super().__init__(config=config, **kwargs)
        self.worker_index = kwargs.get("worker_index", 0) or 0
        self.env = make_task_env(self.config)
        self.settings = sampler_settings(self.config)
        self.rng = np.random.default_rng(None if self.config.seed is None else self.config.seed + self.worker_index)
        self.weights_version = 0
        self._engine = None
        self._pending_weights: dict | None = None
        self._stats: dict[str, Any] = {}
        self.num_dropped_invalid = 0
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

    def _reload(self, weights: dict) -> None:
        self._engine.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        self._engine.reset_prefix_cache()

    def load_weights(self, module_state: dict, weights_version: int) -> None:
        """Load RLModule weights (keys ``lm.*``, numpy or torch) into the engine and stamp ``weights_version``."""
        weights = {k[len(LM_PREFIX):]: torch.tensor(np.asarray(v)) for k, v in module_state.items()
                   if k.startswith(LM_PREFIX)}
        if not weights:
            raise ValueError(f"no '{LM_PREFIX}*' weights in the state sent to the searcher: {list(module_state)[:5]}")
        if self._engine is None:
            self._pending_weights = weights
        else:
            self._reload(weights)
        self.weights_version = int(weights_version)

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
            new = self._generate(want, greedy)
            if not new:  # every sample of the call was dropped (counted and logged in _generate)
                return episodes
            episodes += new
            steps += sum(len(e) for e in new)
            if (num_episodes is None or len(episodes) >= num_episodes) and (num_timesteps is None or steps >= num_timesteps):
                return episodes

    def _generate(self, num_episodes: int | None, greedy: bool) -> list[SingleAgentEpisode]:
        s, env = self.settings, self.env
        t0 = time.time()
        per_prompt = 1 if greedy else s["generations_per_prompt"]
        num_prompts = s["prompts_per_generation"] if num_episodes is None else -(-num_episodes // per_prompt)
        indices = self.rng.integers(len(env.prompts), size=num_prompts)
        prompts = [env.prompts[int(i)] for i in indices]
        params = sampling_params(n=per_prompt, temperature=0.0 if greedy else s["temperature"],
                                 max_tokens=env.max_new_tokens, logprobs=0, stop_token_ids=sorted(env.eos_token_ids))
        weights_version = self.weights_version
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
        episodes = [self._episode(p, ids, lp, r, info, weights_version)
                    for p, ids, lp, r, info, ok in zip(flat_prompts, completions, logps, scored.rewards, scored.infos, scored.valid)
                    if ok]
        dropped = int((~scored.valid).sum())
        self.num_dropped_invalid += dropped
        if dropped:
            logger.warning("searcher %d: dropped %d sample(s) with invalid reward (%d so far)", self.worker_index,
                           dropped, self.num_dropped_invalid)
        num_tokens = sum(len(x) for x in completions)
        self.num_env_steps_sampled_lifetime += num_tokens
        t_end = time.time()
        task = env.task_metrics([info for info, ok in zip(scored.infos, scored.valid) if ok])
        self._stats = {
            "num_samples": len(episodes),
            "num_dropped_invalid_reward": dropped,
            "num_tokens": num_tokens,
            "generate_s": t_gen - t0,
            "score_s": t_end - t_gen,
            "tokens_per_s": num_tokens / max(t_gen - t0, 1e-9),
            "sample_start": t0,
            "sample_end": t_end,
            "weights_version": weights_version,
            "reward_mean": float(np.nanmean(scored.rewards)) if len(scored.rewards) else float("nan"),
            "task": task,
        }
        self._log_rllib_metrics(episodes, task)
        return episodes

    def _log_rllib_metrics(self, episodes, task: dict) -> None:
        """RLlib's standard EnvRunner metrics (what Algorithm results show under ``env_runners``)."""
        m, steps = self.metrics, sum(len(e) for e in episodes)
        m.log_value(NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        m.log_value(NUM_EPISODES, len(episodes), reduce="sum")
        m.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True)
        m.log_value(NUM_EPISODES_LIFETIME, len(episodes), reduce="lifetime_sum")
        window = max(1, self.config.metrics_num_episodes_for_smoothing // max(1, self.config.num_env_runners))
        for e in episodes:
            m.log_value(EPISODE_RETURN_MEAN, e.get_return(), window=window)
            m.log_value(EPISODE_LEN_MEAN, len(e), window=window)
            m.log_value(EPISODE_RETURN_MIN, e.get_return(), reduce="min", window=window)
            m.log_value(EPISODE_RETURN_MAX, e.get_return(), reduce="max", window=window)
        for key, value in task.items():
            m.log_value(("task", key), value, window=1)

    def _episode(self, prompt, ids, logp, reward, info, weights_version) -> SingleAgentEpisode:
        """The episode stepping the token env with these actions would produce."""
        seq = np.asarray(list(prompt.token_ids) + ids, np.int64)
        n_prompt, n = len(prompt.token_ids), len(ids)
        width = self.env.observation_space.shape[0]
        cols = np.arange(width)
        padded = np.full(width, PAD, np.int64)
        padded[: len(seq)] = seq
        obs = np.where(cols[None, :] < (n_prompt + np.arange(n + 1))[:, None], padded[None, :], PAD)
        rewards = np.zeros(n, np.float32)
        rewards[-1] = reward
        return SingleAgentEpisode(
            observations=list(obs), actions=list(ids), rewards=list(rewards),
            infos=[{"prompt_index": prompt.index}] + [{}] * (n - 1) + [info],
            extra_model_outputs={ACTION_LOGP: list(logp), WEIGHTS_VERSION: [weights_version] * n},
            terminated=True, len_lookback_buffer=0,
            observation_space=self.env.observation_space, action_space=self.env.action_space,
        )

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        """RLlib's reduced EnvRunner metrics since the last call (see ``_log_rllib_metrics``)."""
        return self.metrics.reduce()

    def sample_with_metrics(self):
        """``(episodes, searcher stats of this call, RLlib metrics)`` in one remote call (TBA's async loop), or a
        ``SearchError`` when sampling raised."""
        try:
            episodes = self.sample()
        except Exception as e:  # noqa: BLE001 - handed to the driver, which raises it with this searcher's traceback
            logger.exception("searcher %d: sample() failed", self.worker_index)
            return SearchError(self.worker_index, f"{type(e).__name__}: {e}", traceback.format_exc())
        return episodes, dict(self._stats), self.get_metrics()

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
        elif WEIGHTS_VERSION in state:
            self.weights_version = int(state[WEIGHTS_VERSION])

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []

    @override(EnvRunner)
    def stop(self):
        self._engine = None
