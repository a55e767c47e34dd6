"""Ray actors' learners at one and two, in one sitting (issue 50): is the model's miss on them (two learners
predicted at 131 updates/s against 149-172 measured) its structure, or the sitting its inputs were measured in?

The model charges each Ray learner update the machine CPU measured per update at one learner (``inputs.ray_costs``:
every process, from ``/proc/stat``); with two learners that CPU fills the two cores. This probe measures, interleaved
in each round (the order rotated round by round), ``run_learners`` of the Ray backend (the buffer and
parameter-server actors, no actors, a filled buffer) at each count of ``--learners`` (default 1 and 2), each in its
own Ray session, and per run: updates/s, the machine's busy cores over the run, the machine CPU per update (µs),
the learners' own work per update (sample, forward/backward, priority update: µs, from their phase timers) and what
is left of each beyond it: a learner's wait per update (``remote_us``: one learner's wall per update, wall x learners
/ updates, less its own work) and the CPU per update behind it (``remote_cpu_us``). The one-learner figures are the
inputs' ``ray.learner_remote_us``, ``ray.learner_remote_cpu_us`` and ``ray.f_l_1``, measured the same way.

``python -m pal_bench.studies.simulate.ray_learners [--updates N] [--learners 1,2] [--rounds N] [--out DIR]
[--force]`` writes ``DIR/simulation_ray_learners.csv`` (one row per round and learner count) with its
``.meta.json``, only on a quiet machine (``--force``: anyway, marked noisy). ``--model`` measures nothing: it predicts
each stored round's runs twice, from the stored inputs as measured (``simulation_inputs.csv`` in ``--out``, their
medians; no fit) and from the same inputs fitted to the round's own one-learner updates/s (``calibrate.fit``, as the
validation fits Ray's points to theirs: one learner is then right by construction, and two learners test the
model's step from one to two inside one sitting), and prints the errors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from pal_bench.argtypes import Range, number
from pal_bench.paths import RESULTS

FILE = "simulation_ray_learners.csv"
MAX_LEARNERS = 8
SETTLE_S = 30.0        # longest wait after a run for its Ray session's processes to be gone


def ray_processes() -> set[int]:
    """Live processes of a local Ray session (its raylet, GCS and workers), by their command line (``/proc``)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"raylet" in cmd or b"gcs_server" in cmd or b"default_worker" in cmd:
                out.add(int(d.name))
    return out


def learners_run(learners: int, updates: int, filled: int = 20_000, cfg=None) -> dict:
    """One ``run_learners`` of the Ray backend (its actors placement) with ``learners`` learners on a buffer filled
    with ``filled`` real CartPole transitions, in its own Ray session: ``inputs.learner_costs`` and ``updates``.
    Returns once the session's processes are gone (at most ``SETTLE_S`` later), so the next run has the machine;
    ``settle_s`` (s) says how long that took."""
    from pal_bench.studies.scaling.measure import quiet, ray_session, transitions
    from pal_bench.studies.simulate.inputs import learner_costs
    from pal_bench.train import make_config, make_trainer

    cfg = cfg or make_config("dqn", "CartPole-v1")
    before = ray_processes()
    with tempfile.TemporaryDirectory(prefix="pal-ray-learners-") as d:
        c = quiet(cfg, d, backend="ray", ray_placement="pack", actors=1, learners=learners, aggregation="sync",
                  buffer_capacity=max(cfg.buffer_capacity, filled))
        with ray_session(c), make_trainer(c) as tr:
            got = tr.run_learners(transitions(tr, filled), updates)
    t0 = time.monotonic()
    while ray_processes() - before and time.monotonic() - t0 < SETTLE_S:
        time.sleep(0.2)
    return {"updates": got["updates"], **learner_costs(got, learners), "settle_s": time.monotonic() - t0}


def measure(updates: int = 600, learners=(1, 2), rounds: int = 5, progress=print, run=None):
    """Every learner count in ``rounds`` rounds, the order rotated each round: one row per round and count (a pandas
    DataFrame; a run that fails is recorded with its ``error`` and the others go on). ``run(learners, updates)``:
    what measures one (the tests' seam; default ``learners_run``)."""
    import pandas as pd

    run = run or learners_run
    counts = list(learners)
    rows = []
    for r in range(rounds):
        order = counts[r % len(counts):] + counts[:r % len(counts)]
        for k, n in enumerate(order, 1):
            progress(f"[ray learners round {r + 1}/{rounds}, {k}/{len(order)}] {n} learner(s) ...")
            try:
                got = run(n, updates)
            except Exception as e:                      # noqa: BLE001 - recorded; the other runs go on
                got = {"error": f"{type(e).__name__}: {e}"}
                progress(f"  failed: {got['error']}")
            rows.append({"round": r, "learners": n, **got})
    return pd.DataFrame(rows)


