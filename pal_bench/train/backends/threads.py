"""``Trainer(config).run()``: actor threads, learner threads and a parameter-server thread in one
process around PAL's replay buffer, with evaluation, logging, checkpoints and clean shutdown.

Every thread runs through ``_spawn``: an exception in any worker is recorded with its traceback and
sets the stop event, every loop waits in bounded steps on that event, and ``run`` joins every
thread before it returns or raises (``WorkerError``, carrying the worker's traceback; a ``TrainingError``
such as ``Diverged``, whose one line says it all, is raised as it is). Ctrl-C in the main thread stops the
workers, writes a final checkpoint and re-raises ``KeyboardInterrupt``; SIGTERM and SIGHUP do the same
(``Interrupted``, a ``KeyboardInterrupt`` naming the signal) while ``run`` is in progress in the main thread.

What a run is (config, recorder, evaluation, summary, checkpoints) is the ``Driver``'s; this module places the
workers: the parameter server, the buffer and the rate controller as objects of this process, and the workers
as its threads.
"""

from __future__ import annotations

import copy
import threading
import time
import traceback

from pal_bench.train.config import TrainConfig
from pal_bench.train.driver import JOIN_TIMEOUT_S, Driver, DriverSchedule, WorkerError, stop_on_signals
from pal_bench.train.errors import TrainingError
from pal_bench.train.param_server import ParameterServer
from pal_bench.train.rate import RateController
from pal_bench.train.rate_policy import default_slack
from pal_bench.train.workers import actor_thread, learner_thread


