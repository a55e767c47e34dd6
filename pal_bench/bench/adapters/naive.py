"""A deliberately naive prioritized buffer: numpy arrays and an O(N) cumulative sum per sample.

Not a peer: it exists to show that the CI regression check fails when PAL's buffer is replaced by
a slower one (``tests/test_regression_check.py``).
"""

from __future__ import annotations

import numpy as np

from pal_bench.bench.adapters.base import ALPHA, BETA, LUNARLANDER, BufferAdapter
from pal_bench.workloads import Workload


class NaiveNumpyAdapter(BufferAdapter):
    name = "naive-numpy"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload, mode)
        self.data = {k: np.zeros((capacity, *shape), dtype) for k, (shape, dtype) in workload.fields.items()}
        self.prio = np.zeros(capacity)
        self.pos = 0
        self.size = 0
        self.max_p = 1.0
        self.rng = np.random.default_rng(0)
        self.fill()

    def insert_one(self, row: dict) -> None:
        for k, v in row.items():
            self.data[k][self.pos] = v
        self.prio[self.pos] = self.max_p**self.alpha
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def insert_batch(self, batch: dict) -> None:
        n = len(batch["act"])
        idx = (self.pos + np.arange(n)) % self.capacity
        for k, v in batch.items():
            self.data[k][idx] = v
        self.prio[idx] = self.max_p**self.alpha
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> np.ndarray:
        csum = np.cumsum(self.prio[: self.size])  # O(N) per call
        idx = np.searchsorted(csum, self.rng.random(batch_size) * csum[-1], side="right")
        _ = {k: v[idx] for k, v in self.data.items()}
        return idx

    def update(self, indices, priorities: np.ndarray) -> None:
        self.prio[indices] = (priorities + 1e-6) ** self.alpha
        self.max_p = max(self.max_p, float(priorities.max()))
