"""The actor and learner loops every backend runs, driven through fake transports: what goes into the buffer and
when, what a stop or a spent budget leaves behind, and that a non-finite loss stops a learner before its
priorities or gradient go anywhere."""

import math

import numpy as np
import pytest
import torch

from pal_bench.train.actor import actor_loop
from pal_bench.train.errors import Diverged
from pal_bench.train.learner import learner_loop
from pal_bench.train.supervision import actor_rng, env_seeds


class Timer:
    def __init__(self):
        self.laps = []

    def lap(self, phase):
        self.laps.append(phase)


class Grant:
    """Reserves ``n`` env steps at a time until ``budget`` (then ``spent``), or stops after ``stop_after`` calls."""

    def __init__(self, budget, stop_after=None, alive=True):
        self.budget, self.stop_after, self.alive = budget, stop_after, alive
        self.reserved, self.calls, self.spent, self.counted = 0, 0, False, []

    def reserve(self, n, flush=None):
        self.calls += 1
        if self.stop_after is not None and self.calls > self.stop_after:
            return None
        if self.reserved >= self.budget:
            self.spent = True
            return None
        self.reserved += n
        return self.reserved

    def inserted(self, steps):
        self.counted.append(steps)

    def may_insert(self):
        return self.alive


class Weights:
    def __init__(self):
        self.pulls = []

    def pull(self, version):
        self.pulls.append(version)
        return 7


class Stepper:
    """One row per env step (``t``), one episode every third step; ``flush`` closes the open windows: one row
    the first time, nothing after (as ``EnvStepper.flush``: the windows are empty then)."""

    def __init__(self):
        self.flushes = 0

    def step(self, nets, t, rng, timer):
        return [("row", t)], ([(1.0, 3)] if t % 3 == 0 else [])

    def flush(self):
        self.flushes += 1
        return [("flush",)] if self.flushes == 1 else []


class Local:
    """``workers.LocalBuffer``'s contract: hold until ``size`` env steps, or send now with ``send``."""

    def __init__(self, size):
        self.size, self.items, self.steps, self.sent = size, [], 0, []

    def put(self, items, steps, send=False):
        self.items += items
        self.steps += steps
        return self.send() if send or self.steps >= self.size else 0

    def send(self):
        self.sent.append(list(self.items))
        n, self.items, self.steps = self.steps, [], 0
        return n


def run_actor(grant, local_size=2, budget=6):
    stepper, local, weights, episodes = Stepper(), Local(local_size), Weights(), []
    actor_loop(stepper, local, None, grant, weights, episodes.extend, None, Timer(), 1, budget)
    return stepper, local, weights, episodes


def test_the_actor_fills_its_share_and_flushes_the_last_step():
    grant = Grant(budget=6)
    stepper, local, weights, episodes = run_actor(grant)
    rows = [r for batch in local.sent for r in batch]
    assert [r for r in rows if r[0] == "row"] == [("row", t) for t in range(1, 7)]
    assert rows[-1] == ("flush",) and rows.count(("flush",)) == 1    # the budget's last step closes the windows
    assert sum(grant.counted) == 6                               # every env step counted once inserted
    assert episodes == [(1.0, 3), (1.0, 3)]
    assert weights.pulls[0] == -1 and set(weights.pulls[1:]) == {7}


def test_an_actor_whose_budget_another_took_flushes_and_sends_what_it_holds():
    grant = Grant(budget=3)                  # reserve 1..3, then the budget is spent at the fourth call
    stepper, local, _, _ = run_actor(grant, local_size=10, budget=100)
    assert grant.spent and stepper.flushes == 1
    assert local.sent == [[("row", 1), ("row", 2), ("row", 3), ("flush",)]]
    assert sum(grant.counted) == 3


def test_a_stopped_actor_sends_what_it_holds_but_opens_no_window_and_a_dead_driver_gets_nothing():
    grant = Grant(budget=100, stop_after=3)
    stepper, local, _, _ = run_actor(grant, local_size=10, budget=100)
    assert not grant.spent and stepper.flushes == 0
    assert local.sent == [[("row", 1), ("row", 2), ("row", 3)]] and grant.counted == [3]
    grant = Grant(budget=100, stop_after=3, alive=False)
    stepper, local, _, _ = run_actor(grant, local_size=10, budget=100)
    assert local.sent == [] and grant.counted == []


