"""Task metrics of a model: sample from the task's prompts with vLLM, score with the env (no RLlib needed)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from envs.llm_runtime import generate_from_ids, get_engine, sampling_params
from envs.metrics import common_openings
from envs.token_env import Prompt, TokenEnv


def vllm_generator(env: TokenEnv, model_path: str | None = None, temperature: float = 1.0, dtype: str = "auto",
                   seed: int = 0) -> Callable[[Sequence[Prompt]], list[list[int]]]:
    """``generate(prompts) -> completions``: one response per prompt from ``model_path`` (default: the env's model)
    with an in-process vLLM engine, stopping where the env's episodes end (EOS ids, ``max_new_tokens``)."""
    engine = get_engine(model_path or env.model_path, dtype=dtype, seed=seed,
                        max_model_len=env.max_prompt_tokens + env.max_new_tokens)
    params = sampling_params(max_tokens=env.max_new_tokens, temperature=temperature,
                             stop_token_ids=sorted(env.eos_token_ids))

    def generate(prompts):
        outs = generate_from_ids(engine, [p.token_ids for p in prompts], params)
        return [list(o.outputs[0].token_ids) for o in outs]

    return generate


def sample_and_score(env: TokenEnv, model_path: str, num_samples: int, temperature: float = 1.0, greedy: bool = False,
                     seed: int = 0, dtype: str = "auto", batch_size: int = 64):
    """``evaluate_policy``'s draws, batch by batch: ``(prompts, completions, env.score result)``. Each batch is scored
    before the next is sampled (the order fixes which responses a seed draws), so a caller gets the very samples
    `rllib evaluate` scores."""
    generate = vllm_generator(env, model_path, temperature=0.0 if greedy else temperature, dtype=dtype, seed=seed)
    prompts = [env.prompts[i % len(env.prompts)] for i in range(num_samples)]
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        completions = generate(chunk)
        yield chunk, completions, env.score(chunk, completions)


def evaluate_policy(env: TokenEnv, model_path: str, num_samples: int, temperature: float = 1.0, greedy: bool = False,
                    seed: int = 0, dtype: str = "auto", batch_size: int = 64, return_infos: bool = False):
    """Sample ``num_samples`` responses (prompts cycled through the task's dataset; greedy: one per prompt), score
    them with the env, and return mean reward + the env's task metrics (``env.task_metrics``)."""
    rewards, infos = [], []
    for _, _, result in sample_and_score(env, model_path, num_samples, temperature, greedy, seed, dtype, batch_size):
        rewards.extend(result.rewards[result.valid].tolist())
        infos.extend(info for info, ok in zip(result.infos, result.valid) if ok)
    metrics = {"num_samples": len(rewards), "reward_mean": float(np.mean(rewards)) if rewards else float("nan"),
               **env.task_metrics(infos)}
    return (metrics, infos) if return_infos else metrics


def output_openings(env: TokenEnv, infos: Sequence[dict], top: int = 10, words: int = 1):
    """The most common openings of the policy's responses in scored ``infos`` (``envs.metrics.common_openings``), with
    how many of each succeeded for tasks with a notion of success (``env.episode_success``)."""
    if env.output_field is None:
        raise ValueError(f"{type(env).__name__} names no policy output (output_field) whose openings could be counted")
    outcomes = [env.episode_success(info) for info in infos]
    return common_openings([info[env.output_field] for info in infos],
                           None if any(o is None for o in outcomes) else outcomes, words=words, top=top)
