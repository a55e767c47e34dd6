"""The process backend: actor processes write straight into the shared-memory replay buffer.

Placement: every actor is an OS process (``spawn``) stepping its own environments with its own copy of
the policy; learners are threads of the driver, next to the parameter server (torch releases the GIL in
its kernels). What crosses a process boundary, and how:

- transitions: each actor calls ``add_batch`` on the driver's ``PrioritizedReplayBuffer(shared=True)``
  segment (attached by name): no pipe, no pickling;
- weights: the driver publishes every new parameter-server version into a ``SharedWeights`` block
  (seqlock); an actor copies it when its version counter moved;
- counters: one shared int64 array: per actor, transitions reserved and inserted (one writer each),
  plus the learners' started updates, a pause flag and a stop flag written by the driver. An actor asks
  for its next vector step under one process-shared lock, with the rule of ``rate_policy.RatePolicy``;
- episodes, errors and per-phase timers: small messages on a queue.

Everything else (config, algorithms, learners, evaluation, checkpoints, logs, ``summary.json``) is the
thread trainer's. An actor process that dies (exception or SIGKILL) is restarted; the transitions it had
reserved but not inserted are given back to the budget and recorded in ``events.csv``. Actor processes
exit on the stop flag, on the end of the budget, and when the driver dies (``PR_SET_PDEATHSIG`` plus a
parent check), and ignore Ctrl-C, SIGTERM and SIGHUP (the driver handles them and stops them). An actor that dies
more than ``MAX_RESTARTS`` times ends the run with ``ActorGaveUp`` (one line) after a final checkpoint; a worker
process whose learner or actor-side priorities diverge sends that one line (``Diverged``) instead of a traceback.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

import numpy as np

from pal_bench.train.backends.threads import Trainer, WorkerError, stop_on_signals
from pal_bench.train.config import TrainConfig
from pal_bench.train.errors import Diverged, TrainingError
from pal_bench.train.faults import NO_FAULTS, Faults
from pal_bench.train.rate import RateController
from pal_bench.train.rate_policy import RatePolicy, default_slack
from pal_bench.train.replay_spec import buffer_class, make_buffer
from pal_bench.train.shared_weights import SharedWeights, spec_of
from pal_bench.train.workers import PhaseTimer, pin

STOP, PAUSED, STARTED, HOLDER = 0, 1, 2, 3        # HOLDER: 1 + the actor holding the reservation lock, or 0
READY, GO = 4, 5                 # actors set up (count); the driver's clock has started (flag)
FINISHED = 6                     # actors whose share of the budget is collected and inserted (count)
READY_TIMEOUT_S = 300.0          # longest wait for the first actors' set-up (imports, environments)
HEADER = 8                       # counters before the per-actor pairs (reserved, inserted)
MAX_RESTARTS = 5                 # per actor: more deaths than this end the run with an error
POLL_S = 0.002                   # the driver's counter sync period
STOP_JOIN_S = 1.5                # an actor process that has not exited this long after stop is killed


def _reserved(a: int) -> int:
    return HEADER + 2 * a


def _inserted(a: int) -> int:
    return HEADER + 2 * a + 1


class ActorGaveUp(TrainingError, WorkerError):
    """An actor process died more often than it may be restarted; the run wrote a final checkpoint first (the
    buffer and the weights are sound: what the dead incarnations held was accounted as lost)."""

    checkpoint = True


def _ignore_stop_signals() -> None:
    """(worker process) Ctrl-C, SIGTERM and SIGHUP go to the driver, which stops its workers itself (a terminal's
    Ctrl-C or hang-up reaches the whole process group)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _segment_name(run_dir: Path, kind: str) -> str:
    """A name per run directory, so that the next run in the same place replaces what a killed driver left."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return f"pal_{kind}_{digest}"


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


# ---------------------------------------------------------------------- the actor process

def actor_process(cfg: TrainConfig, actor: int, incarnation: int, buffer_name: str, weights_name: str,
                  weights_spec, counters, lock, messages, parent_pid: int, faults: Faults = NO_FAULTS) -> None:
    """Body of one actor process (spawned). Steps ``envs_per_actor`` environments and inserts n-step rows
    with ``add_batch`` into the shared buffer until the budget is spent or the driver says stop."""
    _die_with_parent()
    _ignore_stop_signals()                              # the driver handles Ctrl-C, SIGTERM, SIGHUP and stops us
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.workers import LocalBuffer

    torch.set_num_threads(1)
    pin(actor if cfg.pin_cores else None)               # as the thread backend pins its actor threads
    envs = buf = weights = None
    try:
        ctx = RunCore(cfg)
        policy = RatePolicy.from_config(cfg, default_slack(cfg))
        timer = PhaseTimer()
        buf = buffer_class(cfg).attach(buffer_name, seed=cfg.seed)
        weights = SharedWeights.attach(weights_name, weights_spec)
        nets = ctx.networks()
        targets = ctx.networks() if cfg.actor_priorities else None
        E = cfg.envs_per_actor
        rng = np.random.default_rng([cfg.seed, actor, incarnation])
        envs = ctx.make_vector_env(actor)
        start = int(counters[_inserted(actor)])
        stepper = ctx.make_stepper(envs, [cfg.seed * 100_003 + actor * E + i + start + 7919 * incarnation
                                          for i in range(E)], actor)
        into = _actor_tensors(nets, targets)
        version = _pull(weights, into, 0)
        local = LocalBuffer(ctx, buf, stepper, nets, targets, timer)
        _count(counters, lock, actor, READY)
        messages.put(("ready", actor, incarnation))
        while not counters[GO] and not counters[STOP] and os.getppid() == parent_pid:
            time.sleep(0.001)                            # every actor set up before the driver's clock starts
        timer.lap("setup")
        n_actors = cfg.actors
        while True:
            if counters[STOP] or os.getppid() != parent_pid:
                break
            with lock:
                counters[HOLDER] = actor + 1
                faults.in_reservation(actor, int(counters[_inserted(actor)]), incarnation)
                reserved = sum(int(counters[_reserved(a)]) for a in range(n_actors))
                spent = policy.budget_spent(reserved)
                ok = (not spent and not counters[PAUSED]
                      and policy.actor_may_step(reserved, int(counters[STARTED])))
                if ok:
                    counters[_reserved(actor)] += E
                counters[HOLDER] = 0
            if spent:        # another actor took the last steps: the pending windows bootstrap from the last obs
                counters[_inserted(actor)] += local.put(stepper.flush(), 0, send=True)
                _count(counters, lock, actor, FINISHED)   # the driver need not wait for this process's exit
                break
            if not ok:
                time.sleep(0.0005)
                timer.lap("rate_wait")
                continue
            timer.lap("rate_wait")
            version = _pull(weights, into, version)
            timer.lap("weights_pull")
            rows, episodes = stepper.step(nets, reserved + E, rng, timer)
            if episodes:
                messages.put(("episodes", actor, episodes))
            last = reserved + E >= cfg.steps
            if last:                                     # the budget is spent: flush the pending windows
                rows += stepper.flush()
            counters[_inserted(actor)] += local.put(rows, E, send=last)
        if local.steps and os.getppid() == parent_pid:   # stopped: what the local buffer holds still goes in
            counters[_inserted(actor)] += local.send()
        messages.put(("timers", actor, timer.seconds))
    except TrainingError as e:
        _report_failure(f"actor{actor}", actor, messages, e)
    except BaseException:
        _report_failure(f"actor{actor}", actor, messages)
    finally:
        if envs is not None:
            envs.close()
        if buf is not None:
            buf.close()
        if weights is not None:
            weights.close()


def _report_failure(name: str, index: int, messages, stopped: TrainingError | None = None) -> NoReturn:
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


def _read(q, timeout: float | None = None):
    """(driver) The (kind, payload) messages waiting in a worker's queue, until it is empty (or, with ``timeout``,
    quiet that long) or a message is cut short by a killed writer."""
    while True:
        try:
            kind, _, payload = q.get(timeout=timeout) if timeout else q.get_nowait()
        except Exception:                        # queue.Empty, or a truncated message
            return
        yield kind, payload


def _count(counters, lock, actor: int, slot: int) -> None:
    """Add one to a counter several actors write (READY, FINISHED): under the reservation lock, marked as
    held by ``actor`` so that the driver can release it if the process dies inside."""
    with lock:
        counters[HOLDER] = actor + 1
        counters[slot] += 1
        counters[HOLDER] = 0


def _training_error(payload: tuple[str, str]) -> TrainingError:
    """The ``TrainingError`` a worker process sent as (class name, message)."""
    name, message = payload
    return (Diverged if name == "Diverged" else TrainingError)(message)


# ---------------------------------------------------------------------- the learner process (learner_processes)

L_UPDATE, L_STOP, L_READY, L_FIELDS = 0, 1, 2, 4     # per learner slot: granted update number, stop, set up


def grads_spec(ps) -> list:
    """The shared block a learner process publishes one gradient into: every parameter of every group (float32),
    plus which groups this gradient has (TD3's delayed actor: not every update has every group)."""
    spec = [(f"{g}.{i}", tuple(p.shape), "<f4") for g, params in ps.params.items() for i, p in enumerate(params)]
    return spec + [("groups", (len(ps.params),), "|u1")]


def learner_process(cfg: TrainConfig, learner: int, buffer_name: str, weights_name: str, weights_spec,
                    grads_name: str, gspec, slots, grant, done, messages, parent_pid: int,
                    faults: Faults = NO_FAULTS) -> None:
    """Body of one learner process (spawned): for each update the driver grants, load the latest published
    weights, sample the shared buffer, compute the gradients, write |TD| back as priorities and publish the
    gradients for the driver's parameter server. The rate rule, the update count and the aggregation stay in
    the driver (one proxy thread per learner process), so they are the thread trainer's."""
    _die_with_parent()
    _ignore_stop_signals()
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.losses import check_losses, gradients, param_groups

    torch.set_num_threads(1)
    pin(cfg.actors + learner if cfg.pin_cores else None)
    buf = weights = grads = None
    base = learner * L_FIELDS
    try:
        ctx = RunCore(cfg)
        timer = PhaseTimer()
        buf = buffer_class(cfg).attach(buffer_name, seed=cfg.seed)
        weights = SharedWeights.attach(weights_name, weights_spec)
        grads = SharedWeights.attach(grads_name, gspec)
        nets, targets = ctx.networks(), ctx.networks()
        names = list(ctx.algo.GROUPS)
        params = param_groups(ctx.algo, nets)
        zeros = {f"{g}.{i}": torch.zeros_like(p) for g in names for i, p in enumerate(params[g])}
        # the networks' own tensors as the read target: a new version is copied straight into them
        into = _flat_state(_Pair(nets.state_dict(), targets.state_dict()))
        version = 0
        updates = 0
        slots[base + L_READY] = 1
        timer.lap("setup")
        while True:
            while not grant.acquire(timeout=0.05):
                if slots[base + L_STOP] or os.getppid() != parent_pid:
                    break
            if slots[base + L_STOP] or os.getppid() != parent_pid:
                break
            timer.lap("grant_wait")
            update = int(slots[base + L_UPDATE])
            faults.before_update(learner, updates)
            updates += 1
            with torch.no_grad():
                got = weights.read(out=into, min_version=version + 1)
            version = got[0] if got is not None else version
            timer.lap("weights_pull")
            sample = buf.sample(cfg.batch_size, beta=ctx.beta(update))
            timer.lap("sample")
            losses, td = ctx.algo.losses(nets, targets, ctx.to_tensors(sample), cfg, update)
            check_losses(losses, update, f"learner{learner}")
            flat = dict(zeros)
            has = torch.zeros(len(names), dtype=torch.uint8)
            for g, grads_g in gradients(losses, params).items():
                has[names.index(g)] = 1
                for i, x in enumerate(grads_g):
                    flat[f"{g}.{i}"] = x
            flat["groups"] = has
            timer.lap("forward_backward")
            if cfg.prioritized:
                buf.update_priorities(sample["indices"], td.numpy().astype(np.float64))
            timer.lap("priority_update")
            grads.publish(flat)
            done.release()
            timer.lap("gradient_publish")
        messages.put(("timers", learner, timer.seconds))
    except TrainingError as e:
        _report_failure(f"learner{learner}", learner, messages, e)
    except BaseException:
        _report_failure(f"learner{learner}", learner, messages)
    finally:
        for h in (buf, weights, grads):
            if h is not None:
                h.close()


def _actor_tensors(nets, targets) -> dict:
    """The actor networks' own tensors under the published names: the online networks, and the targets when
    the actor computes Ape-X priorities (a new version is copied straight into them, nothing else)."""
    return _flat_state(_Pair(nets.state_dict(), targets.state_dict() if targets is not None else {}))


def _pull(weights: SharedWeights, into: dict, version: int) -> int:
    """Copy a version newer than ``version`` into ``into`` (``_actor_tensors``); returns the version held."""
    got = weights.read(out=into, min_version=version + 1)      # state_dict tensors are detached: no autograd
    return version if got is None else got[0]


class _Pair:
    """Online and target state dicts in the shape ``_flat_state`` reads (a snapshot's ``online``/``target``)."""

    def __init__(self, online: dict, target: dict):
        self.online, self.target = online, target


def _flat_state(snap, targets: bool = True) -> dict:
    """The shared block's names for a snapshot's tensors (``online.*``, and ``target.*`` unless ``targets`` is
    False)."""
    out = {f"online.{k}": v for k, v in _as_state(snap.online).items()}
    if targets:
        out.update({f"target.{k}": v for k, v in _as_state(snap.target).items()})
    return out


def _as_state(nets) -> dict:
    return nets.state_dict() if hasattr(nets, "state_dict") else nets


# ---------------------------------------------------------------------- the driver

class SharedRate(RateController):
    """The thread trainer's rate controller with its counters in the shared array: ``steps`` and ``reserved``
    are the sums of the actors' inserted and reserved counts, ``started`` and ``paused`` are written through
    for the actors to read. Learner threads wait on it as on the thread trainer's, polling (actor processes
    cannot notify a condition variable): every 0.5 ms while the next update is near, every 10 ms while it
    lacks more than ``FAR_STEPS`` env steps (the prefill, or an actors-only measurement). Actors collecting
    under 25,600 steps/s cannot bring those steps in 10 ms, so there the longer poll never delays an update
    (above, by one poll at most); it spares the actors' cores 1,900 wake-ups a second."""

    POLL_S = 0.0005
    FAR_POLL_S = 0.01
    FAR_STEPS = 256

    def __init__(self, cfg: TrainConfig, counters):
        self._c, self._actors = counters, cfg.actors
        self._started = 0
        self._paused = False
        super().__init__(cfg.updates_per_step, cfg.learning_starts, cfg.steps, default_slack(cfg), lockstep=False)

    def _sum(self, at) -> int:
        return sum(int(self._c[at(a)]) for a in range(self._actors))

    @property
    def steps(self) -> int:
        return self._sum(_inserted)

    @steps.setter
    def steps(self, value: int) -> None:             # init and restore only: all on actor 0's account
        self._c[_inserted(0)] = value - (self.steps - int(self._c[_inserted(0)]))

    @property
    def reserved(self) -> int:
        return self._sum(_reserved)

    @reserved.setter
    def reserved(self, value: int) -> None:
        self._c[_reserved(0)] = value - (self.reserved - int(self._c[_reserved(0)]))

    @property
    def started(self) -> int:
        return self._started

    @started.setter
    def started(self, value: int) -> None:
        self._started = value
        self._c[STARTED] = value

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        self._c[PAUSED] = int(value)

    def _wait(self, role: str) -> None:
        t0 = time.perf_counter()
        self.cond.wait(self._poll_s(role))
        self.wait_s[role] += time.perf_counter() - t0

    def _poll_s(self, role: str) -> float:
        """Seconds until the waiting ``role`` looks at the counters again."""
        if role == "learner" and not self.paused:
            missing = self.policy.steps_for_update(self.started + 1) - self.steps
            if missing > self.FAR_STEPS:
                return self.FAR_POLL_S
        return self.POLL_S


class ProcessTrainer(Trainer):
    """``Trainer`` with actor processes on a shared-memory buffer (``backend = "processes"``). ``faults``: the
    workers' fault-injection seam (``pal_bench.train.faults``; tests set it)."""

    faults: Faults = NO_FAULTS

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False):
        self._ctx = mp.get_context("spawn")
        self._weights: SharedWeights | None = None
        self._lprocs: dict[int, mp.Process] = {}
        self._grads: list[SharedWeights] = []
        self._training_errors: dict[int, tuple[str, str]] = {}    # actor -> a TrainingError it sent (name, line)
        super().__init__(cfg, resume=resume, overwrite=overwrite)
        # one queue per actor: a queue's writers share a lock, which an actor killed mid-put would leave held
        self._messages = [self._ctx.Queue() for _ in range(cfg.actors)]
        self._sync_lock = threading.Lock()
        self._published = -1
        self._published_target: dict | None = None  # the snapshot target dict whose tensors the block holds
        self.restarts = [0] * cfg.actors
        self.lost = [0] * cfg.actors
        name = _segment_name(self.run_dir, "w")
        stale = Path("/dev/shm") / name
        if stale.exists():                                # left by a driver killed in this run directory
            stale.unlink()
        self._weights = SharedWeights.create(spec_of(_flat_state(self.ps.snapshot)), name=name)
        self._publish()
        if cfg.learner_processes:
            self._gspec = grads_spec(self.ps)
            for i in range(cfg.learners):
                gname = _segment_name(self.run_dir, f"g{i}")
                if (Path("/dev/shm") / gname).exists():
                    (Path("/dev/shm") / gname).unlink()
                self._grads.append(SharedWeights.create(self._gspec, name=gname))
            self._lslots = self._ctx.RawArray("q", L_FIELDS * cfg.learners)
            self._grant = [self._ctx.Semaphore(0) for _ in range(cfg.learners)]
            self._done = [self._ctx.Semaphore(0) for _ in range(cfg.learners)]
            self._lmessages = [self._ctx.Queue() for _ in range(cfg.learners)]

    def _place(self) -> None:
        """The thread trainer's parameter server; the buffer in shared memory; the rate counters in a shared
        array (a resumed run's steps count as actor 0's)."""
        super()._place()
        self.counters = self._ctx.RawArray("q", HEADER + 2 * self.cfg.actors)
        self.rate = SharedRate(self.cfg, self.counters)
        self._lock_mp = self._ctx.Lock()

    # buffer: one shared segment per run directory (a killed driver's segment is replaced on creation)
    def _new_buffer(self, fields: dict):
        cfg = self.cfg
        return make_buffer(cfg, fields, shared=True, name=_segment_name(cfg.run_dir(), "buf"))

    def _load_buffer(self, path: Path):
        self.buffer.close()
        return buffer_class(self.cfg).load(path, shared=True, name=_segment_name(self.cfg.run_dir(), "buf"))

    # ------------------------------------------------------------------ counters and weights

    def _publish(self) -> None:
        """Copy the server's latest snapshot into the shared block, its targets only when they changed (the server
        keeps the same target dict until they do)."""
        snap = self.ps.snapshot
        if snap.version != self._published:
            new_targets = snap.target is not self._published_target
            self._weights.publish(_flat_state(snap, targets=new_targets), partial=not new_targets)
            self._published, self._published_target = snap.version, snap.target

    def _sync(self) -> None:
        """Publish new weights and drain the actors' messages (episodes, timers, errors)."""
        with self._sync_lock:
            self._publish()
            for actor in range(self.cfg.actors):
                self._drain(actor)

    def _drain(self, actor: int) -> None:
        """(sync lock held) Read what actor ``actor`` sent. A message cut short by a killed actor ends it."""
        for kind, payload in _read(self._messages[actor]):
            if kind == "episodes":
                for ret, length in payload:
                    self.record_episode(ret, length)
            elif kind == "timers":
                self.timers.setdefault(f"actor{actor}", PhaseTimer()).add(payload)
            elif kind == "error":
                self._last_error[actor] = payload
            elif kind == "training_error":
                self._training_errors[actor] = payload
            elif kind == "ready":
                self._ready.add(actor)

    def _pump(self) -> None:
        while not self.stop.is_set():
            self._sync()
            if self.counters[FINISHED] >= self.cfg.actors and not self.actors_finished.is_set():
                self.actors_finished.set()       # the budget is in: the run need not wait for the processes' exit
                self.rate.wake()
                self._check_ended()
            time.sleep(POLL_S)
        self._sync()

    # ------------------------------------------------------------------ actors

    def run(self) -> dict:
        """``Trainer.run`` with the actor processes started and set up (imports, environments, weights)
        before the clock starts, as the Ray backend does; that set-up time is ``startup_s`` in the summary."""
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        with stop_on_signals():                  # SIGTERM/SIGHUP while the actors start, too
            return self._run_processes()

    def _run_processes(self) -> dict:
        self._last_error: dict[int, str] = {}
        self._ready: set[int] = set()            # actors whose first process reported itself set up
        t0 = time.perf_counter()
        self._procs = {i: self._start(i) for i in range(self.cfg.actors)}
        if self.cfg.learner_processes:
            self._lprocs = {i: self._start_learner(i) for i in range(self.cfg.learners)}
        try:
            self._wait_ready()
        except BaseException:
            self.counters[STOP] = 1
            self._stop_learners()
            for p in self._procs.values():
                p.join(STOP_JOIN_S)
                if p.is_alive():
                    p.kill()
            raise
        self.startup_s = time.perf_counter() - t0
        self._spawn("counters", self._pump)
        return self._run()

    def _wait_ready(self) -> None:
        """Until every live actor process is set up (a dead one is the supervisor's, which restarts it) and
        every learner process is (a learner process that dies before is an error)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self._sync()
            for i, p in self._procs.items():
                if p.exitcode is not None and i not in self._ready:
                    raise WorkerError(f"actor{i} process failed while setting up ({self._actor_cause(i, p)})")
            alive = sum(p.exitcode is None for p in self._procs.values())
            for i, p in self._lprocs.items():
                if p.exitcode is not None:
                    raise WorkerError(f"learner{i} process failed while setting up ({self._learner_cause(i, p)})")
            learners_ready = all(self._lslots[i * L_FIELDS + L_READY] for i in self._lprocs)
            if self.counters[READY] >= alive and learners_ready:
                return
            time.sleep(0.005)
        raise WorkerError(f"actor processes not set up within {READY_TIMEOUT_S:.0f} s "
                          f"({int(self.counters[READY])} of {self.cfg.actors} ready)")

    def _actors(self, i: int) -> None:
        try:
            self._supervise(i)
        finally:
            self._sync()
            with self._lock:
                self._actors_left -= 1
                if self._actors_left == 0:
                    self.actors_finished.set()
            self.rate.wake()
            self._check_ended()

    # ------------------------------------------------------------------ learner processes

    def _start_learner(self, i: int) -> mp.Process:
        p = self._ctx.Process(
            target=learner_process, name=f"pal-learner{i}", daemon=True,
            args=(self.cfg, i, self.buffer.shared_name, self._weights.name, self._weights.spec,
                  self._grads[i].name, self._gspec, self._lslots, self._grant[i], self._done[i],
                  self._lmessages[i], os.getpid(), self.faults))
        p.start()
        return p

    def _learner(self, i: int) -> None:
        """Learner ``i``: the thread trainer's learner, or (``learner_processes``) a proxy thread that takes
        the rate controller's permits and the update number for learner process ``i``, hands it the update,
        waits for its gradient and submits it to the parameter server, as a learner thread would."""
        if not self.cfg.learner_processes:
            return super()._learner(i)
        cfg = self.cfg
        timer = self.timers[f"learner{i}"] = PhaseTimer()
        base = i * L_FIELDS
        names = list(self.ps.params)
        submitted = 0
        try:
            while self.rate.acquire_update(self.stop, self.actors_finished):
                timer.lap("rate_wait")
                with self._sync_lock:
                    self._publish()                      # the learner reads the latest version
                    version = self._published
                self._lslots[base + L_UPDATE] = self.next_update_index()
                self._grant[i].release()
                while not self._done[i].acquire(timeout=0.05):
                    p = self._lprocs[i]
                    if p.exitcode is not None:
                        cause = self._learner_cause(i, p)
                        if isinstance(cause, TrainingError):
                            raise cause
                        raise WorkerError(f"learner{i} process died ({cause})")
                    if self.stop.is_set():
                        return
                timer.lap("learner_process")
                got = self._grads[i].read(min_version=submitted + 1)
                if got is None:
                    raise WorkerError(f"learner{i} process signalled a gradient it had not published")
                _, flat = got
                grads = {g: [flat[f"{g}.{k}"] for k in range(len(self.ps.params[g]))]
                         for j, g in enumerate(names) if flat["groups"][j]}
                if self.ps.direct:                   # the sole sync learner's gradient: applied here
                    self.ps.apply(grads)
                    timer.lap("apply")
                else:
                    if cfg.aggregation == "async":
                        self.ps.wait_handled(i, submitted, self.stop)
                    self.ps.submit(i, version, grads)
                    if cfg.aggregation == "sync":
                        self.ps.wait_version(version, self.stop)
                    timer.lap("aggregation_wait")
                submitted += 1
                self.rate.update_done()
        finally:
            self.ps.learner_left()
            self._lslots[base + L_STOP] = 1
            self._grant[i].release()

    def _actor_cause(self, i: int, p: mp.Process) -> str:
        """How actor ``i``'s process ended, with the traceback it sent; none sent and exit code 1 is most often
        a script without the ``if __name__ == "__main__":`` guard that spawned processes need."""
        deadline = time.monotonic() + 1.0
        while i not in self._last_error and time.monotonic() < deadline:
            self._sync()                         # the error message may still be on its way
            time.sleep(0.01)
        why = self._last_error.get(i)
        code = p.exitcode
        cause = f"exit code {code}" + (f" (signal {-code})" if code is not None and code < 0 else "")
        if why:
            return cause + f":\n{why.strip()}"
        if code == 1:
            cause += ("; no traceback reached the driver: if a script starts this trainer, guard its entry point "
                      "with `if __name__ == \"__main__\":` (actor processes are spawned and import the script)")
        return cause

    def _learner_cause(self, i: int, p: mp.Process) -> str | TrainingError:
        """How learner process ``i`` ended, with the traceback it sent; or the ``TrainingError`` (``Diverged``) it
        sent, to raise as it is."""
        why = None
        for kind, payload in _read(self._lmessages[i], timeout=0.2):
            if kind == "error":
                why = payload
            elif kind == "training_error":
                return _training_error(payload)
        code = p.exitcode
        cause = f"exit code {code}" + (f" (signal {-code})" if code is not None and code < 0 else "")
        return cause + (f":\n{why.strip()}" if why else "")

    def _stop_learners(self) -> None:
        """Stop every learner process (flag, wake, join, kill the ones that do not exit) and collect its timers."""
        if not self._lprocs:
            return
        for i in self._lprocs:
            self._lslots[i * L_FIELDS + L_STOP] = 1
            self._grant[i].release()
        for i, p in self._lprocs.items():
            p.join(STOP_JOIN_S)
            if p.is_alive():
                p.kill()
                p.join(1.0)
            for kind, payload in _read(self._lmessages[i]):
                if kind == "timers":
                    self.timers.setdefault(f"learner{i}", PhaseTimer()).add(payload)
        self._lprocs = {}

    def _start(self, i: int) -> mp.Process:
        p = self._ctx.Process(
            target=actor_process, name=f"pal-actor{i}", daemon=True,
            args=(self.cfg, i, self.restarts[i], self.buffer.shared_name, self._weights.name,
                  self._weights.spec, self.counters, self._lock_mp, self._messages[i], os.getpid(), self.faults))
        p.start()
        return p

    def _supervise(self, i: int) -> None:
        """Run actor ``i``'s process to the end of the budget, restarting it when it dies."""
        self.counters[GO] = 1                    # the clock runs: the set-up actors go
        p = self._procs.pop(i, None) or self._start(i)
        while True:
            p.join(0.05)
            if self.stop.is_set():
                self.counters[STOP] = 1
                p.join(STOP_JOIN_S)
                if p.is_alive():
                    p.kill()
                    p.join(1.0)
                return
            if p.exitcode is None:
                continue
            if p.exitcode == 0:
                return
            self._sync()
            if self.counters[HOLDER] == i + 1:   # killed holding the reservation lock: release it for the others
                self.counters[HOLDER] = 0
                self._lock_mp.release()
            with self._lock_mp:                  # give back what it reserved and never inserted
                lost = int(self.counters[_reserved(i)] - self.counters[_inserted(i)])
                self.counters[_reserved(i)] = self.counters[_inserted(i)]
            self.lost[i] += lost
            if i in self._training_errors:       # it diverged (actor-side priorities): no restart would help
                raise _training_error(self._training_errors.pop(i))
            why = self._last_error.pop(i, None)
            cause = (f"exit code {p.exitcode}" + (f" (signal {-p.exitcode})" if p.exitcode < 0 else "")
                     + (f": {why.strip().splitlines()[-1]}" if why else ""))
            if self.restarts[i] >= MAX_RESTARTS:
                raise ActorGaveUp(f"actor{i} died {self.restarts[i] + 1} times (restarts allowed: {MAX_RESTARTS}); "
                                  f"last: {cause}; stopped with a final checkpoint in {self.run_dir}")
            self.restarts[i] += 1
            with self._sync_lock:                # the dead actor's queue may hold its write lock: a new one
                self._drain(i)
                self._messages[i] = self._ctx.Queue()
            self._event(f"actor{i}", "restart", lost, f"process {p.pid} died ({cause}); "
                                                     f"{lost} reserved transitions lost; restarted")
            p = self._start(i)

    def _join(self) -> None:
        try:
            self._stop_learners()                # their timers reach the summary
        finally:
            super()._join()

    def summary(self) -> dict:
        out = super().summary()
        out["backend"] = "processes"
        out["learner_processes"] = self.cfg.learner_processes
        out["restarts"] = [e for e in self.events if e["event"] == "restart"]
        out["transitions_lost"] = sum(self.lost)
        return out

    def close(self) -> None:
        """Stop every thread, actor and learner process, then unlink the shared buffer, weights and gradient
        blocks (idempotent)."""
        was_closed = self._closed
        super().close()
        if was_closed:
            return
        if hasattr(self, "counters"):
            self.counters[STOP] = 1
        self._stop_learners()
        for g in self._grads:
            g.close()
        if self._weights is not None:
            self._weights.close()
        self.buffer.close()
