"""The simulation's publication (docs/simulation.md): its measured inputs, the leave-one-out check against every
stored point, the predicted curves and core splits, and the sensitivity of the largest prediction."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.argtypes import Range
from pal_bench.bench.publishing import Publication, code, esc, md, missing, source
from pal_bench.stored_tables import read_csv

INPUT_UNITS = {
    "threads.act_us": "inference per env step, thread actor (µs)", "threads.env_us": "env step, thread actor (µs)",
    "threads.insert_us": "buffer insert per env step, thread actor (µs)",
    "threads.insert_call_us": "of which per add_batch call, thread actor (µs)",
    "processes.act_us": "inference per env step, actor process (µs)",
    "processes.env_us": "env step, actor process (µs)",
    "processes.insert_us": "buffer insert per env step, actor process (µs)",
    "processes.insert_call_us": "of which per add_batch call, actor process (µs)",
    "sample_us": "sample one batch (µs)", "grad_us": "forward/backward one batch (µs)",
    "prio_us": "priority update one batch (µs)", "apply_us": "optimizer step and weights (µs)",
    "insert_lock_us": "lock held per inserted row (µs)", "insert_lock_call_us": "lock held per add_batch call (µs)",
    "sample_lock_us": "lock held per sample (µs)",
    "prio_lock_us": "lock held per priority update (µs)", "weight_bytes": "online + target weights (bytes)",
    "publish_us": "publish one weights version (µs)", "pull_us": "read one weights version into an actor (µs)",
    "mem_bw_core": "copy bandwidth, one core (GB/s)", "mem_bw_total": "copy bandwidth, every core (GB/s)",
    "gil.act": "GIL share of inference", "gil.env": "GIL share of the env step", "gil.sample": "GIL share of sample",
    "gil.grad": "GIL share of forward/backward", "gil.apply": "GIL share of the optimizer step",
    "speedup2.act": "inference on 2 threads / 1", "speedup2.env": "env step on 2 threads / 1",
    "speedup2.insert": "one-row insert on 2 threads / 1",
    "speedup2.sample": "sample on 2 threads / 1", "speedup2.grad": "forward/backward on 2 threads / 1",
    "speedup2.apply": "optimizer step on 2 threads / 1", "speedup2.load": "snapshot load on 2 threads / 1",
    "gil_handoff.act": "GIL handoff, inference (µs)", "gil_handoff.insert": "GIL handoff, insert (µs)",
    "gil_handoff.grad": "GIL handoff, forward/backward (µs)",
    "gil_handoff.apply": "GIL handoff, optimizer step (µs)", "gil_handoff.load": "GIL handoff, snapshot load (µs)",
    "snapshot_load_us": "load the server's snapshot into a thread's networks (µs)",
    "ray_call_us": "one Ray remote call, round trip (µs)",
    "lp.process_us": "learner process: weights pull and gradient publish per update (µs)",
    "lp.handoff_us": "learner process: one crossing to or from its proxy thread (µs)",
    "lp.driver_us": "learner process: the proxy's gradient read per update (µs)",
    "ray_call_cpu_us": "the node's CPU per Ray call, every process (µs)",
    "ray.learner_remote_us": "Ray learner: wait per update beyond its own work (µs)",
    "ray.learner_remote_cpu_us": "Ray learner: the node's CPU per update beyond its own work (µs)",
    "corun_slowdown": "one core's slowdown with every core busy",
    "ps_grad_us": "parameter server: average in one gradient (µs)",
}


def _simulated(results: Path, *names: str) -> str:
    """The caption's last line of a simulated table: its files, and the measured inputs it was simulated from."""
    files = ", ".join(code(f"results/{n}") for n in names)
    return f"Simulated ({files}) from the measured inputs. " + source(results, "simulation_inputs.csv")


