"""The learner process (``learner_processes``): the driver grants each update; the process samples the shared
buffer and publishes its gradient for the driver's parameter server, or (``aggregation = "allreduce"``) averages
it with the other learner processes through their shared gradient blocks and steps its own networks, learner 0
publishing the weights for the actors, so that no gradient passes through the driver."""

from __future__ import annotations

import os

from pal_bench.train.backends.processes.shared import (
    Publisher,
    StatePair,
    die_with_parent,
    flat_state,
    ignore_stop_signals,
    report_failure,
)
from pal_bench.train.config import TrainConfig
from pal_bench.train.errors import TrainingError
from pal_bench.train.faults import NO_FAULTS, Faults
from pal_bench.train.replay_spec import buffer_class
from pal_bench.train.shared_weights import SharedWeights
from pal_bench.train.workers import PhaseTimer, pin

WAIT_S = 0.05   # allreduce: how long a learner waits for the others' gradients before it looks at the stop flag
# per learner slot: granted update number (0 in an all-reduce round: none of its own), stop, set up, and the
# weights' version (allreduce: the driver's at the start; learner 0's after each step)
L_UPDATE, L_STOP, L_READY, L_VERSION, L_FIELDS = 0, 1, 2, 3, 4


def grads_spec(ps) -> list:
    """The shared block a learner process publishes one gradient into: every parameter of every group (float32),
    plus which groups this gradient has (TD3's delayed actor: not every update has every group)."""
    spec = [(f"{g}.{i}", tuple(p.shape), "<f4") for g, params in ps.params.items() for i, p in enumerate(params)]
    return spec + [("groups", (len(ps.params),), "|u1")]


def learner_process(cfg: TrainConfig, learner: int, buffer_name: str, weights_name: str, weights_spec,
                    grads_name: str, gspec, slots, grant, done, messages, parent_pid: int,
                    faults: Faults = NO_FAULTS, allreduce: tuple | None = None) -> None:
    """Body of one learner process (spawned): for each update the driver grants, load the latest published
    weights, sample the shared buffer, compute the gradients, write |TD| back as priorities and publish the
    gradients for the driver's parameter server. The rate rule, the update count and the aggregation stay in
    the driver (one proxy thread per learner process), so they are the thread trainer's. With ``allreduce``
    (``aggregation = "allreduce"``: every learner's gradient block name and arrival semaphore) the learners
    average their gradients among themselves (``AllReduceSink``) and step their own networks; the driver only grants
    the rounds."""
    die_with_parent()
    ignore_stop_signals()
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.learner import learner_loop
    from pal_bench.train.losses import param_groups

    torch.set_num_threads(1)
    pin(cfg.actors + learner if cfg.pin_cores else None)
    buf = weights = grads = None
    peers: list = []
    base = learner * L_FIELDS
    try:
        ctx = RunCore(cfg)
        timer = PhaseTimer()
        buf = buffer_class(cfg).attach(buffer_name, seed=cfg.seed)
        weights = SharedWeights.attach(weights_name, weights_spec)
        grads = SharedWeights.attach(grads_name, gspec)
        nets, targets = ctx.networks(), ctx.networks()
        params = param_groups(ctx.algo, nets)
        # the networks' own tensors as the read target: a new version is copied straight into them
        into = flat_state(StatePair(nets.state_dict(), targets.state_dict()))
        source, sink = LearnerWeights(weights, into), PublishGradients(grads, params)
        grant_ = SlotGrant(slots, base, grant, done, learner, parent_pid, faults)
        if allreduce is not None:
            source, sink = _join_allreduce(cfg, learner, allreduce, gspec, ctx, nets, targets, params, source, weights,
                                           slots, base, grant_.stopped)
            peers = sink.blocks
        slots[base + L_READY] = 1
        timer.lap("setup")
        learner_loop(buf, nets, targets, params, grant_, source, sink, ctx.algo, cfg, ctx.beta, ctx.to_tensors,
                     f"learner{learner}", timer)
        messages.put(("timers", learner, timer.seconds))
    except TrainingError as e:
        report_failure(f"learner{learner}", learner, messages, e)
    except BaseException:
        report_failure(f"learner{learner}", learner, messages)
    finally:
        for h in (buf, weights, grads, *peers):
            if h is not None:
                h.close()


def _join_allreduce(cfg: TrainConfig, learner: int, allreduce: tuple, gspec, ctx, nets, targets, params, source,
                    weights, slots, base, stopped):
    """(allreduce) Start from the weights the driver published (its parameter server's version, in the slot), attach
    the other learners' gradient blocks, and return the ``WeightSource`` and ``GradientSink`` of a learner that steps
    its own networks."""
    from pal_bench.train.param_server import ParameterServer

    names, arrived = allreduce
    source.pull(-1)                                  # the driver's weights (a resumed run's too)
    local = ParameterServer(ctx.algo, nets, targets, cfg, 1)   # its optimizers, clipping and target rule
    local.version = int(slots[base + L_VERSION])
    publisher = Publisher(weights) if learner == 0 else None
    if publisher is not None:
        publisher.holds(local.snapshot)
    blocks = [SharedWeights.attach(n, gspec) for n in names]
    return OwnSteps(local), AllReduceSink(local, learner, blocks, arrived, stopped, params, slots, base, publisher)


class PeerLost(TrainingError):
    """(allreduce, learner process) Another learner of the group is gone: this one stops with one line, the driver
    reports the one that died."""


