"""Which adapters exist, and which of them can be imported here."""

from __future__ import annotations

import importlib

from pal_bench.adapters.base import BufferAdapter

# name -> "module:Class"; peers are imported only when asked for (``import ray`` costs seconds)
ADAPTERS: dict[str, str] = {
    "pal": "pal_bench.adapters.pal:PalAdapter",
    "pal-uniform": "pal_bench.adapters.pal:PalUniformAdapter",
}


def adapter_class(name: str) -> type[BufferAdapter]:
    if name not in ADAPTERS:
        raise ValueError(f"unknown buffer {name!r}; known: {sorted(ADAPTERS)}")
    module, cls = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def available(name: str) -> str | None:
    """None when the adapter can be used here, else why not (e.g. the peer is not installed)."""
    try:
        adapter_class(name)
    except ImportError as e:
        return f"not installed: {e}"
    return None


def make_adapter(name: str, capacity: int, **kwargs) -> BufferAdapter:
    """An adapter of ``name`` filled to ``capacity``."""
    return adapter_class(name)(capacity, **kwargs)
