"""Design-space exploration: how many cores go to actors and how many to learners.

The PAL paper's allocation problem. Given the data-collection throughput f_a(x) (transitions/s
with x actor cores) and the data-consumption throughput f_l(x) (learner updates/s with x learner
cores), and the configured ratio r of updates per collected transition, a split (x_a, x_l) with
x_a + x_l <= M trains at

    T(x_a, x_l) = min(f_a(x_a), f_l(x_l) / r)   transitions/s   (and r * T updates/s),

because rate control holds the ratio by slowing whichever side is ahead. ``solve`` searches all
O(M^2) pairs exhaustively and returns the split with the highest T (ties: fewer cores, then more
balanced f_l / (r f_a)), the full table, and the frontier (the best split for each core budget).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import WORKERS, Range, UsageError, nonneg_int, number, positive_int
from pal_bench.bench.publishing import Markup, Publication, md, missing, source
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy, usable_cores
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import SCALING_COLUMNS, SCALING_WHAT, THROUGHPUT, Column, read_csv, read_table

ENV_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")   # a gymnasium id (ALE/Pong-v5) or an algorithm name, as stored


@dataclass(frozen=True)
class Allocation:
    actors: int
    learners: int
    transitions_per_s: float
    updates_per_s: float
    bottleneck: str          # "actors" or "learners" (the side that sets the pace)

    def command(self, algo: str, env: str, ratio: float) -> str:
        return (f"pal-bench train --algo {shlex.quote(algo)} --env {shlex.quote(env)} --actors {self.actors} "
                f"--learners {self.learners} --set updates_per_step={ratio:g}")


def _finite(v) -> float | None:
    """``v`` as a finite float; None when it is not a number (a string, a bool), NaN, infinite or too large."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _curve(f: Mapping[int, float] | list[float], name: str) -> dict[int, float]:
    curve = dict(enumerate(f, start=1)) if isinstance(f, (list, tuple)) else dict(f)
    if not curve:
        raise ValueError(f"{name} is empty")
    for x, v in curve.items():
        if (fx := _finite(x)) is None or not fx.is_integer() or fx < 1:
            raise ValueError(f"{name}: core counts must be integers >= 1, got {x!r}")
        if (fv := _finite(v)) is None or fv < 0:
            raise ValueError(f"{name}({x}) = {v!r}: throughputs must be finite and >= 0")
    return {int(x): float(v) for x, v in curve.items()}


def table(f_a, f_l, ratio: float, max_cores: int) -> pd.DataFrame:
    """Every split (x_a, x_l) with x_a + x_l <= max_cores that both curves cover."""
    if (r := _finite(ratio)) is None or r <= 0:
        raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
    if max_cores < 2:
        raise ValueError(f"max_cores must be >= 2 (one actor and one learner core), got {max_cores}")
    fa, fl = _curve(f_a, "f_a"), _curve(f_l, "f_l")
    rows = []
    for xa, va in fa.items():
        for xl, vl in fl.items():
            if xa + xl > max_cores:
                continue
            t = min(va, vl / ratio)
            rows.append({"actors": xa, "learners": xl, "cores": xa + xl, "f_a": va, "f_l": vl,
                         "transitions_per_s": t, "updates_per_s": ratio * t,
                         "balance": (vl / ratio) / va if va > 0 else float("inf"),
                         "bottleneck": "actors" if va <= vl / ratio else "learners"})
    if not rows:
        raise ValueError(f"no split with at most {max_cores} cores is covered by both curves")
    return pd.DataFrame(rows)


def solve(f_a, f_l, ratio: float, max_cores: int) -> tuple[Allocation, pd.DataFrame, pd.DataFrame]:
    """(best split, all splits, frontier: best split per total core count)."""
    t = table(f_a, f_l, ratio, max_cores)
    t["imbalance"] = (t.balance.clip(lower=1e-12).apply(lambda b: max(b, 1 / b)))
    ranked = t.sort_values(["transitions_per_s", "cores", "imbalance"], ascending=[False, True, True])
    best = ranked.iloc[0]
    frontier = (t.sort_values(["cores", "transitions_per_s", "imbalance"], ascending=[True, False, True])
                .groupby("cores", as_index=False).first())
    alloc = Allocation(int(best.actors), int(best.learners), float(best.transitions_per_s),
                       float(best.updates_per_s), str(best.bottleneck))
    return alloc, t.drop(columns="imbalance"), frontier.drop(columns="imbalance")


