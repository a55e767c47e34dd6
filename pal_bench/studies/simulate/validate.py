"""The model against every stored measurement it can reach, in two sets kept apart:

- **development**: the f_a / f_l points of the scaling CSVs and every split of the end-to-end CSVs, the points the
  model's structure was revised against (docs/simulation.md tells its history);
- **holdout**: ``results/simulation_holdout.csv`` (``pal-bench simulate --measure-holdout``), measured in one
  sitting after the last model change and never used to decide one.

Each point is predicted with itself left out of the fit: for a point the fit uses (a backend's one-worker f_a or
f_l) leaving it out means the model predicts it from the measured phase costs alone; for every other point the fit
is the development set's one-worker points, which the point is not. Its stated 90% interval (``lo90``, ``hi90``)
combines the inputs resampled from the measured rounds with the model's own error on the development set's
multi-worker points (the empirical distribution of their relative residuals, the point's own left out): the
measured value lies at ``predicted / (1 + e)`` for a residual ``e``. Points the model does not cover are listed
with the reason (environments in subprocesses, Ray's all-reduce), not dropped silently.

A point measured more than once carries its repeats (``measured_reps``): ``measured_lo`` / ``measured_hi`` are
their range and ``beyond_repeats`` how far the prediction lies outside it (signed, relative to the nearest repeat;
0 inside). It separates the model's error from the measurement's own spread: a model that predicted each point's
true median exactly would be inside the range of n independent repeats with probability 1 - 2 * 0.5**n (75% for
3); repeats of one sitting are not independent (a sitting's drift moves them together), so that is an upper mark.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from pal_bench.argtypes import WORKERS, Range, UsageError
from pal_bench.stored_tables import SCALING_COLUMNS, SCALING_WHAT, THROUGHPUT, Column, read_table
from pal_bench.studies.simulate.calibrate import fit, inputs_for
from pal_bench.studies.simulate.model import AGGREGATIONS, CHUNK, Workload, throughput

SCALING = {"threads": "scaling.csv", "processes": "scaling_processes.csv", "ray": "scaling_ray.csv",
           "ray-node": "scaling_ray_node.csv", "learner-processes": "scaling_learner_processes.csv",
           "learner-allreduce": "scaling_learner_allreduce.csv"}
END_TO_END = {"threads": "end_to_end.csv", "processes": "end_to_end_processes.csv", "ray": "end_to_end_ray.csv",
              "ray-node": "end_to_end_ray_node.csv", "learner-processes": "end_to_end_learner_processes.csv",
              "learner-allreduce": "end_to_end_learner_allreduce.csv"}
# what the stored validation must hold where its residuals are read back (a prediction's interval): the error of a
# positive prediction is above -1, so that 1 + error divides
VALIDATION_COLUMNS = {"set": Column(str, choices=("development", "holdout"), required=False, default="development"),
                      "actors": Column(int, Range(0, 10**6)), "learners": Column(int, Range(0, 10**6)),
                      "error": Column(float, Range(-1, 1e6, lo_open=True), required=False, default=float("nan"))}
LEARNING = {"updates_per_step": 0.25, "learning_starts": 1_000}     # DQN CartPole-v1's (the stored runs')
MAX_WORKERS = 3
MAX_REPEATS = 100            # repeats of one stored point read back (the studies store 1-5)
END_TO_END_COLUMNS = {"actors": Column(int, WORKERS), "learners": Column(int, WORKERS),
                      "aggregation": Column(str, choices=AGGREGATIONS), "env_backend": Column(str),
                      "measured_transitions_per_s": Column(float, THROUGHPUT),
                      "wall_s": Column(float, Range(0, 10**7, lo_open=True)),
                      "oversubscribed": Column(bool, required=False, default=False)}


def read_scaling(path: Path) -> pd.DataFrame:
    """A stored scaling CSV, its columns checked (``UsageError`` naming the file, column, row and value)."""
    return read_table(path, SCALING_COLUMNS, SCALING_WHAT)


def measured_points(results: Path) -> pd.DataFrame:
    """Every stored point on 1-3 workers, the development set then the held-out one: backend, curve (f_a, f_l,
    end_to_end), actors, learners, aggregation, env_backend, measured, steps (what the run collected),
    oversubscribed, covered (why not, when not), set."""
    dev = development_points(results)
    held = holdout_points(results)
    if held.empty:
        return dev.assign(set="development")
    if dev.empty:
        return held.assign(set="holdout").reset_index(drop=True)
    return pd.concat([dev.assign(set="development"), held.assign(set="holdout")], ignore_index=True)


def holdout_points(results: Path) -> pd.DataFrame:
    """The stored held-out points (empty when none are stored), checked (``points.POINT_COLUMNS``)."""
    from pal_bench.studies.simulate.points import HOLDOUT, POINT_COLUMNS, POINTS_WHAT, check_rows

    if not os.path.lexists(results / HOLDOUT):
        return pd.DataFrame(columns=[*POINT_COLUMNS, "covered"])
    df = check_rows(read_table(results / HOLDOUT, POINT_COLUMNS, POINTS_WHAT), str(results / HOLDOUT))
    reps = [repeats_text(t, f"{results / HOLDOUT}: row {i}", m) for i, (t, m) in
            enumerate(zip(df["measured_reps"] if "measured_reps" in df else [""] * len(df), df.measured), 1)]
    df = df[[c for c in POINT_COLUMNS if c in df]]
    df["covered"] = [_why_not(r) for r in df.itertuples()]
    df["measured_reps"] = reps
    return df


def _repeat_words(text, maxsplit: int = -1) -> list[str]:
    """A stored repeats cell's words ([] for an empty or missing cell)."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return []
    return str(text).split(maxsplit=maxsplit)


