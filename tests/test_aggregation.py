"""Gradient aggregation schemes (``pal_bench.studies.aggregation``): the same inputs give the same averaged
gradients in every scheme (sync mode). Inputs are small integers, so every summation order is exact
and the comparisons are bit for bit."""

import copy

import numpy as np
import torch

from pal_bench.studies.aggregation import measure as agg
from pal_bench.train.param_server import ParameterServer


def fixed_grads(n_learners: int, hidden=(8, 8)) -> list[list[torch.Tensor]]:
    """Per learner, integer-valued gradients shaped like the CartPole Q-network with ``hidden``."""
    *_, params, _ = agg._setup(hidden)
    return [[torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) % 7 * (k + 1) - 3 * k for p in params]
            for k in range(n_learners)]


def captured_ps_average(grad_lists, hidden=(8, 8)) -> list[torch.Tensor]:
    """The gradient the thread backend's ``ParameterServer`` hands its optimizer for one sync round."""
    cfg, algo, nets, targets, _, _ = agg._setup(hidden)
    cfg.grad_clip = 0.0
    ps = ParameterServer(algo, nets, targets, cfg, len(grad_lists))
    seen = []
    ps.optimizers["q"].step = lambda: seen.extend(p.grad.clone() for p in ps.params["q"])
    ps._step([{"q": g} for g in grad_lists])
    return seen


def test_flatten_roundtrip_and_groups():
    g = fixed_grads(1)[0]
    back = agg.unflatten(agg.flatten(g), g)
    assert all(torch.equal(a, b) for a, b in zip(g, back))
    assert agg.make_groups(5, 2) == [[0, 1], [2, 3], [4]]
    assert agg.n_params((128, 128)) == sum(p.numel() for p in agg._setup((128, 128))[4])


def test_parameter_server_average_equals_the_mean():
    grads = fixed_grads(4)
    want = agg.mean_gradients(grads)
    got = captured_ps_average(grads)
    assert len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # the flat sum / world size the collectives compute is the same, bit for bit
    flat = torch.stack([agg.flatten(g) for g in grads]).sum(0) / 4
    assert all(torch.equal(a, b) for a, b in zip(agg.unflatten(flat, grads[0]), want))


def test_a_sole_sync_learner_applies_what_a_served_round_would():
    """``ParameterServer.apply`` (one learner, sync: the learner steps in its own thread) leaves the networks,
    targets and version bit for bit where ``submit`` + ``serve`` leave them, round after round."""
    import threading

    import pytest

    cfg, algo, nets, targets, _, _ = agg._setup((8, 8))
    cfg.target_update = 2                            # a target copy inside the rounds
    direct = ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, 1)
    served = ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, 1)
    assert direct.direct
    stop = threading.Event()
    server = threading.Thread(target=served.serve, args=(stop,))
    server.start()
    try:
        for r in range(3):
            grads = {"q": fixed_grads(1)[0] if r != 1 else [g * -0.5 for g in fixed_grads(1)[0]]}
            direct.apply({"q": [g.clone() for g in grads["q"]]})      # apply() may clip them in place
            served.submit(0, served.version, grads)
            served.wait_version(r, stop)
    finally:
        stop.set()
        server.join()
    assert direct.version == served.version == 3 and direct.handled == served.handled == [3]
    for mine, theirs in ((direct.nets, served.nets), (direct.targets, served.targets)):
        for (k, a), b in zip(mine.state_dict().items(), theirs.state_dict().values()):
            assert torch.equal(a, b), k
    assert direct.snapshot.version == 3
    assert all(torch.equal(a, b) for a, b in zip(direct.snapshot.online.values(), served.snapshot.online.values()))
    cfg.aggregation = "async"                        # a gradient that may be stale goes through serve()
    with pytest.raises(RuntimeError, match="sync"):
        ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, 1).apply(grads)
    cfg.aggregation = "sync"
    with pytest.raises(RuntimeError, match="sync"):
        ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, 2).apply(grads)


def test_thread_reference_runs():
    threads = torch.get_num_threads()
    try:
        out = agg.thread_ps_run(2, (16, 16), iters=3, warmup=1)
    finally:
        torch.set_num_threads(threads)      # thread_ps_run sets 1 for its process
    assert len(out) == 2 and all(len(t["compute_s"]) == 3 for t in out)
    assert all(x > 0 for t in out for x in t["communicate_s"])


