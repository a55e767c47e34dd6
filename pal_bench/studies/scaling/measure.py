"""Measuring f_a and f_l (``sweep``, ``sweep_backends``) and the whole trainer per split (``end_to_end``);
``python -m pal_bench.studies.scaling`` (``main``). The study's overview: ``pal_bench.studies.scaling``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import WORKERS, duration, int_ranges, nonneg_int, positive_int, workers
from pal_bench.conditions import Conditions, add_force_flag, outlier_repeats, refuse_if_busy, usable_cores
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import SCALING_BACKENDS, read_csv
from pal_bench.studies.scaling import worker_costs
from pal_bench.studies.scaling.figures import backends_figure, draw, draw_end_to_end, overhead_table
from pal_bench.train import Trainer, make_config, make_trainer
from pal_bench.train.config import ALGOS
from pal_bench.train.envs import make_env


def quiet(cfg, out_dir: str, **kw):
    """``cfg`` for a measurement run: no progress, evaluation or checkpoints, writing into ``out_dir``."""
    return dataclasses.replace(cfg, progress=False, eval_episodes=0, eval_interval=0, checkpoint_interval=0,
                               deterministic=False, out_dir=out_dir, **kw)


# CPU cores the process kept busy during the last measurement (process CPU time / wall time):
# about 1.0 with several threads means they were serialised (the GIL), not spread over cores
last_cores_used: dict[str, float] = {}


def measure_fa(cfg, actors: int, steps: int) -> float:
    """Transitions/s collected by ``actors`` actor threads, or actor processes for ``cfg.backend`` "processes"
    and "ray" (no learning)."""
    with tempfile.TemporaryDirectory(prefix="pal-scaling-") as out:
        cfg = quiet(cfg, out, actors=actors, learners=1, steps=steps, learning_starts=steps,
                     buffer_capacity=max(cfg.buffer_capacity, steps), batch_size=min(cfg.batch_size, steps))
        with make_trainer(cfg) as tr:
            cpu0 = time.process_time()
            s = tr.run()
            # Ray and actor processes: the work is in other processes, not in the driver's CPU time
            last_cores_used["f_a"] = (None if cfg.backend != "threads"
                                      else (time.process_time() - cpu0) / max(1e-9, tr.wall()))
    return s["env_steps"] / s["wall_s"]


def transitions(tr, n: int, seed: int = 0) -> dict:
    """``n`` real transitions from random actions, as replay-buffer columns; ``tr`` is a ``Trainer``
    or a worker's ``RunCore`` (anything with ``cfg``, ``algo``, ``act_dim``, ``action_space`` and
    ``env_actions``)."""
    env = make_env(tr.cfg.env, **tr.cfg.env_kwargs)
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("obs", "act", "rew", "next_obs", "done", "disc")}
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        if tr.algo.CONTINUOUS:
            a = rng.uniform(-1, 1, tr.act_dim).astype(np.float32)
        else:
            a = int(rng.integers(tr.action_space.n))
        nxt, r, term, trunc, _ = env.step(tr.env_actions(a))
        for k, v in zip(rows, (obs, a, r, nxt, float(term), tr.cfg.gamma)):
            rows[k].append(v)
        obs = env.reset()[0] if term or trunc else nxt
    env.close()
    return {k: np.asarray(v) for k, v in rows.items()}


def label(cfg) -> str:
    """The name a configuration's curves go by: its backend, "learner-processes" for the process backend with
    learners as processes (``learner_processes``; "learner-allreduce" when they average among themselves), or
    "ray-node" for Ray's one-node placement (``ray_placement = "node"``: the process backend's pieces, its actor
    processes started by Ray)."""
    if cfg.backend == "processes" and cfg.learner_processes:
        return "learner-allreduce" if cfg.aggregation == "allreduce" else "learner-processes"
    if cfg.backend == "ray" and cfg.placement == "node":
        return "ray-node"
    return cfg.backend


def config_for(backend: str, algo: str = "dqn", env: str = "CartPole-v1", **kw):
    """The configuration a curve label (``label``) measures: "learner-processes" and "learner-allreduce" are the
    process backend with learner processes, "ray-node" the Ray backend's one-node placement."""
    return make_config(algo, env, backend={"learner-processes": "processes", "learner-allreduce": "processes",
                                           "ray-node": "ray"}.get(backend, backend),
                       learner_processes=backend in ("learner-processes", "learner-allreduce"),
                       aggregation="allreduce" if backend == "learner-allreduce" else "sync",
                       ray_placement="node" if backend == "ray-node" else "pack", **kw)