def repeats(text) -> list[float]:
    """The repeats of a stored point from their space-separated text (transitions/s or updates/s; [] for none)."""
    return [float(x) for x in _repeat_words(text)]


def repeats_text(text, where: str, measured: float | None = None) -> str:
    """A stored point's repeats checked (at most ``MAX_REPEATS`` rates in ``THROUGHPUT``'s range, space-separated,
    whose range holds the point's ``measured`` value, the median of them) and written back in one form;
    ``UsageError`` naming ``where`` otherwise."""
    parts = _repeat_words(text, maxsplit=MAX_REPEATS)
    if len(parts) > MAX_REPEATS:
        raise UsageError(f"{where}: more than {MAX_REPEATS} repeats; at most {MAX_REPEATS} are read")
    values = []
    for x in parts:
        try:
            v = float(x)
        except ValueError:
            v = float("nan")
        if not (np.isfinite(v) and THROUGHPUT.lo <= v <= THROUGHPUT.hi):
            raise UsageError(f"{where}: repeat {x[:40]!r} is not a rate (a number {THROUGHPUT})")
        values.append(v)
    # (the repeats are stored rounded: the median may sit a rounding outside them)
    if values and measured is not None and not min(values) * (1 - 1e-3) <= measured <= max(values) * (1 + 1e-3):
        raise UsageError(f"{where}: the measured value {measured:.6g} lies outside its repeats "
                         f"({min(values):.6g}-{max(values):.6g})")
    return " ".join(f"{v:.6g}" for v in values)


def beyond_repeats(predicted: float, reps: list[float]) -> float:
    """How far ``predicted`` lies outside the range of ``reps`` (signed, relative to the nearest repeat: above the
    highest > 0, below the lowest < 0, inside 0); NaN with fewer than 2 repeats or no prediction."""
    if len(reps) < 2 or predicted is None or not np.isfinite(predicted):
        return float("nan")
    lo, hi = min(reps), max(reps)
    return (predicted - hi) / hi if predicted > hi else (predicted - lo) / lo if predicted < lo else 0.0


def _why_not(r) -> str:
    """Why the model does not cover a point ('' when it does)."""
    return ("environments in subprocesses" if r.env_backend != "sync" else
            "Ray's all-reduce among learner processes" if r.aggregation == "allreduce" and r.backend == "ray" else "")


def development_points(results: Path) -> pd.DataFrame:
    """The development set: every point of the stored scaling and end-to-end CSVs on 1-3 workers."""
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
                             "oversubscribed": bool(r.oversubscribed), "covered": "",
                             "cores": _cores(getattr(r, "cores", None)),
                             "measured_reps": repeats_text(getattr(r, "throughput_reps", ""),
                                                           f"{results / name}: row {r.Index + 1}", r.throughput)})
    for backend, name in END_TO_END.items():
        if not os.path.lexists(results / name):
            continue
        for r in read_table(results / name, END_TO_END_COLUMNS, "the end-to-end CSV of the scaling study").itertuples():
            if r.actors + r.learners > MAX_WORKERS:
                continue
            rows.append({"backend": backend, "curve": "end_to_end", "actors": r.actors, "learners": r.learners,
                         "aggregation": r.aggregation, "env_backend": r.env_backend,
                         "measured": r.measured_transitions_per_s,
                         "steps": int(round(r.measured_transitions_per_s * r.wall_s, -3)),
                         "oversubscribed": bool(r.oversubscribed), "covered": _why_not(
                             SimpleNamespace(backend=backend, env_backend=r.env_backend, aggregation=r.aggregation)),
                         "measured_reps": repeats_text(getattr(r, "measured_transitions_per_s_reps", ""),
                                                       f"{results / name}: row {r.Index + 1}",
                                                       r.measured_transitions_per_s)})
    return pd.DataFrame(rows)


