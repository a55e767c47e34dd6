"""One small adapter per replay-buffer implementation, all with the same operations.

Every adapter stores the same LunarLander-sized transition (``LUNAR_FIELDS``), is filled to
capacity through its fastest public path before timing, and exposes:

- ``insert_one(row)``: one transition (``row`` is a dict of per-transition values);
- ``insert_batch(batch)``: B transitions (``None`` in ``NATIVE_BATCH_INSERT=False`` adapters:
  the peer has no batch insert and the suite marks it instead of faking one);
- ``sample(batch_size)`` -> the indices to hand back to ``update``;
- ``update(indices, priorities)``.

Random numbers for priorities and targets are made by the caller, outside the timed region.
"""

from pal_bench.bench.adapters.base import LUNAR_FIELDS, BufferAdapter, lunar_batch, lunar_row
from pal_bench.bench.adapters.registry import ADAPTERS, available, make_adapter

__all__ = ["ADAPTERS", "LUNAR_FIELDS", "BufferAdapter", "available", "lunar_batch", "lunar_row", "make_adapter"]
