"""Which adapters exist, and which of them can be imported here.

A name is a built-in adapter (``ADAPTERS``, ``TEST_ONLY``, ``COMPONENTS``), a name registered in the entry-point
group ``pal_bench.buffers``, or ``module:Class``: the last two are classes of the public buffer protocol
(``pal_bench.bench.protocol``), measured through ``ProtocolAdapter``."""

from __future__ import annotations

import functools
import importlib

from pal_bench.bench import protocol
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


def builtin(name: str) -> bool:
    return name in ADAPTERS or name in TEST_ONLY or name in COMPONENTS


def adapter_class(name: str) -> type[BufferAdapter]:
    """The adapter class of ``name`` (``protocol.BufferNameError``, a ValueError, when it names nothing)."""
    path = ADAPTERS.get(name) or TEST_ONLY.get(name) or COMPONENTS.get(name)
    if path is not None:
        module, cls = path.split(":")
        return getattr(importlib.import_module(module), cls)
    return _protocol_adapter(name)


@functools.cache
def _protocol_adapter(name: str) -> type[BufferAdapter]:
    from pal_bench.bench.adapters.protocol import protocol_adapter

    return protocol_adapter(implementation(name), name)


def implementation(name: str) -> type:
    """The protocol class ``name`` stands for: an entry point of ``pal_bench.buffers`` or ``module:Class``."""
    target = protocol.entry_points().get(name)
    if target is None and not protocol.is_target(name):
        raise protocol.BufferNameError(
            f"unknown buffer {name!r}: not one of {', '.join(sorted(ADAPTERS))}, not an entry point of the group "
            f"{protocol.ENTRY_POINT_GROUP!r} ({', '.join(sorted(protocol.entry_points())) or 'none installed'}), "
            "not module:Class")
    return protocol.load_target(target or name)


def available(name: str) -> str | None:
    """None when the adapter can be used here, else why not (e.g. the peer is not installed)."""
    import importlib.util

    needs = {"cpprb": "cpprb", "tianshou": "tianshou", "rllib": "ray", "rllib-episode": "ray",
             "sb3": "stable_baselines3"}.get(name)
    if needs and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed (pip install -e '.[peers]')"
    try:
        adapter_class(name)
    except protocol.BufferNameError as e:
        return str(e)
    return None


def make_adapter(name: str, capacity: int, **kwargs) -> BufferAdapter:
    """An adapter of ``name`` filled to ``capacity``."""
    return adapter_class(name)(capacity, **kwargs)


# the built-in buffers as classes of the public protocol: what `pal-bench check-buffer` checks for each name
PROTOCOL_CLASSES: dict[str, str] = {
    "pal": "pal_bench:PrioritizedReplayBuffer",
    "pal-uniform": "pal_bench:ReplayBuffer",
    "cpprb": "pal_bench.bench.peer_buffers:CpprbPrioritized",
    "tianshou": "pal_bench.bench.peer_buffers:TianshouPrioritized",
    "rllib": "pal_bench.bench.peer_buffers:RllibTimestepPrioritized",
    "rllib-episode": "pal_bench.bench.peer_buffers:RllibEpisodePrioritized",
}


NOT_CHECKED = {"sb3": "SB3's ReplayBuffer.sample returns tensors without indices or weights"}


def implementation_for_check(name: str) -> type:
    """The protocol class behind ``name``: a built-in buffer's (``PROTOCOL_CLASSES``), an entry point's, or
    ``module:Class``."""
    if name in PROTOCOL_CLASSES:
        return protocol.load_target(PROTOCOL_CLASSES[name])
    if builtin(name):
        why = NOT_CHECKED.get(name, "a part of a buffer or the floor, not a buffer")
        raise protocol.BufferNameError(f"{name!r} is timed but has no protocol class to check ({why}); checkable "
                                       f"built-in buffers: {', '.join(PROTOCOL_CLASSES)}")
    return implementation(name)
