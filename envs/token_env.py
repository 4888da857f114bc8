"""Token-level LLM environments: an observation is the token ids so far, an action is one token.

Every task subclasses :class:`TokenEnv` and implements two things:

- ``_load_prompts()`` -> the task's prompts (validated here: empty or over-long prompts are errors naming the row);
- ``_score(prompts, completions)`` -> one reward and one info dict per (prompt, completion) pair, for a whole batch.

``score()`` is the batched API a generator (vLLM searcher) calls; ``step()`` calls the same ``score()`` with a batch
of one at the end of an episode, so stepping token by token gives the identical reward.

Observation: ``Box(-1, vocab-1, (max_prompt_tokens + max_new_tokens,), int64)``, the prompt ids followed by the
generated ids, right-padded with -1 (``PAD``). Action: ``Discrete(vocab)``. The episode ends (``terminated``) when
the policy emits EOS or after ``max_new_tokens`` tokens; the reward is 0 until then and the task reward at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from envs.llm_runtime import chat_prompt
from envs.models import explain_model_errors, resolve_model

logger = logging.getLogger(__name__)

PAD = -1  # observation padding value: "no token here"


class RewardError(RuntimeError):
    """A task's reward function raised, or returned a non-finite reward with ``on_invalid_reward="raise"``."""


