"""``RayTrainer(cfg).run()``: the trainer with its actors, learners, replay buffer and parameter
server as Ray actors; the driver (this process) evaluates, logs, checkpoints and watches for
failures. Evaluation, logs, the summary and the progress bar are the ``Driver``'s own code, fed by
driver-side mirrors of the remote counters (polled every ``POLL_S``).

Failures: actors and learners are restarted by Ray (``MAX_RESTARTS`` each); the driver sees the
failed ``run`` call (``RayActorError``), returns the dead worker's outstanding grant or batches to
the budget (``BufferActor.release``: the transitions lost), records the restart in ``events.csv``
and the summary, and calls ``run`` again on the restarted actor, which rejoins at the current
weights version. A Python exception in a worker is no failure to survive: it stops the run and
reaches the caller as ``WorkerError`` with the worker's traceback.

Ray: without ``ray_address`` a local Ray is started with ``num_cpus`` = usable cores; with one the
driver joins that cluster. Either way the driver disconnects (``ray.shutdown``) at the end or on
error only if it connected itself, and an external cluster is left running. Ray resources: each
actor and learner asks for ``min(1, CPUs / workers)`` CPUs; the learners, the buffer and the
parameter server share one placement-group bundle (buffer next to the learners), each actor has
its own; ``ray_placement`` "pack" or "spread" is the placement group's strategy.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pal_bench.conditions import machine_busy_seconds
from pal_bench.train.backends.ray.context import cpu_share, from_numpy, max_updates, rate_slack
from pal_bench.train.config import ConfigError, TrainConfig
from pal_bench.train.driver import JOIN_TIMEOUT_S, Driver, DriverSchedule, WorkerError, stop_on_signals
from pal_bench.train.errors import TrainingError
from pal_bench.train.param_server import Snapshot
from pal_bench.train.supervision import MAX_RESTARTS
from pal_bench.train.workers import PhaseTimer

POLL_S = 0.2
REVIVE_TIMEOUT_S = 120.0  # longest wait for Ray to restart a dead worker
PLACEMENT_TIMEOUT_S = 60.0


class _PSView:
    """What the ``Driver``'s evaluation and summary read from a parameter server, from the Ray actor."""

    direct = False        # Ray's learners always send their gradients to the parameter-server actor

    def __init__(self):
        self.handle = None
        self.version, self.dropped_stale = 0, 0
        self.times = {"aggregate_s": 0.0, "publish_s": 0.0}

    @property
    def snapshot(self) -> Snapshot:
        import ray

        version, (ref,) = ray.get(self.handle.latest.remote(-1))
        state = ray.get(ref)
        return Snapshot(version, from_numpy(state["online"]), from_numpy(state["target"]))


@dataclass
class RemoteCounters:
    """The driver's mirror of the buffer actor's counters (transitions inserted, updates done), refreshed
    every ``POLL_S``; what the ``Driver``'s evaluation, summary and progress bar read as ``rate``."""

    max_updates: int
    steps: int = 0
    done: int = 0
    wait_s: dict = field(default_factory=dict)


class RemoteBufferStats:
    """What ``Driver.summary`` reads from a buffer (``lock_stats``), from the buffer actor's last stats."""

    def __init__(self):
        self.stats: dict = {"lock": {}, "seconds": {}}

    def lock_stats(self) -> dict:
        return self.stats["lock"]


