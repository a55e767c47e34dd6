"""The learner process (``learner_processes``): the driver grants each update; the process samples the
shared buffer and publishes its gradient for the driver's parameter server."""

from __future__ import annotations

import os

import numpy as np

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
        into = flat_state(StatePair(nets.state_dict(), targets.state_dict()))
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
        report_failure(f"learner{learner}", learner, messages, e)
    except BaseException:
        report_failure(f"learner{learner}", learner, messages)
    finally:
        for h in (buf, weights, grads):
            if h is not None:
                h.close()
