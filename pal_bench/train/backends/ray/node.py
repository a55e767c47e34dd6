"""Ray on one node at the process backend's speed (``ray_placement = "node"``, which "auto", the default, picks
unless the run needs Ray actors): Ray places and starts the actor
processes; everything they exchange is the process backend's, in shared memory on the node.

``RayNodeTrainer`` is ``ProcessTrainer`` with another launcher: each actor process is a Ray actor pinned to the
driver's node (``NodeAffinitySchedulingStrategy``) running the same ``actor_process`` body, which attaches by name
to the shared replay segment (``add_batch`` straight into it), the ``SharedWeights`` block (weights read straight
into its networks) and the ``SharedControl`` block (the rate counters and their lock). The learners are the
driver's threads next to the parameter server, reading the segment in this process (no remote call per batch;
a sole learner applies its own gradient). An actor's small messages (episodes, timers, errors) go over a Unix
socket the driver listens on (``SocketInbox``). What goes through Ray is the placement, the start-up and each
process's end.
"""

from __future__ import annotations

import os

from pal_bench.train.backends.processes.actor import actor_process
from pal_bench.train.backends.processes.inbox import SocketInbox
from pal_bench.train.backends.processes.shared import DriverAlive
from pal_bench.train.backends.processes.trainer import ProcessTrainer
from pal_bench.train.config import ConfigError, TrainConfig
from pal_bench.train.driver import WorkerError
from pal_bench.train.errors import TrainingError

START_TIMEOUT_S = 120.0   # longest wait for Ray to start an actor process
INSERTER_PING_S = 30.0    # a remote actor is (re)started only once the inserter answers within this (s)


class InserterLost(TrainingError, WorkerError):
    """The inserter (remote actors' only contact on the driver's node) died: the run ends with a final checkpoint
    (the buffer, the weights and the counters on this node are sound; the remote actors' unsent chunks are lost)."""

    checkpoint = True


class _Host:
    """A Ray actor that runs one worker body (``actor_process``) in its process."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, args: tuple) -> None:
        actor_process(*args)


class _RemoteHost:
    """A Ray actor on another node that runs one remote actor: the Ray backend's ``ActorWorker`` (``actor_loop``
    over ``ChunkGrants`` and ``LatestWeights``) against the inserter on the driver's node."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, args: tuple) -> None:
        import ray

        from pal_bench.train.backends.ray.workers import ActorWorker

        cfg, actor, incarnation, resumed_steps, inserter = args
        out = ActorWorker(cfg, actor, inserter, inserter).run(incarnation, resumed_steps)
        ray.get(inserter.finish.remote(actor, out["seconds"]))


class RayProcess:
    """An actor process started by Ray on ``node_id`` running ``host.run(args)``, with the handle ``mp.Process``
    gives the supervisor (``join``, ``is_alive``, ``exitcode``, ``kill``, ``pid``). ``exitcode``: None while it
    runs, 0 when its body returned, 1 when it raised or its process died (Ray does not tell a signal from an
    exit)."""

    def __init__(self, host: type, args: tuple, node_id: str, num_cpus: float):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.handle = ray.remote(host).options(num_cpus=num_cpus, max_restarts=0, scheduling_strategy=(
            NodeAffinitySchedulingStrategy(node_id, soft=False))).remote()
        ready, _ = ray.wait([pid_ref := self.handle.pid.remote()], timeout=START_TIMEOUT_S)
        if not ready:
            ray.kill(self.handle, no_restart=True)
            raise TimeoutError(f"Ray did not start an actor process within {START_TIMEOUT_S:.0f} s")
        self.pid = ray.get(pid_ref)
        self.ref = self.handle.run.remote(args)
        self._exitcode: int | None = None
        self.error: str | None = None       # what the body raised (Ray's traceback), once it has ended
        self.training_error: tuple[str, str] | None = None   # (class, message) when that was a TrainingError

    def join(self, timeout: float | None = None) -> None:
        import ray

        ray.wait([self.ref], timeout=timeout)

    @property
    def exitcode(self) -> int | None:
        import ray

        if self._exitcode is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                try:
                    ray.get(self.ref)
                    self._exitcode = 0
                except Exception as e:   # noqa: BLE001 - RayTaskError / RayActorError: it raised or died
                    self._exitcode, self.error = 1, str(e)
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, TrainingError):
                        self.training_error = (type(cause).__name__, str(cause))
        return self._exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        import ray

        ray.kill(self.handle, no_restart=True)


