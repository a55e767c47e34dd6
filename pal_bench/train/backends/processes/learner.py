"""The learner process (``learner_processes``): the driver grants each update; the process samples the shared
buffer and publishes its gradient for the driver's parameter server, or (``aggregation = "allreduce"``) averages
it with the other learner processes over gloo and steps its own networks, learner 0 publishing the weights for the
actors, so that no gradient passes through the driver."""

from __future__ import annotations

import os

from pal_bench.train.allreduce import average_gradients
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

# per learner slot: granted update number (0 in an all-reduce round: none of its own), stop, set up, and the
# weights' version (allreduce: the driver's at the start; learner 0's after each step)
L_UPDATE, L_STOP, L_READY, L_VERSION, L_FIELDS = 0, 1, 2, 3, 4
RENDEZVOUS_TIMEOUT_S = 120.0   # allreduce: the longest wait for the other learner processes to join the group


def grads_spec(ps) -> list:
    """The shared block a learner process publishes one gradient into: every parameter of every group (float32),
    plus which groups this gradient has (TD3's delayed actor: not every update has every group)."""
    spec = [(f"{g}.{i}", tuple(p.shape), "<f4") for g, params in ps.params.items() for i, p in enumerate(params)]
    return spec + [("groups", (len(ps.params),), "|u1")]


def learner_process(cfg: TrainConfig, learner: int, buffer_name: str, weights_name: str, weights_spec,
                    grads_name: str, gspec, slots, grant, done, messages, parent_pid: int,
                    faults: Faults = NO_FAULTS, rendezvous: str | None = None) -> None:
    """Body of one learner process (spawned): for each update the driver grants, load the latest published
    weights, sample the shared buffer, compute the gradients, write |TD| back as priorities and publish the
    gradients for the driver's parameter server. The rate rule, the update count and the aggregation stay in
    the driver (one proxy thread per learner process), so they are the thread trainer's. With ``rendezvous`` (the
    path of a gloo ``FileStore``: ``aggregation = "allreduce"``) the learners average their gradients among themselves
    (``AllReduceSink``) and step their own networks; the driver only grants the rounds."""
    die_with_parent()
    ignore_stop_signals()
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.learner import learner_loop
    from pal_bench.train.losses import param_groups

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
        params = param_groups(ctx.algo, nets)
        # the networks' own tensors as the read target: a new version is copied straight into them
        into = flat_state(StatePair(nets.state_dict(), targets.state_dict()))
        source, sink = LearnerWeights(weights, into), PublishGradients(grads, params)
        if rendezvous is not None:
            source, sink = _join_allreduce(cfg, learner, rendezvous, ctx, nets, targets, params, source, weights,
                                           slots, base)
        slots[base + L_READY] = 1
        timer.lap("setup")
        learner_loop(buf, nets, targets, params, SlotGrant(slots, base, grant, done, learner, parent_pid, faults),
                     source, sink, ctx.algo, cfg, ctx.beta, ctx.to_tensors, f"learner{learner}", timer)
        messages.put(("timers", learner, timer.seconds))
    except TrainingError as e:
        report_failure(f"learner{learner}", learner, messages, e)
    except BaseException:
        report_failure(f"learner{learner}", learner, messages)
    finally:
        if rendezvous is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        for h in (buf, weights, grads):
            if h is not None:
                h.close()


def _join_allreduce(cfg: TrainConfig, learner: int, rendezvous: str, ctx, nets, targets, params, source, weights,
                    slots, base):
    """(allreduce) Join the learners' gloo group, start from the weights the driver published (its parameter
    server's version, in the slot), and return the ``WeightSource`` and ``GradientSink`` of a learner that steps
    its own networks."""
    from datetime import timedelta

    import torch.distributed as dist

    from pal_bench.train.param_server import ParameterServer

    timeout = timedelta(seconds=max(RENDEZVOUS_TIMEOUT_S, cfg.learner_timeout_s))
    store = dist.FileStore(rendezvous, cfg.learners)       # a path, never parsed as a URL
    store.set_timeout(timeout)
    dist.init_process_group("gloo", store=store, rank=learner, world_size=cfg.learners, timeout=timeout)
    source.pull(-1)                                  # the driver's weights (a resumed run's too)
    local = ParameterServer(ctx.algo, nets, targets, cfg, 1)   # its optimizers, clipping and target rule
    local.version = int(slots[base + L_VERSION])
    publisher = Publisher(weights) if learner == 0 else None
    if publisher is not None:
        publisher.holds(local.snapshot)
    return OwnSteps(local), AllReduceSink(local, learner, cfg.learners, params, slots, base, publisher)


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
    """(allreduce) The ``GradientSink``: the gradients averaged over the learner processes
    (``allreduce.average_gradients``; a round where the driver granted this learner no update of its own adds
    nothing), then this learner's own optimizer step; learner 0 then publishes the weights for the actors and the
    driver, with their version in its slot."""

    phase = "aggregation"

    def __init__(self, local, learner: int, learners: int, params: dict, slots, base: int, publisher):
        self.local, self.learner, self.learners, self.params = local, learner, learners, params
        self.slots, self.base, self.publisher = slots, base, publisher

    def deliver(self, version: int, grads: dict) -> None:
        mine = grads if self.slots[self.base + L_UPDATE] else {}
        try:
            averaged = average_gradients(mine, self.params, self.learners)
        except RuntimeError as e:      # gloo: a peer is gone (killed); the driver names it, this one ends quietly
            raise PeerLost(f"learner{self.learner}: the all-reduce group lost a learner "
                           f"({str(e).splitlines()[0][-200:]})") from None
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

    def _stopped(self) -> bool:
        return bool(self.slots[self.base + L_STOP]) or os.getppid() != self.parent_pid

    def acquire(self) -> int | None:
        while not self.grant.acquire(timeout=0.05):
            if self._stopped():
                return None
        if self._stopped():
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
