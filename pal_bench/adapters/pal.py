"""PAL-Bench's own buffers."""

from __future__ import annotations

import numpy as np

from pal_bench import DEFAULT_FANOUT, PrioritizedReplayBuffer, ReplayBuffer
from pal_bench.adapters.base import ALPHA, BETA, LUNAR_FIELDS, BufferAdapter


class PalAdapter(BufferAdapter):
    """``pal_bench.PrioritizedReplayBuffer`` (K-ary sum tree, default fan-out unless given)."""

    name = "pal"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, fanout: int = DEFAULT_FANOUT):
        super().__init__(capacity, alpha, beta)
        self.buf = PrioritizedReplayBuffer(capacity, LUNAR_FIELDS, alpha=alpha, fanout=fanout, seed=0)
        self.fill()

    def insert_one(self, row: dict) -> None:
        self.buf.add(**row)

    def insert_batch(self, batch: dict) -> None:
        self.buf.add_batch(**batch)

    def sample(self, batch_size: int) -> np.ndarray:
        return self.buf.sample(batch_size, beta=self.beta)["indices"]

    def update(self, indices, priorities: np.ndarray) -> None:
        self.buf.update_priorities(indices, priorities)


class PalUniformAdapter(PalAdapter):
    """``pal_bench.ReplayBuffer``: uniform sampling, no tree; the floor of a buffer's cost."""

    name = "pal-uniform"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        BufferAdapter.__init__(self, capacity, alpha, beta)
        self.buf = ReplayBuffer(capacity, LUNAR_FIELDS, seed=0)
        self.fill()
