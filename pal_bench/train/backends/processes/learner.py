"""The learner process (``learner_processes``): the driver grants each update; the process samples the
shared buffer and publishes its gradient for the driver's parameter server."""

from __future__ import annotations

import os

from pal_bench.train.backends.processes.shared import (
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
        slots[base + L_READY] = 1
        timer.lap("setup")
        learner_loop(buf, nets, targets, params, SlotGrant(slots, base, grant, done, learner, parent_pid, faults),
                     LearnerWeights(weights, into), PublishGradients(grads, params), ctx.algo, cfg, ctx.beta,
                     ctx.to_tensors, f"learner{learner}", timer)
        messages.put(("timers", learner, timer.seconds))
    except TrainingError as e:
        report_failure(f"learner{learner}", learner, messages, e)
    except BaseException:
        report_failure(f"learner{learner}", learner, messages)
    finally:
        for h in (buf, weights, grads):
            if h is not None:
                h.close()


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
