"""Rate control between actor and learner threads: the rule of ``rate_policy.RatePolicy``, held by blocking.

Counts: ``steps`` (env transitions collected, summed over actors), ``reserved`` (collected and in
flight), ``started``/``done`` learner updates. Every wait is a bounded condition wait that also
watches the stop event, so nothing spins and nothing blocks past a stop.

Lockstep mode (one actor, one learner): the actor only steps while
``done >= floor((steps - learning_starts) * ratio)`` and the learner only starts when the actor is
blocked, so the interleaving, and therefore the run, is reproducible.
"""

from __future__ import annotations

import threading

from pal_bench.train.rate_policy import RatePolicy


class RateController:
    def __init__(self, ratio: float, learning_starts: int, total_steps: int, slack: int, lockstep: bool):
        self.policy = RatePolicy(ratio, learning_starts, total_steps, slack)
        self.ratio = ratio
        self.learning_starts = learning_starts
        self.total_steps = total_steps
        self.slack = slack
        self.lockstep = lockstep
        self.max_updates = self.policy.max_updates
        self.cond = threading.Condition()
        self.steps = 0          # collected and inserted
        self.reserved = 0       # collected + in flight
        self.started = 0
        self.done = 0
        self.paused = False
        self.wait_s = {"actor": 0.0, "learner": 0.0}

    def restore(self, steps: int, updates: int) -> None:
        with self.cond:
            self.steps = self.reserved = steps
            self.started = self.done = updates

    def required_updates(self, steps: int) -> int:
        return self.policy.required_updates(steps)

    def _actor_may_step(self) -> bool:
        if self.lockstep:
            return self.done >= self.required_updates(self.steps) and self.reserved == self.steps
        return self.policy.actor_may_step(self.reserved, self.started)

    def acquire_steps(self, n: int, stop: threading.Event, held: bool = False) -> bool | None:
        """Reserve ``n`` transitions for one vector step; False when the budget is spent or on stop; None when
        the workers are paused and the caller holds reserved steps it has not inserted (``held``): it inserts
        them (a pause waits for them) and asks again."""
        with self.cond:
            while True:
                if stop.is_set() or self.policy.budget_spent(self.reserved):
                    return False
                if not self.paused and self._actor_may_step():
                    self.reserved += n
                    return True
                if self.paused and held:
                    return None
                self._wait("actor")

    def steps_done(self, n: int) -> None:
        with self.cond:
            self.steps += n
            self.cond.notify_all()

    def _learner_may_start(self) -> bool:
        if not self.policy.learner_may_start(self.steps, self.started):
            return False
        if self.lockstep:   # only while the actor is blocked (or finished)
            actor_blocked = self.reserved == self.steps and (
                self.reserved >= self.total_steps or self.done < self.required_updates(self.steps))
            return actor_blocked and self.started == self.done
        return True

    def acquire_update(self, stop: threading.Event, actors_finished: threading.Event) -> bool:
        """Start one update; False when all updates of the budget are started, on stop, or when the
        actors have finished and the data for another update will never come."""
        with self.cond:
            while True:
                if stop.is_set() or self.policy.updates_exhausted(self.started):
                    return False
                if not self.paused and self._learner_may_start():
                    self.started += 1
                    return True
                if actors_finished.is_set() and not self.policy.learner_may_start(self.steps, self.started):
                    return False
                self._wait("learner")

    def acquire_round(self, n: int, stop: threading.Event, actors_finished: threading.Event) -> int:
        """Start ``n`` updates at once, one per learner of an all-reduce round: waits (not paused) until the data
        for all ``n`` is in; fewer only where the budget holds fewer, or the actors have finished and the data for
        more will never come. Returns the updates started: 0 on stop or when none is left. Started together, so a
        checkpoint's pause never waits on a round half-granted."""
        with self.cond:
            while True:
                left = self.max_updates - self.started
                if stop.is_set() or left <= 0:
                    return 0
                want = min(n, left)
                if not self.paused:
                    k = 0
                    while k < want and self.policy.learner_may_start(self.steps, self.started + k):
                        k += 1
                    if k == want or actors_finished.is_set():
                        self.started += k
                        return k
                self._wait("learner")

    def update_done(self) -> None:
        with self.cond:
            self.done += 1
            self.cond.notify_all()

    def _wait(self, role: str) -> None:
        import time

        t0 = time.perf_counter()
        self.cond.wait(0.05)
        self.wait_s[role] += time.perf_counter() - t0

    def pause(self, stop: threading.Event, timeout: float = 30.0) -> bool:
        """Stop new work and wait until none is in flight (for a consistent checkpoint)."""
        import time

        deadline = time.monotonic() + timeout
        with self.cond:
            self.paused = True
            while self.reserved != self.steps or self.started != self.done:
                if stop.is_set() or time.monotonic() > deadline:
                    return False
                self.cond.wait(0.05)
        return True

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()
