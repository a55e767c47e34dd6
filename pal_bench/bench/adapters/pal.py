"""PAL-Bench's own buffers."""

from __future__ import annotations

import numpy as np

from pal_bench import DEFAULT_FANOUT, PrioritizedReplayBuffer, ReplayBuffer, SumTree
from pal_bench.bench.adapters.base import ALPHA, BETA, LUNARLANDER, BufferAdapter
from pal_bench.frame_replay import FrameReplayBuffer
from pal_bench.workloads import Workload


class PalAdapter(BufferAdapter):
    """``pal_bench.PrioritizedReplayBuffer`` (K-ary sum tree, default fan-out unless given); in the memory modes
    ``next-ref`` and ``stack``, ``pal_bench.frame_replay.FrameReplayBuffer`` over it (one stream, so a fill chunk is
    one segment per episode)."""

    name = "pal"
    MODES = ("full", "next-ref", "stack")
    PRIORITIZED = True
    SHARED = False

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, fanout: int = DEFAULT_FANOUT,
                 workload: Workload = LUNARLANDER, mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload, mode)
        if mode == "full":
            cls = PrioritizedReplayBuffer if self.PRIORITIZED else ReplayBuffer
            kw = dict(alpha=alpha, fanout=fanout) if self.PRIORITIZED else {}
            self.buf = cls(capacity, workload.fields, seed=0, shared=self.SHARED, **kw)
        else:
            self.buf = FrameReplayBuffer(capacity, **workload.buffer_kwargs(mode), prioritized=self.PRIORITIZED,
                                         alpha=alpha, fanout=fanout, seed=0, shared=self.SHARED)
        self.fill()

    def fill(self, chunk: int = 50_000) -> None:
        if self.mode == "full":
            return super().fill(chunk)
        # a segment adds k rows beside its steps: insert until every row of the ring is used
        chunk = min(self.fill_chunk_rows(chunk), max(1, self.capacity // 4))
        seed = 0
        while len(self.buf) < self.capacity:
            self._fill_chunk(self.workload.batch(chunk, seed=seed))
            seed += chunk

    def transitions(self) -> int:
        return self.capacity if self.mode == "full" else self.buf.transitions()

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
    SHARED = True


class PalOutAdapter(PalAdapter):
    """``PrioritizedReplayBuffer.sample(B, out=batch)``: the same buffer, sampling into one dict of arrays a learner
    keeps (no allocation), beside the default call."""

    name = "pal-out"
    MODES = ("full",)

    def sample(self, batch_size: int) -> np.ndarray:
        out = getattr(self, "_out", None)
        if out is None or len(out["indices"]) != batch_size:
            out = self._out = self.buf.sample(batch_size, beta=self.beta)
        return self.buf.sample(batch_size, beta=self.beta, out=out)["indices"]


class PalUniformAdapter(PalAdapter):
    """``pal_bench.ReplayBuffer``: uniform sampling, no tree; the floor of a buffer's cost."""

    name = "pal-uniform"
    PRIORITIZED = False

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload=workload, mode=mode)


class PalTreeAdapter(BufferAdapter):
    """``pal_bench.SumTree`` alone (default fan-out): the tree's share of the buffer's cost.

    ``sample`` is ``find`` on B prefix-sum targets (stratified fractions drawn in advance and cycled
    from a pool, as the priorities are, times the current total: one numpy multiply), with no
    weights and no gather, but with ``SumTree.find``'s Python-level validation of the targets;
    ``update`` writes B leaf values. A tree stores no transitions, so it has no insert.
    """

    name = "pal-tree"
    NATIVE_BATCH_INSERT = False
    INSERTS = False
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
