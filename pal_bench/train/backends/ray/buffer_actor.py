"""The replay-buffer actor: PAL's Cython buffer in one Ray process, plus the run's rate control.

It is an async actor (one event loop): buffer calls run one at a time on the loop, and callers
that must wait for the rate controller wait on an ``asyncio.Condition`` in bounded steps
(``WAIT_S``), then get ``"retry"`` and call again, so nothing spins and nothing blocks past a stop.

Rate control, the same rules as ``pal_bench.train.rate.RateController`` in chunk units:

- actors get *grants* of up to one chunk of transitions while
  ``reserved < learning_starts + started / ratio + slack`` (``reserved``: granted so far);
- learners may start update u+1 (one ``sample``) once ``steps >= learning_starts + (u + 1) / ratio``
  (``steps``: transitions inserted), and get ``"end"`` once all updates of the budget were started
  or the actors have finished and the data for another update will never come.

Failure accounting: ``release`` returns a dead actor's outstanding grant (collected or not, never
inserted: its lost transitions, at most one chunk) to the budget; a dead learner's batches in
flight are returned the same way. With ``buffer_checkpoint_interval`` > 0 the buffer writes its
contents and counters every that many transitions; a buffer actor restarted by Ray reloads the
last such checkpoint, so it loses at most the transitions inserted since (the checkpoint interval),
and its counters go back to the checkpoint: the actors collect the lost transitions again.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from pal_bench.train.backends.ray.context import restarted_by_ray
from pal_bench.train.config import TrainConfig
from pal_bench.train.core import RunCore
from pal_bench.train.rate_policy import RatePolicy
from pal_bench.train.replay_spec import buffer_class, make_buffer

WAIT_S = 0.5          # longest wait inside one call (s); the caller then calls again
COUNTERS = ("steps", "started", "done")


class BufferActor:
    """Hosts the replay buffer; counts transitions (``steps``) and updates (``started``/``done``)."""

    def __init__(self, cfg: TrainConfig, slack: int, checkpoint_path: str | None = None,
                 restore_path: str | None = None, restore_counters: dict | None = None):
        self.cfg = cfg
        self.ctx = RunCore(cfg)
        self.slack = slack
        self.policy = RatePolicy.from_config(cfg, slack)
        self.max_updates = self.policy.max_updates
        self.steps = self.reserved = self.started = self.done = 0
        self.granted: dict[int, int] = {}     # actor -> transitions granted, not yet inserted
        self.sampled: dict[int, int] = {}     # learner -> batches handed out, not yet reported done
        self.episodes: list[tuple[int, float, int]] = []   # (env steps, return, length), drained by status()
        self.stopped = False
        self.seconds = {"insert": 0.0, "sample": 0.0, "priority_update": 0.0, "checkpoint": 0.0}
        self.wait_s = {"actor": 0.0, "learner": 0.0}
        self.cond = asyncio.Condition()
        self.checkpoint_path = checkpoint_path
        self.last_checkpoint = 0
        self.restored: dict | None = None     # set when a restarted actor reloaded its checkpoint
        if restore_path:            # resuming a run from its checkpoint
            self._load(restore_path, restore_counters)
        elif checkpoint_path and restarted_by_ray() and Path(checkpoint_path).exists():
            self._load(checkpoint_path)
            self.restored = {"steps": self.steps, "wall": time.time()}
        else:
            self.buffer = self._new_buffer()

    def _new_buffer(self):
        return make_buffer(self.cfg, self.ctx.fields())

    # ------------------------------------------------------------------ actors

    async def acquire(self, actor: int, request: int) -> dict:
        """A grant of up to ``request`` transitions: ``{"granted": n, "t": first step index, "waited": s}``;
        ``granted`` 0: the budget is spent (or stop); -1: not yet (call again)."""
        return await self._grant(actor, request)

    async def add_batch(self, actor: int, batch: dict | None, n_steps: int, episodes: list, request: int,
                        priorities: np.ndarray | None = None) -> dict:
        """Insert one chunk (``n_steps`` env transitions, ``batch`` the n-step rows they produced) and
        the episodes that ended in it, then return the next grant (as ``acquire``)."""
        t0 = time.perf_counter()
        if batch:
            self.buffer.add_batch(priorities=priorities, **batch)
        owed = self.granted.get(actor, 0)
        self.granted[actor] = max(0, owed - n_steps)
        if n_steps > owed:        # steps granted by an earlier incarnation of this buffer
            self.reserved += n_steps - owed
        self.steps += n_steps
        self.episodes += [(self.steps, float(r), int(n)) for r, n in episodes]
        self.seconds["insert"] += time.perf_counter() - t0
        self._maybe_checkpoint()
        async with self.cond:
            self.cond.notify_all()
        return await self._grant(actor, request) if request else {"granted": 0, "t": self.reserved, "waited": 0.0}

    def _actor_may_step(self) -> bool:
        return self.policy.actor_may_step(self.reserved, self.started)

    async def _grant(self, actor: int, request: int) -> dict:
        async with self.cond:
            t0 = time.perf_counter()
            ok = await self._wait(lambda: self._budget_spent() or self._actor_may_step(), "actor")
            waited = time.perf_counter() - t0
            if self._budget_spent():
                return {"granted": 0, "t": self.reserved, "waited": waited}
            if not ok:
                return {"granted": -1, "t": self.reserved, "waited": waited}
            e = self.cfg.envs_per_actor
            n = min(request, -(-(self.cfg.steps - self.reserved) // e) * e)
            t = self.reserved
            self.reserved += n
            self.granted[actor] = self.granted.get(actor, 0) + n
            return {"granted": n, "t": t, "waited": waited}

    def _budget_spent(self) -> bool:
        return self.stopped or self.policy.budget_spent(self.reserved)

    # ------------------------------------------------------------------ learners

    def _learner_may_start(self) -> bool:
        return self.policy.learner_may_start(self.steps, self.started)

    def _no_more_updates(self) -> bool:
        return self.stopped or self.policy.updates_exhausted(self.started) or (
            self.steps >= self.cfg.steps and not self._learner_may_start())

    async def sample(self, learner: int, batch_size: int, indices: np.ndarray | None = None,
                     td: np.ndarray | None = None, n_done: int = 0) -> dict:
        """Report the caller's finished updates (``n_done``, with their |TD| for ``indices``), then start
        one update: ``{"status": "ok" | "retry" | "end", "waited": s, "update": n, "batch": {field: array,
        "indices", "weights"}}`` (``waited``: seconds held back by the rate control)."""
        await self._report(learner, indices, td, n_done, 0)
        async with self.cond:
            t0 = time.perf_counter()
            ok = await self._wait(lambda: self._no_more_updates() or self._learner_may_start(), "learner")
            waited = time.perf_counter() - t0
            if self._no_more_updates():
                return {"status": "end", "waited": waited}
            if not ok:
                return {"status": "retry", "waited": waited}
            self.started += 1
            self.sampled[learner] = self.sampled.get(learner, 0) + 1
            update = self.started
            self.cond.notify_all()
        t0 = time.perf_counter()
        batch = self.buffer.sample(batch_size, beta=self.ctx.beta(update))
        self.seconds["sample"] += time.perf_counter() - t0
        return {"status": "ok", "waited": waited, "update": update, "batch": batch}

    async def finish(self, learner: int, indices: np.ndarray | None = None, td: np.ndarray | None = None,
                     n_done: int = 0, n_abandoned: int = 0) -> None:
        """A learner's last report; ``n_abandoned`` batches it sampled but will not use."""
        await self._report(learner, indices, td, n_done, n_abandoned)

    async def _report(self, learner, indices, td, n_done: int, n_abandoned: int) -> None:
        if indices is not None and len(indices) and self.cfg.prioritized:
            t0 = time.perf_counter()
            self.buffer.update_priorities(indices, td)
            self.seconds["priority_update"] += time.perf_counter() - t0
        if n_done or n_abandoned:
            async with self.cond:
                self.done += n_done
                self.started -= n_abandoned
                self.sampled[learner] = max(0, self.sampled.get(learner, 0) - n_done - n_abandoned)
                self.cond.notify_all()

    # ------------------------------------------------------------------ driver

    async def release(self, kind: str, worker: int) -> int:
        """A worker died: return its outstanding grant (actor: transitions) or batches (learner) to
        the budget; returns how many."""
        async with self.cond:
            if kind == "actor":
                lost = self.granted.pop(worker, 0)
                self.reserved -= lost
            else:
                lost = self.sampled.pop(worker, 0)
                self.started -= lost
            self.cond.notify_all()
        return lost

    def status(self) -> dict:
        """Counters, and the episodes finished since the last call (drained)."""
        eps, self.episodes = self.episodes, []
        return {"steps": self.steps, "reserved": self.reserved, "started": self.started, "done": self.done,
                "size": len(self.buffer), "episodes": eps, "restored": self.restored, "pid": os.getpid()}

    def stats(self) -> dict:
        return {"seconds": dict(self.seconds), "wait_s": dict(self.wait_s), "lock": self.buffer.lock_stats(),
                "size": len(self.buffer)}

    async def stop(self) -> None:
        async with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def save(self, path: str) -> dict:
        """Write the buffer to ``path`` and its counters to ``path + '.json'`` (each atomically);
        returns the counters and the buffer's ``total_added``."""
        t0 = time.perf_counter()
        counters = {k: getattr(self, k) for k in COUNTERS}
        self.buffer.save(path + ".tmp")
        Path(path + ".json.tmp").write_text(json.dumps(counters))
        os.replace(path + ".tmp", path)
        os.replace(path + ".json.tmp", path + ".json")
        self.seconds["checkpoint"] += time.perf_counter() - t0
        return counters | {"total_added": self.buffer.total_added}

    def _maybe_checkpoint(self) -> None:
        interval = self.cfg.buffer_checkpoint_interval
        if self.checkpoint_path and interval and self.steps - self.last_checkpoint >= interval:
            self.save(self.checkpoint_path)
            self.last_checkpoint = self.steps

    def _load(self, path: str, counters: dict | None = None) -> None:
        self.buffer = buffer_class(self.cfg).load(path)
        counters = counters or json.loads(Path(path + ".json").read_text())
        for k in COUNTERS:
            setattr(self, k, counters[k])
        self.reserved = self.last_checkpoint = self.steps
        self.done = min(self.done, self.started)

    def pid(self) -> int:
        return os.getpid()

    async def _wait(self, ready, role: str) -> bool:
        """Wait (condition held) until ``ready()`` or ``WAIT_S`` passed; returns ``ready()``."""
        if ready():
            return True
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(self.cond.wait_for(ready), WAIT_S)
        except asyncio.TimeoutError:
            pass
        self.wait_s[role] += time.perf_counter() - t0
        return ready()
