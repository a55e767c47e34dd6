"""The adapter interface and the LunarLander-sized transition every adapter stores."""

from __future__ import annotations

import numpy as np

from pal_bench.workloads import WORKLOADS, Workload

LUNARLANDER = WORKLOADS["lunarlander"]
# LunarLander-v3: 8-float observation, discrete action, reward, next observation, done flag.
LUNAR_FIELDS = LUNARLANDER.fields
ALPHA = 0.6
BETA = 0.4


def lunar_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` random LunarLander-sized transitions as a struct of arrays."""
    return LUNARLANDER.batch(n, seed)


def lunar_row(seed: int = 0) -> dict:
    """One transition as an environment loop hands it over: arrays for observations, Python
    scalars for action, reward and done."""
    b = lunar_batch(1, seed)
    return {"obs": b["obs"][0], "act": int(b["act"][0]), "rew": float(b["rew"][0]),
            "next_obs": b["next_obs"][0], "done": bool(b["done"][0])}


class BufferAdapter:
    """Base class: subclasses build ``self.buf`` in ``__init__`` and fill it to ``capacity`` with rows of
    ``workload`` (default LunarLander), stored in memory mode ``mode`` (``pal_bench.workloads.MODES``)."""

    name = "abstract"
    #: False when the peer has no batch insert in its public API
    NATIVE_BATCH_INSERT = True
    #: False for what stores no transitions (the tree alone, the bandwidth floor): no insert cases
    INSERTS = True
    #: False when the implementation has no one-transition insert (the protocol's ``add`` is optional)
    SINGLE_INSERT = True
    #: largest capacity this adapter is run at, with the reason (None: no limit)
    MAX_CAPACITY: tuple[int, str] | None = None
    #: the same limit for the quick sweep
    QUICK_MAX_CAPACITY: tuple[int, str] | None = None
    #: the memory modes this implementation has (``full``: every field of every row as given)
    MODES: tuple[str, ...] = ("full",)
    #: rows generated per fill call are capped at this many bytes (Atari rows are 56 KB)
    FILL_CHUNK_BYTES = 64 << 20

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        if mode not in self.MODES or mode not in workload.modes:
            have = [m for m in self.MODES if m in workload.modes]
            raise ValueError(f"{self.name} has no memory mode {mode!r} for {workload.name} (it has {have})")
        self.capacity = capacity
        self.alpha = alpha
        self.beta = beta
        self.workload = workload
        self.mode = mode

    def insert_one(self, row: dict) -> None:
        raise NotImplementedError

    def insert_batch(self, batch: dict) -> None:
        raise NotImplementedError

    def sample(self, batch_size: int):
        raise NotImplementedError

    def update(self, indices, priorities: np.ndarray) -> None:
        raise NotImplementedError

    def transitions(self) -> int:
        """Transitions held (that can be drawn): the capacity unless the mode stores extra rows."""
        return self.capacity

    def fill_chunk_rows(self, chunk: int = 50_000) -> int:
        return max(1, min(chunk, self.FILL_CHUNK_BYTES // self.workload.row_bytes))

    def fill(self, chunk: int = 50_000) -> None:
        """Fill to capacity through the fastest public path (batch insert when there is one)."""
        done = 0
        chunk = self.fill_chunk_rows(chunk)
        while done < self.capacity:
            n = min(chunk, self.capacity - done)
            self._fill_chunk(self.workload.batch(n, seed=done))
            done += n

    def _fill_chunk(self, batch: dict) -> None:
        self.insert_batch(batch)
