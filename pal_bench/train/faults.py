"""The fault-injection seam of the process backend's workers: the actor and learner processes call a ``Faults``
object at fixed points, and the default one does nothing. A test sets ``ProcessTrainer.faults`` to one of the
subclasses below (they are picklable, so they cross into spawned processes); the workers' loops hold no test
branches or sleeps of their own."""

from __future__ import annotations

import time
from dataclasses import dataclass


class Faults:
    """No faults: every hook returns at once."""

    def in_reservation(self, actor: int, inserted: int, incarnation: int) -> None:
        """Called by an actor inside the reservation lock, with its transitions inserted so far."""

    def before_update(self, learner: int, updates: int) -> None:
        """Called by a learner process before its update number ``updates`` (0-based)."""


NO_FAULTS = Faults()


@dataclass(frozen=True)
class StallInReservation(Faults):
    """Actor ``actor`` (its first incarnation) stalls ``seconds`` inside the reservation lock once it has
    inserted ``after`` transitions: a worker that dies holding the lock."""

    actor: int
    after: int
    seconds: float = 60.0

    def in_reservation(self, actor: int, inserted: int, incarnation: int) -> None:
        if actor == self.actor and inserted >= self.after and incarnation == 0:
            time.sleep(self.seconds)


@dataclass(frozen=True)
class LearnerFailsAfter(Faults):
    """Learner process ``learner`` raises before its update number ``updates``."""

    updates: int
    learner: int = 0

    def before_update(self, learner: int, updates: int) -> None:
        if learner == self.learner and updates == self.updates:
            raise RuntimeError(f"injected learner failure after {updates} updates")