def _cores(value) -> float:
    """A stored point's machine cores (NaN where not recorded: the inputs' cores are used)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return v if 1 <= v <= 4096 else float("nan")


def _one_worker(points: pd.DataFrame, backend: str, curve: str, skip: int | None) -> float | None:
    m = points[(points.backend == backend) & (points.curve == curve) & (points[
        "actors" if curve == "f_a" else "learners"] == 1) & (points.get("set", "development") == "development")]
    m = m[m.index != skip] if skip is not None else m
    return float(m.measured.iloc[0]) if len(m) else None


def workload(p, cores: int) -> Workload:
    c = CHUNK[p.backend]
    if p.curve == "f_a":
        return Workload(p.backend, cores, p.actors, 1, "f_a", steps=min(p.steps, 6_000 + 4 * c), chunk=c, **LEARNING)
    if p.curve == "f_l":
        return Workload(p.backend, cores, 1, p.learners, "f_l", aggregation=p.aggregation, updates=600, chunk=c,
                        **LEARNING)
    return Workload(p.backend, cores, p.actors, p.learners, "end_to_end", aggregation=p.aggregation,
                    steps=min(p.steps, 9_000), chunk=c, **LEARNING)


def _predict_backend(row: dict, backend: str, items: list) -> dict:
    """(a worker's task) One backend's points on one draw of the inputs: ``items`` are (index, point, f_a1, f_l1,
    cores); the fit is made once per distinct (f_a1, f_l1, cores). Index -> (predicted, fit factors)."""
    fits: dict = {}
    out = {}
    for idx, p, fa1, fl1, n in items:
        key = (fa1, fl1, n)
        if key not in fits:
            fits[key] = fit(inputs_for(row, backend), backend, fa1, fl1, n, LEARNING)
        inp, factors = fits[key]
        out[idx] = (throughput(inp, workload(SimpleNamespace(**p), n)), factors)
    return out


def validate(results: Path, rounds: pd.DataFrame, progress=print, samples: int = 5, seed: int = 0,
             workers: int | None = None) -> pd.DataFrame:
    """Each stored point predicted with itself left out: ``predicted`` and ``error`` (signed fraction,
    (predicted - measured) / measured), ``lo90`` / ``hi90`` (the stated interval: ``samples`` resampled inputs
    times the development residuals, see the module's docstring) and ``set``. The simulations run in ``workers``
    processes (default: the usable cores; 1: in this one), one task per backend and draw of the inputs."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from pal_bench.conditions import usable_cores
    from pal_bench.studies.simulate.calibrate import median_inputs, resample

    points = measured_points(results)
    base = median_inputs(rounds)
    cores = int(base.get("cores", 2))
    rng = np.random.default_rng(seed)
    rows = [base] + [resample(rounds, rng) for _ in range(samples)]
    by_backend: dict[str, list] = {}
    for idx, p in points.iterrows():
        if p.covered:
            continue
        # at the measured machine's cores where the point recorded them, else the inputs'
        n = int(p.cores) if "cores" in p and pd.notna(p.cores) else cores
        by_backend.setdefault(p.backend, []).append(
            (idx, p.to_dict(), _one_worker(points, p.backend, "f_a", idx), _one_worker(points, p.backend, "f_l", idx),
             n))
    tasks = [(i, b) for i in range(len(rows)) for b in by_backend]
    got: dict[tuple[int, int], tuple[float, dict]] = {}
    workers = max(1, min(workers or usable_cores(), len(tasks)))
    if workers == 1:
        for k, (i, b) in enumerate(tasks, 1):
            got |= {(i, idx): r for idx, r in _predict_backend(rows[i], b, by_backend[b]).items()}
            progress(f"[validate {k}/{len(tasks)}] {b}, inputs draw {i}")
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_predict_backend, rows[i], b, by_backend[b]): (i, b) for i, b in tasks}
            for k, f in enumerate(as_completed(futures), 1):
                i, b = futures[f]
                got |= {(i, idx): r for idx, r in f.result().items()}
                progress(f"[validate {k}/{len(tasks)}] {b}, inputs draw {i}")
    out, draws = [], {}
    for idx, p in points.iterrows():
        if p.covered:
            out.append(p.to_dict() | {"predicted": None, "error": None})
            continue
        predicted, factors = got[0, idx]
        draws[idx] = [got[i, idx][0] for i in range(len(rows))]
        out.append(p.to_dict() | {"predicted": predicted, "error": (predicted - p.measured) / p.measured,
                                  "actor_factor": factors["actor"], "learner_factor": factors["learner"]})
    v = pd.DataFrame(out)
    reps = [repeats(t) for t in v.get("measured_reps", pd.Series([""] * len(v)))]
    v["repeats"] = [len(r) for r in reps]
    v["measured_lo"] = [min(r) if r else np.nan for r in reps]
    v["measured_hi"] = [max(r) if r else np.nan for r in reps]
    v["beyond_repeats"] = [beyond_repeats(p, r) for p, r in zip(v.predicted, reps)]
    v["lo90"], v["hi90"] = np.nan, np.nan
    dev = v[development_residuals_mask(v)]
    for idx, d in draws.items():
        lo, hi = interval(d, dev.error.drop(index=idx, errors="ignore").to_numpy())
        v.loc[idx, ["lo90", "hi90"]] = lo, hi
    return v


