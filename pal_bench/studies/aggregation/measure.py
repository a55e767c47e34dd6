"""How much of a training iteration is gradient aggregation?

For 1..L learners and DQN Q-networks from the CartPole MLP (128x128, 17k parameters) up to a few
million parameters, each learner runs ``iters`` DQN updates (forward + backward on a batch of 128,
``compute``), aggregates its gradient with the others (``communicate``: everything until the
averaged gradient, or the new weights, are here) and brings its weights up to date (``apply``: the
optimizer step, or loading the published weights). Schemes:

- ``threads-ps``: the thread backend's in-process ``ParameterServer`` (sync), learners as threads of
  one process: the zero-network reference;
- ``ps-sync`` / ``ps-async``: the Ray backend's ``ParameterServerActor`` (one process), learners as
  Ray worker processes sending gradients and pulling weights through the object store;
- ``allreduce``: ``torch.distributed`` all-reduce (gloo) among the learner processes, then each
  steps its own optimizer (as the Ray backend's ``aggregation="allreduce"``);
- ``hierarchical``: learners in groups of ``group_size``: reduce to the group's leader, all-reduce
  among leaders, broadcast in the group.

Times are seconds per iteration (mean over timed iterations and learners); ``aggregation_share`` =
(communicate + apply) / iteration. All learner processes are placed with ``num_cpus=0``, so with
more learners than cores they share the cores, as they would on an oversubscribed node.

``pal-bench aggregation --quick``: L = 1, 2, two sizes (a few minutes on 2 cores); the full sweep
(no ``--quick``): L = 1..4, four sizes. ``--ray-address`` runs it on a cluster. Writes
``results/aggregation.csv``, ``results/figures/aggregation_breakdown.png`` and
``results/figures/aggregation_share.png``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from pal_bench.argtypes import choice_list, nonneg_int, positive_int, workers
from pal_bench.bench.publishing import store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.studies.aggregation.publish import SCHEMES, draw
from pal_bench.train.backends.ray.session import session

QUICK_SIZES = ((128, 128), (1024, 1024))
FULL_SIZES = ((128, 128), (512, 512), (1024, 1024), (2048, 2048))
ENV = "CartPole-v1"
BATCH = 128


# --------------------------------------------------------------------------- the aggregation functions


def flatten(grads: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous float32 vector of a list of gradients."""
    return torch.cat([g.reshape(-1) for g in grads])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Split ``flat`` back into tensors shaped like ``like``."""
    out, off = [], 0
    for t in like:
        out.append(flat[off:off + t.numel()].view_as(t))
        off += t.numel()
    return out


def mean_gradients(grad_lists: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The parameter server's average of one gradient per learner (``ParameterServer._step``)."""
    return [torch.stack(parts).mean(0) for parts in zip(*grad_lists)]


def allreduce_mean(grads: list[torch.Tensor], world_size: int, group=None) -> list[torch.Tensor]:
    """Average over the learners with one gloo all-reduce of the flattened gradients."""
    import torch.distributed as dist

    flat = flatten(grads)
    dist.all_reduce(flat, group=group)
    return unflatten(flat / world_size, grads)


def make_groups(world_size: int, group_size: int) -> list[list[int]]:
    """Ranks in consecutive groups of ``group_size`` (the last may be smaller); leader = first rank."""
    return [list(range(i, min(i + group_size, world_size))) for i in range(0, world_size, group_size)]