def measure_fl(cfg, learners: int, updates: int, filled: int = 20_000) -> float:
    """Learner updates/s with ``learners`` learner threads (Ray: learner processes, ``cfg.backend``
    "ray"; the process backend with ``learner_processes``: learner processes on the shared buffer) on a
    pre-filled buffer (no actors). The process backend's default learners are threads of the driver,
    placed exactly as the thread backend's, so "processes" measures them the same way."""
    with tempfile.TemporaryDirectory(prefix="pal-scaling-") as out:
        c = quiet(cfg, out, actors=1, learners=learners, buffer_capacity=max(cfg.buffer_capacity, filled))
        if label(cfg) == "ray":
            return _measure_fl_ray(c, updates, filled)
        if label(cfg) == "ray-node":        # the driver's learner threads on the shared segment, Ray connected
            with ray_session(c):
                return _measure_fl(c, updates, filled, processes=True)
        return _measure_fl(c, updates, filled, processes=label(cfg) in ("learner-processes", "learner-allreduce"))


def _measure_fl(cfg, updates: int, filled: int, processes: bool = False) -> float:
    """Updates/s of ``cfg.learners`` learners on a buffer pre-filled with ``filled`` real transitions (no actors):
    the thread trainer's learner threads, or (``processes``) the process trainer's learner processes
    (``Trainer.run_learners``)."""
    with make_trainer(cfg) if processes else Trainer(cfg) as tr:
        got = tr.run_learners(transitions(tr, filled), updates)
    # learner processes: the work is in other processes, not in this one's CPU time
    last_cores_used["f_l"] = None if processes else got["cpu_s"] / got["wall_s"]
    return got["updates"] / got["wall_s"]


def _measure_fl_ray(cfg, updates: int, filled: int) -> float:
    """``_measure_fl`` on the Ray backend: its buffer actor pre-filled with ``filled`` real transitions, its
    parameter-server actor and ``cfg.learners`` learner processes (``RayTrainer.run_learners``; ``cfg.aggregation``
    sync, async or allreduce)."""
    with ray_session(cfg), make_trainer(cfg) as tr:
        got = tr.run_learners(transitions(tr, filled), updates)
    last_cores_used["f_l"] = None
    return got["updates"] / got["wall_s"]


@contextlib.contextmanager
def ray_session(cfg):
    """For ``cfg.backend`` "ray": connect to Ray (``cfg.ray_address``, else a local Ray with the usable
    cores) unless already connected, and disconnect at the end only if connected here. Every
    measurement in the block shares the session (starting Ray takes seconds)."""
    if cfg.backend != "ray":
        yield
        return
    from pal_bench.train.backends.ray.session import session

    with session(cfg.ray_address):
        yield


def measure_splits(cfg, splits: list[tuple[int, int]], steps: int, progress=print,
                   repeats: int = 1) -> pd.DataFrame:
    """Run the trainer (``cfg.backend``) at each (actors, learners) split for ``steps`` transitions (after
    ``learning_starts``) and measure its end-to-end throughput (transitions/s, updates/s): ``repeats``
    rounds, each running every split once, so that the splits share the machine's drift; per split the
    median over rounds, and every round's transitions/s in ``measured_transitions_per_s_reps``."""
    import dataclasses
    import statistics
    import tempfile

    from pal_bench.train import make_trainer

    got: dict[tuple[int, int], list[dict]] = {split: [] for split in splits}
    for r in range(repeats):
        for i, (xa, xl) in enumerate(splits, 1):
            where = f"[validate {i}/{len(splits)}" + (f" round {r + 1}/{repeats}]" if repeats > 1 else "]")
            progress(f"{where} {xa} actor(s) + {xl} learner(s) ...")
            with tempfile.TemporaryDirectory(prefix="pal-dse-") as out:
                c = dataclasses.replace(cfg, actors=xa, learners=xl, steps=cfg.learning_starts + steps,
                                        progress=False, eval_episodes=0, eval_interval=0, deterministic=False,
                                        out_dir=out)
                with make_trainer(c) as tr:
                    s = tr.run()
            got[(xa, xl)].append(s)
            progress(f"{where} {s['env_steps_per_s']:.0f} transitions/s, {s['updates_per_s']:.0f} updates/s")
    rows = []
    for (xa, xl), runs in got.items():
        rows.append({"actors": xa, "learners": xl,
                     "measured_transitions_per_s": statistics.median(s["env_steps_per_s"] for s in runs),
                     "measured_updates_per_s": statistics.median(s["updates_per_s"] for s in runs),
                     "wall_s": statistics.median(s["wall_s"] for s in runs),
                     "measured_transitions_per_s_reps": " ".join(f"{s['env_steps_per_s']:.1f}" for s in runs)})
    return pd.DataFrame(rows)


