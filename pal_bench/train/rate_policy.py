"""The rate rule between actors and learners, written once for every backend: pure functions of counters.

Counts: ``steps`` (transitions collected and inserted, summed over actors), ``reserved`` (granted to
actors, in flight included), ``started`` learner updates (one update = one sampled batch and one
gradient). With ratio ``r = updates_per_step``:

- a learner may start update u+1 once ``steps >= learning_starts + (u + 1) / r``;
- an actor may collect while ``reserved < learning_starts + started / r + slack``;
- the budget holds ``max_updates = floor((total_steps - learning_starts) * r)`` updates.

Backends only decide how to wait (a condition variable, an asyncio condition, a poll of shared
counters) and where the counters live; none of them restates the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EPS = 1e-9          # steps needed for an update are a float: compare with a little room


@dataclass(frozen=True)
class RatePolicy:
    updates_per_step: float
    learning_starts: int
    total_steps: int
    slack: int

    @classmethod
    def from_config(cls, cfg, slack: int) -> RatePolicy:
        return cls(cfg.updates_per_step, cfg.learning_starts, cfg.steps, slack)

    @property
    def max_updates(self) -> int:
        """Learner updates in the whole budget."""
        return max_updates(self.total_steps, self.learning_starts, self.updates_per_step)

    def required_updates(self, steps: int) -> int:
        """Updates that ``steps`` collected transitions call for."""
        return max(0, math.floor((steps - self.learning_starts) * self.updates_per_step))

    def steps_for_update(self, u: int) -> float:
        """Transitions that must be inserted before update ``u`` (1-based) may start."""
        return self.learning_starts + u / self.updates_per_step

    def learner_may_start(self, steps: int, started: int) -> bool:
        """May update ``started + 1`` start with ``steps`` transitions inserted?"""
        return steps >= self.steps_for_update(started + 1) - EPS

    def actor_may_step(self, reserved: int, started: int) -> bool:
        """May an actor be granted more transitions, ``reserved`` being granted so far?"""
        return reserved < self.learning_starts + started / self.updates_per_step + self.slack

    def budget_spent(self, reserved: int) -> bool:
        return reserved >= self.total_steps

    def updates_exhausted(self, started: int) -> bool:
        return started >= self.max_updates


def max_updates(total_steps: int, learning_starts: int, updates_per_step: float) -> int:
    return max(0, math.floor((total_steps - learning_starts) * updates_per_step))


def unsent_bound(cfg) -> int:
    """The rate slack a local buffer needs: the env steps actors may hold back (each at most
    ``local_buffer + envs_per_actor - 1``) plus the steps one update waits for, so that a learner can always
    start once the actors have run as far ahead as the slack lets them."""
    return cfg.actors * (cfg.local_buffer + cfg.envs_per_actor) + math.ceil(1 / cfg.updates_per_step)


def default_slack(cfg, chunk: int = 0) -> int:
    """Transitions actors may run ahead of the learners (``cfg.rate_slack`` if set): enough for every learner
    to find its next batch (two per learner), four vector steps per actor, where actors send chunks of
    ``chunk`` transitions two chunks per actor so that collection and insertion overlap, and with a local
    buffer (``cfg.local_buffer``) what the actors may hold back plus one update's steps
    (``unsent_bound``)."""
    return cfg.rate_slack or max(math.ceil(2 * cfg.learners / cfg.updates_per_step),
                                 4 * cfg.actors * cfg.envs_per_actor, 2 * cfg.actors * chunk,
                                 unsent_bound(cfg) if cfg.local_buffer > 1 else 0)
