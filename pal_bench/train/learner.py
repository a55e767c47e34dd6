"""The learner loop, written once: the thread backend's learner threads and the process backend's learner
processes run ``learner_loop``; they differ only in where it runs and in the three transports it is handed.

- ``UpdateGrant``: the next update number under the rate rule: the driver's ``RateController`` for a thread,
  a grant the driver's proxy thread writes into the shared slot block for a process.
- ``WeightSource`` (as the actor's, ``pal_bench.train.actor``): the latest published weights, copied into the
  learner's networks (nothing to copy for a sole learner that steps the parameter server's own networks).
- ``GradientSink``: where the gradient goes: applied at once by a sole learner, submitted to the parameter
  server (sync: waiting for the version; async: for the previous gradient to be handled), or published into a
  shared block for the driver.

Sampling, the loss, its check, the gradients and the priority write-back are the same code everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from pal_bench.train.actor import WeightSource
from pal_bench.train.losses import check_losses, gradients


class UpdateGrant(Protocol):
    wait_phase: str          # the timer's name for the wait in ``acquire``

    def acquire(self) -> int | None:
        """The next update's number (1-based, run-wide), waiting while the rule holds the learners back; None when
        this learner must stop."""

    def done(self) -> None:
        """The granted update is finished: its priorities are written and its gradient delivered."""


class GradientSink(Protocol):
    phase: str               # the timer's name for ``deliver``

    def deliver(self, version: int, grads: dict) -> None:
        """Hand over one update's gradients (group -> tensors), computed on weights of ``version``."""


def learner_loop(buffer, nets, targets, groups: dict, grant: UpdateGrant, weights: WeightSource,
                 sink: GradientSink, algo, cfg, beta: Callable[[int], float], to_tensors: Callable[[dict], dict],
                 name: str, timer) -> None:
    """Per granted update: pull the latest weights, sample ``cfg.batch_size`` transitions (importance exponent
    ``beta(update)``), compute the losses (``Diverged`` when one is not finite, before anything uses them) and
    their gradients over ``groups``, write |TD| back as priorities, and deliver the gradients."""
    version = -1
    while (update := grant.acquire()) is not None:
        timer.lap(grant.wait_phase)
        version = weights.pull(version)
        timer.lap("weights_pull")
        sample = buffer.sample(cfg.batch_size, beta=beta(update))
        timer.lap("sample")
        losses, td = algo.losses(nets, targets, to_tensors(sample), cfg, update)
        check_losses(losses, update, name)
        grads = gradients(losses, groups)
        timer.lap("forward_backward")
        if cfg.prioritized:
            buffer.update_priorities(sample["indices"], td.numpy().astype(np.float64))
        timer.lap("priority_update")
        sink.deliver(version, grads)
        timer.lap(sink.phase)
        grant.done()
