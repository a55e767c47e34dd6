"""Which adapters exist, and which of them can be imported here."""

from __future__ import annotations

import importlib

from pal_bench.bench.adapters.base import BufferAdapter

# name -> "module:Class"; peers are imported only when asked for (``import ray`` costs seconds)
ADAPTERS: dict[str, str] = {
    "pal": "pal_bench.bench.adapters.pal:PalAdapter",
    "pal-uniform": "pal_bench.bench.adapters.pal:PalUniformAdapter",
    "cpprb": "pal_bench.bench.adapters.peers:CpprbAdapter",
    "tianshou": "pal_bench.bench.adapters.peers:TianshouAdapter",
    "rllib": "pal_bench.bench.adapters.peers:RllibTimestepAdapter",
    "rllib-episode": "pal_bench.bench.adapters.rllib_episode:RllibEpisodeAdapter",
    "sb3": "pal_bench.bench.adapters.peers:Sb3Adapter",
}
# implementations that exist for tests only and are not part of the default sweep
TEST_ONLY: dict[str, str] = {"naive-numpy": "pal_bench.bench.adapters.naive:NaiveNumpyAdapter"}
# parts of PAL's buffer measured on their own (suites/test_tree_vs_buffer.py), not buffers
COMPONENTS: dict[str, str] = {"pal-tree": "pal_bench.bench.adapters.pal:PalTreeAdapter",
                              "pal-shared": "pal_bench.bench.adapters.pal:PalSharedAdapter",
                              "pal-out": "pal_bench.bench.adapters.pal:PalOutAdapter",
                              "floor-gather": "pal_bench.bench.adapters.floor:FloorGatherAdapter"}


def adapter_class(name: str) -> type[BufferAdapter]:
    path = ADAPTERS.get(name) or TEST_ONLY.get(name) or COMPONENTS.get(name)
    if path is None:
        raise ValueError(f"unknown buffer {name!r}; known: {sorted(ADAPTERS)}")
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)


def available(name: str) -> str | None:
    """None when the adapter can be used here, else why not (e.g. the peer is not installed)."""
    import importlib.util

    needs = {"cpprb": "cpprb", "tianshou": "tianshou", "rllib": "ray", "rllib-episode": "ray",
             "sb3": "stable_baselines3"}.get(name)
    if needs and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed (pip install -e '.[peers]')"
    adapter_class(name)
    return None


def make_adapter(name: str, capacity: int, **kwargs) -> BufferAdapter:
    """An adapter of ``name`` filled to ``capacity``."""
    return adapter_class(name)(capacity, **kwargs)
