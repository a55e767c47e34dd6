"""Measured points the model never saw while it was built: the held-out set (``pal-bench simulate
--measure-holdout``, ``results/simulation_holdout.csv``) and the check on this machine (``--check-here``).

A point is one curve value at one worker count: f_a (env steps/s, actors only), f_l (updates/s, learners only on a
filled buffer) or the whole trainer end to end (env steps/s) at a split and an aggregation, measured with the
scaling study's own functions (``studies.scaling.measure``), so that it is the same quantity as the development
points of the stored scaling CSVs.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass

import pandas as pd

from pal_bench.argtypes import Range, UsageError
from pal_bench.stored_tables import SCALING_BACKENDS, THROUGHPUT, Column
from pal_bench.studies.simulate.model import AGGREGATIONS

HOLDOUT = "simulation_holdout.csv"
CURVES = ("f_a", "f_l", "end_to_end")
POINT_COLUMNS = {"backend": Column(str, choices=SCALING_BACKENDS), "curve": Column(str, choices=CURVES),
                 "actors": Column(int, Range(0, 1024)), "learners": Column(int, Range(0, 1024)),
                 "aggregation": Column(str, choices=AGGREGATIONS),
                 "env_backend": Column(str, choices=("sync", "async")),
                 "measured": Column(float, THROUGHPUT), "steps": Column(int, Range(1, 10**9)),
                 "oversubscribed": Column(bool, required=False, default=False),
                 "cores": Column(int, Range(1, 4096), required=False)}
POINTS_WHAT = "measured points as `pal-bench simulate --measure-holdout` writes them"
MAX_POINTS = 10_000          # rows of a stored set of points (the held-out set has 53)


def check_rows(df: pd.DataFrame, label: str) -> pd.DataFrame:
    """Each stored point's workers agree with its curve (f_a: actors only, f_l: learners only, end to end: both),
    and there are at most ``MAX_POINTS``: a ``UsageError`` naming the file and row otherwise."""
    if len(df) > MAX_POINTS:
        raise UsageError(f"{label}: {len(df)} rows, at most {MAX_POINTS} points are read")
    for i, r in enumerate(df.itertuples(), 1):
        ok = {"f_a": r.actors >= 1 and r.learners == 0, "f_l": r.learners >= 1 and r.actors == 0,
              "end_to_end": r.actors >= 1 and r.learners >= 1}[r.curve]
        if not ok:
            raise UsageError(f"{label}: row {i}: a {r.curve} point cannot have {r.actors} actors and {r.learners} "
                             "learners (f_a: actors only; f_l: learners only; end_to_end: both)")
    return df
# env steps per end-to-end point (after learning starts): Ray actors make a few hundred a second
E2E_STEPS = {"ray": 5_000}


@dataclass(frozen=True)
class Point:
    """One measurement: ``curve`` at ``actors`` + ``learners`` (f_a: learners 0; f_l: actors 0)."""

    backend: str
    curve: str
    actors: int
    learners: int
    aggregation: str = "sync"
    env_backend: str = "sync"

    @property
    def workers(self) -> int:
        return self.actors + self.learners


def holdout_points(workers: tuple[int, ...] = (2, 3)) -> list[Point]:
    """The held-out set: every backend at 2 and 3 workers, f_a (the learner-process backends' actors are the
    process backend's: not repeated), f_l, and every split of the whole trainer with each aggregation the backend
    has (learner all-reduce: only its own). Environments in the actors' own process (the model does not cover
    environment subprocesses)."""
    out = []
    for b in SCALING_BACKENDS:
        for n in workers:
            if b not in ("learner-processes", "learner-allreduce"):
                out.append(Point(b, "f_a", n, 0))
            out.append(Point(b, "f_l", 0, n))
        for agg in ("allreduce",) if b == "learner-allreduce" else ("sync", "async"):
            out += [Point(b, "end_to_end", a, lr, agg) for a in range(1, max(workers))
                    for lr in range(1, max(workers)) if a + lr in workers]
    return out


def check_points(backends: list[str], counts: list[int]) -> list[Point]:
    """``--check-here``: f_a and f_l at each of ``counts`` workers, and the whole trainer (sync) at 1 + 1, at an
    even split of the largest count and at one learner beside the rest as actors."""
    n = max(counts)
    splits = sorted({(1, 1), (max(1, n // 2), max(1, n - n // 2)), (max(1, n - 1), 1)})
    out = []
    for b in backends:
        for k in counts:
            out += [Point(b, "f_a", k, 0), Point(b, "f_l", 0, k)]
        out += [Point(b, "end_to_end", a, lr, "allreduce" if b == "learner-allreduce" else "sync")
                for a, lr in splits]
    return out


def measure_points(points: list[Point], steps: int = 20_000, updates: int = 1_000, e2e_steps: int | None = None,
                   repeats: int = 1, progress=print) -> pd.DataFrame:
    """Each point measured ``repeats`` times (rounds over all points of a backend, so that they share its drift;
    Ray started once per backend): ``measured`` the median, ``measured_reps`` every value, ``load1`` the machine's
    1-minute load average as the backend's points started. ``steps`` env steps per f_a point, ``updates`` per
    f_l point, ``e2e_steps`` per end-to-end point after learning starts (default ``steps``; Ray actors
    ``E2E_STEPS``)."""
    from pal_bench.conditions import usable_cores
    from pal_bench.studies.scaling.measure import config_for, ray_session

    cores = usable_cores()
    rows = []
    backends = list(dict.fromkeys(p.backend for p in points))
    for b in backends:
        mine = [p for p in points if p.backend == b]
        base = config_for(b)
        got: dict[Point, list[tuple[float, int]]] = {p: [] for p in mine}
        load = os.getloadavg()[0]
        with ray_session(base):
            for r in range(repeats):
                for i, p in enumerate(mine, 1):
                    where = f"[{b} {i}/{len(mine)}" + (f" round {r + 1}/{repeats}]" if repeats > 1 else "]")
                    got[p].append(_measure(p, base, steps, updates, e2e_steps))
                    progress(f"{where} {p.curve} {p.actors}+{p.learners} {p.aggregation}: {got[p][-1][0]:.0f}/s")
        for p, runs in got.items():
            values = [v for v, _ in runs]
            rows.append({**dataclasses.asdict(p), "measured": statistics.median(values),
                         "steps": int(statistics.median(s for _, s in runs)),
                         "oversubscribed": p.workers > cores, "cores": cores,
                         "measured_reps": " ".join(f"{v:.1f}" for v in values), "load1": load})
    return pd.DataFrame(rows)


def _measure(p: Point, base, steps: int, updates: int, e2e_steps: int | None) -> tuple[float, int]:
    """One run of ``p``: (its rate, the env steps or updates it made)."""
    from pal_bench.studies.scaling.measure import measure_fa, measure_fl, measure_splits

    if p.curve == "f_a":
        return measure_fa(base, p.actors, steps), steps
    if p.curve == "f_l":
        return measure_fl(base, p.learners, updates), updates
    n = e2e_steps or E2E_STEPS.get(p.backend, steps)
    c = dataclasses.replace(base, aggregation=p.aggregation, env_backend=p.env_backend)
    df = measure_splits(c, [(p.actors, p.learners)], n, progress=lambda m: None)
    rate = float(df.measured_transitions_per_s.iloc[0])
    return rate, int(round(rate * float(df.wall_s.iloc[0])))
