"""The memory-bandwidth floor as an implementation the latency suites time beside the buffers."""

from __future__ import annotations

import numpy as np

from pal_bench.bench.adapters.base import ALPHA, BETA, LUNARLANDER, BufferAdapter
from pal_bench.bench.gather_floor import gather
from pal_bench.workloads import Workload


class FloorGatherAdapter(BufferAdapter):
    """``capacity`` rows of the workload's size (every field of a transition stored in full: ``row_bytes``) in one
    C-contiguous array; ``sample`` copies B random rows into one preallocated destination in plain C
    (``pal_bench.bench.gather_floor``), ``update`` does nothing. What a buffer's sample+update cannot beat when its
    cost is moving rows; the tree's own floor is ``python -m pal_bench.bench.floor``. Random indices are drawn in
    advance and cycled from a pool, as the suites' priorities are."""

    name = "floor-gather"
    NATIVE_BATCH_INSERT = False
    INSERTS = False
    PRIORITIZED = False
    POOL = 64

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload, mode)
        self.records = np.empty((capacity, workload.row_bytes), dtype=np.uint8)
        self.fill()
        self._out: dict[int, np.ndarray] = {}
        rng = np.random.default_rng(0)
        self._pool = [rng.integers(0, capacity, 4096) for _ in range(self.POOL)]
        self._i = 0

    def fill(self, chunk: int = 0) -> None:
        self.records.fill(1)                 # every page written, as a filled buffer's are

    def insert_one(self, row: dict) -> None:
        raise NotImplementedError("the floor stores nothing")

    def sample(self, batch_size: int) -> np.ndarray:
        out = self._out.get(batch_size)
        if out is None:
            out = self._out[batch_size] = np.empty((batch_size, self.records.shape[1]), dtype=np.uint8)
        self._i = (self._i + 1) % self.POOL
        idx = self._pool[self._i][:batch_size]
        gather(self.records, idx, out)
        return idx

    def update(self, indices, priorities: np.ndarray) -> None:
        pass
