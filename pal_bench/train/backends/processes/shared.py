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
TOTAL_RESERVED, TOTAL_INSERTED = 7, 8   # the sums of the per-actor pairs, kept beside them under the lock
READY_TIMEOUT_S = 300.0          # longest wait for the first actors' set-up (imports, environments)
HEADER = 9                       # counters before the per-actor pairs (reserved, inserted)
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


def n_actors_of(counters) -> int:
    """The actors a counter block has pairs for."""
    return (len(counters) - HEADER) // 2


def _enter(counters, actor: int) -> None:
    """(lock held) Mark the lock as held by ``actor``. A holder mark left set means that the last holder died
    inside, perhaps between a per-actor counter and its total: the totals are summed again from the pairs
    (O(actors), only then)."""
    if counters[HOLDER]:
        repair_totals(counters)
    counters[HOLDER] = actor + 1


def repair_totals(counters) -> None:
    """(lock held) ``TOTAL_RESERVED`` and ``TOTAL_INSERTED`` summed again from the per-actor pairs."""
    pairs = counters[HEADER:HEADER + 2 * n_actors_of(counters)]
    counters[TOTAL_RESERVED] = int(pairs[0::2].sum())
    counters[TOTAL_INSERTED] = int(pairs[1::2].sum())


def reserve_steps(counters, lock, actor: int, policy, n: int, unit: int = 0, inside=None) -> tuple[int, int, bool]:
    """Grant ``actor`` up to ``n`` env steps under the rule of ``RatePolicy``, in O(1) whatever the number of
    actors: one lock, four words read or written (the running total, the actor's own counter, the flags).
    ``unit``: grant only whole multiples of it up to the end of the budget (a remote actor's vector step);
    ``inside``: called with the lock held (the tests' fault seam). Returns (steps granted, 0 when the rule says
    wait or the budget is spent; the steps reserved before this grant; whether the budget is spent)."""
    with lock:
        _enter(counters, actor)
        if inside is not None:
            inside()
        reserved = int(counters[TOTAL_RESERVED])
        spent = policy.budget_spent(reserved)
        granted = 0
        if not spent and not counters[PAUSED] and policy.actor_may_step(reserved, int(counters[STARTED])):
            granted = min(n, -(-(policy.total_steps - reserved) // unit) * unit) if unit else n
            counters[reserved_slot(actor)] += granted
            counters[TOTAL_RESERVED] = reserved + granted
        counters[HOLDER] = 0
    return granted, reserved, spent


def count_inserted(counters, lock, actor: int, steps: int) -> None:
    """``steps`` env steps of ``actor`` are in the buffer: its own counter and the running total, under the lock
    (O(1); the learners read the total)."""
    with lock:
        _enter(counters, actor)
        counters[inserted_slot(actor)] += steps
        counters[TOTAL_INSERTED] += steps
        counters[HOLDER] = 0


def give_back(counters, lock, actor: int) -> int:
    """(driver, ``actor`` is dead) Return what it reserved and never inserted to the budget, repairing the totals
    if it died holding the lock; returns the steps given back."""
    with lock:
        if counters[HOLDER]:
            repair_totals(counters)
            counters[HOLDER] = 0
        lost = int(counters[reserved_slot(actor)] - counters[inserted_slot(actor)])
        counters[reserved_slot(actor)] -= lost
        counters[TOTAL_RESERVED] -= lost
    return lost


def count_under_lock(counters, lock, actor: int, slot: int) -> None:
    """Add one to a counter several actors write (READY, FINISHED): under the reservation lock, marked as
    held by ``actor`` (what the driver reads when the process dies inside)."""
    with lock:
        _enter(counters, actor)
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


class Publisher:
    """Publishes a parameter server's snapshots into a ``SharedWeights`` block (the one writer of that block: the
    driver, or with ``aggregation = "allreduce"`` learner process 0): a new version only, and its targets only when
    they changed (the server keeps the same target dict until they do)."""

    def __init__(self, block: SharedWeights):
        self.block = block
        self.version = -1
        self.target: dict | None = None       # the snapshot target dict whose tensors the block holds

    def publish(self, snap) -> bool:
        """Copy ``snap`` in unless the block holds its version already; whether it copied."""
        if snap.version == self.version:
            return False
        new_targets = snap.target is not self.target
        self.block.publish(flat_state(snap, targets=new_targets), partial=not new_targets)
        self.version, self.target = snap.version, snap.target
        return True

    def holds(self, snap) -> None:
        """The block already holds ``snap`` (read back from it): nothing to copy until the next version."""
        self.version, self.target = snap.version, snap.target


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