def validation_text(v: pd.DataFrame) -> str:
    """The validation table (``results/dse_validation.csv``): predicted and measured throughput per split,
    and whether the chosen split is the best measured (within 10%: the choice holds)."""
    top = v.measured_transitions_per_s.max()
    got = float(v[v.chosen].measured_transitions_per_s.iloc[0])
    chosen = v[v.chosen].iloc[0]
    verdict = "the best measured" if got >= top else f"at {got / top:.0%} of the best measured"
    holds = "holds" if got >= 0.9 * top else "does not hold"
    cols = ["actors", "learners", "transitions_per_s", "measured_transitions_per_s", "measured_updates_per_s",
            "chosen"]
    t = v[cols].rename(columns={"transitions_per_s": "predicted transitions/s",
                                "measured_transitions_per_s": "measured transitions/s",
                                "measured_updates_per_s": "measured updates/s"})
    t["chosen"] = t.chosen.map({True: Markup("**chosen**"), False: ""})
    rounds = len(str(v.get("measured_transitions_per_s_reps", pd.Series([""])).iloc[0]).split())
    runs = f"running the trainer at every split ({rounds} rounds, medians)" if rounds > 1 else \
        "running the trainer at every split"
    return (f"The solver chose {int(chosen.actors)} actor(s) + {int(chosen.learners)} learner(s) from the f_a / f_l "
            f"curves ({int(v.cores.max())} cores at most); {runs}, the chosen one is "
            f"{verdict}, so the choice {holds} (threshold: within 10% of the best).\n\n"
            + md(t, ".0f") + "\n")


