"""Ray's own CPU when nothing is asked of it (issue 50): the model's ``background_cores`` for the Ray backends,
until this probe a chosen 0.1 core, and the part of the inputs' measured per-call and per-update CPU that is Ray
idling, not the call's or the update's work.

``python -m pal_bench.studies.simulate.ray_idle`` measures, each round, the machine's busy cores (``/proc/stat``,
every process: ``conditions.machine_busy_seconds``) over ``--idle-s`` seconds in which nothing is asked:

- ``machine``: no Ray session (what the rest of the machine keeps busy);
- ``session``: a local Ray session alone (raylet, GCS and their helpers);
- ``learners``: the session with the processes a Ray learner measurement runs (``RayTrainer.run_learners``: the
  buffer actor holding ``--rows`` rows, the parameter-server actor, ``n`` learner workers) up and idle, for each n
  of ``--learners``.

It writes ``results/simulation_ray_idle.csv`` (round, condition, learners, seconds, busy_cores) with its
``.meta.json``; ``costs.stored_costs`` reads it back as ``ray_idle_cores``, the median over rounds of the
one-learner condition less the machine alone (the configuration the inputs' per-update Ray CPU was measured in,
``inputs.ray_costs``), and ``ray_session_idle_cores``, the session alone less the machine alone (the one the
per-call CPU was measured in). The model keeps Ray's background constant as workers are added; the two-learner rows
say how far that holds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import Range, number
from pal_bench.paths import RESULTS
from pal_bench.studies.simulate.costs import RAY_IDLE as FILE
from pal_bench.studies.simulate.costs import idle_cores


def busy_cores(seconds: float) -> tuple[float, float]:
    """(wall seconds, the machine's busy cores over them) while this process sleeps ``seconds``."""
    from pal_bench.conditions import machine_busy_seconds

    b0, t0 = machine_busy_seconds(), time.perf_counter()
    time.sleep(seconds)
    b1, wall = machine_busy_seconds(), time.perf_counter() - t0
    if b0 is None or b1 is None:
        raise RuntimeError("/proc/stat is not readable here: the machine's busy CPU cannot be measured")
    return wall, (b1 - b0) / wall


def idle_learners(cfg, n: int, rows: dict, seconds: float) -> tuple[float, float]:
    """The busy cores with ``run_learners``' processes for ``n`` learners up and idle (the buffer actor holding
    ``rows``), then every one of them killed."""
    import ray

    from pal_bench.train.backends.ray.buffer_actor import BufferActor
    from pal_bench.train.backends.ray.context import cpu_share
    from pal_bench.train.backends.ray.ps_actor import ParameterServerActor
    from pal_bench.train.backends.ray.workers import LearnerWorker

    n_rows = len(next(iter(rows.values())))
    handles = []                                     # each one as it is made: a failure kills what was made
    try:
        handles.append(buffer := ray.remote(BufferActor).options(num_cpus=0).remote(cfg, 0))
        handles.append(ps := ray.remote(ParameterServerActor).options(num_cpus=0).remote(cfg, n))
        for i in range(n):
            handles.append(ray.remote(LearnerWorker).options(num_cpus=cpu_share(n)).remote(cfg, i, buffer, ps))
        ray.get(buffer.add_batch.remote(0, rows, n_rows, [], 0))
        ray.get([h.info.remote() for h in handles[2:]] + [ps.stats.remote()])      # every process is up
        time.sleep(min(1.0, seconds))                                               # their start-up settles
        return busy_cores(seconds)
    finally:
        for h in handles:
            try:
                ray.kill(h)
            except Exception:                        # noqa: BLE001 (gone already: nothing to stop)
                pass


def measure(cfg, rounds: int = 3, learners: tuple[int, ...] = (1, 2), seconds: float = 3.0, rows: int = 20_000,
            progress=print) -> pd.DataFrame:
    """``rounds`` rounds of every condition (module docstring): one row per round and condition."""
    import dataclasses

    from pal_bench.studies.scaling.measure import quiet, ray_session, transitions
    from pal_bench.train import make_trainer

    out = []
    for r in range(rounds):
        if r:
            time.sleep(min(2.0, seconds))            # the last round's Ray processes exiting are not the machine's
        wall, busy = busy_cores(seconds)
        out.append({"round": r, "condition": "machine", "learners": 0, "seconds": wall, "busy_cores": busy})
        progress(f"[round {r + 1}/{rounds}] machine alone: {busy:.3f} cores busy")
        with tempfile.TemporaryDirectory(prefix="pal-sim-") as d:
            c = quiet(cfg, d, backend="ray", ray_placement="pack", actors=1, learners=1, aggregation="sync",
                      buffer_capacity=max(cfg.buffer_capacity, rows))
            with ray_session(c):
                time.sleep(min(2.0, seconds))                                       # the session's start settles
                wall, busy = busy_cores(seconds)
                out.append({"round": r, "condition": "session", "learners": 0, "seconds": wall, "busy_cores": busy})
                progress(f"[round {r + 1}/{rounds}] Ray session alone: {busy:.3f} cores busy")
                with make_trainer(c) as tr:
                    data = transitions(tr, rows)
                for n in learners:
                    wall, busy = idle_learners(dataclasses.replace(c, learners=n), n, data, seconds)
                    out.append({"round": r, "condition": "learners", "learners": n, "seconds": wall,
                                "busy_cores": busy})
                    progress(f"[round {r + 1}/{rounds}] {n} learner(s) up, idle: {busy:.3f} cores busy")
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.gil_wake import measure_and_write, output_target
    from pal_bench.train import make_config

    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.simulate.ray_idle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=number(Range(1, 100)), default=3, help="rounds of every condition (default 3)")
    ap.add_argument("--idle-s", type=number(Range(0.2, 600), kind=float), default=3.0,
                    help="seconds each condition is watched (default 3)")
    ap.add_argument("--learners", type=number(Range(1, 64)), nargs="+", default=[1, 2],
                    help="learner counts whose processes are watched idle (default 1 2; 1 is the inputs' setting)")
    ap.add_argument("--rows", type=number(Range(256, 10**6)), default=20_000,
                    help="rows the buffer actor holds, as in the inputs' measurement (default 20000)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"folder for {FILE}")
    ap.add_argument("--force", action="store_true", help="measure on a busy machine too (marked noisy)")
    args = ap.parse_args(argv)
    if 1 not in args.learners:
        ap.error("--learners must include 1 (the configuration the inputs' Ray costs are measured in)")
    try:
        import ray  # noqa: F401
    except ImportError:
        print("error: Ray is not installed (pip install 'ray[default]')", file=sys.stderr)
        return 2
    target = output_target(ap, args.out, FILE)
    measured: list[pd.DataFrame] = []                # (what was written, for the summary line)

    def rows() -> pd.DataFrame:
        measured.append(measure(make_config("dqn", "CartPole-v1"), args.rounds, tuple(sorted(set(args.learners))),
                                args.idle_s, args.rows))
        return measured[0]

    try:
        rc = measure_and_write("ray_idle", "Ray's own CPU, idle", target, args.force, argv, rows,
                               float_format="{:,.3f}")
    except (UsageError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rc == 0:
        df = measured[0]
        print(f"Ray's idle cores (one learner's processes up, less the machine alone; median of {args.rounds} "
              f"round(s)): {idle_cores(df):.3f}; the session alone: {idle_cores(df, 'session'):.3f}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