def development_residuals_mask(v: pd.DataFrame) -> pd.Series:
    """The points whose residuals are the model's own error: the development set's covered multi-worker points."""
    return (v.set == "development") & v.error.notna() & ((v.actors + v.learners) >= 2)


def interval(draws, residuals, level: float = 0.90) -> tuple[float, float]:
    """The stated ``level`` interval of a measurement predicted at ``draws`` (one prediction per resampled input):
    the central ``level`` of ``draw / (1 + e)`` over every draw and every residual ``e`` (with no residual, the
    draws' spread alone)."""
    d = np.asarray(draws, dtype=float)
    r = np.asarray(residuals, dtype=float)
    vals = (d[:, None] / (1 + r[None, :])).ravel() if len(r) else d
    q = (1 - level) / 2 * 100
    return float(np.percentile(vals, q)), float(np.percentile(vals, 100 - q))


def _figures(d: pd.DataFrame) -> dict:
    e = d.error
    nan = float("nan")
    inside = ((d.measured >= d.lo90) & (d.measured <= d.hi90)) if "lo90" in d else pd.Series(dtype=bool)
    b = d.beyond_repeats.dropna() if "beyond_repeats" in d else pd.Series(dtype=float)
    spread = (d.measured_hi / d.measured_lo)[d.repeats >= 2] if "repeats" in d else pd.Series(dtype=float)
    return {"points": len(d), "median_abs_error": float(e.abs().median()) if len(d) else nan,
            "worst_abs_error": float(e.abs().max()) if len(d) else nan,
            "bias": float(e.mean()) if len(d) else nan,
            "coverage": float(inside.mean()) if len(inside) and d.lo90.notna().all() else nan,
            # the points measured 2 or more times: the prediction against the range of their repeats
            "with_repeats": len(b), "inside_repeats": float((b == 0).mean()) if len(b) else nan,
            # a model right about every point's median: inside the range of n independent repeats 1 - 2 * 0.5**n
            "inside_repeats_if_right": (float((1 - 2 * 0.5 ** d.repeats[b.index]).mean()) if len(b) else nan),
            "median_abs_beyond_repeats": float(b.abs().median()) if len(b) else nan,
            "worst_abs_beyond_repeats": float(b.abs().max()) if len(b) else nan,
            "median_repeat_spread": float(spread.median()) if len(spread) else nan,
            "worst_repeat_spread": float(spread.max()) if len(spread) else nan}


CONDITIONS = {"not oversubscribed": lambda d: ~d.oversubscribed.astype(bool),
              "oversubscribed": lambda d: d.oversubscribed.astype(bool),
              "end_to_end sync": lambda d: (d.curve == "end_to_end") & (d.aggregation != "async"),
              "end_to_end async": lambda d: (d.curve == "end_to_end") & (d.aggregation == "async")}


def summary(v: pd.DataFrame) -> dict:
    """Per set (development, holdout) over the covered multi-worker points (2 or more workers; the one-worker
    points are the fit): median and worst |error|, bias (the signed mean error), coverage (the share of measured
    values inside their stated 90% interval); the same per backend and per curve. Also over every covered point
    (``all``) and how many points the model does not cover. Per condition (``CONDITIONS``: oversubscribed or not,
    end-to-end sync or async) the same figures; where points carry repeats, the prediction against their range
    (``inside_repeats``, ``median_abs_beyond_repeats``) and the repeats' own spread (highest / lowest)."""
    c = v.dropna(subset=["error"])
    sets = c.set if "set" in c else pd.Series("development", index=c.index)
    multi = c[(c.actors + c.learners) >= 2]
    out: dict = {"all": _figures(c), "not_covered": int(v.error.isna().sum())}
    for name in ("development", "holdout"):
        d = multi[sets.loc[multi.index] == name]
        out[name] = _figures(d) | {
            "per_backend": {b: _figures(g) for b, g in d.groupby("backend")},
            "per_curve": {k: _figures(g) for k, g in d.groupby("curve")},
            "per_condition": {k: _figures(d[f(d)]) for k, f in CONDITIONS.items()
                              if "oversubscribed" in d and f(d).any()}}
    # (older readers)
    out |= {"points": out["all"]["points"], "median_abs_error": out["all"]["median_abs_error"],
            "worst_abs_error": out["all"]["worst_abs_error"], "per_backend": out["development"]["per_backend"]}
    return out
