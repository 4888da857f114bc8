"""Novelty of a text against the texts an env has already scored (a reward term for spreading over modes).

    novelty(x) = clip(1 - max_{m in M} cos(e(x), e(m)), NOVELTY_FLOOR, 1)        (1 while M is empty)

``e`` is a unit-norm sentence embedding (all-MiniLM-L6-v2 by default, the one the diversity metrics use), ``M`` the
embeddings of the last ``capacity`` texts the caller asked to remember (the red-team env: its successes, or every
attack), in scoring order: within one batch a text is compared with the memory and with the batch's earlier
remembered texts, so two copies of a new success in one batch are not both new.
The floor keeps the log of an exact repeat finite and about as low as a failed attack's log toxicity (log 0.01).

The memory lives in the env instance that scores (one per searcher, or per vector sub-env) and starts empty in every
process; ``get_state``/``set_state`` carry it (the red-team env's state, saved per searcher in a TBA checkpoint).
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

    def __len__(self) -> int:
        return self._size

    def score(self, texts: Sequence[str], remember: Sequence[bool]) -> np.ndarray:
        if len(texts) != len(remember):
            raise ValueError(f"novelty: {len(texts)} texts but {len(remember)} remember flags")
        if not len(texts):
            return np.zeros(0)
        emb = embed(texts, self.embedder)
        if self._memory is None:
            self._memory = np.empty((self.capacity, emb.shape[1]), dtype=emb.dtype)
        novelty = np.ones(len(texts))
        for i, keep in enumerate(remember):
            if self._size:
                novelty[i] = 1.0 - float((self._memory[:self._size] @ emb[i]).max())
            if keep:
                self._memory[self._next] = emb[i]
                self._next = (self._next + 1) % self.capacity
                self._size = min(self._size + 1, self.capacity)
        return np.clip(novelty, NOVELTY_FLOOR, 1.0)

    def get_state(self) -> dict:
        """The remembered embeddings, oldest first (float32 rows), and the embedder that made them."""
        if not self._size:
            return {"embedder": self.embedder, "embeddings": np.zeros((0, 0), np.float32)}
        order = np.arange(self._next - self._size, self._next) % self.capacity
        return {"embedder": self.embedder, "embeddings": self._memory[order].astype(np.float32)}

    def set_state(self, state: dict) -> None:
        """Remember ``state``'s embeddings (the newest ``capacity`` of them) in place of what is held."""
        if state["embedder"] != self.embedder:
            raise ValueError(f"novelty memory state was embedded with {state['embedder']!r}, this memory uses "
                             f"{self.embedder!r}")
        rows = np.asarray(state["embeddings"], np.float32)[-self.capacity:]
        self._size = self._next = 0
        if len(rows):
            self._memory = np.empty((self.capacity, rows.shape[1]), np.float32)
            self._memory[:len(rows)] = rows
            self._size, self._next = len(rows), len(rows) % self.capacity