def end_to_end(cfg, max_threads: int, steps: int, progress=print) -> pd.DataFrame:
    """Env steps/s and updates/s of the whole trainer for every (actors, learners) split with
    actors + learners <= max_threads, sync and async aggregation (Ray backend: and allreduce), env
    backend sync and async (the process backend: sync only)."""
    cores = usable_cores()
    splits = [(a, b) for a in range(1, max_threads) for b in range(1, max_threads) if a + b <= max_threads]
    aggregations = {"ray": ("sync", "async", "allreduce"), "learner-allreduce": ("allreduce",)}.get(label(cfg),
                                                                                                  ("sync", "async"))
    frames = []
    with ray_session(cfg):
        for aggregation in aggregations:
            # actor processes step their environments in-process (they cannot start env subprocesses)
            in_process = label(cfg) in ("processes", "learner-processes", "learner-allreduce", "ray-node")
            for backend in ("sync",) if in_process else ("sync", "async"):
                c = dataclasses.replace(cfg, aggregation=aggregation, env_backend=backend)
                df = measure_splits(c, splits, steps,
                              progress=lambda m, a=aggregation, b=backend: progress(f"{a}/{b} {m}"))
                frames.append(df.assign(aggregation=aggregation, env_backend=backend))
    out = pd.concat(frames, ignore_index=True)
    out["threads"] = out.actors + out.learners
    out["oversubscribed"] = out.threads > cores
    out["backend"] = label(cfg)
    return out


def end_to_end_backends(cfgs: list, max_threads: int, steps: int, progress=print,
                        repeats: int = 1) -> dict[str, pd.DataFrame]:
    """``end_to_end`` for each backend of ``cfgs`` in interleaved rounds (round 1 runs every backend's splits, then
    round 2 ...), so that the backends share the machine's drift: per backend, split and variant the median over
    rounds, and every round's value (in round order) in ``measured_transitions_per_s_reps`` and
    ``measured_updates_per_s_reps``, for paired ratios between backends; ``outlier_reps``: the rounds whose
    transitions/s is an outlier among them (``conditions.outlier_repeats``)."""
    runs: dict[str, list[pd.DataFrame]] = {label(c): [] for c in cfgs}
    for r in range(repeats):
        for c in cfgs:
            b = label(c)
            runs[b].append(end_to_end(c, max_threads, steps, progress=lambda m, r=r, b=b: progress(
                f"[round {r + 1}/{repeats} {b}] {m}")))
    return {b: _median_of_rounds(frames) for b, frames in runs.items()}


def _median_of_rounds(frames: list[pd.DataFrame]) -> pd.DataFrame:
    keys = ["actors", "learners", "aggregation", "env_backend"]
    rounds = pd.concat([f.assign(round=i) for i, f in enumerate(frames)], ignore_index=True).sort_values("round")
    out = rounds.groupby(keys, sort=False).agg(
        measured_transitions_per_s=("measured_transitions_per_s", "median"),
        measured_updates_per_s=("measured_updates_per_s", "median"), wall_s=("wall_s", "median"),
        measured_transitions_per_s_reps=("measured_transitions_per_s", lambda v: " ".join(f"{x:.1f}" for x in v)),
        measured_updates_per_s_reps=("measured_updates_per_s", lambda v: " ".join(f"{x:.1f}" for x in v)),
        threads=("threads", "first"), oversubscribed=("oversubscribed", "first"), backend=("backend", "first"),
        outlier_reps=("measured_transitions_per_s", lambda v: " ".join(map(str, outlier_repeats(list(v))))),
        rounds=("round", "count")).reset_index()
    return out


def sweep(cfg, threads: int | list[int], steps: int, updates: int, progress=print, repeats: int = 1) -> pd.DataFrame:
    """f_a and f_l at x = 1..threads threads, or at each x of a list (``thread_points``; ``cfg.backend`` "ray":
    processes), each point measured
    ``repeats`` times in interleaved rounds (x = 1..M, then again): ``throughput`` is the median,
    ``throughput_reps`` every value (space-separated), for bootstrap intervals of the speedups, ``outlier_reps`` the
    indices of the repeats that are outliers among them (``conditions.outlier_repeats``: re-measure those points)."""
    return sweep_backends([cfg], threads, steps, updates, progress, repeats)[label(cfg)]


