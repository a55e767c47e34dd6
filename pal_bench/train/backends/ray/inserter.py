"""The inserter: the one process on the learner's node that actors on other nodes talk to (``ray_placement =
"node"`` with ``ray_remote_actors``). It attaches the node's shared replay segment, ``SharedWeights`` block and
``SharedControl`` block by name, as a local actor process does, and serves the remote actors in chunks:

- ``acquire(actor, chunk)`` and ``add_batch(actor, batch, n_steps, episodes, request, priorities)``: a grant of env
  steps under the rate rule of ``rate_policy`` over the shared counters (each remote actor has its own reserved and
  inserted slots, as an actor process has), a chunk's rows written into the segment with one ``add_batch``, its
  finished episodes handed to the driver through the actor's inbox, and the next grant in the same answer: one round
  trip per chunk (``ChunkGrants`` on the actor's side);
- ``latest(version)``: the newest weights the driver published, put into the object store once per version and
  fetched by a remote actor only when its version is older (``LatestWeights`` on the actor's side).

A call waits at most ``WAIT_S`` for the rate rule, then answers "not yet" (``granted`` -1) and the actor asks
again, so one waiting actor never holds the inserter for long.
"""

from __future__ import annotations

import os
import time

import numpy as np
import ray

from pal_bench._segment import SharedControl
from pal_bench.train.backends.processes.shared import (
    FINISHED,
    GO,
    READY,
    STOP,
    count_inserted,
    count_under_lock,
    reserve_steps,
)
from pal_bench.train.backends.ray.context import chunk_size
from pal_bench.train.config import TrainConfig
from pal_bench.train.rate_policy import RatePolicy, default_slack
from pal_bench.train.replay_spec import buffer_class
from pal_bench.train.shared_weights import SharedWeights

WAIT_S = 0.2          # longest wait inside one call (s); the caller then asks again
POLL_S = 0.0005       # how often a waiting call looks at the counters again (s)


class Inserter:
    """Serves remote actors from the learner's node (a Ray actor pinned there); see the module docstring."""

    def __init__(self, cfg: TrainConfig, buffer_name: str, weights_name: str, weights_spec, control_name: str,
                 inboxes: dict):
        self.cfg, self.inboxes = cfg, inboxes
        self.buffer = buffer_class(cfg).attach(buffer_name, seed=cfg.seed + 7919)
        self.weights = SharedWeights.attach(weights_name, weights_spec)
        self.control = SharedControl.attach(control_name)
        self.c, self.lock = self.control.words, self.control.lock
        self.policy = RatePolicy.from_config(cfg, default_slack(cfg, chunk_size(cfg)))
        self.version, self.ref = -1, None
        self.finished: set[int] = set()
        self.seen: set[int] = set()   # actors whose current incarnation has asked (is set up)
        self.rows = 0                  # rows written
        self.bytes = 0                 # bytes of the rows (and priorities) received
        self.seconds = {"insert": 0.0, "publish": 0.0, "rate_wait": 0.0}

    def set_inbox(self, actor: int, inbox) -> None:
        """A restarted actor's new inbox (its next incarnation counts itself set up again)."""
        self.inboxes[actor] = inbox
        self.seen.discard(actor)

    def acquire(self, actor: int, request: int) -> dict:
        """A grant of up to ``request`` env steps: ``{"granted": n, "t": first step index, "waited": s}``; ``granted``
        0: the budget is spent or the run stops; -1: not yet (ask again)."""
        c, e = self.c, self.cfg.envs_per_actor
        t0 = time.perf_counter()
        if actor not in self.seen:          # its first ask: set up (counted as an actor process counts itself)
            self.seen.add(actor)
            count_under_lock(c, self.lock, actor, READY)
            self.inboxes[actor].put(("ready", actor, None))
        while True:
            if c[STOP]:
                return self._answer(0, 0, t0)
            if c[GO]:
                n, reserved, spent = reserve_steps(c, self.lock, actor, self.policy, request, unit=e)
                if spent:
                    return self._answer(0, reserved, t0)
                if n:
                    return self._answer(n, reserved, t0)
            if time.perf_counter() - t0 >= WAIT_S:
                return self._answer(-1, 0, t0)
            time.sleep(POLL_S)

    def _answer(self, granted: int, t: int, t0: float) -> dict:
        waited = time.perf_counter() - t0
        self.seconds["rate_wait"] += waited
        return {"granted": granted, "t": t, "waited": waited}

    def add_batch(self, actor: int, batch: dict | None, n_steps: int, episodes: list, request: int,
                  priorities: np.ndarray | None = None) -> dict:
        """Insert one chunk (``n_steps`` env steps, ``batch`` the rows they produced), pass its episodes on, and
        answer with the next grant (as ``acquire``; none when ``request`` is 0: the actor's last call)."""
        t0 = time.perf_counter()
        if batch:
            self.buffer.add_batch(priorities=priorities, **batch)
            self.rows += len(next(iter(batch.values())))
            self.bytes += sum(v.nbytes for v in batch.values()) + (priorities.nbytes if priorities is not None else 0)
        count_inserted(self.c, self.lock, actor, n_steps)
        if episodes:
            self.inboxes[actor].put(("episodes", actor, episodes))
        self.seconds["insert"] += time.perf_counter() - t0
        return self.acquire(actor, request) if request else {"granted": 0, "t": 0, "waited": 0.0}

    def finish(self, actor: int, seconds: dict) -> None:
        """The remote actor's end: its timers to the driver, and (once) its share of the budget counted in."""
        self.inboxes[actor].put(("timers", actor, seconds))
        self.inboxes[actor].join_thread()
        if actor not in self.finished:
            self.finished.add(actor)
            count_under_lock(self.c, self.lock, actor, FINISHED)

    def latest(self, known: int = -1):
        """``(version, [ref])`` of the newest published weights, or None when ``known`` is the newest; one
        ``ray.put`` per version."""
        version = self.weights.version
        if version != self.version:
            t0 = time.perf_counter()
            got = self.weights.read(min_version=version)
            if got is not None:
                v, flat = got
                state = {"online": {}, "target": {}}
                for name, tensor in flat.items():
                    part, key = name.split(".", 1)
                    state[part][key] = tensor.numpy()
                self.ref, self.version = ray.put(state), v
            self.seconds["publish"] += time.perf_counter() - t0
        return None if self.version == known else (self.version, [self.ref])

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        return {"rows": self.rows, "bytes": self.bytes, "seconds": dict(self.seconds)}

    def close(self) -> None:
        for h in (self.buffer, self.weights, self.control):
            h.close()