class Trainer(Driver):
    """The thread backend: the ``Driver`` with the parameter server, the buffer and the rate controller in this
    process and every worker a thread of it (``actor_thread``, ``learner_thread``). The process backend's driver
    extends it (its learners are threads too)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False):
        self.actors_finished = threading.Event()
        self._ended = threading.Event()            # set the moment every actor finished and every learner left
        self._learners_left = cfg.learners
        self.threads: list[threading.Thread] = []
        self.errors: list[tuple[str, BaseException, str]] = []
        super().__init__(cfg, resume=resume, overwrite=overwrite)

    def _place(self) -> None:
        """The parameter server, the replay buffer and the rate controller are objects of this process."""
        self.ps = self._make_server()
        self.buffer = self._new_buffer(self.fields())
        self.rate = self._make_rate()

    def _make_server(self) -> ParameterServer:
        nets = self.networks()
        return ParameterServer(self.algo, nets, copy.deepcopy(nets), self.cfg, self.cfg.learners)

    def _make_rate(self) -> RateController:
        cfg = self.cfg
        return RateController(cfg.updates_per_step, cfg.learning_starts, cfg.steps, default_slack(cfg), cfg.lockstep)

    def _spawn(self, name: str, fn, *args) -> None:
        def body():
            try:
                fn(*args)
            except BaseException as e:   # noqa: BLE001 - every worker error must reach the caller
                with self._lock:
                    self.errors.append((name, e, traceback.format_exc()))
                self.stop.set()
                self.rate.wake()

        t = threading.Thread(target=body, name=f"pal-{name}", daemon=True)
        self.threads.append(t)
        t.start()


    def _learner(self, i: int) -> None:
        learner_thread(self, i, self.stop)


    def _learner_body(self, i: int) -> None:
        try:
            self._learner(i)
        finally:
            with self._lock:
                self._learners_left -= 1
            self._check_ended()


    def _check_ended(self) -> None:
        """Wake the run loop the moment the work is done (every actor finished, every learner left), so that
        the training wall time is taken then, not at the loop's next 0.2 s tick."""
        if self.actors_finished.is_set() and self._learners_left == 0:
            self._ended.set()


    def _actors(self, i: int) -> None:
        try:
            actor_thread(self, i, self.stop)
        finally:
            self._actor_left()

    def _actor_left(self) -> None:
        """One actor's share is done (or it failed): the last one sets ``actors_finished``."""
        with self._lock:
            self._actors_left -= 1
            if self._actors_left == 0:
                self.actors_finished.set()
        self.rate.wake()
        self._check_ended()

    def run(self) -> dict:
        """Train to ``cfg.steps`` transitions; returns the summary (also written to summary.json)."""
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        with stop_on_signals():
            return self._run()


    def _run(self) -> dict:
        cfg = self.cfg
        self._start_files()
        self.t0 = time.perf_counter()
        self._actors_left = cfg.actors
        self._learners_left = cfg.learners
        self._ended = threading.Event()
        progress = self._progress_bar()
        schedule = DriverSchedule(self)
        interrupted = False
        try:
            if not self.ps.direct:                     # a sole sync learner applies its own gradients
                self._spawn("parameter-server", self.ps.serve, self.stop)
            for i in range(cfg.learners):
                self._spawn(f"learner{i}", self._learner_body, i)
            for i in range(cfg.actors):
                self._spawn(f"actor{i}", self._actors, i)
            while not self.stop.is_set():
                self._ended.wait(0.2)
                if self._ended.is_set():
                    break
                self._update_progress(progress)
                if schedule.tick(self._paused_checkpoint):
                    break
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            self.train_wall_s = self.wall()            # the work is done: joining the workers is not training
            self.stop.set()
            self.rate.wake()
            failure = None
            try:
                self._join()
            except Exception as e:                     # noqa: BLE001 - raised below, after the files
                failure = e
            if progress is not None:
                progress.close()
            # a clean end, Ctrl-C, or a failure that leaves the state sound (TrainingError.checkpoint): the logs
            # and summary first, then the checkpoint (a full disk there still leaves them)
            if failure is None or getattr(failure, "checkpoint", False):
                evaluated_here = bool(self.evals) and self.evals[-1]["env_steps"] == self.rate.steps
                if failure is None and not interrupted and cfg.eval_episodes and not evaluated_here:
                    self.evaluate()
                self._write_logs()
                self.save_checkpoint()
            if failure is not None:
                raise failure
        return self.summary()


    def run_learners(self, rows: dict, updates: int) -> dict:
        """Learners alone, for measuring f_l: no actors; the buffer gets ``rows`` (replay columns, N each), the
        rate rule allows ``updates`` updates over those N transitions at once, and the learners (with the
        parameter server) run to them. Returns ``updates`` done, ``wall_s`` from the learners' start to the last
        one's end (their set-up, and a backend's worker processes, before the clock) and the driver process's
        ``cpu_s`` meanwhile."""
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        n = len(next(iter(rows.values())))
        self.buffer.add_batch(**rows)
        self.rate = RateController(updates / n, 0, n, slack=0, lockstep=False)
        self.rate.restore(n, 0)
        self.actors_finished.set()
        self._start_learner_workers()
        try:
            if not self.ps.direct:
                self._spawn("parameter-server", self.ps.serve, self.stop)
            first = len(self.threads)
            t0, cpu0 = time.perf_counter(), time.process_time()
            for i in range(self.cfg.learners):
                self._spawn(f"learner{i}", self._learner, i)
            learners = self.threads[first:]
            while any(t.is_alive() for t in learners) and not self.errors:
                time.sleep(0.01)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            self.stop.set()
            self.rate.wake()
            self._join()
        return {"updates": self.rate.done, "wall_s": wall, "cpu_s": cpu}


    def _start_learner_workers(self) -> None:
        """(``run_learners``) Start and set up whatever learners need besides their threads: nothing here."""


    def _join(self) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        self.threads = [t for t in self.threads if t.is_alive()]
        if self.errors:
            name, exc, tb = self.errors[0]
            if isinstance(exc, TrainingError):         # its one line says what failed
                raise exc
            more = f" (and {len(self.errors) - 1} more worker errors)" if len(self.errors) > 1 else ""
            raise WorkerError(f"worker {name} failed{more}:\n{tb}") from exc
        if alive:
            raise WorkerError(f"threads still running {JOIN_TIMEOUT_S} s after stop: {alive}")


    def close(self) -> None:
        """Stop and join every thread (idempotent)."""
        if self._closed:
            return
        super().close()
        self.stop.set()
        self.rate.wake()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
