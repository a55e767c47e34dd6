"""The process backend's driver: ``ProcessTrainer`` places the buffer and the weights in shared memory, starts
and supervises the actor (and learner) processes, and keeps the rate counters in the shared block."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

from pal_bench._segment import SharedControl
from pal_bench.train.backends.processes.actor import actor_process
from pal_bench.train.backends.processes.learner import (
    L_FIELDS,
    L_READY,
    L_STOP,
    L_UPDATE,
    L_VERSION,
    grads_spec,
    learner_process,
)
from pal_bench.train.backends.processes.mail import Mailboxes
from pal_bench.train.backends.processes.shared import (
    FINISHED,
    GO,
    HEADER,
    PAUSED,
    POLL_S,
    READY,
    READY_TIMEOUT_S,
    STARTED,
    STOP,
    STOP_JOIN_S,
    TOTAL_INSERTED,
    TOTAL_RESERVED,
    ParentAlive,
    Publisher,
    flat_state,
    give_back,
    inserted_slot,
    read_messages,
    reserved_slot,
    segment_name,
    training_error,
)
from pal_bench.train.backends.threads import Trainer
from pal_bench.train.config import TrainConfig
from pal_bench.train.driver import WorkerError, stop_on_signals
from pal_bench.train.errors import TrainingError
from pal_bench.train.faults import NO_FAULTS, Faults
from pal_bench.train.rate import RateController
from pal_bench.train.rate_policy import default_slack
from pal_bench.train.replay_spec import buffer_class, make_buffer
from pal_bench.train.shared_weights import SharedWeights, spec_of
from pal_bench.train.supervision import MAX_RESTARTS
from pal_bench.train.workers import PhaseTimer


class ActorGaveUp(TrainingError, WorkerError):
    """An actor process died more often than it may be restarted; the run wrote a final checkpoint first (the
    buffer and the weights are sound: what the dead incarnations held was accounted as lost)."""

    checkpoint = True


class LearnerDied(TrainingError, WorkerError):
    """A learner process was killed (a signal) or exited without a word; the run wrote a final checkpoint first
    (the weights and the buffer are the driver's and sound: its update was never applied)."""

    checkpoint = True


class SharedRate(RateController):
    """The thread trainer's rate controller with its counters in the shared array: ``steps`` and ``reserved`` are the
    running totals of the actors' inserted and reserved counts (one word each, kept under the block's lock beside
    the per-actor counters: reading them is O(1) in the number of actors), ``started`` and ``paused`` are written
    through for the actors to read. Learner threads wait on it as on the thread trainer's, polling (actor processes
    cannot notify a condition variable; each poll reads one word): every 0.5 ms while the next update is near, every
    10 ms while it lacks more than ``FAR_STEPS`` env steps (the prefill, or an actors-only measurement). Actors
    collecting under 25,600 steps/s cannot bring those steps in 10 ms, so there the longer poll never delays an
    update (above, by one poll at most); it spares the actors' cores 1,900 wake-ups a second."""

    POLL_S = 0.0005
    FAR_POLL_S = 0.01
    FAR_STEPS = 256

    def __init__(self, cfg: TrainConfig, counters):
        self._c, self._actors = counters, cfg.actors
        self._started = 0
        self._paused = False
        super().__init__(cfg.updates_per_step, cfg.learning_starts, cfg.steps, default_slack(cfg), lockstep=False)

    @property
    def steps(self) -> int:
        return int(self._c[TOTAL_INSERTED])

    @steps.setter
    def steps(self, value: int) -> None:             # init and restore only: all on actor 0's account
        self._c[inserted_slot(0)] += value - self.steps
        self._c[TOTAL_INSERTED] = value

    @property
    def reserved(self) -> int:
        return int(self._c[TOTAL_RESERVED])

    @reserved.setter
    def reserved(self, value: int) -> None:
        self._c[reserved_slot(0)] += value - self.reserved
        self._c[TOTAL_RESERVED] = value

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
        self._messages = [self._new_queue() for _ in range(cfg.actors)]
        self._mail = Mailboxes()                         # the queues with something in them, O(1) each
        for i, q in enumerate(self._messages):
            self._mail.watch(i, q)
        self._sync_lock = threading.Lock()
        self.restarts = [0] * cfg.actors
        self.lost = [0] * cfg.actors
        name = segment_name(self.run_dir, "w")
        stale = Path("/dev/shm") / name
        if stale.exists():                                # left by a driver killed in this run directory
            stale.unlink()
        self._weights = SharedWeights.create(spec_of(flat_state(self.ps.snapshot)), name=name)
        self._publisher = Publisher(self._weights)
        self._publish()
        if cfg.learner_processes:
            self._gspec = grads_spec(self.ps)
            for i in range(cfg.learners):
                gname = segment_name(self.run_dir, f"g{i}")
                if (Path("/dev/shm") / gname).exists():
                    (Path("/dev/shm") / gname).unlink()
                self._grads.append(SharedWeights.create(self._gspec, name=gname))
            self._lslots = self._ctx.RawArray("q", L_FIELDS * cfg.learners)
            self._grant = [self._ctx.Semaphore(0) for _ in range(cfg.learners)]
            self._done = [self._ctx.Semaphore(0) for _ in range(cfg.learners)]
            # (allreduce) learner j's: released once by every other learner when its gradient of the round is in
            self._arrived = [self._ctx.Semaphore(0) for _ in range(cfg.learners)]
            self._lmessages = [self._ctx.Queue() for _ in range(cfg.learners)]

    def _make_rate(self) -> SharedRate:
        """The rate counters in a named control block the actor processes attach and write (a resumed run's steps
        count as actor 0's), and its robust, process-shared lock they reserve under. The parameter server is the
        thread trainer's and the buffer a shared segment (``_new_buffer``)."""
        self._control = SharedControl.create(segment_name(self.cfg.run_dir(), "ctl"), HEADER + 2 * self.cfg.actors)
        self.counters, self._counter_lock = self._control.words, self._control.lock
        return SharedRate(self.cfg, self.counters)

    # buffer: one shared segment per run directory (a killed driver's segment is replaced on creation)
    def _new_buffer(self, fields: dict):
        cfg = self.cfg
        return make_buffer(cfg, fields, shared=True, name=segment_name(cfg.run_dir(), "buf"))

    def _load_buffer(self, path: Path):
        self.buffer.close()
        return buffer_class(self.cfg).load(path, shared=True, name=segment_name(self.cfg.run_dir(), "buf"))

    # ------------------------------------------------------------------ counters and weights

    def _publish(self) -> None:
        """Copy the server's latest snapshot into the shared block (``Publisher``: new versions only, targets only
        when they changed)."""
        self._publisher.publish(self.ps.snapshot)

    def _sync(self) -> None:
        """Publish new weights and drain the actors' messages (episodes, timers, errors): only the queues the
        epoll names, so that a poll costs O(messages), not O(actors)."""
        with self._sync_lock:
            self._publish()
            for actor in self._mail.ready():
                self._drain(actor)

    def _drain(self, actor: int) -> None:
        """(sync lock held) Read what actor ``actor`` sent. A message cut short by a killed actor ends it."""
        for kind, payload in read_messages(self._messages[actor]):
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
            self._start_learners()
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
            self._actor_left()

    # ------------------------------------------------------------------ learner processes

    def _start_learners(self) -> None:
        """Every learner process; with ``allreduce`` the names of every learner's gradient block (they average through
        them) and the weights' version they start from."""
        allreduce = None
        if self.cfg.aggregation == "allreduce":
            allreduce = ([g.name for g in self._grads], self._arrived)
            for i in range(self.cfg.learners):
                self._lslots[i * L_FIELDS + L_VERSION] = self.ps.version
        self._lprocs = {i: self._start_learner(i, allreduce) for i in range(self.cfg.learners)}

    def _start_learner(self, i: int, allreduce: list | None = None) -> mp.Process:
        p = self._ctx.Process(
            target=learner_process, name=f"pal-learner{i}", daemon=True,
            args=(self.cfg, i, self.buffer.shared_name, self._weights.name, self._weights.spec,
                  self._grads[i].name, self._gspec, self._lslots, self._grant[i], self._done[i],
                  self._lmessages[i], os.getpid(), self.faults, allreduce))
        p.start()
        return p

    def _start_learner_workers(self) -> None:
        """(``run_learners``) The learner processes (``learner_processes``), set up before the clock."""
        self._procs, self._last_error, self._ready = {}, {}, set()
        if self.cfg.learner_processes:
            self._start_learners()
            self._wait_ready()

    def _learner(self, i: int) -> None:
        """Learner ``i``: the thread trainer's learner, or (``learner_processes``) a proxy thread that takes
        the rate controller's permits and the update number for learner process ``i``, hands it the update,
        waits for its gradient and submits it to the parameter server, as a learner thread would."""
        if not self.cfg.learner_processes:
            return super()._learner(i)
        if self.cfg.aggregation == "allreduce":
            if i == 0:                                   # one thread grants every learner's rounds
                self._allreduce_rounds()
            return
        import torch

        # the proxy applies gradients with the parameter server's optimizer here, in the driver: one torch thread,
        # as every worker (torch's default, a thread per core, competes with the worker processes for the cores)
        torch.set_num_threads(1)
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
                    version = self._publisher.version
                self._lslots[base + L_UPDATE] = self.next_update_index()
                self._grant[i].release()
                while not self._done[i].acquire(timeout=0.05):
                    p = self._lprocs[i]
                    if p.exitcode is not None:
                        raise self._learner_death(i, p)
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

    def _allreduce_rounds(self) -> None:
        """(``aggregation = "allreduce"``) Grant the learner processes their updates a round at a time: one update
        each (``rate.acquire_round``), or in the budget's last round an update for some and a round without one for
        the others (slot ``L_UPDATE`` 0: they still join the all-reduce, adding nothing), so that every learner takes
        part in every all-reduce. Then wait for all of them. The gradients never come here: the driver holds only
        the rate rule and the update numbers."""
        L = self.cfg.learners
        timer = self.timers["rounds"] = PhaseTimer()      # (learner process 0 reports as learner0)
        try:
            while (started := self.rate.acquire_round(L, self.stop, self.actors_finished)) > 0:
                timer.lap("rate_wait")
                for j in range(L):
                    self._lslots[j * L_FIELDS + L_UPDATE] = self.next_update_index() if j < started else 0
                    self._grant[j].release()
                for j in range(L):
                    while not self._done[j].acquire(timeout=0.05):
                        # any learner of the round, not only j: j may be waiting for a dead one's gradient
                        dead = [k for k, p in self._lprocs.items() if p.exitcode is not None]
                        if dead:
                            raise self._group_death(dead[0])
                        if self.stop.is_set():
                            return
                timer.lap("learner_processes")
                for _ in range(started):
                    self.rate.update_done()
                if started < L:
                    return
        finally:
            for j in range(L):
                self.ps.learner_left()
                self._lslots[j * L_FIELDS + L_STOP] = 1
                self._grant[j].release()

    def _group_death(self, j: int) -> BaseException:
        """(allreduce) Learner ``j`` has ended mid-round; the others end too once told to stop (up to 1 s).
        The error of the one killed by a signal, if any (the others only lost their peer), else ``j``'s."""
        for k in range(self.cfg.learners):             # the others, waiting for its gradient, end too
            self._lslots[k * L_FIELDS + L_STOP] = 1
        deadline = time.monotonic() + 1.0
        while any(p.exitcode is None for p in self._lprocs.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        killed = [k for k, p in self._lprocs.items() if p.exitcode is not None and p.exitcode < 0]
        k = killed[0] if killed else j
        return self._learner_death(k, self._lprocs[k])

    def _learned(self) -> None:
        """(allreduce) The driver's parameter server takes the weights learner 0 last published (its version from
        learner 0's slot), for a checkpoint, an evaluation or the summary; the optimizers' moments stay in the
        learners (a resumed run's learners start theirs afresh, as Ray's all-reduce learners do)."""
        if self.cfg.aggregation != "allreduce" or not self.cfg.learner_processes or self._closed:
            return
        version = int(self._lslots[L_VERSION])
        if version <= self.ps.version:
            return
        got = self._weights.read(min_version=1)
        if got is None:
            return
        _, flat = got
        part = {w: {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(w + ".")}
                for w in ("online", "target")}
        self.ps.load_weights(part["online"], part["target"], version)
        self._publisher.holds(self.ps.snapshot)          # the block holds them already: nothing to publish back

    def save_checkpoint(self) -> Path:
        self._learned()
        return super().save_checkpoint()

    def evaluate(self) -> dict:
        self._learned()
        return super().evaluate()

    def _process_ended(self, i: int, p) -> None:
        """Actor ``i``'s process ``p`` has ended with an error, its messages read (a launcher whose process handle
        carries the error itself, as Ray's does, records it here)."""

    def _actor_cause(self, i: int, p: mp.Process) -> str:
        """How actor ``i``'s process ended, with the traceback it sent; none sent and exit code 1 is most often
        a script without the ``if __name__ == "__main__":`` guard that spawned processes need."""
        deadline = time.monotonic() + 1.0
        while i not in self._last_error and time.monotonic() < deadline:
            self._sync()                         # the error message may still be on its way
            time.sleep(0.01)
        why = self._last_error.get(i)
        code = p.exitcode
        cause = _exit_cause(code)
        if why:
            return cause + f":\n{why.strip()}"
        if code == 1:
            cause += ("; no traceback reached the driver: if a script starts this trainer, guard its entry point "
                      "with `if __name__ == \"__main__\":` (actor processes are spawned and import the script)")
        return cause

    def _learner_report(self, i: int) -> tuple[str | None, TrainingError | None]:
        """What learner process ``i`` sent before it ended: (its traceback or None, the ``TrainingError`` it raised
        (``Diverged``) or None)."""
        why = None
        for kind, payload in read_messages(self._lmessages[i], timeout=0.2):
            if kind == "error":
                why = payload
            elif kind == "training_error":
                return None, training_error(payload)
        return why, None

    def _learner_cause(self, i: int, p: mp.Process) -> str | TrainingError:
        """How learner process ``i`` ended, with the traceback it sent; or the ``TrainingError`` (``Diverged``) it
        sent, to raise as it is."""
        why, error = self._learner_report(i)
        return error or _exit_cause(p.exitcode) + (f":\n{why.strip()}" if why else "")

    def _learner_death(self, i: int, p: mp.Process) -> BaseException:
        """The error that ends the run once learner process ``i`` died mid-update: the ``TrainingError`` it sent;
        its traceback (a ``WorkerError``: a bug to read); or, killed by a signal or gone without a word,
        ``LearnerDied``, after which the run writes a final checkpoint, as for an actor past its restarts."""
        why, error = self._learner_report(i)
        if error is not None:
            return error
        code = p.exitcode
        if why:
            return WorkerError(f"learner{i} process died ({_exit_cause(code)}:\n{why.strip()})")
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code} without an error message"
        return LearnerDied(f"learner{i} process died ({_exit_cause(code)}): pid {p.pid} {how}; stopped with a final "
                           f"checkpoint in {self.run_dir}")

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
            for kind, payload in read_messages(self._lmessages[i]):
                if kind == "timers":
                    self.timers.setdefault(f"learner{i}", PhaseTimer()).add(payload)
        self._lprocs = {}

    # ------------------------------------------------------------------ placement (what another launcher replaces)

    def _new_queue(self):
        """An actor's message queue (episodes, timers, errors): ``put`` / ``close`` / ``join_thread`` in the
        actor, ``get`` / ``get_nowait`` here."""
        return self._ctx.Queue()

    def _launch(self, i: int, args: tuple) -> mp.Process:
        """Start actor ``i``'s process running ``actor_process(*args)``; returns its handle (``join``,
        ``is_alive``, ``exitcode``, ``kill``, ``pid``: ``mp.Process``'s)."""
        p = self._ctx.Process(target=actor_process, name=f"pal-actor{i}", daemon=True, args=args + (ParentAlive(
            os.getpid()), self.faults))
        p.start()
        return p

    def _start(self, i: int):
        p = self._launch(i, (self.cfg, i, self.restarts[i], self.resumed_steps, self.buffer.shared_name,
                             self._weights.name, self._weights.spec, self._control.shared_name,
                             self._messages[i]))
        _drop_write_end(self._messages[i])
        return p

    # ------------------------------------------------------------------ supervision

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
                with self._sync_lock:            # its last messages, then its queue (at end of file) unwatched
                    self._drain(i)
                    self._mail.forget(i)
                return
            self._sync()
            lost = give_back(self.counters, self._counter_lock, i)   # what it reserved and never inserted
            self.lost[i] += lost
            self._process_ended(i, p)
            if i in self._training_errors:       # it diverged (actor-side priorities): no restart would help
                raise training_error(self._training_errors.pop(i))
            why = self._last_error.pop(i, None)
            cause = _exit_cause(p.exitcode) + (f": {why.strip().splitlines()[-1]}" if why else "")
            if self.restarts[i] >= MAX_RESTARTS:
                raise ActorGaveUp(f"actor{i} died {self.restarts[i] + 1} times (restarts allowed: {MAX_RESTARTS}); "
                                  f"last: {cause}; stopped with a final checkpoint in {self.run_dir}")
            self.restarts[i] += 1
            with self._sync_lock:                # the dead actor's queue may hold its write lock: a new one
                self._drain(i)
                self._mail.forget(i)
                self._messages[i] = self._new_queue()
                self._mail.watch(i, self._messages[i])
            self._event(f"actor{i}", "restart", lost, f"process {p.pid} died ({cause}); "
                                                     f"{lost} reserved transitions lost; restarted")
            p = self._start(i)

    def _join(self) -> None:
        try:
            self._stop_learners()                # their timers reach the summary
        finally:
            super()._join()

    def summary(self) -> dict:
        self._learned()
        out = super().summary()
        out["backend"] = "processes"
        out["learner_processes"] = self.cfg.learner_processes
        out["restarts"] = [e for e in self.events if e["event"] == "restart"]
        out["transitions_lost"] = sum(self.lost)
        return out

    def close(self) -> None:
        """Stop every thread, actor and learner process, then unlink the shared buffer, weights and gradient
        blocks, then release the run lock (idempotent)."""
        was_closed = self._closed
        lock = self.recorder.detach_lock()       # held until the run's segments are gone: they are named after it
        try:
            super().close()
            if not was_closed:
                self._release_shared()
        finally:
            if lock is not None:
                lock.release()

    def _release_shared(self) -> None:
        """(close) Stop the learner processes, unlink the shared blocks and drop the message queues."""
        if hasattr(self, "counters"):
            self.counters[STOP] = 1
        self._stop_learners()
        for g in self._grads:
            g.close()
        if self._weights is not None:
            self._weights.close()
        self.buffer.close()
        if getattr(self, "_control", None) is not None:
            # the counters stay readable (summary, rate) as a copy: a view would keep the block's mapping, and
            # the file descriptor the mapping holds, for as long as this trainer lives
            self.counters = self.counters.copy()
            if isinstance(self.rate, SharedRate):
                self.rate._c = self.counters
            self._control.close()
        # the message queues' pipes: a queue this process never put to has no feeder thread for close() to stop,
        # and its two connections close when the queue is dropped
        if getattr(self, "_mail", None) is not None:
            self._mail.close()
        self._messages, self._lmessages = [], []


def _drop_write_end(q) -> None:
    """Close the driver's copy of a started actor's ``multiprocessing`` queue's write end (the driver never puts
    to it): the actor's copy is then the only one, so a message its process was killed in the middle of ends in
    end-of-file for the driver's read instead of a read that waits forever for the rest. (A ``SocketInbox`` has
    no such end: the driver only listens.)"""
    writer = getattr(q, "_writer", None)
    if writer is not None:
        writer.close()


def _exit_cause(code: int | None) -> str:
    """A worker process's exit code in words: "exit code -9 (signal 9)"."""
    return f"exit code {code}" + (f" (signal {-code})" if code is not None and code < 0 else "")
