"""The parameter-server actor: the thread backend's ``ParameterServer`` (optimizers, target networks,
averaging, clipping) behind an async Ray actor, publishing each weights version once to the object
store (``ray.put``); actors and learners fetch the reference and read the weights from the store.

``sync``: a round is applied when every active learner has sent one gradient; a learner that has
not sent within ``learner_timeout_s`` of the round's first gradient (dead, or restarting) is waited
for no longer: the round is applied with the gradients present and the timeout is recorded. A
restarted learner rejoins with its next gradient. ``async``: a gradient is applied on arrival unless
it is more than ``max_staleness`` versions old (dropped and counted).

``allreduce``: the learners aggregate among themselves (torch.distributed, gloo); learner 0 publishes
its weights here (``publish``) and this actor only hands the reference on.
"""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import time

import ray
import torch

from pal_bench.train.backends.ray.context import from_numpy, to_numpy
from pal_bench.train.config import TrainConfig
from pal_bench.train.core import RunCore
from pal_bench.train.param_server import ParameterServer


class ParameterServerActor:
    def __init__(self, cfg: TrainConfig, n_learners: int, state: dict | None = None):
        torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        ctx = RunCore(cfg)
        nets = ctx.networks()
        self.ps = ParameterServer(ctx.algo, nets, copy.deepcopy(nets), cfg, n_learners)
        if state is not None:
            self.ps.load_state_dict(state)
        self.active = set(range(n_learners))
        self.pending: dict[int, dict] = {}
        self.round = 0
        self.timer: asyncio.Task | None = None   # the open sync round's learner timeout
        self.timeouts: list[dict] = []      # sync rounds applied without every learner
        self.stopped = False
        self.cond = asyncio.Condition()
        self.ref = None
        self.published_version = -1
        self._publish()

    def _publish(self) -> None:
        """At most one ``ray.put`` per version (``{"version", "online", "target"}``, numpy state dicts),
        done when the version is first asked for: versions nobody reads are never serialized."""
        if self.published_version == self.ps.version:
            return
        t0 = time.perf_counter()
        snap = self.ps.snapshot
        self.ref = ray.put({"version": snap.version, "online": to_numpy(snap.online), "target": to_numpy(snap.target)})
        self.published_version = snap.version
        self.ps.times["publish_s"] += time.perf_counter() - t0

    def latest(self, known: int = -1) -> tuple[int, list] | None:
        """``(version, [ref])`` of the newest weights, or None when ``known`` is already the newest
        (the reference is wrapped in a list so that Ray hands it over unresolved)."""
        if self.cfg.aggregation != "allreduce":
            self._publish()
        return None if self.published_version == known else (self.published_version, [self.ref])

    async def submit(self, learner: int, base_version: int, grads: dict) -> tuple[int, list] | None:
        """One gradient (group -> list of arrays) computed on ``base_version``; returns after it was
        applied or dropped (sync: after its round), with ``latest(base_version)``."""
        grads = {g: from_numpy(v) for g, v in grads.items()}
        async with self.cond:
            if self.cfg.aggregation == "async":
                if self.ps.version - base_version > self.cfg.max_staleness:
                    self.ps.dropped_stale += 1
                else:
                    self._step([grads])
                return self.latest(base_version)
            self.active.add(learner)        # a restarted learner rejoins here
            my_round = self.round
            self.pending[learner] = grads
            if self.active <= set(self.pending):
                self._apply_round()
            else:
                if self.timer is None:      # the round's first gradient starts its timeout
                    self.timer = asyncio.get_running_loop().create_task(self._timeout(my_round))
                await self.cond.wait_for(lambda: self.round > my_round or self.stopped)
            return self.latest(base_version)

    def _step(self, grad_list: list[dict]) -> None:
        self.ps._step(grad_list)

    def _apply_round(self) -> None:
        if self.timer is not None:          # (a round applied at once, one learner, starts none)
            if self.timer is not asyncio.current_task():
                self.timer.cancel()
            self.timer = None
        self._step(list(self.pending.values()))
        self.pending.clear()
        self.round += 1
        self.cond.notify_all()

    async def _timeout(self, my_round: int) -> None:
        await asyncio.sleep(self.cfg.learner_timeout_s)
        async with self.cond:
            if self.round == my_round and self.pending and not self.stopped:
                missing = sorted(self.active - set(self.pending))
                self.timeouts.append({"version": self.ps.version + 1, "gradients": len(self.pending),
                                      "missing_learners": missing, "waited_s": self.cfg.learner_timeout_s,
                                      "time": time.time()})
                self._apply_round()
            if self.timer is asyncio.current_task():
                self.timer = None

    async def leave(self, learner: int) -> None:
        """A learner has finished (or is gone for good): later rounds do not wait for it."""
        async with self.cond:
            self.active.discard(learner)
            if self.pending and self.active <= set(self.pending):
                self._apply_round()

    def publish(self, version: int, state: list) -> None:
        """allreduce: learner 0's weights ``[ref]`` of ``version``."""
        if version > self.published_version:
            self.ref, self.published_version = state[0], version
            self.ps.version = version

    async def state_dict(self) -> dict:
        """For checkpoints. allreduce: the published weights and targets; the optimizers' moments
        live in the learners and are not included."""
        if self.cfg.aggregation == "allreduce" and self.published_version > 0:
            state = await self.ref         # not ray.get: that would block this actor's event loop
            self.ps.nets.load_state_dict(from_numpy(state["online"]))
            self.ps.targets.load_state_dict(from_numpy(state["target"]))
        return self.ps.state_dict()

    def info(self) -> dict:
        """Where this actor runs: pid, Ray node id, host."""
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def stats(self) -> dict:
        return {"version": self.ps.version, "dropped_stale": self.ps.dropped_stale,
                "times": dict(self.ps.times), "timeouts": list(self.timeouts)}

    async def stop(self) -> None:
        async with self.cond:
            self.stopped = True
            self.cond.notify_all()
