"""The Ray actors of the long-haul experiment: the buffer node at the edge, the learner in the cloud,
and an evaluator. Edge actors are the Ray backend's own ``ActorWorker``; the buffer node answers
their ``acquire`` / ``add_batch`` / ``latest`` calls (it is both their buffer and their parameter
server), paced to ``actor_rate`` env steps per second in total (the edge produces experience at its
own speed, independent of the learner; 0: as fast as the actors run).

Everything between the buffer node and the learner crosses the modelled link (``Link``): each
side owns the sending end of its direction and a ``Receiver`` for the other. Topologies:

- ``learner-replay``: the node forwards transitions first-in first-out (chunks of ``forward_rows``,
  one at a time as the link frees up; a backlog over ``forward_backlog`` rows drops the oldest);
  the learner keeps the prioritized replay and samples locally;
- ``buffer-replay``: the node keeps the prioritized replay; each learner request (carrying the
  |TD| priorities of its previous batch) crosses to the node and a sampled batch crosses back.

In both, the learner sends its weights to the node every ``weights_every_s`` (to the actors), or
later when its direction of the link is still busy (a byte budget below the weights' rate would
otherwise queue them without end), and may start update u once the replay it samples from holds
``learning_starts + u / updates_per_step`` transitions. "Priority of an experience that crossed
the link": its |TD| under the learner's weights when it arrives (learner-replay: computed on
arrival; buffer-replay: the batch's |TD| before its update). Times are ``time.time()`` seconds.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque

import numpy as np
import ray
import torch

from pal_bench import PrioritizedReplayBuffer
from pal_bench.studies.longhaul.link import TO_BUFFER, TO_LEARNER, Link, Receiver
from pal_bench.train.backends.ray.context import from_numpy, to_numpy
from pal_bench.train.config import TrainConfig
from pal_bench.train.core import RunCore
from pal_bench.train.losses import gradients, param_groups
from pal_bench.train.param_server import ParameterServer
from pal_bench.train.rate_policy import RatePolicy

RECV_TIMEOUT_S = 60.0


def _concat(chunks: list[dict]) -> dict:
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


class BufferNode:
    """The edge's buffer node (an async Ray actor)."""

    def __init__(self, cfg: TrainConfig, topology: str, link: dict, actor_rate: float,
                 forward_rows: int = 256, forward_backlog: int = 50_000):
        self.cfg, self.topology, self.actor_rate = cfg, topology, actor_rate
        self.ctx = RunCore(cfg)
        self.link, self.rx = Link.preset(link), Receiver(TO_BUFFER)
        self.buffer = (PrioritizedReplayBuffer(cfg.buffer_capacity, self.ctx.fields(), alpha=cfg.alpha, seed=cfg.seed)
                       if topology == "buffer-replay" else None)
        self.forward_rows, self.forward_backlog = forward_rows, forward_backlog
        self.fifo: deque[dict] = deque()
        self.fifo_rows = self.forwarded = self.dropped = 0
        self.reserved = self.inserted = self.started = 0
        self.t0: float | None = None
        self.episodes: list[tuple[float, float]] = []     # (time, return)
        self.weights = None                              # (version, [ref]) for the actors
        self.learner = None
        self.pushes: list = []
        self.stopped = False
        self.cond = asyncio.Condition()

    async def start(self, learner) -> None:
        """Connect the learner (learner-replay: start forwarding to it)."""
        self.learner = learner
        if self.topology == "learner-replay":
            asyncio.get_running_loop().create_task(self._forward())

    # ---------------------------------------------------------------- the edge actors

    async def acquire(self, actor: int, request: int) -> dict:
        return await self._grant(request)

    async def add_batch(self, actor: int, batch: dict | None, n_steps: int, episodes: list, request: int,
                        priorities=None) -> dict:
        now = time.time()
        self.inserted += n_steps
        self.episodes += [(now, float(r)) for r, _ in episodes]
        if batch:
            if self.buffer is not None:
                self.buffer.add_batch(**batch)
            else:
                self.fifo.append(batch)
                self.fifo_rows += len(batch["rew"])
                while self.fifo_rows > self.forward_backlog and len(self.fifo) > 1:
                    self.fifo_rows -= len(old := self.fifo.popleft()["rew"])
                    self.dropped += len(old)
        async with self.cond:
            self.cond.notify_all()
        return await self._grant(request) if request else {"granted": 0, "t": self.reserved, "waited": 0.0}

    async def _grant(self, request: int) -> dict:
        """Up to ``request`` steps, handed out no faster than ``actor_rate`` steps/s over the run."""
        if self.t0 is None:
            self.t0 = time.time()
        if self.stopped or self.reserved >= self.cfg.steps:
            return {"granted": 0, "t": self.reserved, "waited": 0.0}
        e = self.cfg.envs_per_actor
        n = min(request, -(-(self.cfg.steps - self.reserved) // e) * e)
        t, self.reserved = self.reserved, self.reserved + n
        waited = max(0.0, self.t0 + t / self.actor_rate - time.time()) if self.actor_rate > 0 else 0.0
        await asyncio.sleep(waited)
        return {"granted": n, "t": t, "waited": waited}

    def steps(self) -> int:
        """Env steps handed out to the actors so far."""
        return self.reserved

    def latest(self, known: int = -1):
        """The learner's newest weights as the actors' ``ParameterServerActor.latest`` would give them."""
        return None if self.weights is None or self.weights[0] == known else self.weights

    # ---------------------------------------------------------------- the learner's side of the link

    async def receive_weights(self, packet) -> None:
        msg = await self.rx.arecv(packet, RECV_TIMEOUT_S)
        self.started = max(self.started, msg["updates"])
        self.weights = (msg["version"], [ray.put(msg["state"])])

    async def sample(self, packet):
        """buffer-replay: a request (priorities of the previous batch, then one batch); the answer, a
        packet: ``{"status": "ok" | "retry" | "end", "batch", "update"}``."""
        req = await self.rx.arecv(packet, RECV_TIMEOUT_S)
        if req["indices"] is not None:
            self.buffer.update_priorities(req["indices"], req["td"])
        cfg = self.cfg
        policy = RatePolicy.from_config(cfg, slack=0)      # the learner side only: no actor slack here

        def ready() -> bool:
            return self.stopped or policy.learner_may_start(self.inserted, self.started)

        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(ready), 0.2)
            except asyncio.TimeoutError:
                pass
        if self.stopped:
            reply = {"status": "end"}
        elif not ready() or len(self.buffer) < cfg.batch_size:
            reply = {"status": "retry"}
        else:
            self.started += 1
            reply = {"status": "ok", "update": self.started,
                     "batch": self.buffer.sample(cfg.batch_size, beta=self.ctx.beta(self.started))}
        return self.link.send(reply, TO_LEARNER)

    async def _forward(self) -> None:
        """learner-replay: first in, first out, one chunk at a time as the link frees up."""
        while not self.stopped:
            if not self.fifo:
                async with self.cond:
                    try:
                        await asyncio.wait_for(self.cond.wait_for(lambda: self.fifo or self.stopped), 0.1)
                    except asyncio.TimeoutError:
                        pass
                continue
            if (wait := self.link.ready_in(TO_LEARNER)) > 0:
                await asyncio.sleep(wait)
                continue
            chunks, n = [], 0
            while self.fifo and n < self.forward_rows:
                chunks.append(self.fifo.popleft())
                n += len(chunks[-1]["rew"])
            self.fifo_rows -= n
            self.forwarded += n
            self.pushes.append(self.learner.receive.remote(self.link.send(_concat(chunks), TO_LEARNER)))
            if len(self.pushes) > 64:
                _, self.pushes = ray.wait(self.pushes, num_returns=len(self.pushes), timeout=0)

    async def stop(self) -> None:
        async with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def stats(self) -> dict:
        return {"link": self.link.stats(), "rx": self.rx.stats(), "inserted": self.inserted,
                "forwarded": self.forwarded, "dropped": self.dropped, "backlog_left": self.fifo_rows,
                "episodes": self.episodes, "started": self.started}


class CloudLearner:
    """The learner behind the link (a threaded Ray actor: ``receive`` runs beside ``run``)."""

    def __init__(self, cfg: TrainConfig, topology: str, link: dict, weights_every_s: float = 0.25):
        torch.set_num_threads(1)
        self.cfg, self.topology, self.weights_every_s = cfg, topology, weights_every_s
        self.ctx = RunCore(cfg)
        self.link, self.rx = Link.preset(link), Receiver(TO_LEARNER)
        self.inbox: queue.Queue = queue.Queue()
        self.arrived = threading.Event()
        self.stop_event = threading.Event()
        self.node = None

    def connect(self, node) -> None:
        self.node = node

    def receive(self, packet) -> None:
        """learner-replay: a forwarded chunk, delivered at its modelled arrival time."""
        self.inbox.put(self.rx.recv(packet, RECV_TIMEOUT_S))
        self.arrived.set()

    def stop(self) -> None:
        self.stop_event.set()

    def prepare(self) -> None:
        """Networks and optimizer, and one optimizer call without gradients (a no-op that does torch's
        lazy imports, seconds on a loaded machine), before the run's clock starts."""
        cfg, algo = self.cfg, self.ctx.algo
        nets, targets = self.ctx.networks(), self.ctx.networks()
        targets.load_state_dict(nets.state_dict())
        self.ps = ParameterServer(algo, nets, targets, cfg, 1)       # optimizer, clipping, target updates
        for opt in self.ps.optimizers.values():
            opt.step()
        self.nets, self.targets = nets, targets
        self.params = param_groups(algo, nets)

    def run(self) -> dict:
        """Train until ``stop`` (after ``prepare``); returns the per-update timeline and the counters."""
        self.log = {"t": [], "loss": [], "priority": []}            # per update
        self.arrivals = {"t": [], "priority": [], "n": []}          # learner-replay: per arriving chunk
        self.idle_s, self.updates, self.last_weights = 0.0, 0, 0.0
        self.t_start = time.time()
        self._send_weights()
        if self.topology == "learner-replay":
            self._run_local()
        else:
            self._run_remote()
        return {"log": self.log, "arrivals": self.arrivals, "idle_s": self.idle_s, "updates": self.updates,
                "wall_s": time.time() - self.t_start, "link": self.link.stats(), "rx": self.rx.stats()}

    def _update(self, sample: dict) -> np.ndarray:
        batch = self.ctx.to_tensors(sample)
        losses, td = self.ctx.algo.losses(self.nets, self.targets, batch, self.cfg, self.updates + 1)
        grads = gradients(losses, self.params)
        self.ps._step([grads])
        self.updates += 1
        self.log["t"].append(time.time())
        self.log["loss"].append(float(sum(v.item() for v in losses.values())))
        self.log["priority"].append(float(td.mean()))
        # no faster than the link carries them: a newer version replaces one that could not start yet
        if time.time() - self.last_weights > self.weights_every_s and self.link.ready_in(TO_BUFFER) == 0:
            self._send_weights()
        return td.numpy().astype(np.float64)

    def _send_weights(self) -> None:
        snap = self.ps.snapshot
        msg = {"version": snap.version, "updates": self.updates,
               "state": {"online": to_numpy(snap.online), "target": to_numpy(snap.target)}}
        self.node.receive_weights.remote(self.link.send(msg, TO_BUFFER))
        self.last_weights = time.time()

    def _run_local(self) -> None:
        """learner-replay: replay here, filled by what the link delivers."""
        cfg = self.cfg
        policy = RatePolicy.from_config(cfg, slack=0)
        buf = PrioritizedReplayBuffer(cfg.buffer_capacity, self.ctx.fields(), alpha=cfg.alpha, seed=cfg.seed)
        received = 0
        while not self.stop_event.is_set():
            self.arrived.clear()
            while True:
                try:
                    rows = self.inbox.get_nowait()
                except queue.Empty:
                    break
                td = self.ctx.actor_priorities(self.nets, self.targets, rows)      # |TD| on arrival
                self.arrivals["t"].append(time.time())
                self.arrivals["priority"].append(float(td.mean()))
                self.arrivals["n"].append(len(rows["rew"]))
                buf.add_batch(**rows)
                received += len(rows["rew"])
            if policy.learner_may_start(received, self.updates) and len(buf) >= cfg.batch_size:
                sample = buf.sample(cfg.batch_size, beta=self.ctx.beta(self.updates + 1))
                buf.update_priorities(sample["indices"], self._update(sample))
            else:
                t0 = time.time()
                self.arrived.wait(0.01)         # idle: waiting for data to arrive
                self.idle_s += time.time() - t0

    def _run_remote(self) -> None:
        """buffer-replay: one request in flight beyond the batch being used (``ray_prefetch``)."""
        pending = {"indices": None, "td": None}
        inflight = deque(self._request(pending) for _ in range(1 + self.cfg.ray_prefetch))
        while inflight and not self.stop_event.is_set():
            t0 = time.time()
            try:
                reply = self.rx.recv(ray.get(inflight.popleft()), RECV_TIMEOUT_S)
            finally:
                self.idle_s += time.time() - t0
            if reply["status"] == "end":
                break
            if reply["status"] == "ok":
                sample = reply["batch"]
                pending = {"indices": sample["indices"], "td": self._update(sample)}
            inflight.append(self._request(pending))
            pending = {"indices": None, "td": None}

    def _request(self, pending: dict):
        return self.node.sample.remote(self.link.send(pending, TO_BUFFER))


class Evaluator:
    """Greedy episodes with the weights the edge has (``BufferNode.latest``) every ``interval_s``."""

    def __init__(self, cfg: TrainConfig, node, interval_s: float, episodes: int):
        torch.set_num_threads(1)
        self.cfg, self.node, self.interval_s, self.episodes = cfg, node, interval_s, episodes
        self.ctx = RunCore(cfg)
        self.stop_event = threading.Event()
        self.results: list[tuple[float, int, float]] = []      # (time, version, mean return)

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> list:
        import gymnasium as gym

        nets, version = self.ctx.networks(), -1
        env = gym.make(self.cfg.env, **self.cfg.env_kwargs)
        while True:
            final = self.stop_event.wait(self.interval_s)
            latest = ray.get(self.node.latest.remote(version))
            if latest is not None:
                state = ray.get(latest[1][0])
                nets.load_state_dict(from_numpy(state["online"]))
                version = latest[0]
            if version >= 0 and self.episodes:
                rets = []
                for ep in range(self.episodes):
                    obs, _ = env.reset(seed=10_000 + ep)
                    done, ret = False, 0.0
                    while not done:
                        a = self.ctx.algo.act(nets, obs[None], 0.0, None)[0]
                        obs, r, term, trunc, _ = env.step(int(a))
                        ret += float(r)
                        done = term or trunc
                    rets.append(ret)
                self.results.append((time.time(), version, float(np.mean(rets))))
            if final:
                env.close()
                return self.results
