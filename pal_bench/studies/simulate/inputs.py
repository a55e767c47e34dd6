"""The model's inputs, measured on this machine: each a short run of the real trainer or a probe of one cost.

- **Per-phase service times** at one worker: the trainer's own per-phase profile (``phase_seconds``) of an
  actors-only run with one actor (thread and process backends: inference, env step, buffer insert, per env step;
  the insert at one row and at 64 rows per ``add_batch``, which splits it into a part per call and one per row)
  and of a learners-only run with one learner on a filled buffer (sample, forward/backward, priority update,
  apply, per update); the same with one learner process (what a process adds: its weights pull and gradient
  publish, the crossings to its proxy thread and back, the proxy's gradient read);
- **the buffer's lock**: how long an insert (per row), a sample and a priority update hold it (the buffer's own
  ``lock_stats``, hold time sampled in the Cython core);
- **weights**: one version published into a ``SharedWeights`` block and read out of it into an actor's networks,
  its size, and the memory bandwidth: one core alone, and every core copying at once (a STREAM-like copy of 64 MB
  arrays, one process per core);
- **the GIL**: each phase a thread runs, in a loop on one thread and on two at once: the two-thread speedup
  gives the phase's GIL share (two threads serialise on it) or, below 1, what each GIL handoff costs;
- **Ray**, where it is installed: one remote call's round trip (a no-op actor method, ``ray.get``) and the
  machine's CPU per call; a Ray learner's wall and machine CPU per update beyond its own compute.

``measure(rounds)`` returns one dict of inputs per round; the rounds are the samples the predictions resample.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import statistics
import tempfile
import threading
import time

import numpy as np

COPY_MB = 64                 # bytes per STREAM-like copy (MB): well past the caches
PROBE_S = 1.0                # seconds per GIL probe side
BATCHED = 64                 # rows per add_batch of the actor's second run (the insert's per-call part)


def _per(phases: dict, n: int, *names: str) -> float:
    return sum(phases.get(k, 0.0) for k in names) / max(1, n) * 1e6


def actor_phases(cfg, backend: str, steps: int) -> dict:
    """µs per env step of one actor's phases (an actors-only run: ``learning_starts`` = ``steps``, so the rate rule
    never holds it back and the weights never change); the insert twice, at one row per ``add_batch`` and at
    ``BATCHED`` rows, which splits it into a part per call and a part per row."""
    one = _actor_run(cfg, backend, steps, 1)
    batched = _actor_run(cfg, backend, steps, BATCHED)
    # insert(1) = call + row, insert(B) = call / B + row
    call = (one["insert_us"] - batched["insert_us"]) * BATCHED / (BATCHED - 1)
    return one | {"insert_call_us": max(0.0, min(call, one["insert_us"]))}


def _actor_run(cfg, backend: str, steps: int, local_buffer: int) -> dict:
    from pal_bench.studies.scaling.measure import quiet
    from pal_bench.train import make_trainer

    with tempfile.TemporaryDirectory(prefix="pal-sim-") as out:
        c = quiet(cfg, out, backend=backend, actors=1, learners=1, steps=steps, learning_starts=steps,
                  buffer_capacity=max(cfg.buffer_capacity, steps), local_buffer=local_buffer)
        with make_trainer(c) as tr:
            s = tr.run()
    p = s["phase_seconds"]["actor0"]
    return {"act_us": _per(p, steps, "inference"), "env_us": _per(p, steps, "env_step"),
            # the insert and the step's bookkeeping: reserving steps and counting them in (timed as rate_wait,
            # never a wait here: no learner), the weights check
            "insert_us": _per(p, steps, "buffer_insert", "transport", "serialize", "rate_wait", "weights_pull"),
            "f_a_1": steps / s["wall_s"]}


def _learner_run(cfg, updates: int, filled: int, **kw) -> tuple[dict, dict]:
    """One learner (``kw``: its backend) on a buffer filled with ``filled`` real transitions
    (``Trainer.run_learners``): the run's result and learner0's phases (seconds)."""
    from pal_bench.studies.scaling.measure import quiet, transitions
    from pal_bench.train import make_trainer

    with tempfile.TemporaryDirectory(prefix="pal-sim-") as out:
        c = quiet(cfg, out, actors=1, learners=1, buffer_capacity=max(cfg.buffer_capacity, filled), **kw)
        with make_trainer(c) as tr:
            got = tr.run_learners(transitions(tr, filled), updates)
            return got, tr.summary()["phase_seconds"]["learner0"]


def learner_phases(cfg, updates: int, filled: int = 20_000) -> dict:
    """µs per update of one learner thread's phases on a filled buffer (``Trainer.run_learners``)."""
    got, p = _learner_run(cfg, updates, filled, backend="threads")
    n = got["updates"]
    # forward/backward with the update's bookkeeping: taking the update from the rate rule (never a wait here)
    # and pulling the latest weights into the learner's networks, once per update as well
    return {"sample_us": _per(p, n, "sample"), "grad_us": _per(p, n, "forward_backward", "weights_pull", "rate_wait"),
            "prio_us": _per(p, n, "priority_update"),
            "apply_us": _per(p, n, "apply", "aggregation_wait"), "f_l_1": n / got["wall_s"]}


