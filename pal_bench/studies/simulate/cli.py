"""``pal-bench simulate``: measure the model's inputs, check the model against every stored measurement, and
predict the trainer past the cores this machine has.

    pal-bench simulate --measure-inputs                 # results/simulation_inputs.csv (about 2 min a round)
    pal-bench simulate --validate                       # results/simulation_validation.csv
    pal-bench simulate --backend processes --cores 1-64 # results/simulation_processes.csv + figure
    pal-bench simulate --sensitivity 64                 # results/simulation_sensitivity.csv
    pal-bench simulate --design                         # results/simulation_design.csv
    pal-bench simulate --measure-holdout                # results/simulation_holdout.csv (about 10 min)
    pal-bench simulate --check-here                     # results/simulation_check_<host>.csv (<= 15 min on 2 cores)

The predictions use the stored inputs (a missing inputs file is an error naming the command that measures them)
and the one-worker points of the stored scaling CSVs (the model's one fit, ``calibrate.fit``); their intervals
use the development residuals of ``simulation_validation.csv``. Every stored file is checked before anything is
simulated (``calibrate.INPUT_COLUMNS``, ``stored_tables``): a bad one is one line naming it, exit status 2. Every
file ``simulate`` writes gets its ``.meta.json``: the conditions of what it measured, or for what it simulated the
commit, the command and the files it was computed from with their commits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import CORES, WORKERS, choice_list, int_ranges, number, positive_int
from pal_bench.paths import RESULTS
from pal_bench.studies.simulate.model import BACKENDS
from pal_bench.studies.simulate.predict import DEFAULT_CORES, cores_type
from pal_bench.studies.simulate.stored import INPUTS, VALIDATION, dev_residuals, require_inputs, write_csv


def one_worker_points(results: Path, backend: str) -> dict:
    """The stored one-worker f_a and f_l of ``backend`` (the fit's targets; empty where none are stored)."""
    from pal_bench.studies.simulate.validate import SCALING, read_scaling

    path = results / SCALING[backend]
    if not os.path.lexists(path):
        return {}
    df = read_scaling(path)
    one = df[(df.threads == 1) & (df.get("env_backend", "sync") == "sync")]
    return {c: float(one[one.curve == c].throughput.iloc[0]) for c in ("f_a", "f_l") if (one.curve == c).any()}


def prepare_out(ap, out: Path) -> None:
    """``--out`` made a directory before anything is measured or simulated (a long measurement is not lost at
    write time): something there that is not a directory, or one that cannot be made, is an argument error."""
    if os.path.lexists(out) and not out.is_dir():
        ap.error(f"argument --out: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"argument --out: {out}: cannot make the directory ({e.strerror or e})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", type=choice_list(BACKENDS),
                    help=f"comma list of {', '.join(BACKENDS)} (default processes; with --check-here threads,"
                         "processes)")
    ap.add_argument("--cores", type=cores_type, default=DEFAULT_CORES,
                    help=f"core counts to predict, e.g. 1-64 or 1,2,4, each {CORES} (default {DEFAULT_CORES})")
    ap.add_argument("--samples", type=positive_int, default=10,
                    help="resampled inputs per prediction, for its interval (default 10)")
    ap.add_argument("--measure-inputs", action="store_true", help="measure the inputs (and store them)")
    ap.add_argument("--rounds", type=positive_int,
                    help="input measurement rounds (default 3; with --check-here 1)")
    ap.add_argument("--validate", action="store_true", help="predict every stored point, each left out of the fit")
    ap.add_argument("--sensitivity", type=number(CORES), metavar="CORES",
                    help=f"which input moves the prediction at CORES most ({CORES})")
    ap.add_argument("--design", action="store_true",
                    help="the design at scale: the buffer's lock at 64 actors (batched inserts, shards, seqlock "
                         "samplers), 16 learners (parameter server or all-reduce), Ray on 1-8 nodes")
    ap.add_argument("--candidate", action="store_true",
                    help="measure the cheapest design candidate (batched inserts) on this machine's cores beside its "
                         "prediction (results/simulation_candidate.csv; quiet machine, about 2 min)")
    ap.add_argument("--measure-holdout", action="store_true",
                    help="measure the held-out set (every backend at 2-3 workers, one sitting; quiet machine, about "
                         "10 min): results/simulation_holdout.csv, never used to change the model")
    ap.add_argument("--check-here", action="store_true",
                    help="measure inputs and a sparse set of points on this machine and predict each from them: "
                         "results/simulation_check_<host>.csv (about 2 min on 2 cores)")
    ap.add_argument("--threads", type=int_ranges(WORKERS), metavar="LIST",
                    help="with --check-here: worker counts (default 1, 2, 4, ... up to the usable cores)")
    ap.add_argument("--steps", type=positive_int, default=20_000,
                    help="with --check-here / --measure-holdout: env steps per f_a and end-to-end point")
    ap.add_argument("--updates", type=positive_int, default=1_000,
                    help="with --check-here / --measure-holdout: updates per f_l point")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="with --check-here / --measure-holdout: rounds per point (the median is kept)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-figure", action="store_true")
    from pal_bench.conditions import add_force_flag

    add_force_flag(ap)
    args = ap.parse_args(argv)
    backends, cores = args.backend, args.cores
    log = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    prepare_out(ap, args.out)
    if args.rounds is None:
        args.rounds = 1 if args.check_here else 3
    if args.backend is None and not args.check_here:
        args.backend = backends = ["processes"]
    if args.measure_holdout:
        return _holdout(args, log)
    if args.check_here:
        from pal_bench.studies.simulate.check import run_check

        return run_check(args, log)
    # every stored file the command reads, checked before anything is measured or simulated (--measure-inputs
    # replaces the stored inputs: they are not read)
    from pal_bench.studies.simulate.costs import stored_costs

    costs = stored_costs(args.out)                   # (checked before anything is measured, too)
    rounds = None if args.measure_inputs else require_inputs(args.out)
    needed = set(backends) | ({"processes"} if args.design or args.candidate else set())
    points = {b: one_worker_points(args.out, b) for b in BACKENDS if b in needed}
    if args.validate:
        from pal_bench.studies.simulate.validate import measured_points

        measured_points(args.out)
    if args.design:
        from pal_bench.studies.simulate.design import design_inputs

        extra = design_inputs(args.out)
    residuals = None
    if not (args.measure_inputs or args.validate or args.design or args.candidate or args.sensitivity):
        residuals = dev_residuals(args.out)
    if args.measure_inputs:
        rounds = _measure(args, log)
        if rounds is None:
            return 2
        rounds = rounds.assign(**costs)
        if not (args.validate or args.sensitivity or args.design):
            print(rounds.T.to_string())
            return 0
    inputs_file = args.out / INPUTS
    if args.validate:
        from pal_bench.studies.simulate.points import HOLDOUT
        from pal_bench.studies.simulate.validate import END_TO_END, SCALING, summary, validate

        v = validate(args.out, rounds, progress=log, samples=args.samples)
        stored = [args.out / n for n in (*SCALING.values(), *END_TO_END.values(), HOLDOUT) if (args.out / n).exists()]
        write_csv(v, args.out / VALIDATION, sources=(inputs_file, *stored))
        s = summary(v)
        print(v.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        for name in ("development", "holdout"):
            f = s[name]
            print(f"{name}: {f['points']} multi-worker points: median |error| {f['median_abs_error']:.1%}, worst "
                  f"{f['worst_abs_error']:.1%}, bias {f['bias']:+.1%}, 90% interval coverage {f['coverage']:.0%}")
            if f["with_repeats"]:
                print(f"  {f['with_repeats']} measured 2+ times (repeats' spread: median "
                      f"{f['median_repeat_spread']:.2f}x): prediction inside its repeats' range "
                      f"{f['inside_repeats']:.0%}, median |beyond it| {f['median_abs_beyond_repeats']:.1%}")
        print(f"{s['not_covered']} points not covered")
        return 0
    if args.design:
        from pal_bench.studies.simulate.design import design_at_scale
        from pal_bench.studies.simulate.predict import fitted

        inp = fitted(rounds, "processes", points["processes"], int(rounds.cores.iloc[0]))
        df = design_at_scale(inp, args.out, progress=log, extra=extra)
        write_csv(df, args.out / "simulation_design.csv", sources=(inputs_file,))
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        return 0
    if args.candidate:
        return _candidate(args, rounds, points["processes"], log)
    if args.sensitivity:
        from pal_bench.studies.simulate.calibrate import RAY_BACKENDS
        from pal_bench.studies.simulate.predict import fitted, sensitivity

        frames = []
        for b in backends:
            inp = fitted(rounds, b, points[b], int(rounds.cores.iloc[0]))
            idle = "ray_idle_cores" in rounds and b in RAY_BACKENDS        # (then measured: ray_idle)
            frames.append(sensitivity(inp, b, args.sensitivity, measured=("background_cores",) if idle else ())
                          .assign(backend=b, cores=args.sensitivity))
        df = pd.concat(frames, ignore_index=True)
        write_csv(df, args.out / "simulation_sensitivity.csv", sources=(inputs_file,))
        print(df.to_string(index=False, float_format=lambda x: f"{x:+.3f}"))
        return 0
    from pal_bench.studies.simulate.predict import predict

    for b in backends:
        df = predict(rounds, b, cores, points[b], samples=args.samples, progress=log, residuals=residuals)
        path = write_csv(df, args.out / f"simulation_{b.replace('-', '_')}.csv",
                          sources=(inputs_file, args.out / VALIDATION))
        print(df.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
        print(f"wrote {path}")
        if not args.no_figure:
            from pal_bench.studies.simulate.figures import draw_predictions

            print(f"figure: {draw_predictions(df, args.out, b)}")
    return 0


def _candidate(args, rounds: pd.DataFrame, one_worker: dict, log) -> int:
    from pal_bench.conditions import Conditions, refuse_if_busy
    from pal_bench.studies.simulate.design import candidate_check
    from pal_bench.studies.simulate.predict import fitted
    from pal_bench.train import make_config

    if refuse_if_busy("pal-bench simulate --candidate", args.force):
        return 2
    inp = fitted(rounds, "processes", one_worker, int(rounds.cores.iloc[0]))
    with Conditions("simulation candidate (batched inserts, measured)") as c:
        df = candidate_check(inp, make_config("dqn", "CartPole-v1"), progress=log)
    write_csv(df, args.out / "simulation_candidate.csv", c)
    print(df.groupby("variant", sort=False)[["measured", "simulated"]].median().to_string(float_format="%.0f"))
    return 0


def _holdout(args, log) -> int:
    """``--measure-holdout``: the held-out set measured in one sitting (``points.holdout_points``)."""
    from pal_bench.conditions import Conditions, refuse_if_busy
    from pal_bench.studies.simulate.points import HOLDOUT, holdout_points, measure_points

    if refuse_if_busy("pal-bench simulate --measure-holdout", args.force):
        return 2
    with Conditions("simulation held-out points (never used to change the model)") as c:
        df = measure_points(holdout_points(), steps=args.steps, updates=args.updates, repeats=args.repeats,
                            progress=log)
    df["commit"] = c.commit
    path = write_csv(df, args.out / HOLDOUT, c)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    print(f"wrote {path}")
    return 0


def _measure(args, log) -> pd.DataFrame | None:
    from pal_bench.conditions import Conditions, refuse_if_busy
    from pal_bench.studies.simulate.inputs import measure
    from pal_bench.train import make_config

    if refuse_if_busy("pal-bench simulate --measure-inputs", args.force):
        return None
    cfg = make_config("dqn", "CartPole-v1")
    with Conditions("simulation inputs") as c:
        rounds = pd.DataFrame(measure(cfg, args.rounds, progress=log))
    write_csv(rounds, args.out / INPUTS, c)
    return rounds