def test_gloo_allreduce_and_hierarchical_match_the_mean(ray_session):
    """Two learner processes: all-reduce, hierarchical with one group of two (reduce, broadcast) and
    with two groups of one (all-reduce among leaders) all give the parameter server's average."""
    ray = ray_session
    grads = fixed_grads(2)
    want = [w.numpy() for w in captured_ps_average(grads)]
    workers = [ray.remote(num_cpus=0)(agg.AggLearner).remote(r, 2) for r in range(2)]
    try:
        addr = ray.get(workers[0].address.remote())
        ray.get([w.init_dist.remote(addr, 2) for w in workers])
        results = {}
        for scheme in ("allreduce", "hierarchical"):
            results[scheme] = ray.get([w.reduce.remote(scheme, [g.numpy() for g in grads[r]])
                                       for r, w in enumerate(workers)])
        ray.get([w.regroup.remote(1) for w in workers])
        results["hierarchical-1"] = ray.get([w.reduce.remote("hierarchical", [g.numpy() for g in grads[r]])
                                             for r, w in enumerate(workers)])
        for scheme, per_rank in results.items():
            for got in per_rank:
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b, err_msg=scheme)
        # and the Ray parameter-server actor (sync) steps with that same average
        from pal_bench.train.backends.ray.context import to_numpy
        from pal_bench.train.backends.ray.ps_actor import ParameterServerActor
        from pal_bench.train.core import RunCore

        cfg = agg._setup((8, 8))[0]
        ps = ray.remote(num_cpus=0)(ParameterServerActor).remote(cfg, 2)
        latest = ray.get([ps.submit.remote(r, 0, {"q": to_numpy(grads[r])}) for r in range(2)])
        state = ray.get(latest[0][1][0])
        torch.manual_seed(cfg.seed)
        nets = RunCore(cfg).networks()
        local = ParameterServer(agg._setup((8, 8))[1], nets, copy.deepcopy(nets), cfg, 1)
        local._step([{"q": [torch.as_tensor(w) for w in want]}])
        for k, v in local.nets.state_dict().items():
            np.testing.assert_array_equal(state["online"][k], v.numpy(), err_msg=k)
        ray.kill(ps)
    finally:
        ray.get([w.close.remote() for w in workers])
        for w in workers:
            ray.kill(w)


def test_the_servers_clip_gives_torchs_bits():
    """``clip_grad_norm`` scales like ``torch.nn.utils.clip_grad_norm_``, bit for bit, above and below the limit."""
    from pal_bench.train.param_server import clip_grad_norm

    gen = torch.Generator().manual_seed(0)
    for scale in (0.01, 1.0, 100.0):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in ((8, 4), (8,), (2, 8), (2,))]
        grads = [torch.randn(p.shape, generator=gen) * scale for p in params]
        mine = [torch.nn.Parameter(torch.zeros(p.shape)) for p in params]
        for p, q, g in zip(params, mine, grads):
            p.grad, q.grad = g.clone(), g.clone()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        clip_grad_norm(mine, 1.0)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, mine)), scale


def test_snapshots_share_the_targets_until_a_target_copy():
    """DQN copies its targets every ``target_update`` steps: the snapshots in between keep the previous target
    tensors (nothing cloned), a copy gives fresh ones equal to the online weights; they are never written."""
    cfg, algo, nets, targets, _, _ = agg._setup((8, 8))
    cfg.target_update = 3
    ps = ParameterServer(algo, copy.deepcopy(nets), copy.deepcopy(targets), cfg, 1)
    snaps = [ps.snapshot]
    for _ in range(4):
        ps.apply({"q": [g.clone() for g in fixed_grads(1)[0]]})
        snaps.append(ps.snapshot)
    first = {k: v.clone() for k, v in snaps[0].target.items()}
    assert snaps[1].target is snaps[0].target and snaps[2].target is snaps[0].target     # versions 1, 2
    assert snaps[3].target is not snaps[2].target                                         # version 3 copies
    assert all(torch.equal(snaps[3].target[k], snaps[3].online[k]) for k in snaps[3].online)
    assert snaps[4].target is snaps[3].target
    assert all(torch.equal(first[k], snaps[0].target[k]) for k in first)                  # never written
    assert not torch.equal(snaps[3].target[next(iter(first))], first[next(iter(first))])