def against_the_model(results: Path = RESULTS):
    """The stored rounds against the model: each run of ``n`` learners simulated as the validation simulates Ray's
    f_l (``validate.workload``, on the inputs' cores), from the stored inputs' medians in ``results`` as measured
    (``stored``: no fit) and fitted to the round's one-learner updates/s (``fitted``: ``calibrate.fit``, as the
    validation fits Ray's points to the development set's f_l(1)). Returns (one row per run compared: measured, both
    predictions and their signed errors, (predicted - measured) / measured, a pandas DataFrame; the rows left out,
    each with why). A file with a (round, learners) twice is refused (``UsageError`` naming it)."""
    import pandas as pd

    from pal_bench.argtypes import UsageError
    from pal_bench.stored_tables import THROUGHPUT, Column, read_table
    from pal_bench.studies.simulate.calibrate import fit, inputs_for, median_inputs
    from pal_bench.studies.simulate.model import throughput
    from pal_bench.studies.simulate.stored import require_inputs
    from pal_bench.studies.simulate.validate import LEARNING, workload

    us = Range(0, 10**7)
    columns = {"round": Column(int, Range(0, 1000)), "learners": Column(int, Range(1, MAX_LEARNERS)),
               "updates_per_s": Column(float, THROUGHPUT, required=False),
               "remote_us": Column(float, us, required=False), "remote_cpu_us": Column(float, us, required=False)}
    path = results / FILE
    df = read_table(path, columns, what="the Ray learners probe's rows")
    for name in ("updates_per_s", "remote_us", "remote_cpu_us"):       # optional: absent reads as not measured
        if name not in df:
            df[name] = float("nan")
    twice = df[df.duplicated(["round", "learners"])]
    if len(twice):
        r = twice.iloc[0]
        raise UsageError(f"{path}: round {r['round']} has {r.learners} learner(s) more than once")
    base = median_inputs(require_inputs(results))
    cores = int(base["cores"])
    stored = inputs_for(base, "ray")
    out, left_out = [], []
    for r, g in df.groupby("round"):
        one = g[(g.learners == 1)].updates_per_s.dropna()
        if one.empty:
            left_out += [(r, n, "no one-learner updates/s in its round to fit to") for n in g.learners]
            continue
        fitted = fit(stored, "ray", None, float(one.iloc[0]), cores, LEARNING)[0]
        for run in g.itertuples():
            if pd.isna(run.updates_per_s):
                left_out.append((r, run.learners, "no updates/s (the run failed)"))
                continue
            point = SimpleNamespace(backend="ray", curve="f_l", actors=1, learners=int(run.learners),
                                    aggregation="sync", steps=0)
            got = {name: throughput(inp, workload(point, cores)) for name, inp in
                   (("stored", stored), ("fitted", fitted))}
            out.append({"round": r, "learners": run.learners, "measured": run.updates_per_s,
                        **{f"predicted_{k}": v for k, v in got.items()},
                        **{f"error_{k}": (v - run.updates_per_s) / run.updates_per_s for k, v in got.items()}})
    cols = ["round", "learners", "measured", "predicted_stored", "predicted_fitted", "error_stored", "error_fitted"]
    return pd.DataFrame(out, columns=cols), pd.DataFrame(left_out, columns=["round", "learners", "why"])


def main(argv: list[str] | None = None) -> int:
    from pal_bench.argtypes import UsageError, number_list
    from pal_bench.studies.simulate.gil_wake import measure_and_write, output_target

    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.simulate.ray_learners", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=number(Range(10, 10**6)), default=600, help="updates per run (default 600)")
    ap.add_argument("--learners", type=number_list(Range(1, MAX_LEARNERS)), default=[1, 2],
                    help="learner counts, comma-separated (default 1,2; 1 is what the model is set against)")
    ap.add_argument("--rounds", type=number(Range(1, 100)), default=5, help="rounds of every count (default 5)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"folder for {FILE}")
    ap.add_argument("--force", action="store_true", help="measure on a busy machine too (marked noisy)")
    ap.add_argument("--model", action="store_true",
                    help="measure nothing: the stored measurement (in --out) against the model, round by round")
    args = ap.parse_args(argv)
    if 1 not in args.learners:
        ap.error("--learners must include 1: each round's other counts are set against its one-learner run")
    if args.model:
        try:
            df, left_out = against_the_model(args.out)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if len(df):
            print(df.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
        for n, g in df.groupby("learners"):
            print(f"{n} learner(s): {len(g)} rounds, measured {g.measured.min():,.0f}-{g.measured.max():,.0f} "
                  f"updates/s; stored inputs {g.error_stored.min():+.1%} to {g.error_stored.max():+.1%}, "
                  f"fitted to the round's one learner {g.error_fitted.min():+.1%} to {g.error_fitted.max():+.1%} "
                  f"(median {g.error_fitted.median():+.1%})")
        for row in left_out.itertuples():
            print(f"left out: round {row.round}, {row.learners} learner(s): {row.why}")
        if df.empty:
            print(f"error: no run in {args.out / FILE} could be compared", file=sys.stderr)
            return 2
        return 0
    try:
        import ray  # noqa: F401 - the probe measures Ray
    except ImportError:
        print("error: Ray is not installed here: nothing to measure", file=sys.stderr)
        return 2
    target = output_target(ap, args.out, FILE)
    return measure_and_write("ray_learners", "Ray learners probe", target, args.force, argv,
                             lambda: measure(args.updates, sorted(set(args.learners)), args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