def inputs_block(results: Path) -> str:
    name = "simulation_inputs.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench simulate --measure-inputs")
    df = read_csv(results / name)
    rows = []
    for col, what in INPUT_UNITS.items():
        if col in df and df[col].notna().any():
            v = df[col] / (1e9 if col.startswith("mem_bw") else 1)
            rows.append({"input": what, "median": v.median(), "range over rounds": f"{v.min():.3g}-{v.max():.3g}"})
    return (f"The model's inputs as measured ({len(df)} rounds): per-phase costs from the trainer's own profile at "
            "one worker, the buffer lock's holds from its `lock_stats`, probes for the rest.\n\n"
            + md(pd.DataFrame(rows), ".3g") + "\n\n" + source(results, name) + "\n")


def _published_validation() -> dict:
    from pal_bench.stored_tables import THROUGHPUT, Column
    from pal_bench.studies.simulate.validate import VALIDATION_COLUMNS

    nan = float("nan")
    return VALIDATION_COLUMNS | {
        "backend": Column(str), "curve": Column(str), "aggregation": Column(str, required=False, default="sync"),
        "measured": Column(float, THROUGHPUT), "predicted": Column(float, Range(0, 1e12), required=False, default=nan),
        "lo90": Column(float, Range(0, 1e12), required=False, default=nan),
        "hi90": Column(float, Range(0, 1e12), required=False, default=nan),
        "covered": Column(str, required=False, default=""),
        "oversubscribed": Column(bool, required=False, default=False),
        "repeats": Column(int, Range(0, 10**6), required=False, default=0),
        **{k: Column(float, Range(0, 1e12), required=False, default=nan) for k in ("measured_lo", "measured_hi")},
        "beyond_repeats": Column(float, Range(-1, 1e6), required=False, default=nan)}


def validation_block(results: Path) -> str:
    from pal_bench.stored_tables import read_table
    from pal_bench.studies.simulate.validate import summary

    columns = _published_validation()
    name = "simulation_validation.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench simulate --validate")
    v = read_table(results / name, columns, "the validation `pal-bench simulate --validate` writes")
    v["covered"] = v.covered.fillna("")
    v["split"] = [f"{int(r.actors)} + {int(r.learners)}" if r.curve == "end_to_end" else
                  str(int(r.actors or r.learners)) for r in v.itertuples()]
    t = pd.DataFrame({"set": v.set, "backend": v.backend, "curve": v.curve, "workers": v.split,
                      "aggregation": v.aggregation, "measured": v.measured,
                      "its repeats": [f"{lo:.0f}-{hi:.0f}" if n >= 2 else "" for lo, hi, n in
                                      zip(v.measured_lo, v.measured_hi, v.repeats)],
                      "predicted": v.predicted,
                      "stated 90%": [f"{lo:.0f}-{hi:.0f}" if pd.notna(lo) else "" for lo, hi in zip(v.lo90, v.hi90)],
                      "error": [f"{e:+.0%}" if pd.notna(e) else c for e, c in zip(v.error, v.covered)],
                      "oversubscribed": v.oversubscribed.map({True: "yes", False: ""})})
    s = summary(v)

    def pct(x, fmt=".0%") -> str:
        return format(x, fmt) if pd.notna(x) else ""

    def figures(name_: str, over: str, f: dict) -> dict:
        return {"set": name_, "over": over, "points": f["points"], "median |error|": pct(f["median_abs_error"]),
                "worst |error|": pct(f["worst_abs_error"]), "bias (signed mean)": pct(f["bias"], "+.0%"),
                "inside stated 90%": pct(f["coverage"])}

    def against_repeats(name_: str, over: str, f: dict) -> dict:
        return {"set": name_, "over": over, "points measured 2+ times": f["with_repeats"],
                "repeats' spread, median (worst)": (f"{f['median_repeat_spread']:.2f}x "
                                                    f"({f['worst_repeat_spread']:.2f}x)"),
                "prediction inside its repeats": pct(f["inside_repeats"]),
                "a right model's chance": pct(f["inside_repeats_if_right"]),
                "median |beyond its repeats|": pct(f["median_abs_beyond_repeats"]),
                "worst |beyond its repeats|": pct(f["worst_abs_beyond_repeats"]),
                "median |error|": pct(f["median_abs_error"])}

    rows, reps = [], []
    for name_ in ("development", "holdout"):
        f = s[name_]
        groups = [("all", f), *f["per_backend"].items(), *f["per_curve"].items(),
                  *f.get("per_condition", {}).items()]
        rows += [figures(name_, over, g) for over, g in groups]
        reps += [against_repeats(name_, over, g) for over, g in groups if g.get("with_repeats", 0) >= 1
                 and g["with_repeats"] == g["points"]]
    return ("Every stored point on 1-3 workers predicted with itself left out of the fit (signed error, "
            "(predicted - measured) / measured; a one-worker point is predicted from the measured phase costs "
            "alone). Two sets: **development**, the points the model's structure was revised against, and "
            "**holdout**, measured in one sitting after the last model change (`pal-bench simulate "
            "--measure-holdout`) and never used to change it. The stated 90% interval combines inputs resampled "
            "from the measured rounds with the model's own error on the development set's multi-worker points "
            "(their relative residuals, a development point's own left out).\n\n"
            + md(t, '.0f') + "\n\nOver the multi-worker points (2 or more workers; one-worker points are the "
            "fit):\n\n" + md(pd.DataFrame(rows)) + _repeats_part(reps)
            + f"\n\n{s['not_covered']} points not covered by the model (reason in "
            "the error column).\n\n" + _simulated(results, name) + "\n")


