"""Preference tuning (TL;DR summarisation): the policy summarises a post; a reward model scores the summary.

Data: a jsonl file of ``{"post": str, "summary": str (optional reference)}`` rows (``dataset`` key). No TL;DR data
exists offline; ``envs/data/tldr_standin.jsonl`` is a small generated STAND-IN so the code path runs.

Reward (``reward_model`` key): any HF sequence-classification reward model id/path (scored on prompt + summary,
logit of its single output, or of the last label), or ``"standin-rouge1"``: unigram F1 against the row's reference
summary. The latter is a STAND-IN for tests and CPU demos, not a preference model.
A completion without EOS gets ``no_eos_reward`` (-1, as in the paper).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from envs.models import explain_model_errors
from envs.token_env import Prompt, TokenEnv, read_jsonl

STANDIN_DATA = str(Path(__file__).parent / "data" / "tldr_standin.jsonl")
STANDIN_REWARD = "standin-rouge1"
DEFAULT_TEMPLATE = "{post}\nTL;DR:"


def rouge1_f1(candidate: str, reference: str) -> float:
    """Unigram-overlap F1 of lower-cased word tokens (ROUGE-1 F without stemming)."""
    c = Counter(re.findall(r"\w+", candidate.lower()))
    r = Counter(re.findall(r"\w+", reference.lower()))
    overlap = sum((c & r).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(c.values()), overlap / sum(r.values())
    return 2 * precision * recall / (precision + recall)


class TLDREnv(TokenEnv):
    output_field = "summary"
    default_config = {
        **TokenEnv.default_config,
        "max_new_tokens": 48,
        "dataset": STANDIN_DATA,
        "reward_model": STANDIN_REWARD,
        "no_eos_reward": -1.0,
        "template": DEFAULT_TEMPLATE,
        "rm_batch_size": 16,
    }

    def __init__(self, config: dict | None = None, render_mode: str | None = None):
        super().__init__(config, render_mode)
        name = self.config["reward_model"]
        self._rm = None if name == STANDIN_REWARD else self._load_reward_model(name)

    def _load_prompts(self) -> list[Prompt]:
        path = self.config["dataset"]
        prompts = []
        for lineno, row in read_jsonl(path):
            if not isinstance(row, dict) or not isinstance(row.get("post"), str):
                raise ValueError(f"{path}: line {lineno} needs a string 'post', got {row!r:.200}")
            if "summary" in row and not isinstance(row["summary"], str):
                raise ValueError(f"{path}: line {lineno}: 'summary' must be a string")
            text = self.render_user_prompt(self.config["template"].format(post=row["post"].strip()))
            prompts.append(self.make_prompt(len(prompts), text, post=row["post"], summary=row.get("summary")))
        if self.config["reward_model"] == STANDIN_REWARD:
            missing = [p.index for p in prompts if not p.meta["summary"]]
            if missing:
                raise ValueError(f"{path}: reward_model={STANDIN_REWARD!r} needs a reference 'summary' in every row; "
                                 f"rows without one: {missing[:10]}")
        return prompts

    @staticmethod
    def _load_reward_model(name: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        with explain_model_errors(name, f"reward_model (use {STANDIN_REWARD!r} or an HF sequence-classification model)"):
            tokenizer = AutoTokenizer.from_pretrained(name)
            model = AutoModelForSequenceClassification.from_pretrained(name).eval()
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, model

    def _rm_scores(self, texts: list[str]) -> list[float]:
        import torch

        tokenizer, model = self._rm
        scores = []
        bs = self.config["rm_batch_size"]
        with torch.no_grad():
            for i in range(0, len(texts), bs):
                enc = tokenizer(texts[i:i + bs], padding=True, truncation=True, return_tensors="pt")
                scores.extend(model(**enc).logits[:, -1].float().tolist())
        return scores

    def _score(self, prompts, completions):
        summaries = [self.decode(c) for c in completions]
        if self._rm is None:
            raw = [rouge1_f1(s, p.meta["summary"]) for s, p in zip(summaries, prompts)]
        else:
            raw = self._rm_scores([p.meta["post"] + "\nTL;DR: " + s for s, p in zip(summaries, prompts)])
        rewards, infos = [], []
        for s, c, r in zip(summaries, completions, raw):
            eos = self.ends_with_eos(c)
            rewards.append(r if eos else self.config["no_eos_reward"])
            infos.append({"summary": s, "eos": eos, "rm_score": r})
        return rewards, infos
