"""Novelty of a text against the texts an env has already scored (a reward term for spreading over modes).

    novelty(x) = clip(1 - max_{m in M} cos(e(x), e(m)), NOVELTY_FLOOR, 1)        (1 while M is empty)

``e`` is a unit-norm sentence embedding (all-MiniLM-L6-v2 by default, the one the diversity metrics use), ``M`` the
embeddings of the last ``capacity`` texts the caller asked to remember (the red-team env: its successes, or every
attack), in scoring order: within one batch a text is compared with the memory and with the batch's earlier
remembered texts, so two copies of a new success in one batch are not both new.
The floor keeps the log of an exact repeat finite and about as low as a failed attack's log toxicity (log 0.01).

The memory lives in the env instance that scores (one per searcher, or per vector sub-env) and starts empty in every
process; ``get_state``/``set_state`` carry it (the red-team env's state, saved per searcher in a TBA checkpoint).
Memories can share what they remember: ``take_news`` hands over the texts this memory remembered since its last call,
``absorb`` adds another memory's news (not handed on again by ``take_news``), ``merge_news`` joins two hand-overs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from envs.metrics import MINILM, embed

NOVELTY_FLOOR = 0.01


class NoveltyMemory:
    """``memory.score(texts, remember)`` -> novelty of each text (module docstring), then remembers the texts with
    ``remember[i]`` for the next calls; once ``capacity`` are held, each new one replaces the oldest."""

    def __init__(self, capacity: int = 4096, embedder: str = MINILM):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"novelty memory capacity must be a positive integer, got {capacity!r}")
        self.capacity, self.embedder = int(capacity), embedder
        self._memory: np.ndarray | None = None  # (capacity, dim) unit-norm rows, a ring: row _next is the oldest
        self._size = self._next = 0
        self._news: list[np.ndarray] = []  # rows this memory remembered itself since the last take_news

    def __len__(self) -> int:
        return self._size

    def score(self, texts: Sequence[str], remember: Sequence[bool]) -> np.ndarray:
        if len(texts) != len(remember):
            raise ValueError(f"novelty: {len(texts)} texts but {len(remember)} remember flags")
        if not len(texts):
            return np.zeros(0)
        emb = embed(texts, self.embedder)
        novelty = np.ones(len(texts))
        for i, keep in enumerate(remember):
            if self._size:
                novelty[i] = 1.0 - float((self._memory[:self._size] @ emb[i]).max())
            if keep:
                self._remember(emb[i])
                self._news.append(emb[i])
        del self._news[:-self.capacity]
        return np.clip(novelty, NOVELTY_FLOOR, 1.0)

    def _remember(self, row: np.ndarray) -> None:
        if self._memory is None:
            self._memory = np.empty((self.capacity, len(row)), dtype=np.float32)
        self._memory[self._next] = row
        self._next = (self._next + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def _remember_all(self, rows: np.ndarray) -> None:  # the newest ``capacity`` rows, oldest first
        for row in rows[-self.capacity:]:
            self._remember(row)

    def _rows(self, rows) -> dict:
        rows = np.asarray(rows, np.float32)[-self.capacity:] if len(rows) else np.zeros((0, 0), np.float32)
        return {"embedder": self.embedder, "embeddings": rows}

    def _check(self, state: dict, what: str) -> np.ndarray:
        if state["embedder"] != self.embedder:
            raise ValueError(f"novelty memory {what} was embedded with {state['embedder']!r}, this memory uses "
                             f"{self.embedder!r}")
        return np.asarray(state["embeddings"], np.float32)

    def take_news(self) -> dict:
        """The rows this memory remembered itself (not absorbed) since the last call, oldest first (at most
        ``capacity``), in ``get_state``'s form; the next call starts after them."""
        news, self._news = self._news, []
        return self._rows(news)

    def absorb(self, news: dict) -> None:
        """Remember another memory's news (``take_news`` / ``merge_news``) after what is held."""
        self._remember_all(self._check(news, "news"))

    def merge_news(self, older: dict, newer: dict) -> dict:
        """One hand-over of ``older``'s rows then ``newer``'s (the newest ``capacity``)."""
        rows = [r for news in (older, newer) for r in self._check(news, "news")]
        return self._rows(rows)

    def get_state(self) -> dict:
        """The remembered embeddings, oldest first (float32 rows), and the embedder that made them."""
        order = np.arange(self._next - self._size, self._next) % self.capacity
        return self._rows(self._memory[order] if self._size else [])

    def set_state(self, state: dict) -> None:
        """Remember ``state``'s embeddings (the newest ``capacity`` of them) in place of what is held."""
        rows = self._check(state, "state")
        self._size = self._next = 0
        self._remember_all(rows)
