"""Any buffer of the public protocol (``pal_bench.bench.protocol``) as an adapter the suites time: a user's
``module:Class``, an entry point of the group ``pal_bench.buffers``, and the peers' protocol classes
(``pal_bench.bench.peer_buffers``) are all measured through this one class, the same calls for each."""

from __future__ import annotations

import numpy as np

from pal_bench.bench.adapters.base import ALPHA, BETA, LUNARLANDER, BufferAdapter
from pal_bench.bench.protocol import has_single_add, is_prioritized
from pal_bench.workloads import Workload


class ProtocolAdapter(BufferAdapter):
    """``IMPL(capacity, workload.fields, alpha=alpha, seed=0)``, filled with ``add_batch``; ``insert_one`` is
    ``add(**row)`` (skipped by the suites when the class has no ``add``), ``insert_batch`` is ``add_batch``,
    ``sample`` is ``sample(B, beta)`` (its ``"indices"`` are handed to ``update``), ``update`` is
    ``update_priorities`` (nothing for a buffer that declares ``PRIORITIZED = False`` and has none)."""

    IMPL: type = object
    PRIORITIZED = True
    name = "protocol"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload, mode)
        kw = {"alpha": alpha} if self.PRIORITIZED else {}
        self.proto = self.buf = self.IMPL(capacity, dict(workload.fields), seed=0, **kw)
        self._update = getattr(self.proto, "update_priorities", None)
        self.fill()

    def insert_one(self, row: dict) -> None:
        self.proto.add(**row)

    def insert_batch(self, batch: dict) -> None:
        self.proto.add_batch(**batch)

    def sample(self, batch_size: int):
        return self.proto.sample(batch_size, self.beta)["indices"]

    def update(self, indices, priorities: np.ndarray) -> None:
        if self._update is not None:
            self._update(indices, priorities)


def protocol_adapter(impl: type, name: str) -> type[ProtocolAdapter]:
    """A ``ProtocolAdapter`` subclass for the protocol class ``impl``, named ``name`` in the results."""
    return type(f"ProtocolAdapter[{name}]", (ProtocolAdapter,), {
        "IMPL": impl, "name": name, "SINGLE_INSERT": has_single_add(impl), "PRIORITIZED": is_prioritized(impl),
        "NATIVE_BATCH_INSERT": bool(getattr(impl, "NATIVE_BATCH_INSERT", True)),
        "__doc__": f"{name} through the buffer protocol ({ProtocolAdapter.__doc__.split(',')[0]})"})