def learner_process_costs(cfg, updates: int, apply_us: float, filled: int = 20_000) -> dict:
    """µs per update of what learners as processes (``learner_processes``) add, from one learner process on a
    filled buffer (``Trainer.run_learners``, its own phases and its proxy thread's): ``lp.process_us``, the process's
    weights pull and gradient publish; ``lp.handoff_us``, one crossing between process and proxy (the proxy's wait
    for the process less the process's work, halved); ``lp.driver_us``, the proxy's gradient read (its apply less
    the optimizer step ``apply_us`` measured on a learner thread); ``lp.f_l_1``, its updates/s."""
    got, p = _learner_run(cfg, updates, filled, backend="processes", learner_processes=True)
    n = got["updates"]
    process = _per(p, n, "weights_pull", "gradient_publish")
    work = process + _per(p, n, "sample", "forward_backward", "priority_update")
    return {"lp.process_us": process, "lp.handoff_us": max(0.0, (_per(p, n, "learner_process") - work) / 2),
            "lp.driver_us": max(0.0, _per(p, n, "apply") - apply_us), "lp.f_l_1": n / got["wall_s"]}


def lock_holds(cfg, batch: int, n: int = 2_000) -> dict:
    """µs the buffer's lock is held per inserted row and per ``add_batch`` call beyond its rows (from one row
    and 256 rows a call), per sample of ``batch`` and per priority update of it."""
    from pal_bench import PrioritizedReplayBuffer

    rng = np.random.default_rng(0)
    buf = PrioritizedReplayBuffer(100_000, {"obs": ((4,), np.float32), "act": ((), np.int64)}, alpha=0.6)
    rows = {"obs": rng.random((256, 4), dtype=np.float32), "act": rng.integers(0, 2, 256)}

    def hold(fn, calls: int) -> float:
        h0 = buf.lock_stats()["hold_s"]
        for _ in range(calls):
            fn()
        return (buf.lock_stats()["hold_s"] - h0) / calls * 1e6

    one = {k: v[:1] for k, v in rows.items()}
    for _ in range(200):
        buf.add_batch(**rows)
    chunk = hold(lambda: buf.add_batch(**rows), n // 4)
    single = hold(lambda: buf.add_batch(**one), n)
    per_row = max(0.0, (chunk - single) / 255)
    got = buf.sample(batch)
    sample = hold(lambda: buf.sample(batch), n)
    prio = rng.random(batch) + 0.1
    update = hold(lambda: buf.update_priorities(got["indices"], prio), n)
    return {"insert_lock_us": per_row, "insert_lock_call_us": max(0.0, single - per_row),
            "sample_lock_us": sample, "prio_lock_us": update}


def weight_copies(cfg, n: int = 300) -> dict:
    """µs to publish one version of the run's networks (online and target) into a ``SharedWeights`` block, and to
    read one into an actor's networks; the bytes of one version."""
    import torch

    from pal_bench.train.core import RunCore
    from pal_bench.train.shared_weights import SharedWeights, spec_of

    core = RunCore(cfg)
    state = {f"{part}.{k}": v.detach().clone() for part in ("online", "target")
             for k, v in core.networks().state_dict().items()}
    block = SharedWeights.create(spec_of(state))
    try:
        into = {k: torch.empty_like(v) for k, v in state.items()}
        t0 = time.perf_counter()
        for _ in range(n):
            block.publish(state)
        publish = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(n):
            block.read(into)
        pull = (time.perf_counter() - t0) / n * 1e6
    finally:
        block.close()
    return {"publish_us": publish, "pull_us": pull, "weight_bytes": sum(v.numel() * v.element_size()
                                                                         for v in state.values())}


def ps_grad_us(cfg, n: int = 500) -> float:
    """µs the parameter server spends per gradient it averages: one gradient set of the run's network added into
    an accumulator (what a sync round does once per learner)."""
    import torch

    from pal_bench.train.core import RunCore

    params = [p.detach() for p in RunCore(cfg).networks().parameters()]
    acc, grad = [torch.zeros_like(p) for p in params], [torch.ones_like(p) for p in params]
    t0 = time.perf_counter()
    for _ in range(n):
        for a, g in zip(acc, grad):
            a.add_(g)
    return (time.perf_counter() - t0) / n * 1e6


def _on_every_core(target, cores: int, seconds: float, settle_s: float) -> list[float]:
    """``target(seconds, out, start)`` in one spawned process per core, all released at once after ``settle_s``:
    the rate each one puts on ``out``. The processes are killed if one of them does not answer."""
    ctx = mp.get_context("spawn")
    q, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(seconds, q, start)) for _ in range(cores)]
    try:
        for p in procs:
            p.start()
        time.sleep(settle_s)
        start.set()
        return [q.get(timeout=180 + seconds) for _ in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def _actor_work_rate(seconds: float, out=None, start=None) -> float:
    """Calls/s of an actor's own work (a small MLP's forward and a CartPole step) in this process, one torch
    thread."""
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 2))
    env, obs = gym.make("CartPole-v1"), torch.zeros(1, 4)
    env.reset(seed=0)
    if start is not None:
        start.wait(120)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with torch.no_grad():
            net(obs)
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
        n += 1
    rate = n / (time.perf_counter() - t0)
    if out is not None:
        out.put(rate)
    return rate


