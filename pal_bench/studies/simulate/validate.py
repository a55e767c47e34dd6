"""The model against every stored measurement it can reach: the f_a / f_l points of the scaling CSVs and every
split of the end-to-end CSVs, per backend, each predicted with that point left out of the fit.

For a point the fit uses (a backend's one-worker f_a or f_l) leaving it out means the model predicts it from the
measured phase costs alone; for every other point the fit is the one-worker points, which the point is not.
Points the model does not cover are listed with the reason (environments in subprocesses, learner processes,
Ray's all-reduce), not dropped silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import WORKERS, Range
from pal_bench.stored_tables import SCALING_COLUMNS, SCALING_WHAT, THROUGHPUT, Column, read_table
from pal_bench.studies.simulate.calibrate import fit, inputs_for
from pal_bench.studies.simulate.model import AGGREGATIONS, CHUNK, Workload, throughput

SCALING = {"threads": "scaling.csv", "processes": "scaling_processes.csv", "ray": "scaling_ray.csv",
           "ray-node": "scaling_ray_node.csv", "learner-processes": "scaling_learner_processes.csv",
           "learner-allreduce": "scaling_learner_allreduce.csv"}
END_TO_END = {"threads": "end_to_end.csv", "processes": "end_to_end_processes.csv", "ray": "end_to_end_ray.csv",
              "ray-node": "end_to_end_ray_node.csv", "learner-processes": "end_to_end_learner_processes.csv",
              "learner-allreduce": "end_to_end_learner_allreduce.csv"}
LEARNING = {"updates_per_step": 0.25, "learning_starts": 1_000}     # DQN CartPole-v1's (the stored runs')
MAX_WORKERS = 3
END_TO_END_COLUMNS = {"actors": Column(int, WORKERS), "learners": Column(int, WORKERS),
                      "aggregation": Column(str, choices=AGGREGATIONS), "env_backend": Column(str),
                      "measured_transitions_per_s": Column(float, THROUGHPUT),
                      "wall_s": Column(float, Range(0, 10**7, lo_open=True)),
                      "oversubscribed": Column(bool, required=False, default=False)}


def read_scaling(path: Path) -> pd.DataFrame:
    """A stored scaling CSV, its columns checked (``UsageError`` naming the file, column, row and value)."""
    return read_table(path, SCALING_COLUMNS, SCALING_WHAT)


def measured_points(results: Path) -> pd.DataFrame:
    """Every stored point on 1-3 workers: backend, curve (f_a, f_l, end_to_end), actors, learners, aggregation,
    env_backend, measured, steps (what the run collected), oversubscribed, covered (why not, when not)."""
    rows = []
    for backend, name in SCALING.items():
        if not os.path.lexists(results / name):
            continue
        df = read_scaling(results / name)
        df = df[df.env_backend == "sync"] if "env_backend" in df else df
        for r in df.itertuples():
            if r.threads <= MAX_WORKERS:
                rows.append({"backend": backend, "curve": r.curve, "actors": r.threads if r.curve == "f_a" else 0,
                             "learners": r.threads if r.curve == "f_l" else 0, "aggregation": "sync",
                             "env_backend": "sync", "measured": r.throughput, "steps": 20_000,
                             "oversubscribed": bool(r.oversubscribed), "covered": ""})
    for backend, name in END_TO_END.items():
        if not os.path.lexists(results / name):
            continue
        for r in read_table(results / name, END_TO_END_COLUMNS, "the end-to-end CSV of the scaling study").itertuples():
            if r.actors + r.learners > MAX_WORKERS:
                continue
            why = ("environments in subprocesses" if r.env_backend != "sync" else
                   "all-reduce among learner processes" if r.aggregation == "allreduce" else "")
            rows.append({"backend": backend, "curve": "end_to_end", "actors": r.actors, "learners": r.learners,
                         "aggregation": r.aggregation, "env_backend": r.env_backend,
                         "measured": r.measured_transitions_per_s,
                         "steps": int(round(r.measured_transitions_per_s * r.wall_s, -3)),
                         "oversubscribed": bool(r.oversubscribed), "covered": why})
    return pd.DataFrame(rows)


def _one_worker(points: pd.DataFrame, backend: str, curve: str, skip: int | None) -> float | None:
    m = points[(points.backend == backend) & (points.curve == curve) & (points[
        "actors" if curve == "f_a" else "learners"] == 1)]
    m = m[m.index != skip] if skip is not None else m
    return float(m.measured.iloc[0]) if len(m) else None


def workload(p, cores: int) -> Workload:
    c = CHUNK[p.backend]
    if p.curve == "f_a":
        return Workload(p.backend, cores, p.actors, 1, "f_a", steps=min(p.steps, 6_000 + 4 * c), chunk=c, **LEARNING)
    if p.curve == "f_l":
        return Workload(p.backend, cores, 1, p.learners, "f_l", updates=600, chunk=c, **LEARNING)
    return Workload(p.backend, cores, p.actors, p.learners, "end_to_end", aggregation=p.aggregation,
                    steps=min(p.steps, 9_000), chunk=c, **LEARNING)


def validate(results: Path, rounds: pd.DataFrame, progress=print) -> pd.DataFrame:
    """Each stored point predicted with itself left out: ``predicted`` and ``error`` (signed fraction,
    (predicted - measured) / measured)."""
    from pal_bench.studies.simulate.calibrate import median_inputs

    points = measured_points(results)
    base = median_inputs(rounds)
    cores = int(base.get("cores", 2))
    out = []
    for idx, p in points.iterrows():
        if p.covered:
            out.append(p.to_dict() | {"predicted": None, "error": None})
            continue
        inp, factors = fit(inputs_for(base, p.backend), p.backend, _one_worker(points, p.backend, "f_a", idx),
                           _one_worker(points, p.backend, "f_l", idx), cores, LEARNING)
        predicted = throughput(inp, workload(p, cores))
        out.append(p.to_dict() | {"predicted": predicted, "error": (predicted - p.measured) / p.measured,
                                  "actor_factor": factors["actor"], "learner_factor": factors["learner"]})
        progress(f"{p.backend} {p.curve} {p.actors}+{p.learners} {p.aggregation}: measured {p.measured:.0f}, "
                 f"predicted {predicted:.0f} ({out[-1]['error']:+.0%})")
    return pd.DataFrame(out)


def summary(v: pd.DataFrame) -> dict:
    """Median and worst absolute error over the covered points, overall and per backend."""
    c = v.dropna(subset=["error"])
    err = c.error.abs()
    out = {"points": len(c), "median_abs_error": float(err.median()), "worst_abs_error": float(err.max()),
           "not_covered": int(v.error.isna().sum())}
    out["per_backend"] = {b: {"points": len(d), "median_abs_error": float(d.error.abs().median()),
                              "worst_abs_error": float(d.error.abs().max())} for b, d in c.groupby("backend")}
    return out