def _repeats_part(rows: list[dict]) -> str:
    """The validation's figures against the points' own repeats (only where every point of a group has them)."""
    if not rows:
        return ""
    return ("\n\nAgainst the measurements' own spread (the groups whose every point was measured 2 or more times, "
            "the repeats of one sitting): how far each prediction lies outside the range of its point's repeats "
            "(0 inside; relative to the nearest repeat). A model that predicted each point's true median exactly "
            "would be inside the range of n independent repeats with probability 1 - 2 x 0.5^n (75% for 3: \"a "
            "right model's chance\", averaged over the group's points; the repeats of one sitting drift together, so "
            "it is an upper mark):\n\n"
            + md(pd.DataFrame(rows)))


def predictions_block(results: Path) -> str:
    files = sorted(results.glob("simulation_*.csv"))
    from pal_bench.studies.simulate.model import BACKENDS

    stems = {b.replace("-", "_") for b in BACKENDS}
    files = [f for f in files if f.stem.split("_", 1)[1] in stems]
    if not files:
        return missing("simulation_processes.csv", f"pal-bench simulate --backend {','.join(BACKENDS)}")
    rows = []
    for f in files:
        df = read_csv(f)
        for n in (8, 16, 32, 64):
            at = df[df.cores == n].set_index("curve")
            if "end_to_end" not in at.index:
                continue
            e = at.loc["end_to_end"]
            band = lambda r: (f"{r.lo90:.0f}-{r.hi90:.0f}" if "lo90" in r and pd.notna(r.lo90)   # noqa: E731
                              else "")
            rows.append({"backend": e.backend, "cores": n, "f_a": at.loc["f_a"].predicted,
                         "f_a interval": band(at.loc["f_a"]), "f_l": at.loc["f_l"].predicted,
                         "f_l interval": band(at.loc["f_l"]), "split (actors + learners)":
                         f"{int(e.actors)} + {int(e.learners)}", "env steps/s": e.predicted,
                         "interval": band(e), "limit": "; ".join(x for x in at.limit.fillna("") if x)})
    return ("Predicted (not measured): f_a (env steps/s, actors only), f_l (updates/s, learners only) and the whole "
            "trainer at the split the paper's exhaustive search picks from the predicted curves (0.25 updates per "
            "env step); intervals: the stated 90% interval, inputs resampled from the measured rounds combined with "
            "the model's own error on the development set (docs/simulation.md); limit: a "
            "shared resource held 85% of the run or more (the prediction is past its knee).\n\n"
            + md(pd.DataFrame(rows), ".0f") + "\n\n" + _simulated(results, *(f.name for f in files)) + "\n")