class OwnSteps:
    """(allreduce) The ``WeightSource`` of a learner that steps its own networks: nothing to copy."""

    def __init__(self, local):
        self.local = local

    def pull(self, version: int) -> int:
        return self.local.version


class AllReduceSink:
    """(allreduce) The ``GradientSink``: this learner's gradient into its shared block (in a round where the driver
    granted it no update of its own: no group, nothing added), a wait until every learner's block holds this round
    (each learner releases every other's arrival semaphore once its block is written; the wait looks at the
    driver's stop flag every ``WAIT_S``, which ends it when a learner died), then every learner's block read and
    averaged per group over the learners that have it, and this learner's own optimizer step with the same
    average as every other's; learner 0 then publishes the weights for the actors and the driver, with their
    version in its slot. An all-reduce through shared memory on one node: one write and L reads of the gradient per
    learner (gloo's TCP ring took 3.2 ms a round at two learners on two cores, more than the update's gradient).
    A block is written again only after the driver's next grant, which waits for every learner of the round: no
    read races a write."""

    phase = "aggregation"

    def __init__(self, local, learner: int, blocks: list, arrived: list, stopped, params: dict, slots, base: int,
                 publisher):
        self.local, self.learner, self.blocks, self.stopped = local, learner, blocks, stopped
        self.arrived = arrived
        self.params, self.slots, self.base, self.publisher = params, slots, base, publisher
        self.own = PublishGradients(blocks[learner], params)
        self.names = list(params)
        self.rounds = 0

    def deliver(self, version: int, grads: dict) -> None:
        import torch

        self.own.deliver(version, grads if self.slots[self.base + L_UPDATE] else {})
        self.rounds += 1
        # a barrier of semaphores with timeouts (a process-shared Barrier hangs for good when a waiter is killed: its
        # condition waits for the dead one's wake-up); the blocks' versions say the same, checked after it
        for k, sem in enumerate(self.arrived):
            if k != self.learner:
                sem.release()
        for _ in range(len(self.blocks) - 1):
            while not self.arrived[self.learner].acquire(timeout=WAIT_S):
                if self.stopped():
                    raise PeerLost(f"learner{self.learner}: the all-reduce lost a learner in round {self.rounds}")
        if any(b.version < self.rounds for b in self.blocks):
            raise PeerLost(f"learner{self.learner}: a learner's gradient of round {self.rounds} is missing")
        sums: dict = {}
        counts: dict = {}
        for block in self.blocks:
            got = block.read(min_version=self.rounds)
            if got is None:
                raise PeerLost(f"learner{self.learner}: a learner's gradient of round {self.rounds} is missing")
            flat = got[1]
            for j, g in enumerate(self.names):
                if flat["groups"][j]:
                    parts = [flat[f"{g}.{i}"] for i in range(len(self.params[g]))]
                    if g in sums:
                        torch._foreach_add_(sums[g], parts)
                    else:
                        sums[g] = parts
                    counts[g] = counts.get(g, 0) + 1
        averaged = {g: torch._foreach_div(sums[g], float(counts[g])) for g in sums}
        if averaged:
            self.local._step([averaged], [self.learner])
        if self.publisher is not None and self.publisher.publish(self.local.snapshot):
            self.slots[self.base + L_VERSION] = self.local.version


class SlotGrant:
    """(learner process) The driver's proxy thread as the ``UpdateGrant``: it writes the update number into this
    learner's slot and releases ``grant``; the learner releases ``done`` when the update is finished."""

    wait_phase = "grant_wait"

    def __init__(self, slots, base: int, grant, done, learner: int, parent_pid: int, faults: Faults):
        self.slots, self.base, self.grant, self._done = slots, base, grant, done
        self.learner, self.parent_pid, self.faults = learner, parent_pid, faults
        self.updates = 0

    def stopped(self) -> bool:
        """Whether the driver told this learner to stop, or is gone."""
        return bool(self.slots[self.base + L_STOP]) or os.getppid() != self.parent_pid

    def acquire(self) -> int | None:
        while not self.grant.acquire(timeout=0.05):
            if self.stopped():
                return None
        if self.stopped():
            return None
        self.faults.before_update(self.learner, self.updates)
        self.updates += 1
        return int(self.slots[self.base + L_UPDATE])

    def done(self) -> None:
        self._done.release()


class LearnerWeights:
    """(learner process) The ``SharedWeights`` block as the ``WeightSource``, online and target networks."""

    def __init__(self, weights: SharedWeights, into: dict):
        self.weights, self.into = weights, into

    def pull(self, version: int) -> int:
        import torch

        with torch.no_grad():
            got = self.weights.read(out=self.into, min_version=version + 1)
        return version if got is None else got[0]


class PublishGradients:
    """(learner process) The ``GradientSink``: one gradient into the shared block, every parameter of every group
    (zeros for a group this update has none of) and which groups it has."""

    phase = "gradient_publish"

    def __init__(self, block: SharedWeights, params: dict):
        import torch

        self.block, self.names = block, list(params)
        self.zeros = {f"{g}.{i}": torch.zeros_like(p) for g in self.names for i, p in enumerate(params[g])}

    def deliver(self, version: int, grads: dict) -> None:
        import torch

        flat = dict(self.zeros)
        has = torch.zeros(len(self.names), dtype=torch.uint8)
        for g, grads_g in grads.items():
            has[self.names.index(g)] = 1
            for i, x in enumerate(grads_g):
                flat[f"{g}.{i}"] = x
        flat["groups"] = has
        self.block.publish(flat)