def sweep_backends(cfgs: list, threads: int | list[int], steps: int, updates: int, progress=print,
                   repeats: int = 1) -> dict[str, pd.DataFrame]:
    """``sweep`` for several backends at once, interleaved point by point (each x and curve measured on every
    backend in turn, round after round), so that a drifting machine affects them alike: backend -> curves."""
    got: dict[tuple[str, str, int], list[tuple[float, float, float | None]]] = {}
    with contextlib.ExitStack() as sessions:
        for cfg in cfgs:
            sessions.enter_context(ray_session(cfg))       # Ray: one session for every point
        _interleave(cfgs, threads, steps, updates, progress, repeats, got)
    return {label(cfg): _curves(cfg, {(k, x): r for (b, k, x), r in got.items() if b == label(cfg)})
            for cfg in cfgs}


def thread_points(threads: int | list[int]) -> list[int]:
    """The thread counts a sweep measures: 1..``threads``, or the list given (``--threads 1,2,4,8``)."""
    return list(range(1, threads + 1)) if isinstance(threads, int) else sorted(set(threads))


def _interleave(cfgs, threads, steps, updates, progress, repeats, got) -> None:
    points = thread_points(threads)
    max_threads = points[-1]
    for rep in range(repeats):
        for x in points:
            for kind, fn, n in (("f_a", measure_fa, steps), ("f_l", measure_fl, updates)):
                for cfg in cfgs:
                    where = f"[{label(cfg)} {kind} x={x}/{max_threads}" + (f" round {rep + 1}/{repeats}]"
                                                                           if repeats > 1 else "]")
                    progress(f"{where} measuring ...")
                    # the machine's 1-minute load average as the point started (other jobs share the cores)
                    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
                    v = fn(cfg, x, n)
                    got.setdefault((label(cfg), kind, x), []).append((v, load, last_cores_used.get(kind)))
                    progress(f"{where} {v:.0f} {'transitions' if kind == 'f_a' else 'updates'}/s")