def sensitivity_block(results: Path) -> str:
    name = "simulation_sensitivity.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench simulate --sensitivity 64 --backend threads,processes,learner-processes")
    df = read_csv(results / name)
    parts = []
    for (b, n), d in df.groupby(["backend", "cores"], sort=False):
        d = d.drop(columns=["backend", "cores"])
        if "kind" in d:                                 # the largest measured ones, and every chosen parameter
            d = pd.concat([d[d.kind == "measured"].head(5), d[d.kind == "chosen"]])
        t = d.head(12).copy()
        for c in [c for c in t.columns if c.endswith("change")]:
            t[c] = t[c].map(lambda x: f"{x:+.1%}")
        parts.append(f"{esc(b)}, {esc(n)} cores: the change in each prediction for +10% on one input (the five "
                     "measured inputs that move it most, then every chosen parameter).\n\n" + md(t))
    return "\n\n".join(parts) + "\n\n" + _simulated(results, name) + "\n"


def design_block(results: Path) -> str:
    name = "simulation_design.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench simulate --design")
    df = read_csv(results / name)
    parts = []
    for q, d in df.groupby("question", sort=False):
        t = pd.DataFrame({"variant": d.variant, "workers": [f"{a} actors" if m != "f_l" else f"{lr} learners"
                                                            for a, lr, m in zip(d.actors, d.learners, d["mode"])],
                          "throughput": d.throughput, "busiest resource": [f"{b} {s:.0%}" for b, s in
                                                                           zip(d.busiest, d.busiest_share)]})
        parts.append(f"**{esc(q)}** (simulated; env steps/s for f_a, updates/s for f_l)\n\n" + md(t, ".0f"))
    return "\n\n".join(parts) + "\n\n" + _simulated(results, name) + "\n"


def candidate_block(results: Path) -> str:
    """The cheapest design candidate measured on this machine's cores beside the model's prediction."""
    from pal_bench.bench.stats import fmt_ci, median_ci, ratio_ci

    name = "simulation_candidate.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench simulate --candidate")
    df = read_csv(results / name)
    groups = dict(list(df.groupby("variant", sort=False)))
    rows = [{"variant": v, "measured f_a (median [95% CI])": fmt_ci(*median_ci(d.measured), 0),
             "simulated f_a": d.simulated.iloc[0]} for v, d in groups.items()]
    (base, b), (other, o) = list(groups.items())[:2]
    measured = fmt_ci(*ratio_ci(o.measured, b.measured), 3)
    simulated = o.simulated.iloc[0] / b.simulated.iloc[0]
    return (f"f_a (env steps/s) of {int(df.actors.iloc[0])} actor processes on {int(df.cores.iloc[0])} cores, "
            f"measured in {df['round'].nunique()} interleaved rounds, beside the model's prediction for the same "
            f"workload.\n\n{md(pd.DataFrame(rows), '.0f')}\n\n{esc(other)} against {esc(base)}: measured "
            f"{measured}x (ratio of medians, bootstrap interval), simulated {simulated:.3f}x.\n\n"
            + source(results, name) + "\n")


def outputs(results: Path, figures: bool) -> list[Path]:
    if not figures:
        return []
    from pal_bench.studies.simulate.figures import draw_predictions
    from pal_bench.studies.simulate.model import BACKENDS

    out = []
    for b in BACKENDS:
        path = results / f"simulation_{b.replace('-', '_')}.csv"
        if path.exists():
            out.append(draw_predictions(read_csv(path), results, b))
    return out


PUBLICATION = Publication("simulate", {
    "simulation-inputs": inputs_block,
    "simulation-validation": validation_block,
    "simulation-predictions": predictions_block,
    "simulation-sensitivity": sensitivity_block,
    "simulation-design": design_block,
    "simulation-candidate": candidate_block,
}, outputs)