class Hierarchy:
    """The process groups of hierarchical aggregation. Every rank must build it (``new_group`` is collective)."""

    def __init__(self, world_size: int, group_size: int):
        import torch.distributed as dist

        self.world_size = world_size
        self.members = make_groups(world_size, group_size)
        self.handles = [dist.new_group(m) if len(m) > 1 else None for m in self.members]
        self.leaders = [m[0] for m in self.members]
        self.leader_group = dist.new_group(self.leaders) if len(self.leaders) > 1 else None

    def mean(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Reduce to the group leader, all-reduce among leaders, broadcast back in the group."""
        import torch.distributed as dist

        rank = dist.get_rank()
        i = next(k for k, m in enumerate(self.members) if rank in m)
        leader, handle = self.members[i][0], self.handles[i]
        flat = flatten(grads)
        if handle is not None:
            dist.reduce(flat, dst=leader, group=handle)
        if rank == leader and self.leader_group is not None:
            dist.all_reduce(flat, group=self.leader_group)
        if handle is not None:
            dist.broadcast(flat, src=leader, group=handle)
        return unflatten(flat / self.world_size, grads)


# --------------------------------------------------------------------------- one learner's work


def _setup(hidden: tuple, aggregation: str = "sync", seed: int = 0):
    """(cfg, algo, nets, targets, params, batch): a DQN on CartPole with ``hidden`` and a fixed batch."""
    from pal_bench.train import make_config
    from pal_bench.train.algos import dqn

    cfg = make_config("dqn", ENV, hidden=tuple(hidden), aggregation=aggregation, seed=seed, progress=False,
                      target_update=10**9, max_staleness=10**9)
    torch.manual_seed(seed)
    nets, targets = dqn.networks(4, _Discrete(2), cfg), dqn.networks(4, _Discrete(2), cfg)
    targets.load_state_dict(nets.state_dict())
    g = torch.Generator().manual_seed(seed)
    batch = {"obs": torch.randn(BATCH, 4, generator=g), "act": torch.randint(0, 2, (BATCH,), generator=g),
             "rew": torch.randn(BATCH, generator=g), "next_obs": torch.randn(BATCH, 4, generator=g),
             "done": torch.zeros(BATCH), "disc": torch.full((BATCH,), 0.99), "weights": torch.ones(BATCH)}
    return cfg, dqn, nets, targets, list(nets["q"].parameters()), batch


class _Discrete:
    def __init__(self, n: int):
        self.n = n


def n_params(hidden: tuple) -> int:
    """Parameters of the CartPole Q-network with ``hidden`` layers."""
    sizes = [4, *hidden, 2]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def _compute(algo, nets, targets, params, batch, cfg) -> list[torch.Tensor]:
    losses, _ = algo.losses(nets, targets, batch, cfg, 1)
    return [x.detach() for x in torch.autograd.grad(losses["q"], params)]


def thread_ps_run(learners: int, hidden: tuple, iters: int, warmup: int) -> list[dict]:
    """The zero-network reference: the thread backend's ``ParameterServer`` (sync) and ``learners``
    learner threads in this process; per learner ``{"compute_s", "communicate_s", "apply_s"}`` (lists)."""
    import copy

    from pal_bench.train.param_server import ParameterServer
    from pal_bench.train.workers import load_snapshot

    torch.set_num_threads(1)
    cfg, algo, nets, targets, _, batch = _setup(hidden)
    ps = ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, learners)
    stop = threading.Event()
    server = threading.Thread(target=ps.serve, args=(stop,), daemon=True)
    server.start()
    out: list[dict] = [{} for _ in range(learners)]

    def learner(lid: int) -> None:
        my_nets, my_targets = copy.deepcopy(nets), copy.deepcopy(targets)
        params = list(my_nets["q"].parameters())
        times = {"compute_s": [], "communicate_s": [], "apply_s": []}
        version = ps.snapshot.version
        for it in range(warmup + iters):
            t0 = time.perf_counter()
            grads = _compute(algo, my_nets, my_targets, params, batch, cfg)
            t1 = time.perf_counter()
            ps.submit(lid, version, {"q": grads})
            ps.wait_version(version, stop)
            t2 = time.perf_counter()
            snap = ps.snapshot
            load_snapshot(my_nets, my_targets, snap)
            version = snap.version
            t3 = time.perf_counter()
            if it >= warmup:
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                    times[k].append(v)
        ps.learner_left()
        out[lid] = times

    threads = [threading.Thread(target=learner, args=(i,)) for i in range(learners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    server.join(5)
    return out


class AggLearner:
    """One learner process (a Ray actor): gradients of a DQN update, aggregated by one scheme."""

    def __init__(self, rank: int, world_size: int):
        import warnings

        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.rank, self.world_size, self.hierarchy = rank, world_size, None

    def address(self) -> str:
        """rank 0: a ``tcp://ip:port`` rendezvous for ``torch.distributed``."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def init_dist(self, init_method: str, group_size: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=init_method, rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=120))
        self.hierarchy = Hierarchy(self.world_size, group_size)

    def regroup(self, group_size: int) -> None:
        """New hierarchical groups (collective: every rank calls it)."""
        self.hierarchy = Hierarchy(self.world_size, group_size)

    def reduce(self, scheme: str, grads: list[np.ndarray]) -> list[np.ndarray]:
        """Average fixed gradients with ``allreduce`` or ``hierarchical`` (for the tests)."""
        t = [torch.as_tensor(g).clone() for g in grads]
        out = allreduce_mean(t, self.world_size) if scheme == "allreduce" else self.hierarchy.mean(t)
        return [x.numpy() for x in out]

    def run(self, scheme: str, hidden: tuple, iters: int, warmup: int, ps=None) -> dict:
        """``iters`` timed iterations (after ``warmup``): per-phase seconds as lists."""
        import ray
        import torch.distributed as dist

        from pal_bench.train.backends.ray.context import from_numpy, to_numpy
        from pal_bench.train.param_server import ParameterServer

        cfg, algo, nets, targets, params, batch = _setup(hidden, "async" if scheme == "ps-async" else "sync")
        local = ParameterServer(algo, nets, targets, cfg, 1) if ps is None else None
        times = {"compute_s": [], "communicate_s": [], "apply_s": []}
        version = 0
        if ps is None:
            dist.barrier()
        for it in range(warmup + iters):
            t0 = time.perf_counter()
            grads = _compute(algo, nets, targets, params, batch, cfg)
            t1 = time.perf_counter()
            if ps is not None:
                latest = ray.get(ps.submit.remote(self.rank, version, {"q": to_numpy(grads)}))
                t2 = time.perf_counter()
                if latest is not None:
                    state = ray.get(latest[1][0])
                    nets.load_state_dict(from_numpy(state["online"]))
                    targets.load_state_dict(from_numpy(state["target"]))
                    version = latest[0]
            else:
                avg = allreduce_mean(grads, self.world_size) if scheme == "allreduce" else self.hierarchy.mean(grads)
                t2 = time.perf_counter()
                local._step([{"q": avg}])
            t3 = time.perf_counter()
            if it >= warmup:
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                    times[k].append(v)
        if ps is not None:
            ray.get(ps.leave.remote(self.rank))
        return times

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- the study


def _row(scheme: str, learners: int, hidden: tuple, per_learner: list[dict]) -> dict:
    phases = {k: float(np.mean([np.mean(t[k]) for t in per_learner])) for k in per_learner[0]}
    iteration = sum(phases.values())
    iters = [sum(x) for t in per_learner for x in zip(*t.values())]
    return {"scheme": scheme, "learners": learners, "hidden": "x".join(map(str, hidden)), "params": n_params(hidden),
            "iteration_s": iteration, **phases, "iteration_p50_s": float(np.median(iters)),
            "aggregation_share": (phases["communicate_s"] + phases["apply_s"]) / iteration}


def study(learners: list[int], sizes, iters: int, warmup: int, group_size: int = 2,
          schemes=SCHEMES, progress=print) -> list[dict]:
    """Run every (learners, size, scheme) in the current Ray session; rows as ``_row``."""
    import ray

    from pal_bench.train.backends.ray.ps_actor import ParameterServerActor

    rows = []
    remote_learner = ray.remote(num_cpus=0)(AggLearner)
    ps_cls = ray.remote(num_cpus=0)(ParameterServerActor)
    ref_runner = ray.remote(num_cpus=0)(thread_ps_run)
    for L in learners:
        workers = [remote_learner.remote(r, L) for r in range(L)]
        addr = ray.get(workers[0].address.remote())
        ray.get([w.init_dist.remote(addr, group_size) for w in workers])
        for hidden in sizes:
            for scheme in schemes:
                t0 = time.perf_counter()
                if scheme == "threads-ps":
                    res = ray.get(ref_runner.remote(L, hidden, iters, warmup))
                elif scheme.startswith("ps-"):
                    cfg = _setup(hidden, scheme.removeprefix("ps-"))[0]
                    ps = ps_cls.remote(cfg, L)
                    res = ray.get([w.run.remote(scheme, hidden, iters, warmup, ps) for w in workers])
                    ray.kill(ps)
                else:
                    res = ray.get([w.run.remote(scheme, hidden, iters, warmup) for w in workers])
                rows.append(_row(scheme, L, hidden, res))
                r = rows[-1]
                progress(f"[aggregation] L={L} {r['hidden']:>9} ({r['params']:>9,d} params) {scheme:>12}: "
                         f"{r['iteration_s'] * 1e3:7.2f} ms/iteration, {r['aggregation_share']:5.1%} aggregating "
                         f"({time.perf_counter() - t0:.1f} s)")
        ray.get([w.close.remote() for w in workers])
        for w in workers:
            ray.kill(w)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench aggregation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1-2 learners, 2 model sizes (a few minutes on 2 cores)")
    ap.add_argument("--learners", type=workers, help="up to this many learners (default 2 quick, 4 full)")
    ap.add_argument("--iters", type=positive_int, help="timed iterations per point (default 15 quick, 50 full)")
    ap.add_argument("--warmup", type=nonneg_int, default=3)
    ap.add_argument("--group-size", type=positive_int, default=2, help="hierarchical: learners per group")
    ap.add_argument("--schemes", type=choice_list(SCHEMES), default=list(SCHEMES),
                    help=f"comma-separated, of {', '.join(SCHEMES)} (default: all)")
    ap.add_argument("--ray-address", help="join this Ray cluster (default: a local Ray of this machine's cores)")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="where the CSV and figure go (default: the project's results/)")
    add_force_flag(ap)
    args = ap.parse_args(argv)
    import pandas as pd

    top = args.learners or (2 if args.quick else 4)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    iters = args.iters or (15 if args.quick else 50)
    schemes = args.schemes
    if refuse_if_busy("pal-bench aggregation", args.force):
        return 2
    measured = Conditions("gradient aggregation")
    with session(args.ray_address, log_to_driver=False):
        rows = study(list(range(1, top + 1)), sizes, iters, args.warmup, args.group_size, schemes,
                     progress=lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(args.out)
    df = pd.DataFrame(rows)
    store(df, out / "aggregation.csv", measured, "%.6g")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for p in draw(df, out / "figures"):
        print(f"figure: {p}")
    print(f"csv: {out / 'aggregation.csv'}")
    return 0

