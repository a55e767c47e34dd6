"""The replay-buffer protocol PAL-Bench measures and checks, and how a buffer is found by name.

A buffer under test is a class with the shape of ``pal_bench.PrioritizedReplayBuffer``::

    buf = cls(capacity, fields, alpha=0.6, seed=0)   # fields: {name: (shape, dtype)}, shape () for a scalar
    buf.add(**row)                                    # optional: one transition, a value per field
    buf.add_batch(**columns)                          # B transitions: an array [B, *shape] per field
    out = buf.sample(batch_size, beta)                # {field: [B, *shape], "indices": [B], "weights": [B]}
    buf.update_priorities(indices, priorities)        # raw priorities (e.g. |TD error|), float[B]
    len(buf)                                          # transitions held

Sampling is proportional to ``priority ** alpha``; ``weights`` are the importance weights ``(N P(i)) ** -beta``
up to a normalisation (Schaul et al. 2016 divide by the largest weight in the buffer). A uniform buffer declares
``PRIORITIZED = False`` as a class attribute; it may omit ``update_priorities`` and return weights of one.
The complete example a user can copy is in docs/latency.md (and ``tests/test_buffer_protocol.py``).

A buffer is named, wherever PAL-Bench takes a buffer name (``pal-bench latency --impl``, ``pal-bench
check-buffer``, ``python -m pal_bench.bench.run --peers``, ``PAL_BENCH_PEERS``), by

- a built-in name (``pal``, ``tianshou``, ...: ``pal_bench.bench.adapters.registry.ADAPTERS``);
- a name an installed package registers in the entry-point group ``pal_bench.buffers``
  (``[project.entry-points."pal_bench.buffers"] mybuf = "mypkg.buf:MyBuffer"``); a built-in name wins over an
  entry point of the same name, and an entry point named like ``module:Class`` is ignored;
- ``module:Class``, a class importable from ``sys.path`` (the current directory included for the commands).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any, Protocol, runtime_checkable

import numpy as np

ENTRY_POINT_GROUP = "pal_bench.buffers"
# module:Class, both dotted Python identifiers
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
REQUIRED_METHODS = ("add_batch", "sample", "__len__")

Fields = dict[str, tuple[tuple[int, ...], Any]]


@runtime_checkable
class ReplayBufferProtocol(Protocol):
    """What ``pal-bench latency`` times and ``pal-bench check-buffer`` checks (see the module docstring).
    ``add`` is optional; ``update_priorities`` may be omitted by a buffer that declares ``PRIORITIZED = False``."""

    def add_batch(self, **columns: np.ndarray) -> object: ...

    def sample(self, batch_size: int, beta: float) -> dict[str, np.ndarray]: ...

    def __len__(self) -> int: ...


class BufferNameError(ValueError):
    """A buffer name that names nothing loadable; the message says why and what is known."""


def entry_points() -> dict[str, str]:
    """``name -> "module:Class"`` registered by installed packages in the group ``pal_bench.buffers``."""
    return {ep.name: f"{ep.module}:{ep.attr}" for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            if not is_target(ep.name)}


def is_target(name: str) -> bool:
    """True for a ``module:Class`` name."""
    return bool(_TARGET.match(name))


def load_target(target: str) -> type:
    """The class ``module:Class`` names, checked against the protocol (BufferNameError if it is not one)."""
    if not is_target(target):
        raise BufferNameError(f"{target!r} is not module:Class")
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:            # noqa: BLE001 - whatever a module raises on import is one line
        raise BufferNameError(f"cannot import {module_name!r} for {target!r}: {type(e).__name__}: "
                              f"{str(e)[:500]}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:             # noqa: BLE001 - AttributeError, or a module __getattr__ that raises
            raise BufferNameError(f"{module_name!r} has no {attr!r} (for {target!r})") from None
    check_class(obj, target)
    return obj


def check_class(cls: object, name: str) -> None:
    """BufferNameError unless ``cls`` is a class with the protocol's methods (``update_priorities`` too unless it
    declares ``PRIORITIZED = False``)."""
    if not isinstance(cls, type):
        raise BufferNameError(f"{name!r} is not a class (got {type(cls).__name__})")
    need = list(REQUIRED_METHODS)
    if is_prioritized(cls):
        need.append("update_priorities")
    missing = [m for m in need if not callable(getattr(cls, m, None))]
    if missing:
        raise BufferNameError(f"{name!r} lacks {', '.join(missing)} of the buffer protocol (docs/latency.md)"
                              + (" or PRIORITIZED = False" if missing == ["update_priorities"] else ""))


def is_prioritized(cls: type) -> bool:
    """A buffer is prioritized unless its class says ``PRIORITIZED = False``."""
    return bool(getattr(cls, "PRIORITIZED", True))


def has_single_add(cls: type) -> bool:
    return callable(getattr(cls, "add", None))
