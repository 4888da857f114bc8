"""The newest synced weights, for searchers to load at the start of a generation call (``pull_weights=True``).

A searcher is a Ray actor that runs one call at a time: a weights request the driver sends at a sync waits behind
the generation calls queued before it, so without this board a sync reaches generation up to two calls later,
with the weights of the moment it was sent, and ``sync_every`` below the updates one call spans changes nothing
(docs/data_path.md). The board is a CPU-free actor that holds the object-store reference of the last sync's
weights; each generation call asks it first (one small remote call) and loads a newer version if there is one.
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0, max_restarts=-1)
class WeightsBoard:
    """``publish(key, [ref])`` at every sync, ``newer_than(key)`` -> ``(key, [ref])`` or None, where key =
    (epoch, version): the learner's epoch (+1 at every restore) and weights version. The reference travels inside a
    list, so Ray hands it on instead of resolving it: each searcher that loads the weights fetches them from the
    object store itself. A board restarted after a crash is empty until the next sync."""

    def __init__(self):
        self._key: tuple[int, int] | None = None
        self._holder: list | None = None

    def publish(self, key: tuple[int, int], holder: list) -> None:
        self._key, self._holder = tuple(key), holder

    def newer_than(self, key: tuple[int, int]) -> tuple[tuple[int, int], list] | None:
        if self._key is None or self._key <= tuple(key):
            return None
        return self._key, self._holder