def draw(table: pd.DataFrame, frontier: pd.DataFrame, best: Allocation, path, measured: pd.DataFrame | None = None):
    """Predicted throughput of every split against its core count, the frontier, the chosen split
    (star) and, when given, the throughput measured at each split."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(table.cores, table.transitions_per_s, s=12, color="gray", alpha=0.5, label="splits (predicted)")
    ax.plot(frontier.cores, frontier.transitions_per_s, color="#1f77b4", label="frontier (best per core budget)")
    ax.scatter([best.actors + best.learners], [best.transitions_per_s], marker="*", s=180, color="#d62728",
               zorder=5, label=f"chosen: {best.actors} actors + {best.learners} learners")
    if measured is not None and len(measured):
        ax.scatter(measured.actors + measured.learners, measured.measured_transitions_per_s, marker="x",
                   color="black", label="measured (trainer)")
    ax.set_xlabel("cores (actors + learners)")
    ax.set_ylabel("training throughput (transitions/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, Path(path))


def split_from_curves(updates_per_step: float, backend: str = "threads",
                      results: Path = RESULTS, cores: int | None = None) -> tuple[int, int]:
    """The split ``solve`` picks for ``cores`` (default: this machine's usable cores; at least 2) from the backend's
    stored f_a/f_l curves (``results/scaling.csv`` for threads, ``scaling_<backend>.csv`` otherwise) at
    ``updates_per_step`` updates per env step; (1, 1) when none are stored."""
    curves = results / ("scaling.csv" if backend == "threads" else f"scaling_{backend}.csv")
    if not os.path.lexists(curves):
        return 1, 1
    c = read_table(curves, SCALING_COLUMNS, SCALING_WHAT)
    if "backend" in c:
        c = c[c.backend.fillna("threads") == backend]
    f = {k: dict(zip(g.threads, g.throughput)) for k, g in c.groupby("curve")}
    try:
        best, _, _ = solve(f.get("f_a", {}), f.get("f_l", {}), updates_per_step, max(2, cores or usable_cores()))
    except ValueError as e:
        raise UsageError(f"{curves}: {e}") from None
    return best.actors, best.learners


def dse_block(results: Path) -> str:
    path = results / "dse_validation.csv"
    if not path.exists():
        return missing("dse_validation.csv", "make scaling")
    v = read_csv(path)
    return validation_text(v) + "\n" + source(results, "dse_validation.csv") + "\n"


def outputs(results: Path, figures: bool) -> list[Path]:
    """``figures/dse.png`` redrawn from the stored validation (``dse_validation.csv`` holds every split's
    prediction, the chosen one and what was measured)."""
    path = results / "dse_validation.csv"
    if not (figures and path.exists()):
        return []
    v = read_csv(path)
    t = v.drop(columns=[c for c in v.columns if c.startswith("measured") or c in ("wall_s", "predicted_rank",
                                                                                 "chosen")])
    t["imbalance"] = t.balance.clip(lower=1e-12).apply(lambda b: max(b, 1 / b))
    frontier = (t.sort_values(["cores", "transitions_per_s", "imbalance"], ascending=[True, False, True])
                .groupby("cores", as_index=False).first())
    b = v[v.chosen].iloc[0]
    best = Allocation(int(b.actors), int(b.learners), float(b.transitions_per_s), float(b.updates_per_s),
                      str(b.bottleneck))
    return [draw(t, frontier, best, results / "figures" / "dse.png", v)]


PUBLICATION = Publication("dse", {"dse": dse_block}, outputs)


# the backend whose curves `pal-bench dse` measures and uses unless told otherwise: actor processes collect
# in parallel where actor threads lose to the GIL (docs/backends.md, "Actor processes against threads")
DSE_BACKEND = "processes"
DSE_OUT = "pal-bench-out"       # dse's default --out: never the tracked results/ unless asked


def _placement(backend: str) -> dict:
    """The Ray curves (``scaling_ray.csv``) are the Ray-actor placement's: measure and validate that one."""
    return {"ray_placement": "pack"} if backend == "ray" else {}


PREDICT_ONLY = ("learner-processes", "ray-node")     # backends --predict takes from the simulation's labels
SIMULATION_COLUMNS = {"curve": Column(str, choices=("f_a", "f_l", "end_to_end")), "cores": Column(int, WORKERS),
                      "predicted": Column(float, Range(0, THROUGHPUT.hi))}
VALIDATION_COLUMNS = {"actors": Column(int, WORKERS), "learners": Column(int, WORKERS),
                      "measured_transitions_per_s": Column(float, THROUGHPUT)}
# --ratio, updates per collected transition: from one update per million transitions up to the config's own ceiling
# for updates_per_step (FIELD_RANGES), so that the suggested `--set updates_per_step=` is one the trainer takes
RATIO_MIN = 1e-6


def predicted_curves(backend: str, measured_csv: Path | None, max_cores: int) -> tuple[pd.DataFrame, set[str]]:
    """f_a / f_l for 1..``max_cores`` from the simulation's predictions (``pal-bench simulate``), the measured
    points of ``measured_csv`` (or the backend's stored scaling CSV) taking their place where they exist; and the
    names (``f_a(8)``) of the points that are predicted."""
    from pal_bench.paths import RESULTS

    path = RESULTS / f"simulation_{backend.replace('-', '_')}.csv"
    if not os.path.lexists(path):
        raise UsageError(f"--predict: {path} is not there; `pal-bench simulate --backend {backend} --cores "
                         f"1-{max_cores}` writes it")
    sim = read_table(path, SIMULATION_COLUMNS, "the predictions `pal-bench simulate` writes")
    sim = sim[sim.curve.isin(["f_a", "f_l"]) & (sim.cores <= max_cores)]
    if sim.cores.max() < max_cores - 1:
        raise UsageError(f"--predict: {path} predicts up to {sim.cores.max()} cores; `pal-bench simulate "
                         f"--backend {backend} --cores 1-{max_cores}` predicts up to {max_cores}")
    stored = measured_csv or RESULTS / ("scaling.csv" if backend == "threads" else
                                       f"scaling_{backend.replace('-', '_')}.csv")
    got = {}
    if measured_csv is not None or os.path.lexists(stored):
        m = read_table(stored, SCALING_COLUMNS, SCALING_WHAT)
        if "env_backend" in m:
            m = m[m.env_backend == "sync"]
        if "oversubscribed" in m:
            m = m[~m.oversubscribed.astype(bool)]
        got = {(r.curve, int(r.threads)): float(r.throughput) for r in m.itertuples()}
    rows, predicted = [], set()
    for curve, d in sim.groupby("curve"):
        xs, ys = d.cores.to_numpy(), d.predicted.to_numpy()
        for x in range(1, max_cores):
            if (curve, x) in got:
                v = got[(curve, x)]
            else:
                v, _ = float(np.interp(x, xs, ys)), predicted.add(f"{curve}({x})")
            rows.append({"curve": curve, "threads": x, "throughput": v})
    return pd.DataFrame(rows), predicted


def run(args) -> int:
    """``pal-bench dse``: the split from stored or freshly measured curves, its figure, and with ``--validate``
    the trainer run at every split (``dse_validation.csv``)."""
    from pal_bench.train import make_config

    if args.measured and not os.path.lexists(args.measured):
        raise UsageError(f"--measured {args.measured}: no such file")
    if args.curves and not os.path.lexists(args.curves):
        raise UsageError(f"--curves {args.curves}: no such file (make one with `python -m "
                         "pal_bench.studies.scaling`)")
    # every file the command reads, checked before anything is measured
    measured = (read_table(Path(args.measured), VALIDATION_COLUMNS, "a stored dse_validation.csv",
                           label=f"--measured {args.measured}") if args.measured else None)
    if args.backend in PREDICT_ONLY and not args.predict:
        raise UsageError(f"--backend {args.backend}: its curves come from the simulation here; add --predict "
                         "(or measure them with python -m pal_bench.studies.scaling)")
    m = args.max_cores or usable_cores()
    predicted: set[str] = set()
    if args.predict:
        backend = args.backend or DSE_BACKEND
        curves, predicted = predicted_curves(backend, Path(args.curves) if args.curves else None, m)
        print(f"curves: predicted by the simulation (results/simulation_{backend.replace('-', '_')}.csv) for "
              f"{', '.join(sorted(predicted)) or 'no'} point(s); measured where stored (backend {backend})")
        cfg = make_config(args.algo or "dqn", args.env or "CartPole-v1")
    elif args.curves:
        curves = read_table(Path(args.curves), SCALING_COLUMNS, SCALING_WHAT, label=f"--curves {args.curves}")
        for flag, col in (("algo", "algo"), ("env", "env")):   # the curves say what they were measured on
            found = sorted(curves[col].dropna().unique()) if col in curves else []
            if bad := [v for v in found if not ENV_ID.fullmatch(v)]:
                raise UsageError(f"--curves {args.curves}: column {col!r} holds {bad[0]!r}, not an environment or "
                                 "algorithm name (letters, digits and the characters _.:/-)")
            given = getattr(args, flag)
            if given is not None and found and found != [given]:
                raise UsageError(f"--{flag} {given}: the curves in {args.curves} were measured with "
                                 f"{col} {', '.join(found)}; measure {given}'s curves (python -m "
                                 f"pal_bench.studies.scaling --{flag} {given}) or drop --{flag}")
            if given is None and len(found) == 1:
                setattr(args, flag, found[0])
        # curves written before the backend column are the thread backend's
        found = sorted(curves.backend.dropna().unique()) if "backend" in curves else ["threads"]
        if args.backend:
            if "backend" in curves:
                curves = curves[curves.backend == args.backend]
            if args.backend not in found:
                print(f"pal-bench dse: {args.curves} holds curves of backend {', '.join(found)}, "
                      f"not {args.backend}", file=sys.stderr)
                return 2
            backend = args.backend
        elif len(found) == 1:
            backend = found[0]
        elif DSE_BACKEND in found:
            backend = DSE_BACKEND
            curves = curves[curves.backend == backend]
        else:
            print(f"pal-bench dse: {args.curves} holds curves of backends {', '.join(found)}: choose one with "
                  "--backend", file=sys.stderr)
            return 2
        print(f"curves: {args.curves} (backend {backend})")
        cfg = make_config(args.algo, args.env)
    else:
        backend = args.backend or DSE_BACKEND
        if refuse_if_busy("pal-bench dse (measuring the curves)", args.force):
            return 2
        cfg = make_config(args.algo or "dqn", args.env or "CartPole-v1", backend=backend, **_placement(backend))
        from pal_bench.studies.scaling import measure as scaling  # (torch: imported only to measure)

        curves = scaling.sweep(cfg, m, args.steps, args.updates, progress=lambda msg: print(msg, file=sys.stderr))
        print(f"curves: measured now (backend {backend})")
    args.algo, args.env = cfg.algo, cfg.env
    ratio = args.ratio or cfg.updates_per_step
    if backend != cfg.backend:       # --validate runs the backend the curves came from
        cfg = make_config(args.algo, args.env, backend=backend, **_placement(backend))
    f_a = dict(zip(curves[curves.curve == "f_a"].threads, curves[curves.curve == "f_a"].throughput))
    f_l = dict(zip(curves[curves.curve == "f_l"].threads, curves[curves.curve == "f_l"].throughput))
    try:
        best, table, frontier = solve(f_a, f_l, ratio, m)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ranked = table.sort_values("transitions_per_s", ascending=False)
    if args.predict:
        ranked = ranked.assign(source=[
            "predicted" if f"f_a({a})" in predicted or f"f_l({b})" in predicted else "measured"
            for a, b in zip(ranked.actors, ranked.learners)])
        if args.validate:
            raise UsageError("--predict chooses among splits this machine cannot run; --validate runs them: "
                             "use one or the other")
    print(ranked.head(40).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"\nchosen split for M={m}, {ratio:g} updates per transition: {best.actors} actor(s) + {best.learners} "
          f"learner(s): {best.transitions_per_s:.0f} transitions/s, {best.updates_per_s:.0f} updates/s "
          f"(limited by the {best.bottleneck})")
    print(best.command(args.algo, args.env, ratio) + (f" --backend {backend}" if backend != "threads" else ""))
    fig_path = args.out / "figures" / "dse.png"
    fig_path.parent.mkdir(parents=True, exist_ok=True)
    if args.validate:
        if refuse_if_busy("pal-bench dse --validate", args.force):
            return 2
        validated = Conditions("core-split validation")
        splits = list(zip(table.actors, table.learners))
        from pal_bench.studies.scaling import measure as scaling

        with scaling.ray_session(cfg):      # Ray: one session for every split
            measured = scaling.measure_splits(cfg, splits, args.validate,
                                              progress=lambda msg: print(msg, file=sys.stderr),
                                              repeats=args.repeats)
        v = table.merge(measured, on=["actors", "learners"])
        v["predicted_rank"] = v.transitions_per_s.rank(ascending=False, method="min").astype(int)
        v["chosen"] = (v.actors == best.actors) & (v.learners == best.learners)
        args.out.mkdir(parents=True, exist_ok=True)
        v.to_csv(args.out / "dse_validation.csv", index=False, float_format="%.2f")
        validated.write(args.out / "dse_validation.csv")
        print(validation_text(v))
    print(f"figure: {draw(table, frontier, best, fig_path, measured)}")
    return 0


def add_arguments(d: argparse.ArgumentParser) -> None:
    """``pal-bench dse``'s flags."""
    from pal_bench.train.config import FIELD_RANGES

    ratio = Range(RATIO_MIN, FIELD_RANGES["updates_per_step"].hi)
    d.add_argument("--algo", help="algorithm of the curves and of the suggested command (default: the curves' "
                                  "algo column, else dqn)")
    d.add_argument("--env", help="environment (default: the curves' env column, else CartPole-v1)")
    d.add_argument("--out", type=Path, default=Path(DSE_OUT),
                   help=f"where the figure (figures/dse.png) and --validate's dse_validation.csv go (default: "
                        f"{DSE_OUT}/ in the current directory; the Makefile passes --out results)")
    d.add_argument("--ratio", type=number(ratio, float),
                   help=f"learner updates per collected transition (the config's updates_per_step), {ratio} "
                        "(default: the algorithm's config)")
    d.add_argument("--max-cores", type=number(Range(2, WORKERS.hi)),
                   help="core budget M, at least 2: one actor and one learner (default: usable cores)")
    d.add_argument("--curves", help="stored f_a/f_l curves (results/scaling.csv, scaling_processes.csv, "
                                    "scaling_ray.csv); default: measure them now")
    d.add_argument("--backend", choices=["threads", "processes", "ray", *PREDICT_ONLY],
                   help="the backend whose curves to use (a CSV holding both), to measure, and to --validate "
                        "(default: the one in --curves, else processes; "
                        f"{', '.join(PREDICT_ONLY)}: with --predict only)")
    d.add_argument("--steps", type=positive_int, default=20_000, help="transitions per f_a point when measuring")
    d.add_argument("--updates", type=positive_int, default=1_000, help="updates per f_l point when measuring")
    d.add_argument("--predict", action="store_true",
                   help="choose from the simulation's predicted curves (`pal-bench simulate`), measured points "
                        "taking their place where stored: for a --max-cores this machine does not have")
    d.add_argument("--measured", help="stored validation (results/dse_validation.csv) to draw on the figure")
    d.add_argument("--validate", type=nonneg_int, metavar="STEPS", default=0,
                   help="also run the trainer at every split for STEPS transitions and compare "
                        "(results/dse_validation.csv)")
    d.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="--validate in R rounds (every split once per round), medians per split (default 1)")
    add_force_flag(d)


