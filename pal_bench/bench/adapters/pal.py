"""PAL-Bench's own buffers."""

from __future__ import annotations

import numpy as np

from pal_bench import DEFAULT_FANOUT, PrioritizedReplayBuffer, ReplayBuffer, SumTree
from pal_bench.bench.adapters.base import ALPHA, BETA, LUNAR_FIELDS, BufferAdapter


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


class PalSharedAdapter(PalAdapter):
    """``PrioritizedReplayBuffer(..., shared=True)`` used from the process that created it: the cost of
    living in a named shared-memory segment (suites/test_shared_vs_private.py)."""

    name = "pal-shared"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, fanout: int = DEFAULT_FANOUT):
        BufferAdapter.__init__(self, capacity, alpha, beta)
        self.buf = PrioritizedReplayBuffer(capacity, LUNAR_FIELDS, alpha=alpha, fanout=fanout, seed=0, shared=True)
        self.fill()


class PalUniformAdapter(PalAdapter):
    """``pal_bench.ReplayBuffer``: uniform sampling, no tree; the floor of a buffer's cost."""

    name = "pal-uniform"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        BufferAdapter.__init__(self, capacity, alpha, beta)
        self.buf = ReplayBuffer(capacity, LUNAR_FIELDS, seed=0)
        self.fill()


class PalTreeAdapter(BufferAdapter):
    """``pal_bench.SumTree`` alone (default fan-out): the tree's share of the buffer's cost.

    ``sample`` is ``find`` on B prefix-sum targets (stratified fractions drawn in advance and cycled
    from a pool, as the priorities are, times the current total: one numpy multiply), with no
    weights and no gather, but with ``SumTree.find``'s Python-level validation of the targets;
    ``update`` writes B leaf values. A tree stores no transitions, so it has no insert.
    """

    name = "pal-tree"
    NATIVE_BATCH_INSERT = False
    POOL = 64

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, fanout: int = DEFAULT_FANOUT):
        super().__init__(capacity, alpha, beta)
        self.tree = SumTree(capacity, fanout)
        self.fill()
        self._targets: dict[int, list[np.ndarray]] = {}
        self._i = 0

    def fill(self, chunk: int = 0) -> None:
        rng = np.random.default_rng(0)
        self.tree.update(np.arange(self.capacity), (rng.random(self.capacity) * 2 + 1e-6) ** self.alpha)

    def insert_one(self, row: dict) -> None:
        raise NotImplementedError("a sum tree alone stores no transitions")

    def sample(self, batch_size: int) -> np.ndarray:
        pool = self._targets.get(batch_size)
        if pool is None:
            rng = np.random.default_rng(batch_size)
            # stratified, sorted fractions, as the buffer draws them
            pool = self._targets[batch_size] = [(np.arange(batch_size) + rng.random(batch_size)) / batch_size
                                                for _ in range(self.POOL)]
        self._i = (self._i + 1) % self.POOL
        return self.tree.find(pool[self._i] * self.tree.total())

    def update(self, indices, priorities: np.ndarray) -> None:
        self.tree.update(indices, priorities)
