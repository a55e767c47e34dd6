"""A run's core budget: the run's process tree pinned to the same CPUs for every contestant.

``cpu_set(n)`` chooses the first ``n`` CPUs this process may use; ``launch`` starts the run's process already
pinned to them (``os.sched_setaffinity`` before the interpreter starts: every thread and process it starts, Ray's
included, inherits the set). ``tree_cpus()`` reads back, at the end of the run, the CPUs every thread of the run's
process and of each live descendant may use: a run stores it, and a run whose tree escaped its set is refused.
The CPU time the run actually used (``own_cores``) comes from the race's ``Conditions``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pal_bench.argtypes import UsageError
from pal_bench.conditions import descendants

CPU_BUDGETS = (1, 2)             # the race's core tracks: every contestant on one CPU, or on two
OWN_CORES_SLACK = 0.1            # a run may read at most this much above its budget (the detector's granularity)


def cpu_set(n: int) -> list[int]:
    """The first ``n`` CPUs this process may run on; ``UsageError`` when it may use fewer."""
    if not hasattr(os, "sched_getaffinity"):
        raise UsageError("pinning a race run to its CPUs needs os.sched_setaffinity (Linux)")
    have = sorted(os.sched_getaffinity(0))
    if n < 1 or n > len(have):
        raise UsageError(f"--cpus {n}: this process may use {len(have)} CPU(s) ({_ranges(have)}); a run's budget "
                         f"must be between 1 and {len(have)}")
    return have[:n]


def pin_self(cpus: list[int]) -> None:
    """Pin the calling process (its calling thread, and whatever it starts afterwards) to ``cpus`` (a
    ``preexec_fn``: runs in the child between fork and exec)."""
    os.sched_setaffinity(0, cpus)


def tree_cpus(root: int | None = None) -> list[int]:
    """Every CPU that some thread of ``root`` (default: this process) or of a live descendant may run on."""
    pids = [os.getpid() if root is None else root, *descendants(root)]
    seen: set[int] = set()
    for pid in pids:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir() if t.name.isdigit()]
        except OSError:
            tids = [pid]
        for tid in tids:
            try:
                seen |= os.sched_getaffinity(tid)
            except OSError:                   # ended since it was listed
                continue
    return sorted(seen)


class TreeWatch:
    """The CPUs the process tree could use, sampled every ``period_s`` while the run trains (a worker process that
    ends early, such as an actor, is seen while it lives) and once more at ``stop()``: their union."""

    def __init__(self, period_s: float = 2.0):
        import threading

        self.seen: set[int] = set(tree_cpus())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(period_s,), daemon=True, name="race-cpus")
        self._thread.start()

    def _watch(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.seen |= set(tree_cpus())

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        self.seen |= set(tree_cpus())
        return sorted(self.seen)


def over_budget(own_cores: float | None, cpus: int | None) -> bool:
    """Whether a run used more CPU than its budget (``own_cores`` above ``cpus`` + ``OWN_CORES_SLACK``)."""
    return own_cores is not None and cpus is not None and own_cores > cpus + OWN_CORES_SLACK


def _ranges(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)
