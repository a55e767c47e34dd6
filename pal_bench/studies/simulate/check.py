"""``pal-bench simulate --check-here``: the model checked on whatever machine runs it.

On this machine: the inputs measured (``inputs.measure``, one round by default), f_a and f_l at a sparse set of
worker counts (1, 2, 4, ... up to the usable cores, or ``--threads``) and a few splits of the whole trainer
(``points.check_points``), each predicted from the inputs measured here with the model's one fit on this check's
own one-worker points. Writes ``results/simulation_check_<host>.csv``: per point the measured and predicted value,
the signed error, the stated 90% interval (the development residuals of the stored validation, where there is one)
and the machine's description; its ``.meta.json`` holds the conditions; the inputs measured here go to
``results/simulation_inputs_check_<host>.csv``. On 2 cores with the defaults it takes
about 2 minutes (2026-12-06: 1 min 55 s).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket

import pandas as pd

from pal_bench.studies.simulate.points import check_points, measure_points

DEFAULT_BACKENDS = ("threads", "processes")


def host_name(raw: str | None = None) -> str:
    """This machine's name as a file-name part: letters, digits, '.', '_' and '-' only, at most 64 of them; a name
    that had to be changed gets 8 hex digits of its own hash, so two hosts whose names differ stay apart."""
    raw = socket.gethostname() if raw is None else raw
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", raw).strip("._-")[:64] or "host"
    if name != raw:
        name = f"{name[:55]}-{hashlib.sha256(raw.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"
    return name


def default_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, and ``cores``."""
    out, k = [], 1
    while k < cores:
        out.append(k)
        k *= 2
    return [*out, cores]


def ray_idle_here(log) -> dict:
    """Ray's idle cores on this machine (one round of ``ray_idle``, 2 s a condition, about 15 s with the session's
    start); {} where Ray is not installed (the Ray backends' inputs are left out there too)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return {}
    from pal_bench.studies.simulate.costs import idle_cores
    from pal_bench.studies.simulate.ray_idle import measure
    from pal_bench.train import make_config

    df = measure(make_config("dqn", "CartPole-v1"), rounds=1, learners=(1,), seconds=2.0, progress=log)
    return {"ray_idle_cores": idle_cores(df), "ray_session_idle_cores": idle_cores(df, "session")}


def run_check(args, log) -> int:
    from pal_bench.conditions import Conditions, cpu_model, refuse_if_busy, usable_cores
    from pal_bench.studies.simulate.calibrate import fit, inputs_for, median_inputs
    from pal_bench.studies.simulate.inputs import measure
    from pal_bench.studies.simulate.model import throughput
    from pal_bench.studies.simulate.stored import VALIDATION, dev_residuals, write_csv
    from pal_bench.studies.simulate.validate import LEARNING, _one_worker, interval, workload
    from pal_bench.train import make_config

    if refuse_if_busy("pal-bench simulate --check-here", args.force):
        return 2
    host = host_name()                             # (before the measurement: it cannot fail after it)
    cores = usable_cores()
    counts = sorted(set(args.threads)) if args.threads else default_counts(cores)
    if 1 not in counts:
        counts = [1, *counts]                      # the fit's points
    backends = list(args.backend or DEFAULT_BACKENDS)
    residuals = dev_residuals(args.out) if os.path.lexists(args.out / VALIDATION) else []
    with Conditions("simulate --check-here: the model checked on this machine") as c:
        log(f"[check] inputs on this machine ({args.rounds} round(s)) ...")
        rounds = pd.DataFrame(measure(make_config("dqn", "CartPole-v1"), args.rounds,
                                      steps=max(500, args.steps // 4), updates=max(50, args.updates // 2),
                                      progress=log, ray=any(b.startswith("ray") for b in backends)))
        from pal_bench.studies.simulate.costs import measure_here

        rounds = rounds.assign(**measure_here(progress=log))
        if any(b.startswith("ray") for b in backends):
            rounds = rounds.assign(**ray_idle_here(log))
        points = measure_points(check_points(backends, counts), steps=args.steps, updates=args.updates,
                                repeats=args.repeats, progress=log)
    row = median_inputs(rounds)
    out = []
    for b, mine in points.groupby("backend", sort=False):
        inp, _ = fit(inputs_for(row, b), b, _one_worker(mine, b, "f_a", None), _one_worker(mine, b, "f_l", None),
                     cores, LEARNING)
        for p in mine.itertuples():
            predicted = throughput(inp, workload(p, cores))
            lo, hi = interval([predicted], residuals)
            out.append({"backend": b, "curve": p.curve, "actors": p.actors, "learners": p.learners,
                        "aggregation": p.aggregation, "env_backend": p.env_backend, "measured": p.measured,
                        "predicted": predicted, "error": (predicted - p.measured) / p.measured,
                        "lo90": lo, "hi90": hi, "fit_point": p.actors + p.learners == 1 and p.curve != "end_to_end",
                        "oversubscribed": p.oversubscribed, "measured_reps": p.measured_reps,
                        "host": host, "cpu": cpu_model(), "cores": cores})
    df = pd.DataFrame(out)
    path = write_csv(df, args.out / f"simulation_check_{host}.csv", c)
    # (its own prefix: no host's check file can be another host's inputs file)
    write_csv(rounds, args.out / f"simulation_inputs_check_{host}.csv", c)
    print(df.drop(columns=["measured_reps", "cpu"]).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    multi = df[~df.fit_point]
    inside = ((multi.measured >= multi.lo90) & (multi.measured <= multi.hi90)).mean()
    print(f"\n{len(multi)} points beyond the fit: median |error| {multi.error.abs().median():.1%}, worst "
          f"{multi.error.abs().max():.1%}, bias {multi.error.mean():+.1%}"
          + (f", inside the stated 90% interval {inside:.0%}" if len(residuals)
             else " (no stored validation: no interval)"))
    print(f"wrote {path} (send it and its .meta.json back: docs/simulation.md)")
    return 0

