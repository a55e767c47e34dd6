"""Actor and learner processes of the Ray backend (plain classes, wrapped with ``ray.remote`` by the
driver). Each ``run()`` returns its per-phase seconds; an exception in it reaches the driver as a
``RayTaskError`` carrying the worker's traceback.

Actor: per chunk, one round trip to the buffer (``add_batch`` inserts the chunk and returns the
next grant) and, in parallel, one to the parameter server (``latest``: a new weights reference or
None). Learner: ``1 + ray_prefetch`` ``sample`` calls in flight; each carries the |TD| priorities
of the previous update back; gradients go to the parameter server (or into a gloo all-reduce).

Phases (seconds): ``rate_wait`` (held back by the rate control), ``transport`` (Ray round trips,
the buffer's or parameter server's own work included), ``serialize`` (building arrays and
submitting calls: Ray pickles the arguments then), ``weights_pull`` (reading a published version
from the object store into the networks), plus the thread backend's ``inference``, ``env_step``,
``sample_wait``, ``forward_backward``, ``aggregation_wait``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import warnings
from collections import deque
from datetime import timedelta

import numpy as np
import ray
import torch

from pal_bench.train.backends.ray.context import chunk_size, from_numpy, to_numpy
from pal_bench.train.config import TrainConfig
from pal_bench.train.core import RunCore
from pal_bench.train.losses import check_losses, gradients, param_groups
from pal_bench.train.param_server import ParameterServer
from pal_bench.train.supervision import actor_rng, env_seeds
from pal_bench.train.workers import PhaseTimer

PUBLISH_EVERY_S = 0.02      # allreduce: learner 0 publishes its weights at most this often


def node_info() -> dict:
    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}


def weights_digest(nets, targets) -> str:
    """SHA-1 of the online and target weights (bit for bit): learners that applied the same averaged
    gradients (allreduce) end with the same digest."""
    h = hashlib.sha1()
    for module in (nets, targets):
        for k, v in module.state_dict().items():
            h.update(k.encode())
            h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _load(nets, targets, state: dict) -> None:
    nets.load_state_dict(from_numpy(state["online"]))
    if targets is not None:
        targets.load_state_dict(from_numpy(state["target"]))


class _Worker:
    def __init__(self, cfg: TrainConfig, worker_id: int, buffer, ps):
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.cfg, self.id, self.buffer, self.ps = cfg, worker_id, buffer, ps
        self.ctx = RunCore(cfg)

    def info(self) -> dict:
        """Where this worker runs: pid, Ray node id, host."""
        return node_info()

    def _pull(self, latest, nets, targets, timer: PhaseTimer, version: int) -> int:
        """Load ``latest`` (``ParameterServerActor.latest``'s answer) if it is newer; returns the version."""
        if latest is not None and latest[0] != version:
            _load(nets, targets, ray.get(latest[1][0]))
            version = latest[0]
        timer.lap("weights_pull")
        return version


class ActorWorker(_Worker):
    """Steps ``envs_per_actor`` environments and sends n-step transitions to the buffer in chunks."""

    def run(self, incarnation: int = 0, resumed_steps: int = 0) -> dict:
        """``incarnation``: the restarts of this actor so far, ``resumed_steps``: the run's env steps when it
        resumed (the driver's; for the seeds, ``supervision``)."""
        cfg, ctx = self.cfg, self.ctx
        E, chunk = cfg.envs_per_actor, chunk_size(cfg)
        timer = PhaseTimer()
        rng = actor_rng(cfg.seed, self.id, incarnation, resumed_steps)
        envs = ctx.make_vector_env(self.id)
        try:
            nets = ctx.networks()
            targets = ctx.networks() if cfg.actor_priorities else None
            stepper = ctx.make_stepper(envs, env_seeds(cfg.seed, self.id, E, incarnation, resumed_steps), self.id)
            version, collected = -1, 0
            grant_ref = self.buffer.acquire.remote(self.id, chunk)
            weights_ref = self.ps.latest.remote(version)
            timer.lap("setup")
            while True:
                grant = ray.get(grant_ref)
                timer.lap("transport")
                timer.seconds["transport"] -= grant["waited"]
                timer.seconds["rate_wait"] = timer.seconds.get("rate_wait", 0.0) + grant["waited"]
                if grant["granted"] < 0:
                    grant_ref = self.buffer.acquire.remote(self.id, chunk)
                    continue
                if grant["granted"] == 0:
                    break
                version = self._pull(ray.get(weights_ref), nets, targets, timer, version)
                rows, episodes = [], []
                for k in range(0, grant["granted"], E):
                    new_rows, ended = stepper.step(nets, grant["t"] + k, rng, timer)
                    rows += new_rows
                    episodes += ended
                    timer.lap("serialize")
                collected += grant["granted"]
                batch, prios = self._batch(stepper, rows, nets, targets, timer)
                grant_ref = self.buffer.add_batch.remote(self.id, batch, grant["granted"], episodes, chunk, prios)
                weights_ref = self.ps.latest.remote(version)
                timer.lap("serialize")
            # the budget is spent: pending n-step windows bootstrap from the last observation
            batch, prios = self._batch(stepper, stepper.flush(), nets, targets, timer)
            if batch is not None:
                ray.get(self.buffer.add_batch.remote(self.id, batch, 0, [], 0, prios))
                timer.lap("transport")
        finally:
            envs.close()
        return {"seconds": timer.seconds, "steps": collected} | node_info()

    def _batch(self, stepper, rows: list, nets, targets, timer: PhaseTimer):
        if not rows:
            return None, None
        batch = stepper.batch(rows)
        timer.lap("serialize")
        prios = self.ctx.actor_priorities(nets, targets, batch) if targets is not None else None
        timer.lap("inference")
        return batch, prios


class LearnerWorker(_Worker):
    """Samples (with prefetch), computes gradients with the algorithm's losses, aggregates them (parameter
    server or all-reduce) and sends |TD| priorities back with its next sample request."""

    def rendezvous(self) -> str:
        """allreduce (learner 0): a ``tcp://ip:port`` address for ``torch.distributed``."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def run(self, init_method: str | None = None) -> dict:
        cfg, ctx, algo = self.cfg, self.ctx, self.ctx.algo
        timer = PhaseTimer()
        nets, targets = ctx.networks(), ctx.networks()
        groups = param_groups(algo, nets)
        allreduce = cfg.aggregation == "allreduce"
        local = None
        if allreduce:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=init_method, rank=self.id, world_size=cfg.learners,
                                    timeout=timedelta(seconds=max(60.0, cfg.learner_timeout_s)))
            local = ParameterServer(algo, nets, targets, cfg, 1)   # optimizers, clipping, targets
        timer.lap("setup")                      # (the gloo rendezvous is no weights pull)
        version = self._pull(ray.get(self.ps.latest.remote(-1)), nets, targets, timer, -1)
        report = {"indices": [], "td": [], "n_done": 0}
        inflight = deque(self._request(report) for _ in range(1 + cfg.ray_prefetch))
        ended, peers_stopped, updates, abandoned, last_publish = False, False, 0, 0, 0.0
        timer.lap("setup")
        try:
            while inflight:
                res = ray.get(inflight.popleft())
                timer.lap("transport")
                timer.seconds["transport"] -= res["waited"]
                timer.seconds["rate_wait"] = timer.seconds.get("rate_wait", 0.0) + res["waited"]
                if res["status"] == "retry":
                    if not ended:
                        inflight.append(self._request(report))
                    continue
                if res["status"] == "end" or ended:     # drain what is in flight
                    ended = True
                    abandoned += res["status"] == "ok"
                    continue
                sample = res["batch"]
                batch = ctx.to_tensors(sample)
                timer.lap("deserialize")
                losses, td = algo.losses(nets, targets, batch, cfg, res["update"])
                check_losses(losses, res["update"], f"learner{self.id}")
                grads = gradients(losses, groups)
                timer.lap("forward_backward")
                if allreduce:
                    grads = self._allreduce(grads, groups)
                    timer.lap("aggregation_wait")
                    if grads is None:           # another learner has finished: all stop here
                        ended = peers_stopped = True
                        abandoned += 1
                        continue
                    local._step([grads], [self.id])
                    version = local.version
                    timer.lap("aggregate")      # the optimizer step the parameter server does otherwise
                    if self.id == 0 and time.perf_counter() - last_publish > PUBLISH_EVERY_S:
                        self._publish(local)
                        last_publish = time.perf_counter()
                        timer.lap("serialize")
                else:
                    ref = self.ps.submit.remote(self.id, version, {g: to_numpy(v) for g, v in grads.items()})
                    timer.lap("serialize")
                    latest = ray.get(ref)
                    timer.lap("aggregation_wait")
                    version = self._pull(latest, nets, targets, timer, version)
                updates += 1
                report["indices"].append(sample["indices"])
                report["td"].append(td.numpy().astype(np.float64))
                report["n_done"] += 1
                if not ended:
                    inflight.append(self._request(report))
                    timer.lap("priority_update")
            if allreduce and not peers_stopped:
                self._allreduce(None, groups)   # tell the others
        finally:
            idx, tdv = self._take(report)
            ray.get(self.buffer.finish.remote(self.id, idx, tdv, report["n_done"], abandoned))
            if allreduce:
                if self.id == 0:
                    self._publish(local, wait=True)     # the final weights, before the driver reads them
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            else:
                ray.get(self.ps.leave.remote(self.id))
        return {"seconds": timer.seconds, "updates": updates, "version": version,
                "weights_sha1": weights_digest(nets, targets)} | node_info()

    def _request(self, report: dict):
        """Start one ``sample`` call carrying the unreported priorities."""
        idx, td = self._take(report)
        n, report["n_done"] = report["n_done"], 0
        return self.buffer.sample.remote(self.id, self.cfg.batch_size, idx, td, n)

    @staticmethod
    def _take(report: dict):
        if not report["indices"]:
            return None, None
        idx, td = np.concatenate(report["indices"]), np.concatenate(report["td"])
        report["indices"], report["td"] = [], []
        return idx, td

    def _allreduce(self, grads: dict | None, groups: dict) -> dict | None:
        """Average gradients over the learners: one gloo all-reduce of every group's gradients (zeros
        for a group this update has no loss for), a count per group and a have-batch flag. Returns
        the averaged gradients, or None when some learner has no batch (``grads`` None here): then
        every learner stops."""
        import torch.distributed as dist

        names = sorted(groups)
        parts, counts = [], []
        for g in names:
            mine = grads is not None and g in grads
            parts += [t.reshape(-1) for t in grads[g]] if mine else [torch.zeros(p.numel()) for p in groups[g]]
            counts.append(float(mine))
        flat = torch.cat(parts + [torch.tensor(counts + [float(grads is not None)])])
        dist.all_reduce(flat)
        if flat[-1] < self.cfg.learners:
            return None
        out, offset = {}, 0
        for i, g in enumerate(names):
            sizes = [p.numel() for p in groups[g]]
            seg = []
            for size, p in zip(sizes, groups[g]):
                seg.append(flat[offset:offset + size].view_as(p))
                offset += size
            count = float(flat[len(flat) - 1 - len(names) + i])
            if count > 0:
                out[g] = [x / count for x in seg]
        return out

    def _publish(self, local: ParameterServer, wait: bool = False) -> None:
        snap = local.snapshot
        ref = ray.put({"version": snap.version, "online": to_numpy(snap.online), "target": to_numpy(snap.target)})
        done = self.ps.publish.remote(snap.version, [ref])
        if wait:
            ray.get(done)
