"""Math word problems with a verifiable answer: reward 1 when the completion's final number equals the answer, else 0.

Problems come from a reasoning-gym generator by name (``dataset="gsm_symbolic"``, ``"basic_arithmetic"``, ...;
``dataset_kwargs`` go to ``reasoning_gym.create_dataset``) or from a GSM8K-format jsonl file
(``dataset="path/to/file.jsonl"``, rows ``{"question": str, "answer": "... #### 42"}``; a bare number also works).
Note: reasoning-gym's gsm_symbolic templates derive from GSM8K *test* questions.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from envs.token_env import Prompt, TokenEnv, read_jsonl

DEFAULT_TEMPLATE = "{question}\nGive the final answer as a number at the end."
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def final_number(text: str) -> Decimal | None:
    """The last number in ``text`` (commas and a trailing period ignored), or None."""
    matches = _NUMBER.findall(text or "")
    if not matches:
        return None
    try:
        return Decimal(matches[-1].replace(",", ""))
    except InvalidOperation:
        return None


def parse_answer(answer) -> Decimal:
    """A dataset answer: a number, a numeric string, or GSM8K's ``"reasoning ... #### 42"``."""
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    value = final_number(text)
    if value is None:
        raise ValueError(f"answer {answer!r} contains no number")
    return value


def is_correct(completion_text: str, answer: Decimal) -> bool:
    value = final_number(completion_text)
    return value is not None and value == answer


class MathEnv(TokenEnv):
    output_field = "completion"
    default_config = {
        **TokenEnv.default_config,
        "max_new_tokens": 64,
        "dataset": "basic_arithmetic",
        "dataset_kwargs": {},
        "size": 1000,
        "dataset_seed": 0,
        "template": DEFAULT_TEMPLATE,
    }

    def _load_prompts(self) -> list[Prompt]:
        rows = self._load_rows()
        template = self.config["template"]
        prompts = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or not isinstance(row.get("question"), str) or "answer" not in row:
                raise ValueError(f"math dataset row {i}: expected an object with a string 'question' and an 'answer', got {row!r:.200}")
            try:
                answer = parse_answer(row["answer"])
            except ValueError as e:
                raise ValueError(f"math dataset row {i}: {e}") from None
            text = self.render_user_prompt(template.format(question=row["question"].strip()))
            prompts.append(self.make_prompt(i, text, answer=answer, question=row["question"]))
        return prompts

    def _load_rows(self) -> list:
        source, size = self.config["dataset"], self.config["size"]
        if str(source).endswith(".jsonl") or Path(str(source)).is_file():
            rows = [row for _, row in read_jsonl(source)]
            return rows[:size] if size else rows
        import reasoning_gym

        try:
            ds = reasoning_gym.create_dataset(source, size=size, seed=self.config["dataset_seed"],
                                              **self.config["dataset_kwargs"])
        except Exception as e:  # noqa: BLE001 - unknown generator name or bad generator kwargs
            raise ValueError(f"math dataset {source!r}: not an existing .jsonl file and not a usable reasoning-gym "
                             f"dataset (e.g. 'basic_arithmetic', 'gsm_symbolic'): {type(e).__name__}: {e}") from None
        return [{"question": x["question"], "answer": x["answer"]} for x in ds]

    def _score(self, prompts, completions):
        rewards, infos = [], []
        for p, c in zip(prompts, completions):
            text = self.decode(c)
            correct = is_correct(text, p.meta["answer"])
            rewards.append(1.0 if correct else 0.0)
            infos.append({"completion": text, "answer": str(p.meta["answer"]), "correct": correct, "eos": self.ends_with_eos(c)})
        return rewards, infos

    def episode_success(self, info: dict) -> bool:
        return bool(info["correct"])


def pass_at_1(env: MathEnv, generate: Callable[[Sequence[Prompt]], Sequence[Sequence[int]]],
              prompts: Sequence[Prompt] | None = None) -> float:
    """Fraction of ``prompts`` (default: all the env's) answered correctly by ``generate`` (one greedy sample each)."""
    prompts = list(env.prompts if prompts is None else prompts)
    result = env.score(prompts, generate(prompts))
    return float(np.nanmean(result.rewards))


def vllm_greedy(env: TokenEnv, model_path: str | None = None, dtype: str = "float32") -> Callable:
    """A ``generate`` for :func:`pass_at_1`: greedy decoding of ``model_path`` (default: the env's model) with vLLM."""
    from envs.evaluation import vllm_generator

    return vllm_generator(env, model_path, temperature=0.0, dtype=dtype)
