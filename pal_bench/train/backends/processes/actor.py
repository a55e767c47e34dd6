"""The actor process: ``actor_loop`` (``pal_bench.train.actor``) over the shared counter block and the
shared weights."""

from __future__ import annotations

import time

from pal_bench._segment import SharedControl
from pal_bench.train.actor import actor_loop
from pal_bench.train.backends.processes.shared import (
    FINISHED,
    GO,
    PAUSED,
    READY,
    STOP,
    actor_tensors,
    count_inserted,
    count_under_lock,
    die_with_parent,
    ignore_stop_signals,
    inserted_slot,
    pull_weights,
    report_failure,
    reserve_steps,
)
from pal_bench.train.config import TrainConfig
from pal_bench.train.errors import TrainingError
from pal_bench.train.faults import NO_FAULTS, Faults
from pal_bench.train.rate_policy import RatePolicy, default_slack
from pal_bench.train.replay_spec import buffer_class
from pal_bench.train.shared_weights import SharedWeights
from pal_bench.train.supervision import actor_rng, env_seeds
from pal_bench.train.workers import PhaseTimer, pin


def actor_process(cfg: TrainConfig, actor: int, incarnation: int, resumed_steps: int, buffer_name: str,
                  weights_name: str, weights_spec, control_name: str, messages, driver_alive,
                  faults: Faults = NO_FAULTS) -> None:
    """Body of one actor process (spawned, or a Ray actor on the driver's node; ``incarnation``: its restarts so
    far, ``resumed_steps``: the run's env steps when it resumed, for its seeds; ``driver_alive()``: whether the
    driver still runs, ``shared.ParentAlive`` or ``shared.DriverAlive``). Steps ``envs_per_actor`` environments
    and inserts n-step rows with ``add_batch`` into the shared buffer until the budget is spent or the driver says
    stop."""
    die_with_parent()
    ignore_stop_signals()                              # the driver handles Ctrl-C, SIGTERM, SIGHUP and stops us
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.workers import LocalBuffer

    torch.set_num_threads(1)
    pin(actor if cfg.pin_cores else None)               # as the thread backend pins its actor threads
    envs = buf = weights = control = None
    try:
        control = SharedControl.attach(control_name)
        counters, lock = control.words, control.lock
        ctx = RunCore(cfg)
        policy = RatePolicy.from_config(cfg, default_slack(cfg))
        timer = PhaseTimer()
        buf = buffer_class(cfg).attach(buffer_name, seed=cfg.seed)
        weights = SharedWeights.attach(weights_name, weights_spec)
        nets = ctx.networks()
        targets = ctx.networks() if cfg.actor_priorities else None
        E = cfg.envs_per_actor
        envs = ctx.make_vector_env(actor)
        stepper = ctx.make_stepper(envs, env_seeds(cfg.seed, actor, E, incarnation, resumed_steps), actor)
        into = actor_tensors(nets, targets)
        local = LocalBuffer(ctx, buf, stepper, nets, targets, timer)
        count_under_lock(counters, lock, actor, READY)
        messages.put(("ready", actor, incarnation))
        while not counters[GO] and not counters[STOP] and driver_alive():
            time.sleep(0.001)                            # every actor set up before the driver's clock starts
        timer.lap("setup")
        grant = SharedStepGrant(counters, lock, actor, incarnation, cfg.actors, policy, driver_alive, faults)
        actor_loop(stepper, local, nets, grant, SharedWeightsSource(weights, into), lambda episodes: messages.put(
            ("episodes", actor, episodes)), actor_rng(cfg.seed, actor, incarnation, resumed_steps), timer, E, cfg.steps)
        if grant.spent:
            count_under_lock(counters, lock, actor, FINISHED)      # the driver need not wait for this process's exit
        messages.put(("timers", actor, timer.seconds))
    except TrainingError as e:
        report_failure(f"actor{actor}", actor, messages, e)
    except BaseException:
        report_failure(f"actor{actor}", actor, messages)
    finally:
        if envs is not None:
            envs.close()
        if buf is not None:
            buf.close()
        if weights is not None:
            weights.close()
        if control is not None:
            control.close()


class SharedStepGrant:
    """(actor process) The shared counter block as the actor's ``StepGrant``: a vector step is reserved with
    ``shared.reserve_steps`` (the rule of ``RatePolicy`` over the running total of every actor's reservations,
    O(1) in the number of actors, under the block's lock, marked as held so that the driver knows when this
    process died inside); inserted steps go to this actor's own counter and the total (``count_inserted``)."""

    def __init__(self, counters, lock, actor: int, incarnation: int, n_actors: int, policy: RatePolicy,
                 driver_alive, faults: Faults):
        self.c, self.lock, self.actor, self.incarnation = counters, lock, actor, incarnation
        self.n_actors, self.policy, self.driver_alive, self.faults = n_actors, policy, driver_alive, faults
        self.spent = False

    def _inside(self) -> None:
        self.faults.in_reservation(self.actor, int(self.c[inserted_slot(self.actor)]), self.incarnation)

    def reserve(self, n: int, flush=None) -> int | None:
        c = self.c
        while True:
            if c[STOP] or not self.driver_alive():
                return None
            granted, reserved, spent = reserve_steps(c, self.lock, self.actor, self.policy, n, inside=self._inside)
            if spent:        # another actor took the last steps
                self.spent = True
                return None
            if granted:
                return reserved + granted
            if flush is not None and c[PAUSED]:   # paused: what the actor holds goes in first (once)
                flush()
                flush = None
            time.sleep(0.0005)

    def inserted(self, steps: int) -> None:
        count_inserted(self.c, self.lock, self.actor, steps)

    def may_insert(self) -> bool:
        return self.driver_alive()


class SharedWeightsSource:
    """(actor process) The ``SharedWeights`` block as the actor's ``WeightSource``, copied straight into the
    networks' own tensors (``into``)."""

    def __init__(self, weights: SharedWeights, into: dict):
        self.weights, self.into = weights, into

    def pull(self, version: int) -> int:
        return pull_weights(self.weights, self.into, version)
