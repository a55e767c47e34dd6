"""Actor and learner processes of the Ray backend (plain classes, wrapped with ``ray.remote`` by the
driver): Ray's placement of the shared loops. An actor runs ``actor_loop`` and a learner ``learner_loop``, the
same code as on the thread and process backends, over the Ray transports of ``transport.py`` (chunk grants and
inserts through the buffer actor, weights and gradients through the parameter-server actor or a gloo
all-reduce). Each ``run()`` returns its per-phase seconds; an exception in it reaches the driver as a
``RayTaskError`` carrying the worker's traceback.
"""

from __future__ import annotations

import hashlib
import os
import socket
import warnings
from datetime import timedelta

import ray
import torch

from pal_bench.train.actor import actor_loop
from pal_bench.train.backends.ray.context import chunk_size
from pal_bench.train.backends.ray.transport import (
    AllReduceGradients,
    ChunkGrants,
    LatestWeights,
    PrefetchedSamples,
    ServerGradients,
)
from pal_bench.train.config import TrainConfig
from pal_bench.train.core import RunCore
from pal_bench.train.learner import learner_loop
from pal_bench.train.losses import param_groups
from pal_bench.train.param_server import ParameterServer
from pal_bench.train.supervision import actor_rng, env_seeds
from pal_bench.train.workers import PhaseTimer


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


class _Worker:
    def __init__(self, cfg: TrainConfig, worker_id: int, buffer, ps):
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.cfg, self.id, self.buffer, self.ps = cfg, worker_id, buffer, ps
        self.ctx = RunCore(cfg)

    def info(self) -> dict:
        """Where this worker runs: pid, Ray node id, host."""
        return node_info()


class ActorWorker(_Worker):
    """Steps ``envs_per_actor`` environments (``actor_loop``) and sends n-step transitions to the buffer actor in
    chunks."""

    def run(self, incarnation: int = 0, resumed_steps: int = 0) -> dict:
        """``incarnation``: the restarts of this actor so far, ``resumed_steps``: the run's env steps when it
        resumed (the driver's; for the seeds, ``supervision``)."""
        cfg, ctx = self.cfg, self.ctx
        E = cfg.envs_per_actor
        timer = PhaseTimer()
        envs = ctx.make_vector_env(self.id)
        try:
            nets = ctx.networks()
            targets = ctx.networks() if cfg.actor_priorities else None
            stepper = ctx.make_stepper(envs, env_seeds(cfg.seed, self.id, E, incarnation, resumed_steps), self.id)
            chunks = ChunkGrants(ctx, self.buffer, self.id, chunk_size(cfg), stepper, nets, targets, timer)
            weights = LatestWeights(self.ps, nets, targets, due=lambda: chunks.grants)
            timer.lap("setup")
            actor_loop(stepper, chunks, nets, chunks, weights, chunks.on_episodes,
                       actor_rng(cfg.seed, self.id, incarnation, resumed_steps), timer, E, cfg.steps)
        finally:
            envs.close()
        return {"seconds": timer.seconds, "steps": chunks.collected} | node_info()


class LearnerWorker(_Worker):
    """Runs ``learner_loop`` on batches the buffer actor samples ahead (``ray_prefetch``), its gradients
    aggregated by the parameter-server actor or a gloo all-reduce; |TD| priorities go back with the next
    sample request."""

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
        local = sink = None
        if allreduce:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=init_method, rank=self.id, world_size=cfg.learners,
                                    timeout=timedelta(seconds=max(60.0, cfg.learner_timeout_s)))
            local = ParameterServer(algo, nets, targets, cfg, 1)   # optimizers, clipping, targets
        timer.lap("setup")                      # (the gloo rendezvous is no weights pull)
        weights = LatestWeights(self.ps, nets, targets)
        weights.pull(-1)
        timer.lap("weights_pull")
        samples = PrefetchedSamples(self.buffer, self.id, cfg.batch_size, cfg.ray_prefetch, timer)
        if allreduce:
            sink = AllReduceGradients(self.ps, self.id, cfg.learners, local, groups, samples, timer)
            weights = _OwnSteps(local)
        else:
            sink = ServerGradients(self.ps, self.id, weights, timer)
        timer.lap("setup")
        try:
            learner_loop(samples, nets, targets, groups, samples, weights, sink, algo, cfg, ctx.beta,
                         ctx.to_tensors, f"learner{self.id}", timer)
            if allreduce and not sink.peers_stopped:
                sink.reduce(None)               # tell the others
            version = weights.pull(weights.version) if not allreduce else local.version  # the last answer's
        finally:
            samples.finish()
            if allreduce:
                if self.id == 0:
                    sink.publish(wait=True)     # the final weights, before the driver reads them
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            else:
                ray.get(self.ps.leave.remote(self.id))
        return {"seconds": timer.seconds, "updates": samples.updates, "version": version,
                "weights_sha1": weights_digest(nets, targets)} | node_info()


class _OwnSteps:
    """(all-reduce) The learner steps its own networks: the version is its own optimizer's."""

    def __init__(self, local: ParameterServer):
        self.local = local

    def pull(self, version: int) -> int:
        return self.local.version
