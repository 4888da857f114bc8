"""TBA's replay buffer (docs/method.md §3): per-prompt groups, "most-on-policy" draws with probability m.

``sample(num_prompts=B, num_samples_per_prompt=K, m, reward_inv_temp)`` draws B prompt groups. For each, with
probability ``m`` a prompt whose samples arrived since the last weight sync (``mark_sync()``) and K of those fresh
samples uniformly (topped up with the prompt's newest older samples when fewer than K are fresh); otherwise any
prompt uniformly and K of its samples drawn with probability softmax(reward_inv_temp · reward) (0 = uniform), with
replacement, so the draw frequencies are exactly that softmax.

Capacity: ``capacity`` samples in all (eviction ``"fifo"``: oldest first, or ``"lowest_reward"``) and
``per_prompt_capacity`` per prompt (oldest first). Identical (prompt, completion) token sequences are stored once
(``dedup``). ``add`` and a draw are O(1) amortised in the buffer size (a draw scans one group, at most
``per_prompt_capacity`` samples); lowest-reward eviction is O(log n).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

EVICTION_POLICIES = ("fifo", "lowest_reward")


@dataclass(eq=False)
class TBSample:
    """One generated response. ``reward`` is r (never r/beta); ``weights_version`` the version of the weights that generated it."""

    prompt_key: int
    prompt_ids: tuple
    completion: np.ndarray
    reward: float
    weights_version: int
    sampler_logp: float = 0.0
    seq: int = -1
    alive: bool = field(default=True, repr=False)

    def dedup_key(self):
        return self.prompt_key, self.completion.tobytes()


class _KeySet:
    """A set with O(1) add, remove and uniform random choice."""

    def __init__(self):
        self.items: list = []
        self.pos: dict = {}

    def add(self, key):
        if key not in self.pos:
            self.pos[key] = len(self.items)
            self.items.append(key)

    def discard(self, key):
        i = self.pos.pop(key, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i

    def choice(self, rng: np.random.Generator):
        return self.items[int(rng.integers(len(self.items)))]

    def __len__(self):
        return len(self.items)

    def clear(self):
        self.items.clear()
        self.pos.clear()


class _Group:
    __slots__ = ("samples", "fresh")

    def __init__(self):
        self.samples: deque[TBSample] = deque()  # alive samples, oldest first
        self.fresh: list[TBSample] = []  # arrived since the last sync (may hold evicted ones: filtered on use)


class TBAReplayBuffer:
    def __init__(self, capacity: int = 100_000, per_prompt_capacity: int = 100, eviction: str = "fifo",
                 dedup: bool = True, seed: int | None = None):
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        if capacity < 1 or per_prompt_capacity < 1:
            raise ValueError("capacity and per_prompt_capacity must be >= 1")
        self.capacity, self.per_prompt_capacity = int(capacity), int(per_prompt_capacity)
        self.eviction, self.dedup = eviction, dedup
        self.rng = np.random.default_rng(seed)
        self._groups: dict[int, _Group] = {}
        self._keys, self._fresh_keys = _KeySet(), _KeySet()
        self._order: deque[TBSample] = deque()  # insertion order, lazily skips evicted samples (fifo)
        self._heap: list = []  # (reward, seq, sample) for lowest_reward eviction
        self._seen: set = set()
        self._seq = itertools.count()
        self._size = 0
        self.stats = {"added": 0, "duplicates": 0, "evicted": 0, "on_policy_draws": 0, "off_policy_draws": 0,
                      "on_policy_fallbacks": 0}

    def __len__(self) -> int:
        return self._size

    @property
    def num_prompts(self) -> int:
        return len(self._keys)

    # ---- adding and evicting -----------------------------------------------------------------------------------
    def add(self, samples: Iterable[TBSample]) -> int:
        """Store samples; returns how many were new (duplicates are counted in ``stats['duplicates']``)."""
        added = 0
        for s in samples:
            if self.dedup:
                key = s.dedup_key()
                if key in self._seen:
                    self.stats["duplicates"] += 1
                    continue
                self._seen.add(key)
            s.seq, s.alive = next(self._seq), True
            group = self._groups.get(s.prompt_key)
            if group is None:
                group = self._groups[s.prompt_key] = _Group()
                self._keys.add(s.prompt_key)
            group.samples.append(s)
            group.fresh.append(s)
            self._fresh_keys.add(s.prompt_key)
            self._order.append(s)
            if self.eviction == "lowest_reward":
                heapq.heappush(self._heap, (s.reward, s.seq, s))
            self._size += 1
            added += 1
            if len(group.samples) > self.per_prompt_capacity:
                self._remove(group.samples[0])
            while self._size > self.capacity:
                self._remove(self._next_victim())
        self.stats["added"] += added
        return added

    def _next_victim(self) -> TBSample:
        if self.eviction == "fifo":
            while not self._order[0].alive:
                self._order.popleft()
            return self._order[0]
        while not self._heap[0][2].alive:
            heapq.heappop(self._heap)
        return self._heap[0][2]

    def _remove(self, s: TBSample) -> None:
        group = self._groups[s.prompt_key]
        if group.samples[0] is s:
            group.samples.popleft()
        else:  # lowest-reward eviction: anywhere in the group (bounded by per_prompt_capacity)
            group.samples.remove(s)
        s.alive = False
        self._size -= 1
        self.stats["evicted"] += 1
        if self.dedup:
            self._seen.discard(s.dedup_key())
        if not group.samples:
            del self._groups[s.prompt_key]
            self._keys.discard(s.prompt_key)
            self._fresh_keys.discard(s.prompt_key)
        # keep the lazy structures from growing without bound
        if len(self._order) > 2 * self.capacity + 16:
            self._order = deque(x for x in self._order if x.alive)
        if len(self._heap) > 2 * self.capacity + 16:
            self._heap = [x for x in self._heap if x[2].alive]
            heapq.heapify(self._heap)

    def mark_sync(self) -> None:
        """New weights reached the searchers: from now on only newer arrivals count as most-on-policy."""
        for key in self._fresh_keys.items:
            self._groups[key].fresh = []
        self._fresh_keys.clear()

    # ---- sampling ----------------------------------------------------------------------------------------------
    def sample(self, num_prompts: int, num_samples_per_prompt: int, m: float, reward_inv_temp: float = 0.0
               ) -> tuple[list[TBSample], np.ndarray, np.ndarray]:
        """B groups of K samples. Returns (samples, group id per sample, on-policy flag per sample)."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        out, groups, on_policy = [], [], []
        k = num_samples_per_prompt
        for _ in range(num_prompts):
            fresh = None
            if self.rng.random() < m:
                while len(self._fresh_keys):
                    key = self._fresh_keys.choice(self.rng)
                    group = self._groups[key]
                    fresh = [s for s in group.fresh if s.alive]
                    if fresh:
                        group.fresh = fresh
                        break
                    self._fresh_keys.discard(key)
                    fresh = None
                if fresh is None:
                    self.stats["on_policy_fallbacks"] += 1
            if fresh is not None:
                chosen = self._on_policy_pick(group, fresh, k)
                self.stats["on_policy_draws"] += 1
            else:
                key = self._keys.choice(self.rng)
                chosen = self._reward_pick(self._groups[key], k, reward_inv_temp)
                self.stats["off_policy_draws"] += 1
            out.extend(chosen)
            groups.extend([key] * len(chosen))
            on_policy.extend([fresh is not None] * len(chosen))
        return out, np.asarray(groups, dtype=np.int64), np.asarray(on_policy, dtype=bool)

    def _on_policy_pick(self, group: _Group, fresh: list[TBSample], k: int) -> list[TBSample]:
        if len(fresh) >= k:
            return [fresh[i] for i in self.rng.choice(len(fresh), size=k, replace=False)]
        fresh_ids = {id(s) for s in fresh}
        older = [s for s in reversed(group.samples) if id(s) not in fresh_ids][: k - len(fresh)]
        chosen = fresh + older
        if len(chosen) < k:  # the prompt has fewer than K samples in all: repeat some
            chosen += [chosen[i] for i in self.rng.integers(len(chosen), size=k - len(chosen))]
        return chosen

    def _reward_pick(self, group: _Group, k: int, inv_temp: float) -> list[TBSample]:
        samples = group.samples
        if inv_temp == 0.0:
            idx = self.rng.integers(len(samples), size=k)
        else:
            logits = inv_temp * np.fromiter((s.reward for s in samples), np.float64, len(samples))
            p = np.exp(logits - logits.max())
            idx = self.rng.choice(len(samples), size=k, p=p / p.sum())
        return [samples[int(i)] for i in idx]

    # ---- checkpointing -----------------------------------------------------------------------------------------
    def get_state(self) -> dict:
        alive = sorted((s for g in self._groups.values() for s in g.samples), key=lambda s: s.seq)
        fresh = {s.seq for g in self._groups.values() for s in g.fresh if s.alive}
        return {
            "samples": [(s.prompt_key, s.prompt_ids, s.completion, s.reward, s.weights_version, s.sampler_logp, s.seq in fresh)
                        for s in alive],
            "stats": dict(self.stats),
            "rng": self.rng.bit_generator.state,
            # the draw order of prompts depends on these lists' order: keep it, so draws resume identically
            "keys": list(self._keys.items),
            "fresh_keys": list(self._fresh_keys.items),
        }

    def set_state(self, state: dict) -> None:
        self.__init__(self.capacity, self.per_prompt_capacity, self.eviction, self.dedup)
        stats = state["stats"]
        samples = [TBSample(k, tuple(p), np.asarray(c), float(r), int(v), float(lp)) for k, p, c, r, v, lp, _ in state["samples"]]
        self.add(samples)
        self.mark_sync()
        for s, (*_, was_fresh) in zip(samples, state["samples"]):
            if was_fresh:
                self._groups[s.prompt_key].fresh.append(s)
                self._fresh_keys.add(s.prompt_key)
        for keyset, items in ((self._keys, state["keys"]), (self._fresh_keys, state["fresh_keys"])):
            keyset.items = list(items)
            keyset.pos = {k: i for i, k in enumerate(keyset.items)}
        self.stats = dict(stats)
        self.rng.bit_generator.state = state["rng"]