@dataclass(frozen=True)
class Prompt:
    """One task prompt. ``index`` is its row in the task's dataset; ``meta`` holds task data (answer, reference...)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class ScoreResult:
    """Batched rewards. ``valid[i]`` is False for a counted, logged drop (reward was NaN/inf: ``rewards[i]`` is NaN)."""

    rewards: np.ndarray
    infos: list[dict]
    valid: np.ndarray


class TokenEnv(gym.Env):
    """Base class of the token-level tasks. ``config`` keys (all optional):

    model: policy model whose tokenizer defines the vocabulary ("tiny-test", "smollm2-135m-instruct", HF id/path).
    max_new_tokens: episode length limit in generated tokens.
    max_prompt_tokens: longest allowed prompt (longer rows are an error naming the row and the limit).
    on_invalid_reward: "raise" (default) or "drop" (a NaN/inf reward is counted, logged and marked invalid).
    """

    metadata = {"render_modes": ["ansi"]}
    default_config: dict[str, Any] = {
        "model": "tiny-test",
        "max_new_tokens": 32,
        "max_prompt_tokens": 256,
        "on_invalid_reward": "raise",
    }

    def __init__(self, config: dict | None = None, render_mode: str | None = None):
        unknown = set(config or {}) - set(self.default_config)
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown config keys {sorted(unknown)}; allowed: {sorted(self.default_config)}")
        self.config = {**self.default_config, **dict(config or {})}
        self.render_mode = render_mode
        self.max_new_tokens = positive_int(self.config, "max_new_tokens")
        self.max_prompt_tokens = positive_int(self.config, "max_prompt_tokens")
        if self.config["on_invalid_reward"] not in ("raise", "drop"):
            raise ValueError(f"on_invalid_reward must be 'raise' or 'drop', got {self.config['on_invalid_reward']!r}")
        self.model_path = resolve_model(self.config["model"])

        from transformers import AutoConfig, AutoTokenizer

        with explain_model_errors(self.config["model"]):
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            vocab = max(AutoConfig.from_pretrained(self.model_path).vocab_size, len(self.tokenizer))
        self.eos_token_id = self.tokenizer.eos_token_id
        # Every id that ends generation: the tokenizer's EOS and the model's generation-config EOS ids (Llama-3 has
        # several), so that an episode ends exactly where vLLM stops.
        self.eos_token_ids = frozenset([self.eos_token_id, *_generation_eos_ids(self.model_path)]) - {None}
        self.observation_space = gym.spaces.Box(PAD, vocab - 1, (self.max_prompt_tokens + self.max_new_tokens,), np.int64)
        self.action_space = gym.spaces.Discrete(vocab)
        self.prompts: list[Prompt] = self._check_prompts(self._load_prompts())
        self.num_invalid_rewards = 0
        self._prompt: Prompt | None = None
        self._completion: list[int] = []

    # ---- what a task implements ------------------------------------------------------------------------------
    def _load_prompts(self) -> list[Prompt]:
        raise NotImplementedError

    def _score(self, prompts: Sequence[Prompt], completions: Sequence[Sequence[int]]) -> tuple[Sequence[float], list[dict]]:
        raise NotImplementedError

    # ---- helpers for tasks --------------------------------------------------------------------------------------
    def render_user_prompt(self, user_text: str) -> str:
        """The policy's input text for a user message: its chat template when it has one, else the plain text."""
        return chat_prompt(self.tokenizer, user_text)

    def make_prompt(self, index: int, text: str, **meta) -> Prompt:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Prompt(index=index, text=text, token_ids=tuple(ids), meta=meta)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def ends_with_eos(self, completion: Sequence[int]) -> bool:
        return len(completion) > 0 and int(completion[-1]) in self.eos_token_ids

    # ---- batched scoring ----------------------------------------------------------------------------------------
    def score(self, prompts: Sequence[Prompt], completions: Sequence[Sequence[int]]) -> ScoreResult:
        """Rewards for a batch of (prompt, completion token ids). A completion ending in EOS includes the EOS id."""
        if len(prompts) != len(completions):
            raise ValueError(f"score(): {len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            return ScoreResult(np.zeros(0, np.float64), [], np.zeros(0, bool))
        try:
            rewards, infos = self._score(prompts, completions)
        except Exception as e:  # name the task and the batch; keep the cause
            raise RewardError(f"{type(self).__name__} reward function failed on a batch of {len(prompts)} "
                              f"(first prompt row {prompts[0].index}): {type(e).__name__}: {e}") from e
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if len(rewards) != len(prompts) or len(infos) != len(prompts):
            raise RewardError(f"{type(self).__name__} reward function returned {len(rewards)} rewards / {len(infos)} "
                              f"infos for {len(prompts)} samples")
        valid = np.isfinite(rewards)
        if not valid.all():
            bad = [int(i) for i in np.flatnonzero(~valid)]
            detail = ", ".join(f"prompt row {prompts[i].index}: {rewards[i]}" for i in bad[:5])
            if self.config["on_invalid_reward"] == "raise":
                raise RewardError(f"{type(self).__name__}: non-finite reward for {len(bad)} sample(s) ({detail}). "
                                  "Set on_invalid_reward='drop' to count and skip them instead.")
            self.num_invalid_rewards += len(bad)
            logger.warning("%s: dropped %d sample(s) with non-finite reward (%s); %d dropped so far",
                           type(self).__name__, len(bad), detail, self.num_invalid_rewards)
            rewards = np.where(valid, rewards, np.nan)
        for info, ok in zip(infos, valid):
            info["reward_valid"] = bool(ok)
        return ScoreResult(rewards, list(infos), valid)

    def task_metrics(self, infos: Sequence[dict]) -> dict[str, float]:
        """Batch metrics from final-step infos: the mean of every finite numeric or boolean field. Tasks add their own."""
        sums: dict[str, list] = {}
        for info in infos:
            for key, value in info.items():
                if isinstance(value, (bool, int, float, np.number)) and key != "reward_valid" and np.isfinite(value):
                    sums.setdefault(key, []).append(float(value))
        return {key: float(np.mean(v)) for key, v in sums.items()}

    # the final-step info key that holds the policy's decoded response (red-team: the attack); None: the task has none
    output_field: str | None = None

    # env_config values `rllib evaluate` always uses, whatever a run trained with (a task's fixed evaluation protocol)
    evaluation_config: dict = {}
    # evaluation_config keys whose evaluation value must differ from the run's own (red-team: the victim's sampling
    # seed, so evaluated samples are not scored with the very draws training rewarded)
    held_out_config: tuple = ()

    def episode_success(self, info: dict) -> bool | None:
        """Whether a scored sample (its final-step info) counts as a success for the task's success rate (red-team:
        the attack succeeded; math: the answer is right); None for tasks without a notion of success."""
        return None

    # ---- what a task learns while scoring (the red-team env's novelty memory): saved with a run's checkpoint ------
    def get_state(self) -> dict:
        """What scoring changed that later scores depend on, carried across a resume by ``set_state``; {} (the
        default) for a task whose scores depend on nothing earlier."""
        return {}

    def set_state(self, state: dict) -> None:
        pass

    def take_news(self) -> dict:
        """What scoring learned since the last call that this env shares with the other searchers' envs of a run
        (e.g. a run-wide novelty memory), handed to them by ``absorb_news``; {} (the default) for nothing to share."""
        return {}

    def absorb_news(self, news: dict) -> None:
        """Take in what other envs of the run learned (their ``take_news``, joined by ``merge_news``)."""

    def merge_news(self, older: dict, newer: dict) -> dict:
        """One hand-over of two (``older`` first), for an env that missed both; only called for tasks that share."""
        raise NotImplementedError(f"{type(self).__name__} shares news but does not say how to merge it")

    def describe(self, info: dict) -> str:
        """A scored sample (its final-step info) as text for a person; tasks show what matters to them."""
        return ", ".join(f"{k}={v!r}" for k, v in info.items()
                         if isinstance(v, (str, bool, int, float)) and k != "reward_valid")

    # ---- gymnasium API ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("prompt_index")
        if index is None:
            index = int(self.np_random.integers(len(self.prompts)))
        if not 0 <= index < len(self.prompts):
            raise IndexError(f"prompt_index {index} out of range: the task has {len(self.prompts)} prompts")
        self._prompt = self.prompts[index]
        self._completion = []
        return self._observation(), {"prompt_index": index}

    def step(self, action):
        if self._prompt is None:
            raise RuntimeError("step() called before reset()")
        token = int(action)
        if not self.action_space.contains(token):
            raise ValueError(f"action {action!r} is not a token id in [0, {self.action_space.n})")
        if len(self._completion) >= self.max_new_tokens:
            raise RuntimeError("step() called after the episode ended; call reset()")
        self._completion.append(token)
        done = token in self.eos_token_ids or len(self._completion) >= self.max_new_tokens
        reward, info = 0.0, {}
        if done:
            result = self.score([self._prompt], [self._completion])
            info = result.infos[0]
            # A dropped (non-finite) reward cannot be un-sent in a gym episode: pay 0, flagged in info.
            reward = float(result.rewards[0]) if result.valid[0] else 0.0
        return self._observation(), reward, done, False, info

    def _observation(self) -> np.ndarray:
        obs = np.full(self.observation_space.shape, PAD, dtype=np.int64)
        ids = self._prompt.token_ids + tuple(self._completion)
        obs[: len(ids)] = ids
        return obs

    def render(self):
        if self._prompt is None:
            return ""
        return self._prompt.text + self.decode(self._completion)

    # ---- validation ---------------------------------------------------------------------------------------------
    def _check_prompts(self, prompts: list[Prompt]) -> list[Prompt]:
        if not prompts:
            raise ValueError(f"{type(self).__name__}: the dataset has no prompts")
        for p in prompts:
            if not p.text.strip() or not p.token_ids:
                raise ValueError(f"{type(self).__name__}: prompt row {p.index} is empty")
            if len(p.token_ids) > self.max_prompt_tokens:
                raise ValueError(f"{type(self).__name__}: prompt row {p.index} has {len(p.token_ids)} tokens, over "
                                 f"max_prompt_tokens={self.max_prompt_tokens}; shorten it or raise the limit")
        return prompts


def read_jsonl(path) -> list[tuple[int, Any]]:
    """``(line number, parsed row)`` for each non-blank line; invalid JSON is an error naming the file and line."""
    import json

    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from None
    return rows


def _generation_eos_ids(model_path: str) -> list[int]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def positive_int(config: dict, key: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def log_clip(p: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """log(p) with p clipped into [eps, 1] so that a 0 probability gives a finite (very negative) log."""
    return np.log(np.clip(np.asarray(p, dtype=np.float64), eps, 1.0))
