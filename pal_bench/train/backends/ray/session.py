"""Starting or joining Ray the same way everywhere.

With no address: a local Ray instance owned by this process (``address="local"``: never a cluster
that ``ray start`` left running on the machine), with as many CPUs as this process may use. With an
address: join that cluster. Either way, only the code that connected disconnects, so a caller's
session (tests share one: Ray takes seconds to start) is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pal_bench.conditions import usable_cores


def connect(address: str | None = None, num_cpus: int | None = None, log_to_driver: bool = True) -> bool:
    """Connect unless this process already is; True when this call connected (the caller then
    shuts Ray down when done, and only then)."""
    import ray

    if ray.is_initialized():
        return False
    kw = dict(include_dashboard=False, configure_logging=True, logging_level="warning", log_to_driver=log_to_driver)
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(address="local", num_cpus=num_cpus or usable_cores(), **kw)
    return True


@contextmanager
def session(address: str | None = None, **kw) -> Iterator[None]:
    """``connect`` for the block; shut down at its end (also on error) if connected here."""
    owns = connect(address, **kw)
    try:
        yield
    finally:
        if owns:
            import ray

            ray.shutdown()


def local_ray() -> None:
    """Start this process's own Ray instance (a bare ``ray.init()`` would join any cluster that
    ``ray start`` left running on the machine) with as many CPUs as the machine has."""
    import os

    connect(num_cpus=max(2, os.cpu_count() or 1), log_to_driver=False)