def corun_slowdown(cores: int, seconds: float = 2.0) -> float:
    """How much slower one process's CPU-bound work runs with every core busy (one such process per core) than
    alone: 1 - (each one's rate beside the others) / (its rate alone). Caches, memory, the clock and the host
    shared by the cores, measured with an actor's own work."""
    alone = _actor_work_rate(seconds)
    rates = _on_every_core(_actor_work_rate, cores, seconds, settle_s=3.0)     # spawned, torch imported
    return max(0.0, 1 - statistics.mean(rates) / alone)


def _copy_rate(seconds: float, out=None, start=None) -> float:
    a = np.ones(COPY_MB * 2**20 // 8)
    b = np.empty_like(a)
    if start is not None:
        start.wait(60)                    # every copier starts at once
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        np.copyto(b, a)
        n += 1
    rate = n * a.nbytes / (time.perf_counter() - t0)
    if out is not None:
        out.put(rate)
    return rate


def memory_bandwidth(cores: int, seconds: float = 1.0) -> dict:
    """Bytes/s one core copies, and all ``cores`` copying at once (one process each)."""
    one = _copy_rate(seconds)
    rates = _on_every_core(_copy_rate, cores, seconds, settle_s=2.0)          # spawned, arrays allocated
    return {"mem_bw_core": one, "mem_bw_total": sum(rates)}


def _count_while(stop: threading.Event) -> int:
    n = 0
    while not stop.is_set():
        n += 1
    return n


def two_thread_speedup(make, seconds: float | None = None) -> tuple[float, float]:
    """A call (``make()`` builds one with its own objects: each thread gets its own) in a loop on one thread, then
    on two threads at once: (the two threads' calls/s over one thread's, µs per call on one thread). 2: the GIL
    never in the way; 1: fully serialised; below 1: the handoffs cost."""
    seconds = PROBE_S if seconds is None else seconds

    def rate(threads: int) -> float:
        stop, counts = threading.Event(), [0] * threads
        fns = [make() for _ in range(threads)]

        def loop(k: int) -> None:
            fn = fns[k]
            while not stop.is_set():
                fn()
                counts[k] += 1

        ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        return sum(counts) / (time.perf_counter() - t0)

    one = rate(1)
    return rate(2) / one, 1e6 / one


def gil_from_speedup(s2: float, us: float, segments: int) -> tuple[float, float]:
    """The model's GIL share and handoff cost (µs) of a phase whose two-thread speedup is ``s2`` and one call
    ``us``: with g >= 1/2 two threads serialise on the GIL (speedup 1/g); a speedup below 1 means g = 1 and each
    of the call's ``segments`` GIL acquisitions costs the handoff h that makes T / (T + segments h) = s2."""
    if s2 >= 1:
        return min(1.0, 1 / min(s2, 2.0)) if s2 < 2 else 0.0, 0.0
    return 1.0, us * (1 / s2 - 1) / max(1, segments)


def gil_shares(cfg) -> dict:
    """Per phase a thread runs, each the trainer's own code on the run's own objects (one of each per thread):
    inference (``algo.act`` on one observation), the environment's step (a one-environment vector env, as an
    actor steps it), an insert (one row stacked into columns and ``add_batch``-ed into the shared buffer), a sample
    of one batch, the losses and their gradients on one batch (``algo.losses``, ``gradients``) and one optimizer
    step (``ParameterServer.apply``) and a load of the parameter server's snapshot into a worker's networks
    (``load_snapshot``: a thread actor's or a non-sole learner's weights pull, whose µs alone is stored as
    ``snapshot_load_us``): its GIL share ``gil.<phase>`` and handoff cost ``gil_handoff.<phase>`` from its
    two-thread speedup (``gil_from_speedup``, with the model's GIL pieces per phase), and the speedup itself
    (``speedup2.<phase>``)."""
    import torch

    from pal_bench.studies.scaling.measure import transitions
    from pal_bench.studies.simulate.model import Inputs
    from pal_bench.train.core import RunCore
    from pal_bench.train.losses import gradients, param_groups
    from pal_bench.train.param_server import ParameterServer, Snapshot
    from pal_bench.train.replay_spec import make_buffer
    from pal_bench.train.workers import load_snapshot

    core = RunCore(cfg)
    buf = make_buffer(dataclasses.replace(cfg, buffer_capacity=100_000), core.fields())   # thread-safe: shared
    rows = transitions(core, 5_000)
    buf.add_batch(**rows)
    sample = buf.sample(cfg.batch_size)
    envs = []

    def infer():
        nets, rng, obs = core.networks(), np.random.default_rng(0), np.zeros((1, core.obs_dim), np.float32)
        return lambda: core.algo.act(nets, obs, 0.05, rng)

    def step():
        env = core.make_vector_env(len(envs))
        env.reset(seed=len(envs))
        envs.append(env)
        return lambda: env.step(core.env_actions(np.array([env.single_action_space.sample()])))

    def insert():
        row = [v[:1] for v in rows.values()]

        def call():
            buf.add_batch(**{k: np.stack(list(v)) for k, v in zip(rows, row)})
        return call

    def load():
        nets, targets, src = core.networks(), core.networks(), core.networks()
        snap = Snapshot(1, {k: v.detach().clone() for k, v in src.state_dict().items()},
                        {k: v.detach().clone() for k, v in src.state_dict().items()})
        return lambda: load_snapshot(nets, targets, snap)

    def losses_of(nets, targets):
        groups = param_groups(core.algo, nets)
        return lambda: gradients(core.algo.losses(nets, targets, core.to_tensors(sample), cfg, 1)[0], groups)

    def grad():
        return losses_of(core.networks(), core.networks())

    def apply():
        nets, targets = core.networks(), core.networks()
        ps = ParameterServer(core.algo, nets, targets, dataclasses.replace(cfg, aggregation="sync"), 1)
        grads = losses_of(nets, targets)()
        return lambda: ps.apply(grads)

    torch.set_num_threads(1)
    segments = Inputs.__dataclass_fields__["gil_segments"].default_factory()
    out = {}
    try:
        for phase, make in (("act", infer), ("env", step), ("insert", insert),
                            ("sample", lambda: lambda: buf.sample(cfg.batch_size)), ("grad", grad),
                            ("apply", apply), ("load", load)):
            s2, us = two_thread_speedup(make)
            g, h = gil_from_speedup(s2, us, segments.get(phase, 1))
            out |= {f"gil.{phase}": g, f"gil_handoff.{phase}": h, f"speedup2.{phase}": s2}
        out["snapshot_load_us"] = us
    finally:
        for env in envs:
            env.close()
    return out


OWN_PHASES = ("sample", "forward_backward", "priority_update")   # a learner's own work in an update


def learner_costs(got: dict, learners: int) -> dict:
    """From ``run_learners``' result (``updates``, ``wall_s``, ``machine_cpu_s``, ``phase_seconds``) with
    ``learners`` learners: ``updates_per_s``, ``machine_cores`` (busy cores over the run), ``cpu_us`` (machine CPU
    per update), ``own_us`` (the learners' sample, forward/backward and priority update per update), ``remote_us``
    (a learner's wall per update beyond its own work) and ``remote_cpu_us`` (the machine CPU per update beyond it);
    µs throughout. ``ValueError`` on a run with no update or no CPU reading."""
    n, wall, cpu = got["updates"], got["wall_s"], got.get("machine_cpu_s")
    if not n or wall <= 0:
        raise ValueError(f"the run made {n} updates in {wall:.3g} s: nothing to divide")
    if cpu is None:
        raise ValueError("the run has no machine CPU reading (/proc/stat not readable)")
    phases = got["phase_seconds"]
    own = sum(_per(phases.get(f"learner{j}", {}), n, *OWN_PHASES) for j in range(learners))
    return {"updates_per_s": n / wall, "machine_cores": cpu / wall, "cpu_us": cpu / n * 1e6, "own_us": own,
            "remote_us": max(0.0, wall * learners / n * 1e6 - own), "remote_cpu_us": max(0.0, cpu / n * 1e6 - own)}


def ray_costs(cfg, updates: int = 600, filled: int = 20_000, calls: int = 300) -> dict:
    """Ray's costs beyond the workers' own work, where Ray is installed (else {}), in one local Ray session:

    - ``ray_call_us``: one remote call's round trip (a no-op actor method, ``ray.get``; median of ``calls``) and
      ``ray_call_cpu_us``: the machine's busy CPU per such call (every process: caller, callee, Ray's own);
    - a Ray learner's update beyond its own compute (``run_learners`` of one learner on a filled buffer: the buffer
      and parameter-server actors, no actors): ``ray.learner_remote_us``, its wall per update less its own sample,
      forward/backward and priority update, and ``ray.learner_remote_cpu_us``, the machine's busy CPU per update
      less the same; ``ray.f_l_1`` its updates/s."""
    try:
        import ray
    except ImportError:
        return {}
    from pal_bench.conditions import machine_busy_seconds
    from pal_bench.studies.scaling.measure import quiet, ray_session, transitions
    from pal_bench.train import make_trainer

    class Echo:
        def noop(self):
            return None

    with tempfile.TemporaryDirectory(prefix="pal-sim-") as d:
        c = quiet(cfg, d, backend="ray", ray_placement="pack", actors=1, learners=1, aggregation="sync",
                  buffer_capacity=max(cfg.buffer_capacity, filled))
        with ray_session(c):
            a = ray.remote(Echo).remote()
            ray.get(a.noop.remote())
            times = []
            busy0 = machine_busy_seconds()
            for _ in range(calls):
                t1 = time.perf_counter()
                ray.get(a.noop.remote())
                times.append(time.perf_counter() - t1)
            busy = (machine_busy_seconds() or 0.0) - (busy0 or 0.0)
            ray.kill(a)
            out = {"ray_call_us": statistics.median(times) * 1e6, "ray_call_cpu_us": busy / calls * 1e6}
            with make_trainer(c) as tr:
                got = tr.run_learners(transitions(tr, filled), updates)
    one = learner_costs(got, 1)
    return out | {"ray.learner_remote_us": one["remote_us"], "ray.learner_remote_cpu_us": one["remote_cpu_us"],
                  "ray.f_l_1": one["updates_per_s"]}


def measure(cfg, rounds: int = 3, steps: int = 5_000, updates: int = 500, progress=print,
            ray: bool = True) -> list[dict]:
    """Every input, ``rounds`` times (each round one sample of each): a list of flat dicts. Thread and process
    actors' phases are stored as ``threads.act_us`` ... and ``processes.act_us`` ... (``ray`` False: Ray's costs
    left out, for a check of the other backends)."""
    import torch

    from pal_bench.conditions import usable_cores

    torch.set_num_threads(1)              # as every worker of the trainer runs: one torch thread
    cores = usable_cores()
    out = []
    for r in range(rounds):
        row: dict = {"round": r, "cores": cores}
        progress(f"[inputs {r + 1}/{rounds}] actor phases (threads, processes) ...")
        for backend in ("threads", "processes"):
            row |= {f"{backend}.{k}": v for k, v in actor_phases(cfg, backend, steps).items()}
        progress(f"[inputs {r + 1}/{rounds}] learner phases ...")
        row |= learner_phases(cfg, updates)
        row |= learner_process_costs(cfg, updates, row["apply_us"])
        progress(f"[inputs {r + 1}/{rounds}] lock holds, memory bandwidth, GIL, Ray call ...")
        row |= lock_holds(cfg, cfg.batch_size)
        row |= weight_copies(cfg)
        row["ps_grad_us"] = ps_grad_us(cfg)
        row |= memory_bandwidth(cores)
        row["corun_slowdown"] = corun_slowdown(cores)
        row |= gil_shares(cfg)
        if ray:
            row |= ray_costs(cfg, updates)
        out.append(row)
    return out
