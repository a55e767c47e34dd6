"""The process backend's shared pieces: the counter block's layout, the worker processes' start-up and
failure reporting, and the published weights' names (``pal_bench.train.backends.processes``)."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from pal_bench.train.errors import Diverged, TrainingError
from pal_bench.train.shared_weights import SharedWeights

STOP, PAUSED, STARTED, HOLDER = 0, 1, 2, 3        # HOLDER: 1 + the actor holding the reservation lock, or 0
READY, GO = 4, 5                 # actors set up (count); the driver's clock has started (flag)
FINISHED = 6                     # actors whose share of the budget is collected and inserted (count)
READY_TIMEOUT_S = 300.0          # longest wait for the first actors' set-up (imports, environments)
HEADER = 8                       # counters before the per-actor pairs (reserved, inserted)
POLL_S = 0.002                   # the driver's counter sync period
STOP_JOIN_S = 1.5                # an actor process that has not exited this long after stop is killed


def reserved_slot(a: int) -> int:
    return HEADER + 2 * a


def inserted_slot(a: int) -> int:
    return HEADER + 2 * a + 1


def ignore_stop_signals() -> None:
    """(worker process) Ctrl-C, SIGTERM and SIGHUP go to the driver, which stops its workers itself (a terminal's
    Ctrl-C or hang-up reaches the whole process group)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def segment_name(run_dir: Path, kind: str) -> str:
    """A name per run directory, so that the next run in the same place replaces what a killed driver left."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return f"pal_{kind}_{digest}"


class ParentAlive:
    """(worker process) Whether the driver that spawned this process still runs: it is still our parent."""

    def __init__(self, pid: int):
        self.pid = pid

    def __call__(self) -> bool:
        return os.getppid() == self.pid


class DriverAlive:
    """(a worker another launcher started on the driver's node: Ray) Whether the driver process ``pid`` still
    exists."""

    def __init__(self, pid: int):
        self.pid = pid

    def __call__(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def report_failure(name: str, index: int, messages, stopped: TrainingError | None = None) -> NoReturn:
    """(in an ``except`` block of a worker process) Print the traceback, send it to the driver, wait until it is
    sent, and exit with status 1. ``stopped``: a ``TrainingError`` (divergence), whose one line is sent instead
    and not printed here (the driver reports it)."""
    if stopped is not None:
        messages.put(("training_error", index, (type(stopped).__name__, str(stopped))))
    else:
        tb = traceback.format_exc()
        print(f"pal-bench {name} (process {os.getpid()}) failed:\n{tb}", file=sys.stderr, flush=True)
        messages.put(("error", index, tb))
    messages.close()
    messages.join_thread()                               # the error reaches the driver before we exit
    raise SystemExit(1) from None


def read_messages(q, timeout: float | None = None):
    """(driver) The (kind, payload) messages waiting in a worker's queue, until it is empty (or, with ``timeout``,
    quiet that long) or a message is cut short by a killed writer."""
    while True:
        try:
            kind, _, payload = q.get(timeout=timeout) if timeout else q.get_nowait()
        except Exception:                        # queue.Empty, or a truncated message
            return
        yield kind, payload


def count_under_lock(counters, lock, actor: int, slot: int) -> None:
    """Add one to a counter several actors write (READY, FINISHED): under the reservation lock, marked as
    held by ``actor`` (what the driver reads when the process dies inside)."""
    with lock:
        counters[HOLDER] = actor + 1
        counters[slot] += 1
        counters[HOLDER] = 0


def training_error(payload: tuple[str, str]) -> TrainingError:
    """The ``TrainingError`` a worker process sent as (class name, message)."""
    name, message = payload
    return (Diverged if name == "Diverged" else TrainingError)(message)


def actor_tensors(nets, targets) -> dict:
    """The actor networks' own tensors under the published names: the online networks, and the targets when
    the actor computes Ape-X priorities (a new version is copied straight into them, nothing else)."""
    return flat_state(StatePair(nets.state_dict(), targets.state_dict() if targets is not None else {}))


def pull_weights(weights: SharedWeights, into: dict, version: int) -> int:
    """Copy a version newer than ``version`` into ``into`` (``actor_tensors``); returns the version held."""
    got = weights.read(out=into, min_version=version + 1)      # state_dict tensors are detached: no autograd
    return version if got is None else got[0]


class StatePair:
    """Online and target state dicts in the shape ``flat_state`` reads (a snapshot's ``online``/``target``)."""

    def __init__(self, online: dict, target: dict):
        self.online, self.target = online, target


def flat_state(snap, targets: bool = True) -> dict:
    """The shared block's names for a snapshot's tensors (``online.*``, and ``target.*`` unless ``targets`` is
    False)."""
    out = {f"online.{k}": v for k, v in as_state(snap.online).items()}
    if targets:
        out.update({f"target.{k}": v for k, v in as_state(snap.target).items()})
    return out


def as_state(nets) -> dict:
    return nets.state_dict() if hasattr(nets, "state_dict") else nets