class RayNodeTrainer(ProcessTrainer):
    """The process backend's trainer with its actor processes placed by Ray on the driver's node
    (``backend = "ray"``, ``ray_placement = "node"``)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False):
        if cfg.backend != "ray" or cfg.placement != "node":
            raise ConfigError("RayNodeTrainer runs backend = 'ray' with ray_placement 'node' (or 'auto')")
        from pal_bench.train.backends.ray.session import connect

        self._owns_ray = connect(cfg.ray_address)
        import ray

        self._node_id = ray.get_runtime_context().get_node_id()
        self._remote_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != self._node_id]
        if cfg.ray_remote_actors and not self._remote_nodes:
            self._disconnect()
            raise ConfigError("ray_remote_actors: the Ray cluster has no node besides the driver's")
        self._inserter = None
        self._inboxes: list[SocketInbox] = []
        self.placement: dict[str, dict] = {}       # actor -> {pid, node_id} of its current process
        self._hosts: list[RayProcess] = []          # every actor process started (killed at close)
        try:
            super().__init__(cfg, resume=resume, overwrite=overwrite)
        except BaseException:
            self._disconnect()
            raise

    def _new_queue(self) -> SocketInbox:
        q = SocketInbox()
        self._inboxes.append(q)
        return q

    def _launch(self, i: int, args: tuple) -> RayProcess:
        """Actor ``i``'s process: on this node running ``actor_process(*args)``, or (``ray_remote_actors``) on
        another node running the Ray ``ActorWorker`` against the inserter."""
        import ray

        cpus = ray.cluster_resources().get("CPU", 1.0)
        share = min(1.0, cpus / max(1, self.cfg.actors + self.cfg.learners))
        if self.cfg.ray_remote_actors:
            node = self._remote_nodes[i % len(self._remote_nodes)]
            inserter = self.inserter()
            ready, _ = ray.wait([inserter.stats.remote()], timeout=INSERTER_PING_S)
            try:
                ray.get(ready)
            except Exception as e:   # noqa: BLE001 - RayActorError: the inserter process is gone
                raise InserterLost(f"the inserter on the driver's node died ({type(e).__name__}); stopped with a final "
                                   f"checkpoint in {self.run_dir}") from None
            if not ready:
                raise InserterLost(f"the inserter on the driver's node did not answer within {INSERTER_PING_S:.0f} "
                                   f"s; stopped with a final checkpoint in {self.run_dir}")
            ray.get(inserter.set_inbox.remote(i, self._messages[i]))
            proc = RayProcess(_RemoteHost, (self.cfg, i, self.restarts[i], self.resumed_steps, inserter), node,
                              share)
        else:
            node = self._node_id
            proc = RayProcess(_Host, args + (DriverAlive(os.getpid()), self.faults), node, share)
        self.placement[f"actor{i}"] = {"pid": proc.pid, "node_id": node}
        self._hosts.append(proc)
        return proc

    def inserter(self):
        """The inserter on this node (started on first use): remote actors' only contact (``ray_remote_actors``; the
        two-node study measures its ceiling through it)."""
        if self._inserter is None:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from pal_bench.train.backends.ray.inserter import Inserter

            self._inserter = ray.remote(Inserter).options(
                num_cpus=0, max_concurrency=self.cfg.actors + 4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self._node_id, soft=False)).remote(
                self.cfg, self.buffer.shared_name, self._weights.name, self._weights.spec, self._control.shared_name,
                dict(enumerate(self._messages)))
        return self._inserter

    def _process_ended(self, i: int, p) -> None:
        """A remote actor's error comes with Ray's exception, not as a message: a ``TrainingError`` it raised
        (``Diverged``) ends the run as it would from an actor process; any other error is the restart's cause.
        What the actor sent itself (read first) takes precedence."""
        self._sync()
        if getattr(p, "training_error", None) and i not in self._training_errors:
            self._training_errors[i] = p.training_error
        if getattr(p, "error", None) and i not in self._last_error and i not in self._training_errors:
            self._last_error[i] = p.error

    def _actor_cause(self, i: int, p) -> str:
        self._process_ended(i, p)
        return super()._actor_cause(i, p)

    def summary(self) -> dict:
        out = super().summary()
        out["backend"] = "ray"
        out["ray_placement"] = "node"
        out["placement"] = dict(self.placement)
        if self._inserter is not None:
            import ray

            try:
                out["inserter"] = ray.get(self._inserter.stats.remote(), timeout=INSERTER_PING_S)
            except Exception:   # noqa: BLE001 - RayActorError / GetTimeoutError: the inserter is gone
                out["inserter"] = None
        return out

    def close(self) -> None:
        was_closed = self._closed
        try:
            super().close()
        finally:
            if not was_closed:
                if self._inserter is not None:
                    try:
                        import ray

                        ray.get(self._inserter.close.remote())
                        ray.kill(self._inserter, no_restart=True)
                    except Exception:   # noqa: BLE001 - gone with its node
                        pass
                for q in [*self._hosts, *self._inboxes]:
                    try:
                        q.kill()
                    except Exception:   # noqa: BLE001 - gone with its node
                        pass
                self._disconnect()

    def _disconnect(self) -> None:
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False
