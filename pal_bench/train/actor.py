"""The actor loop, written once: the thread and process backends' actors run ``actor_loop``; what differs
between them is only where it runs and the two transports it is handed.

- ``StepGrant``: env steps reserved under the rate rule (``rate_policy``) and counted once inserted: the
  driver's ``RateController`` for an actor thread, the shared counter block and its process-shared lock for an
  actor process.
- ``WeightSource``: the latest published weights copied into the actor's own networks: the parameter server's
  snapshot for a thread, the ``SharedWeights`` block for a process.

The rest is the same object on every backend: the environment stepper (``workers.EnvStepper``: n-step rows,
or R2D2's sequences) and the local buffer (``workers.LocalBuffer``: Ape-X's batches of ``local_buffer`` env
steps into one ``add_batch``, with actor-side priorities when the preset asks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class StepGrant(Protocol):
    """Env steps for one actor, under the run's rate rule."""

    spent: bool        # set when ``reserve`` returned None because the budget is spent (not a stop)

    def reserve(self, n: int, flush: Callable[[], None] | None = None) -> int | None:
        """Reserve ``n`` env steps (waiting while the rule holds the actors back); returns the env steps
        reserved by all actors after this reservation, or None when this actor must stop: the budget is spent
        (``spent``) or the run is stopping. While the driver pauses the workers (an evaluation or a checkpoint
        waits for every reserved step to be inserted), ``flush()`` is called once first: it inserts what the
        actor holds back (its local buffer), which would otherwise never arrive."""

    def inserted(self, steps: int) -> None:
        """Count ``steps`` env steps whose transitions are now in the replay buffer."""

    def may_insert(self) -> bool:
        """Whether what the actor still holds may go into the buffer as it stops (False once the driver is
        gone)."""


class WeightSource(Protocol):
    def pull(self, version: int) -> int:
        """Copy a published version newer than ``version`` into the actor's networks, if there is one;
        returns the version the networks now hold."""


def actor_loop(stepper, local, nets, grant: StepGrant, weights: WeightSource,
               on_episodes: Callable[[list[tuple[float, int]]], None], rng, timer, n: int, budget: int) -> None:
    """Step ``n`` environments at a time with the latest weights until the budget (``budget`` env steps, all
    actors together) is reserved or the run stops; finished rows go through ``local`` into the buffer, and
    ``on_episodes`` gets each batch of finished episodes as (return, length) pairs. When another actor took the
    last steps, the windows still open bootstrap from their last observation and go in too."""
    version = -1

    def flush() -> None:                          # a pause waits for what the local buffer holds
        grant.inserted(local.send())

    while (reserved := grant.reserve(n, flush)) is not None:
        timer.lap("rate_wait")
        version = weights.pull(version)
        timer.lap("weights_pull")
        rows, episodes = stepper.step(nets, reserved, rng, timer)
        if episodes:
            on_episodes(episodes)
        last = reserved >= budget
        if last:                                  # the budget is spent: flush before counting the last step
            rows += stepper.flush()
        sent = local.put(rows, n, send=last)
        if sent:
            grant.inserted(sent)
    timer.lap("rate_wait")
    if grant.spent:                               # another actor took the last steps
        local.put(stepper.flush(), 0)
    if grant.may_insert():                        # stopped or spent: what the local buffer holds still goes in
        grant.inserted(local.send())