class UpdateGrant:
    wait_phase = "rate_wait"

    def __init__(self, n):
        self.n, self.given, self.finished = n, 0, 0

    def acquire(self):
        if self.given == self.n:
            return None
        self.given += 1
        return self.given

    def done(self):
        self.finished += 1


class Sink:
    phase = "apply"

    def __init__(self):
        self.got = []

    def deliver(self, version, grads):
        self.got.append((version, grads))


class Buffer:
    def __init__(self):
        self.updates = []

    def sample(self, n, beta):
        return {"x": np.ones((n, 1), np.float32), "indices": np.arange(n), "weights": np.ones(n)}

    def update_priorities(self, indices, td):
        self.updates.append(td)


class Algo:
    def __init__(self, w, bad_at=None):
        self.w, self.bad_at = w, bad_at

    def losses(self, nets, targets, batch, cfg, update):
        loss = (self.w * torch.as_tensor(batch["x"])).sum()
        if update == self.bad_at:
            loss = loss * math.nan
        return {"q": loss}, torch.ones(len(batch["x"]))


class Cfg:
    batch_size, prioritized = 4, True


def run_learner(updates, bad_at=None):
    w = torch.nn.Parameter(torch.tensor(2.0))
    grant, sink, buf, timer = UpdateGrant(updates), Sink(), Buffer(), Timer()
    learner_loop(buf, None, None, {"q": [w]}, grant, Weights(), sink, Algo(w, bad_at), Cfg(), lambda u: 0.4,
                 lambda s: s, "learner0", timer)
    return grant, sink, buf, timer


def test_the_learner_delivers_every_granted_update_and_writes_its_priorities():
    grant, sink, buf, timer = run_learner(3)
    assert grant.finished == 3 and len(sink.got) == 3 and len(buf.updates) == 3
    version, grads = sink.got[0]
    assert version == 7 and float(grads["q"][0]) == 4.0          # d(sum 2w over 4 ones)/dw
    assert timer.laps[:7] == ["rate_wait", "weights_pull", "sample", "forward_backward", "priority_update",
                              "apply", "rate_wait"]


def test_a_non_finite_loss_stops_the_learner_before_its_priorities_or_gradient_go_anywhere():
    with pytest.raises(Diverged, match="update 2"):
        run_learner(3, bad_at=2)


def test_seeds_differ_by_actor_incarnation_and_resume_and_the_first_incarnation_keeps_its_stream():
    first = actor_rng(1, 0).integers(1 << 30, size=4)
    assert (first == np.random.default_rng([1, 0]).integers(1 << 30, size=4)).all()
    streams = {tuple(actor_rng(1, a, i, r).integers(1 << 30, size=4)) for a in (0, 1) for i in (0, 1)
               for r in (0, 1000)}
    assert len(streams) == 8
    assert env_seeds(1, 0, 2) != env_seeds(1, 0, 2, incarnation=1) != env_seeds(1, 0, 2, resumed_steps=5)


def test_a_pause_takes_in_what_an_actors_local_buffer_holds():
    """An evaluation or checkpoint pause waits until every reserved step is inserted; an actor with a local buffer
    (Ape-X's) holds reserved steps it only sends every 50, and cannot step while paused: its grant must hand them
    over (``flush``) instead of the pause waiting out its timeout (the stall of the race's pal-apex run)."""
    import threading
    import time

    from pal_bench.train.rate import RateController
    from pal_bench.train.workers import ThreadStepGrant

    rate = RateController(0.25, 100_000, 1_000_000, 64, lockstep=False)
    stop = threading.Event()
    grant = ThreadStepGrant(rate, stop)
    held = [0]

    def flush():
        grant.inserted(held[0])
        held[0] = 0

    def actor():
        while grant.reserve(1, flush) is not None:
            held[0] += 1
            if held[0] >= 50:
                flush()

    t = threading.Thread(target=actor, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while (rate.reserved < 120 or rate.reserved % 50 in (0, 49)) and time.monotonic() < deadline:
        time.sleep(0.0001)
    try:
        assert rate.pause(stop, timeout=5.0), "the pause waited out its timeout"
        assert rate.reserved == rate.steps
    finally:
        rate.resume()
        stop.set()
        t.join(5)