def _curves(cfg, got: dict) -> pd.DataFrame:
    cores = usable_cores()
    rows = []
    for (kind, x), runs in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        values = [r[0] for r in runs]
        used = [r[2] for r in runs if r[2] is not None]
        rows.append({"curve": kind, "threads": x, "throughput": float(np.median(values)),
                     "throughput_reps": " ".join(f"{v:.3f}" for v in values),
                     "outlier_reps": " ".join(map(str, outlier_repeats(values))),
                     "cores_used": float(np.median(used)) if used else None, "cores": cores,
                     "oversubscribed": x > cores, "algo": cfg.algo, "env": cfg.env, "env_backend": cfg.env_backend,
                     "backend": label(cfg), "load1": max(r[1] for r in runs)})
    df = pd.DataFrame(rows)
    base = df[df.threads == 1].set_index("curve").throughput
    df["speedup"] = df.throughput / df.curve.map(base)
    df["efficiency"] = df.speedup / df.threads
    # Amdahl's serial fraction implied by the speedup at x threads: 0 = perfectly parallel, 1 = serial
    x = df.threads.clip(upper=cores)
    df["serial_fraction"] = ((x / df.speedup - 1) / (x - 1)).where(x > 1)
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=ALGOS, default="dqn")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--max-threads", type=workers, default=usable_cores(),
                    help="measure f_a and f_l at 1..N threads (default: the usable cores)")
    ap.add_argument("--threads", type=int_ranges(WORKERS), metavar="LIST",
                    help="measure at these thread counts instead (1,2,4,8,16,32,64 or 1-8; 1 must be in it: the "
                         "speedups are against it)")
    ap.add_argument("--reservation-cost", action="store_true",
                    help="instead, time one step reservation and one pump poll with --actors actors registered "
                         "(DIR/reservation_cost.csv, DIR/pump_cost.csv; see pal_bench.studies.scaling.worker_costs)")
    ap.add_argument("--actors", type=int_ranges(WORKERS), default=[1, 16, 64, 256], metavar="LIST",
                    help="with --reservation-cost: actor counts (default 1,16,64,256)")
    ap.add_argument("--rounds", type=positive_int, default=20_000,
                    help="with --reservation-cost: calls per timed block (default 20000)")
    ap.add_argument("--seconds", type=duration, default=1.0,
                    help="with --reservation-cost: seconds of the contended measurement per point (default 1)")
    ap.add_argument("--steps", type=positive_int, default=20_000, help="transitions per f_a point")
    ap.add_argument("--updates", type=positive_int, default=1_000, help="updates per f_l point")
    ap.add_argument("--repeats", type=positive_int, default=3,
                    help="interleaved rounds per point, for the speedups' intervals (default 3)")
    ap.add_argument("--env-backend", choices=["sync", "async"], default="sync",
                    help="async: actors step their environments in subprocesses (outside the GIL)")
    ap.add_argument("--backend", type=_backends, default=["threads"],
                    help="threads in this process, actor processes on the shared buffer "
                         "(results/scaling_processes.csv), the same with learner processes too "
                         "(learner-processes: results/scaling_learner_processes.csv; learner-allreduce: averaging "
                         "among themselves, results/scaling_learner_allreduce.csv), or Ray processes "
                         "(results/scaling_ray.csv); a comma list (threads,processes) measures them side by side, "
                         "interleaved point by point")
    ap.add_argument("--ray-address", help="with --backend ray: join this Ray cluster (default: a local Ray)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--end-to-end", type=nonneg_int, metavar="STEPS", default=0,
                    help="instead, measure the whole trainer at every split, --repeats rounds (results/"
                         "end_to_end.csv, end_to_end_<backend>.csv for another backend); a comma list of backends "
                         "runs them in interleaved rounds")
    add_force_flag(ap)
    args = ap.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"argument --out: {args.out} exists and is not a directory")
    if args.threads is not None and 1 not in args.threads:
        ap.error(f"--threads must include 1 (the speedups are against one thread), got {args.threads}")
    if args.reservation_cost:
        if refuse_if_busy("pal_bench.studies.scaling --reservation-cost", args.force):
            return 2
        worker_costs.write(args.out, args.actors, args.rounds, args.repeats, args.seconds,
                           Conditions("scaling --reservation-cost"), progress=lambda m: print(m, file=sys.stderr))
        return 0
    cfgs = [config_for(b, args.algo, args.env, env_backend=args.env_backend, ray_address=args.ray_address)
            for b in args.backend]
    if refuse_if_busy("pal_bench.studies.scaling", args.force):
        return 2
    measured = Conditions("scaling")
    if not args.end_to_end:
        return _write_curves(args, sweep_backends(cfgs, args.threads or args.max_threads, args.steps, args.updates,
                                                  progress=lambda m: print(m, file=sys.stderr), repeats=args.repeats),
                             measured)
    measured_all = end_to_end_backends(cfgs, max(2, args.max_threads), args.end_to_end,
                                       progress=lambda m: print(m, file=sys.stderr), repeats=args.repeats)
    measured.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    for backend, e2e in measured_all.items():
        name = "end_to_end" + ("" if backend == "threads" else f"_{backend.replace('-', '_')}")
        e2e.to_csv(args.out / f"{name}.csv", index=False, float_format="%.2f")
        measured.write(args.out / f"{name}.csv")
        print(e2e.to_string(index=False))
        print(f"figure: {draw_end_to_end(e2e, args.out / 'figures' / f'{name}.png')}")
    if (fig := backends_figure(args.out)) is not None:
        print(f"figure: {fig}")
    return 0


def _backends(text: str) -> list[str]:
    """``--backend``: one backend or a comma list of them."""
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in SCALING_BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(SCALING_BACKENDS)}; got {text!r}")
    return list(dict.fromkeys(names))


def _write_curves(args, curves: dict[str, pd.DataFrame], measured: Conditions) -> int:
    """Each backend's curves to its CSV (with the conditions of the whole command) and figure."""
    args.out.mkdir(parents=True, exist_ok=True)
    measured.finish()
    for backend, df in curves.items():
        suffix = "" if backend == "threads" else f"_{backend.replace('-', '_')}"
        name = ("scaling" if args.env_backend == "sync" else "scaling_async_env") + suffix + ".csv"
        df.to_csv(args.out / name, index=False, float_format="%.3f")
        measured.write(args.out / name)
        print(df.to_string(index=False))
        print(f"figure: {draw(df, args.out / 'figures' / name.replace('.csv', '.png'))}")
    threads_csv, ray_csv = args.out / "scaling.csv", args.out / "scaling_ray.csv"
    if args.env_backend == "sync" and threads_csv.exists() and ray_csv.exists():
        t, r = read_csv(threads_csv), read_csv(ray_csv)
        print("\nRay vs threads (overhead_us: 1/f_ray - 1/f_threads per transition or update):")
        print(overhead_table(t, r).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print(f"figure: {backends_figure(args.out)}")
    return 0

