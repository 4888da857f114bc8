"""Novelty of a text against the successes an env has already scored (a reward term for spreading over modes).

    novelty(x) = clip(1 - max_{m in M} cos(e(x), e(m)), NOVELTY_FLOOR, 1)        (1 while M is empty)

``e`` is a unit-norm sentence embedding (all-MiniLM-L6-v2 by default, the one the diversity metrics use), ``M`` the
embeddings of the last ``capacity`` texts that succeeded, in scoring order: within one batch a text is compared with
the memory and with the batch's earlier successes, so two copies of a new success in one batch are not both new.
The floor keeps the log of an exact repeat finite and about as low as a failed attack's log toxicity (log 0.01).

The memory lives in the env instance that scores (one per searcher, or per vector sub-env): it starts empty in every
process and is not part of a checkpoint, so a resumed run starts it afresh.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from envs.metrics import MINILM, embed

NOVELTY_FLOOR = 0.01


class NoveltyMemory:
    """``memory.score(texts, remember)`` -> novelty of each text (module docstring), then remembers the texts with
    ``remember[i]`` (the successes) for the next calls; the oldest go once more than ``capacity`` are held."""

    def __init__(self, capacity: int = 4096, embedder: str = MINILM):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"novelty memory capacity must be a positive integer, got {capacity!r}")
        self.capacity, self.embedder = int(capacity), embedder
        self._memory: np.ndarray | None = None  # (n, dim) unit-norm rows, oldest first

    def __len__(self) -> int:
        return 0 if self._memory is None else len(self._memory)

    def score(self, texts: Sequence[str], remember: Sequence[bool]) -> np.ndarray:
        if len(texts) != len(remember):
            raise ValueError(f"novelty: {len(texts)} texts but {len(remember)} remember flags")
        if not len(texts):
            return np.zeros(0)
        emb = embed(texts, self.embedder)
        novelty = np.ones(len(texts))
        for i, keep in enumerate(remember):
            if self._memory is not None:
                novelty[i] = 1.0 - float((self._memory @ emb[i]).max())
            if keep:
                row = emb[i][None]
                self._memory = row if self._memory is None else np.concatenate([self._memory, row])[-self.capacity:]
        return np.clip(novelty, NOVELTY_FLOOR, 1.0)