class RayTrainer(Driver):
    """The Ray backend's driver: the ``Driver`` with the buffer, the parameter server and the workers in Ray
    actors; ``run() -> summary``, ``close()``, context manager, run directory, as every backend."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False):
        if cfg.backend != "ray":
            raise ConfigError(f"backend: RayTrainer runs backend = 'ray', got {cfg.backend!r}")
        self.placement: dict[str, dict] = {}       # worker -> {pid, node_id, host}
        self.learner_results: dict[str, dict] = {}  # learner -> {updates, version, weights_sha1} at its end
        self._owns_ray = False
        self._handles: dict = {}                   # name -> actor handle
        self._pg = None
        self._resume_state: dict | None = None
        self._restarts: dict[str, int] = {}
        self._running: dict = {}                   # ref of a call the driver waits on -> worker name
        self._reviving: dict[str, float] = {}      # worker being restarted -> deadline (monotonic)
        self._stopping = False
        self._buffer_pid: int | None = None
        super().__init__(cfg, resume=resume, overwrite=overwrite)

    def _place(self) -> None:
        """Ray: parameter server, buffer and counters live in Ray actors (started by ``run``); the driver
        keeps views of them."""
        self.rate = RemoteCounters(max_updates=self.max_updates)
        self.ps = _PSView()
        self.buffer = RemoteBufferStats()

    # ------------------------------------------------------------------ Ray set-up and tear-down

    def _connect(self) -> None:
        from pal_bench.train.backends.ray.session import connect

        self._owns_ray = connect(self.cfg.ray_address)   # False: the caller's session (tests share one)

    def _spawn(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from pal_bench.train.backends.ray.buffer_actor import BufferActor
        from pal_bench.train.backends.ray.ps_actor import ParameterServerActor
        from pal_bench.train.backends.ray.workers import ActorWorker, LearnerWorker

        cfg = self.cfg
        n = cfg.actors + cfg.learners
        cpu = cpu_share(n)
        bundles = [{"CPU": cpu * cfg.learners}] + [{"CPU": cpu}] * cfg.actors
        self._pg = placement_group(bundles, strategy="SPREAD" if cfg.ray_placement == "spread" else "PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise WorkerError(f"Ray cannot place {bundles} ({cfg.ray_placement}) within {PLACEMENT_TIMEOUT_S} s; "
                              f"cluster resources: {ray.cluster_resources()}")

        def where(bundle: int):
            return PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=bundle)

        rs = self._resume_state or {}
        ckpt = str((self.run_dir / "buffer_actor.pal").resolve()) if cfg.buffer_checkpoint_interval else None
        restore = str(Path(rs["buffer_file"]).resolve()) if rs else None
        counters = {"steps": rs["steps"], "started": rs["updates"], "done": rs["updates"]} if rs else None
        buffer = ray.remote(BufferActor).options(
            name=None, num_cpus=0, scheduling_strategy=where(0), max_restarts=1 if ckpt else 0,
            max_task_retries=-1 if ckpt else 0).remote(cfg, rate_slack(cfg), ckpt, restore, counters)
        ps = ray.remote(ParameterServerActor).options(num_cpus=0, scheduling_strategy=where(0)).remote(
            cfg, cfg.learners, rs.get("ps"))
        self._handles = {"buffer": buffer, "parameter-server": ps}
        restarts = MAX_RESTARTS if cfg.aggregation != "allreduce" else 0
        for i in range(cfg.learners):
            self._handles[f"learner{i}"] = ray.remote(LearnerWorker).options(
                num_cpus=cpu, scheduling_strategy=where(0), max_restarts=restarts).remote(cfg, i, buffer, ps)
        for i in range(cfg.actors):
            self._handles[f"actor{i}"] = ray.remote(ActorWorker).options(
                num_cpus=cpu, scheduling_strategy=where(1 + i), max_restarts=MAX_RESTARTS).remote(cfg, i, buffer, ps)
        self.ps.handle = ps
        # every process is up before the clock starts (the parameter server too: a worker's first weights
        # pull would otherwise wait for it to start, about a second, inside the measured run)
        names = list(self._handles)
        infos = ray.get([self._handles[k].info.remote() if k != "buffer" else buffer.pid.remote() for k in names])
        for k, info in zip(names, infos):
            self.placement[k] = info if isinstance(info, dict) else {"pid": info}
        self._buffer_pid = self.placement["buffer"]["pid"]

    def _teardown(self) -> None:
        """Kill every actor of this run, remove its placement group, disconnect if we connected."""
        import ray

        if not ray.is_initialized():
            return
        for h in self._handles.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:   # noqa: BLE001 - already gone
                pass
        self._handles = {}
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # ------------------------------------------------------------------ the run

    def run(self) -> dict:
        """Train to ``cfg.steps`` transitions; returns the summary (also written to summary.json)."""
        if self._closed:
            raise RuntimeError("this RayTrainer is closed")
        with stop_on_signals():
            return self._run()

    def _run(self) -> dict:
        self._start_files()
        interrupted, failed = False, True
        progress = None
        try:
            t0 = time.perf_counter()
            self._connect()
            self._spawn()
            self.t0 = time.perf_counter()
            self.startup_s = self.t0 - t0
            progress = self._progress_bar()
            self._loop(progress)
            failed = False
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            try:
                self._finish(progress, clean=not failed or interrupted, interrupted=interrupted)
            finally:
                self._teardown()
        return self.summary()

    def _start(self, name: str):
        h = self._handles[name]
        if name.startswith("learner"):
            return h.run.remote(self._init_method)
        return h.run.remote(self._restarts.get(name, 0), self.resumed_steps)

    def _loop(self, progress) -> None:
        import ray

        cfg = self.cfg
        self._init_method = None
        if cfg.aggregation == "allreduce":
            self._init_method = ray.get(self._handles["learner0"].rendezvous.remote())
        self._running = {self._start(k): k for k in self._handles if k.startswith(("actor", "learner"))}
        schedule = DriverSchedule(self)
        while self._running:
            ready, _ = ray.wait(list(self._running), num_returns=1, timeout=POLL_S)
            for ref in ready:
                self._collect(ref)
            self._poll()
            self._update_progress(progress)
            if schedule.tick(self.save_checkpoint):     # the workers keep running (see save_checkpoint)
                break

    def _collect(self, ref) -> None:
        """A call the driver waits on returned: a worker's ``run`` (record its phases, or handle its
        process's death) or the ``info`` probe of a restarting worker (then call ``run`` again)."""
        import ray
        from ray.exceptions import RayActorError

        name = self._running.pop(ref)
        reviving = name in self._reviving
        try:
            out = ray.get(ref)
        except RayActorError as e:
            if reviving:                  # the probe reached the dead incarnation: probe again
                if time.monotonic() > self._reviving[name]:
                    raise WorkerError(f"worker {name} did not come back within {REVIVE_TIMEOUT_S} s:\n{e}") from e
                self._running[self._handles[name].info.remote()] = name
                return
            self._died(name, e)
            return
        except ray.exceptions.RayTaskError as e:
            if isinstance(getattr(e, "cause", None), TrainingError):    # divergence: its one line says it all
                raise e.cause from None
            raise WorkerError(f"worker {name} failed:\n{e}") from e
        if reviving:                      # restarted: run again (unless the run is ending)
            del self._reviving[name]
            self.placement[name] = out
            if not self._stopping:
                self._running[self._start(name)] = name
            return
        self.timers.setdefault(name, PhaseTimer()).add(out["seconds"])    # summed over its incarnations
        self.placement[name] = {k: out[k] for k in ("pid", "node_id", "host")}
        if name.startswith("learner"):
            prev = self.learner_results.get(name, {}).get("updates", 0)
            self.learner_results[name] = {"updates": prev + out["updates"], "version": out["version"],
                                          "weights_sha1": out["weights_sha1"]}

    def _died(self, name: str, error: Exception) -> None:
        """``name``'s process died: return its outstanding work to the budget, log, probe for the restart."""
        import ray

        n = self._restarts.get(name, 0) + 1
        limit = MAX_RESTARTS if name.startswith("actor") or self.cfg.aggregation != "allreduce" else 0
        if n > limit:
            raise WorkerError(f"worker {name} died {n} times (restarts allowed: {limit}):\n{error}") from error
        self._restarts[name] = n
        kind, i = ("actor", int(name[5:])) if name.startswith("actor") else ("learner", int(name[7:]))
        lost = ray.get(self._handles["buffer"].release.remote(kind, i))
        self._event(name, "restart", lost if kind == "actor" else 0,
                    f"process {self.placement.get(name, {}).get('pid')} died; restart {n}"
                    + (f"; {lost} transitions lost" if kind == "actor" else f"; {lost} sampled batches dropped"))
        self._reviving[name] = time.monotonic() + REVIVE_TIMEOUT_S
        self._running[self._handles[name].info.remote()] = name

    def _poll(self) -> None:
        """Mirror the buffer's counters and drain its episodes."""
        import ray

        st = ray.get(self._handles["buffer"].status.remote())
        if st["pid"] != self._buffer_pid:        # Ray restarted the buffer actor
            restored = st["restored"] or {"steps": 0}
            lost = max(0, self.rate.steps - restored["steps"])
            self._event("buffer", "restart", lost, f"process {self._buffer_pid} died; reloaded the checkpoint at "
                                                   f"{restored['steps']} transitions; {lost} transitions lost")
            self._buffer_pid = st["pid"]
            self.placement["buffer"]["pid"] = st["pid"]
        self.rate.steps, self.rate.done = st["steps"], st["done"]
        self.update_count = st["done"]
        wall = self.wall()
        self.episodes += [(s, r, n, wall) for s, r, n in st["episodes"]]

    def _finish(self, progress, clean: bool, interrupted: bool) -> None:
        """Stop the workers, wait for their last phases, then (clean run) evaluate, checkpoint and log."""
        import ray

        running = self._running
        self._stopping = True
        if self._handles:
            ray.get([self._handles["buffer"].stop.remote(), self._handles["parameter-server"].stop.remote()])
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            while running and time.monotonic() < deadline:
                ready, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                for ref in ready:
                    try:
                        self._collect(ref)
                    except WorkerError:
                        if clean:
                            raise
            self._poll()
            ps, buf = ray.get([self._handles["parameter-server"].stats.remote(),
                               self._handles["buffer"].stats.remote()])
            self.ps.version, self.ps.dropped_stale, self.ps.times = ps["version"], ps["dropped_stale"], ps["times"]
            self.buffer.stats = buf
            self.rate.wait_s = buf["wait_s"]
            for t in ps["timeouts"]:
                self._event("parameter-server", "learner_timeout", 0,
                            f"version {t['version']} applied with {t['gradients']} gradients after "
                            f"{t['waited_s']} s; missing learners {t['missing_learners']}")
        self.train_wall_s = self.wall()
        if progress is not None:
            progress.close()
        if clean and self._handles:
            evaluated_here = bool(self.evals) and self.evals[-1]["env_steps"] == self.rate.steps
            if not interrupted and self.cfg.eval_episodes and not evaluated_here:
                self.evaluate()
            self._write_logs()                  # before the checkpoint: a full disk there still leaves them
            self.save_checkpoint()

    def run_learners(self, rows: dict, updates: int) -> dict:
        """Learners alone, for measuring f_l (as ``Trainer.run_learners``): the buffer actor holding ``rows``
        (replay columns, N each) as if the actors had collected them, a budget that allows ``updates`` updates at
        once, the parameter-server actor and ``cfg.learners`` learner workers, no actors. ``wall_s`` runs from the
        learners' ``run`` calls to the last one's return (every process up before); ``cpu_s`` is None (the work
        is in other processes); ``machine_cpu_s``: the machine's busy CPU seconds meanwhile (every process, /proc/stat),
        ``phase_seconds``: each learner's phases."""
        import ray

        from pal_bench.train.backends.ray.buffer_actor import BufferActor
        from pal_bench.train.backends.ray.ps_actor import ParameterServerActor
        from pal_bench.train.backends.ray.workers import LearnerWorker

        n_rows = len(next(iter(rows.values())))
        cfg = dataclasses.replace(self.cfg, steps=n_rows, learning_starts=0, updates_per_step=updates / n_rows)
        while max_updates(cfg) < updates:
            cfg = dataclasses.replace(cfg, updates_per_step=float(np.nextafter(cfg.updates_per_step, 1.0)))
        self._connect()
        try:
            n = cfg.learners
            buffer = ray.remote(BufferActor).options(num_cpus=0).remote(cfg, 0)
            ps = ray.remote(ParameterServerActor).options(num_cpus=0).remote(cfg, n)
            learners = [ray.remote(LearnerWorker).options(num_cpus=cpu_share(n)).remote(cfg, i, buffer, ps)
                        for i in range(n)]
            self._handles = {"buffer": buffer, "parameter-server": ps} | {f"learner{i}": h
                                                                          for i, h in enumerate(learners)}
            ray.get(buffer.add_batch.remote(0, rows, n_rows, [], 0))
            ray.get([h.info.remote() for h in learners] + [ps.stats.remote()])     # every process is up
            init = ray.get(learners[0].rendezvous.remote()) if cfg.aggregation == "allreduce" else None
            busy0, t0 = machine_busy_seconds(), time.perf_counter()
            got = ray.get([h.run.remote(init) for h in learners])
            wall, busy1 = time.perf_counter() - t0, machine_busy_seconds()
            done = ray.get(buffer.status.remote())["done"]
        finally:
            self._teardown()
        return {"updates": done, "wall_s": wall, "cpu_s": None,
                "machine_cpu_s": None if busy0 is None or busy1 is None else busy1 - busy0,
                "phase_seconds": {f"learner{i}": r["seconds"] for i, r in enumerate(got)}}

    def close(self) -> None:
        """Kill this run's Ray actors and disconnect from Ray if we connected (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._teardown()

    # ------------------------------------------------------------------ summary, checkpoints

    def summary(self) -> dict:
        s = super().summary()
        s["phase_seconds"]["buffer"] = {k: round(v, 4) for k, v in self.buffer.stats["seconds"].items()}
        return s | {
            "backend": "ray", "ray_placement": "spread" if self.cfg.ray_placement == "spread" else "pack",
            "ray_address": self.cfg.ray_address, "buffer_size": self.buffer.stats.get("size"),
            "restarts": [e for e in self.events if e["event"] == "restart"],
            "transitions_lost": sum(e["transitions_lost"] for e in self.events),
            "learner_timeouts": sum(e["event"] == "learner_timeout" for e in self.events),
            "placement": self.placement,
            "learners_final": self.learner_results,
        }

    def save_checkpoint(self) -> Path:
        """checkpoint.pt (weights, optimizers, targets, counters, logs) and buffer.pal, written by the
        buffer actor (on a cluster, ``out_dir`` must be a path every node sees). The workers keep
        running: the buffer is saved atomically and the weights within milliseconds of it."""
        import ray

        saved: dict = {}

        def write_buffer(path: Path) -> int:
            saved.update(ray.get(self._handles["buffer"].save.remote(str(path.resolve()))))
            saved["ps"] = ray.get(self._handles["parameter-server"].state_dict.remote())
            return saved["total_added"]

        # the state's counters are the buffer actor's at its save: built once the buffer is written
        return self.recorder.save_checkpoint(
            lambda: self._checkpoint_state(saved["ps"], saved["steps"], saved["done"]), write_buffer,
            steps=self.rate.steps)

    def _restore(self, state: dict) -> None:
        """Counters now; weights and buffer go to the Ray actors when ``run`` starts them. The buffer file is
        checked here first (read once in the driver): this run's fields and capacity, its checkpoint's
        ``total_added``."""
        from pal_bench.train.replay_spec import buffer_class

        self._restore_buffer(state, load=buffer_class(self.cfg).load).close()
        self._resume_state = state
        self.rate.steps, self.rate.done = state["steps"], state["updates"]
        self.wall_offset = state["wall_s"]
        self.resumed_steps = state["steps"]
