"""The Ray backend's transports for the shared loops (``train/actor.py``'s ``actor_loop``, ``train/learner.py``'s
``learner_loop``): what a Ray actor or learner hands the loops instead of the thread backend's driver objects or the
process backend's shared-memory blocks.

- ``ChunkGrants``: the buffer actor's chunk grants as the actor loop's ``StepGrant`` *and* its local buffer: the env
  steps of one grant (``chunk_size``, whole vector steps) are stepped, then their rows and finished episodes go to
  the buffer actor in one ``add_batch`` call whose answer is the next grant (one round trip per chunk).
- ``LatestWeights``: the parameter-server actor's newest weights as a ``WeightSource``, asked for once per chunk
  (actors) or per update (learners), the next ask in flight while the worker computes.
- ``PrefetchedSamples``: the buffer actor's ``sample`` calls as the learner loop's ``UpdateGrant`` *and* its buffer:
  ``1 + ray_prefetch`` calls in flight, each carrying the |TD| priorities of the updates finished before it.
- ``ServerGradients`` / ``AllReduceGradients``: the learner's ``GradientSink``: the parameter-server actor (which
  answers with the newest weights), or a gloo all-reduce and the learner's own optimizer step.

Phases (seconds, as before): ``transport`` (Ray round trips, the buffer's or parameter server's own work
included), ``rate_wait`` (the part of it the buffer actor held the caller back), ``serialize`` (building arrays and
submitting calls: Ray pickles the arguments then), ``weights_pull``, ``aggregation_wait``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import ray

from pal_bench.train.allreduce import average_gradients
from pal_bench.train.backends.ray.context import from_numpy, to_numpy
from pal_bench.train.param_server import ParameterServer
from pal_bench.train.workers import PhaseTimer

PUBLISH_EVERY_S = 0.02      # allreduce: learner 0 publishes its weights at most this often


def load_weights(nets, targets, state: dict) -> None:
    """Copy a published state (``{"online", "target"}`` numpy arrays) into ``nets`` (and ``targets``, if any)."""
    nets.load_state_dict(from_numpy(state["online"]))
    if targets is not None:
        targets.load_state_dict(from_numpy(state["target"]))


def waited(timer: PhaseTimer, answer: dict) -> None:
    """Move the seconds the buffer actor held this call back (``answer["waited"]``) from transport to rate_wait."""
    timer.lap("transport")
    timer.seconds["transport"] -= answer["waited"]
    timer.seconds["rate_wait"] = timer.seconds.get("rate_wait", 0.0) + answer["waited"]


class ChunkGrants:
    """(actor) ``StepGrant`` and local buffer over the buffer actor: grants of ``chunk`` env steps, each chunk's rows
    (with Ape-X's actor-side priorities when ``targets`` is given) sent in the call that fetches the next grant."""

    def __init__(self, ctx, buffer, actor: int, chunk: int, stepper, nets, targets, timer: PhaseTimer):
        self.ctx, self.buffer, self.actor, self.chunk = ctx, buffer, actor, chunk
        self.stepper, self.nets, self.targets, self.timer = stepper, nets, targets, timer
        self.spent = False
        self.grants = 0                 # grants received (the weights are asked for once per grant)
        self.collected = 0              # env steps reserved by this actor
        self.left = 0                   # env steps of the current grant not reserved yet
        self.next_t = 0                 # run-wide index of the current grant's next env step
        self.items: list = []
        self.steps = 0                  # env steps behind the items held
        self.episodes: list = []
        self.pending = buffer.acquire.remote(actor, chunk)

    # ---- StepGrant
    def reserve(self, n: int, flush=None) -> int | None:
        """(``flush`` is not needed: a chunk is sent whole, and the Ray actors are never paused)"""
        if self.left <= 0:
            if self.steps:                              # the grant is stepped: its rows go, the answer is the next
                self.pending = self._send(self.chunk)
            if not self._next_grant():
                return None
        self.left -= n
        self.next_t += n
        self.collected += n
        return self.next_t

    def _next_grant(self) -> bool:
        while True:
            grant = ray.get(self.pending)
            waited(self.timer, grant)
            if grant["granted"] > 0:
                self.left, self.next_t = grant["granted"], grant["t"]
                self.grants += 1
                return True
            if grant["granted"] == 0:                   # the budget is spent (or the run stops)
                self.spent = True
                return False
            self.pending = self.buffer.acquire.remote(self.actor, self.chunk)

    def inserted(self, steps: int) -> None:
        """(the buffer actor counts the env steps each ``add_batch`` brings)"""

    def may_insert(self) -> bool:
        return True

    # ---- local buffer
    def put(self, items: list, steps: int, send: bool = False) -> int:
        self.items += items
        self.steps += steps
        if send:
            self.pending = self._send(self.chunk)
        return 0

    def send(self) -> int:
        """Send what is held and wait for it to be inserted (the actor's last call)."""
        if self.items or self.steps or self.episodes:
            ray.get(self._send(0))
            self.timer.lap("transport")
        return 0

    def on_episodes(self, episodes: list) -> None:
        self.episodes += episodes

    def _send(self, request: int):
        batch = prios = None
        if self.items:
            batch = self.stepper.batch(self.items)
            self.timer.lap("serialize")
            if self.targets is not None:
                prios = self.ctx.actor_priorities(self.nets, self.targets, batch)
                self.timer.lap("inference")
        ref = self.buffer.add_batch.remote(self.actor, batch, self.steps, self.episodes, request, prios)
        self.items, self.steps, self.episodes = [], 0, []
        self.timer.lap("serialize")
        return ref


class LatestWeights:
    """``WeightSource`` over the parameter-server actor's ``latest`` (a new weights reference, or None when the
    version asked with is current); with ``due`` (an actor's ``lambda: grants``) it asks only when ``due()``
    changed. ``offer`` hands it an answer the caller already has (a learner's ``submit``)."""

    def __init__(self, ps, nets, targets, due: Callable[[], int] | None = None):
        self.ps, self.nets, self.targets, self.due = ps, nets, targets, due
        self.pending = ps.latest.remote(-1)
        self.answer = None
        self.last_due = None
        self.version = -1               # the version the networks hold

    def offer(self, latest) -> None:
        self.answer, self.pending = latest, None

    def pull(self, version: int) -> int:
        if self.due is not None:
            now = self.due()
            if now == self.last_due:
                return version
            self.last_due = now
        latest = ray.get(self.pending) if self.pending is not None else self.answer
        if latest is not None and latest[0] != version:
            load_weights(self.nets, self.targets, ray.get(latest[1][0]))
            version = latest[0]
        self.pending = self.ps.latest.remote(version) if self.due is not None else None
        self.answer, self.version = None, version
        return version


class PrefetchedSamples:
    """(learner) ``UpdateGrant`` and buffer over the buffer actor's ``sample``: ``1 + prefetch`` calls in flight; an
    update's |TD| priorities go back with the next call; ``"end"`` drains what is in flight (``abandoned``: batches
    sampled but not used)."""

    wait_phase = "transport"

    def __init__(self, buffer, learner: int, batch_size: int, prefetch: int, timer: PhaseTimer):
        self.buffer, self.learner, self.batch_size, self.timer = buffer, learner, batch_size, timer
        self.indices: list = []
        self.td: list = []
        self.n_done = 0                 # updates finished and not reported yet
        self.updates = 0
        self.abandoned = 0
        self.ended = False
        self.drop_current = False       # the sink could not deliver this update (all-reduce peers stopped)
        self.batch: dict | None = None
        self.inflight = deque(self._request() for _ in range(1 + prefetch))

    def _take(self):
        if not self.indices:
            return None, None
        idx, td = np.concatenate(self.indices), np.concatenate(self.td)
        self.indices, self.td = [], []
        return idx, td

    def _request(self):
        idx, td = self._take()
        n, self.n_done = self.n_done, 0
        return self.buffer.sample.remote(self.learner, self.batch_size, idx, td, n)

    # ---- UpdateGrant
    def acquire(self) -> int | None:
        while self.inflight:
            res = ray.get(self.inflight.popleft())
            waited(self.timer, res)
            if res["status"] == "retry":
                if not self.ended:
                    self.inflight.append(self._request())
                continue
            if res["status"] == "end" or self.ended:
                self.ended = True
                self.abandoned += res["status"] == "ok"
                continue
            self.batch = res["batch"]
            return res["update"]
        return None

    def done(self) -> None:
        if self.drop_current:
            self.ended, self.drop_current = True, False
            self.abandoned += 1
            return
        self.updates += 1
        self.n_done += 1
        if not self.ended:
            self.inflight.append(self._request())

    # ---- buffer
    def sample(self, batch_size: int, beta: float) -> dict:
        """The batch the buffer actor sampled for this update (with the same ``beta(update)``)."""
        return self.batch

    def update_priorities(self, indices, td) -> None:
        self.indices.append(indices)
        self.td.append(td)

    def finish(self) -> None:
        """The learner's last report: its unreported priorities and updates, and the batches it will not use."""
        idx, td = self._take()
        ray.get(self.buffer.finish.remote(self.learner, idx, td, self.n_done, self.abandoned))


class ServerGradients:
    """``GradientSink`` into the parameter-server actor; its answer (the newest weights) goes to ``weights``."""

    phase = "aggregation_wait"

    def __init__(self, ps, learner: int, weights: LatestWeights, timer: PhaseTimer):
        self.ps, self.learner, self.weights, self.timer = ps, learner, weights, timer

    def deliver(self, version: int, grads: dict) -> None:
        ref = self.ps.submit.remote(self.learner, version, {g: to_numpy(v) for g, v in grads.items()})
        self.timer.lap("serialize")
        self.weights.offer(ray.get(ref))


class AllReduceGradients:
    """``GradientSink`` of all-reduce: the gradients averaged over the learners by one gloo all-reduce, then this
    learner's own optimizer step (``local``: the parameter server's update rule, clipping and targets); learner 0
    publishes its weights to the parameter-server actor at most every ``PUBLISH_EVERY_S``."""

    phase = "aggregation_wait"

    def __init__(self, ps, learner: int, learners: int, local: ParameterServer, groups: dict,
                 samples: PrefetchedSamples, timer: PhaseTimer):
        self.ps, self.learner, self.learners, self.local, self.groups = ps, learner, learners, local, groups
        self.samples, self.timer = samples, timer
        self.peers_stopped = False
        self.last_publish = 0.0

    def deliver(self, version: int, grads: dict) -> None:
        averaged = self.reduce(grads)
        if averaged is None:                # another learner has finished: all stop here
            self.peers_stopped = True
            self.samples.drop_current = True
            return
        self.timer.lap("aggregation_wait")
        self.local._step([averaged], [self.learner])
        self.timer.lap("aggregate")         # the optimizer step the parameter server does otherwise
        if self.learner == 0 and time.perf_counter() - self.last_publish > PUBLISH_EVERY_S:
            self.publish()
            self.last_publish = time.perf_counter()
            self.timer.lap("serialize")

    def reduce(self, grads: dict | None) -> dict | None:
        """``allreduce.average_gradients`` over this learner's groups (None: some learner stops)."""
        return average_gradients(grads, self.groups, self.learners)

    def publish(self, wait: bool = False) -> None:
        snap = self.local.snapshot
        ref = ray.put({"version": snap.version, "online": to_numpy(snap.online), "target": to_numpy(snap.target)})
        done = self.ps.publish.remote(snap.version, [ref])
        if wait:
            ray.get(done)
