"""Every published table, built from stored result files only; ``regenerate`` rewrites the docs' blocks.

README.md and ``docs/*.md`` carry blocks between markers::

    <!-- BEGIN generated:NAME -->
    ...
    <!-- END generated:NAME -->

``regenerate(files, results)`` replaces each block's body with ``TABLES[NAME](results)``; with
``check=True`` it writes nothing and returns the blocks whose committed text differs (a CI test does
that). Each table ends with a line naming its source file(s) and the conditions they were measured
under (machine, date, load before/after, commit; ``pal_bench.bench.conditions``); a result measured at a
1-minute load above half the cores is marked **noisy**. Speedups carry bootstrap 95% intervals
(``pal_bench.bench.stats``) where the repetitions are stored.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from pal_bench.bench import conditions
from pal_bench.bench.stats import fmt_ci, median_ci, ratio_ci

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- BEGIN generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END generated:(?P=name) -->)",
                   re.S)


# ------------------------------------------------------------------ sources and conditions

def git_stamp(path: Path) -> str:
    """'commit abc123 of 2026-12-01': the last commit that stored ``path`` ('' outside git or if untracked)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"stored by commit {out[0]} of {out[1]}" if len(out) == 2 else ""


def source(results: Path, *names: str) -> str:
    """The caption's last line: each source file and its recorded conditions."""
    parts = []
    for name in names:
        path = results / name
        meta = conditions.read_meta(path)
        if meta is None and path.suffix == ".json" and path.exists():
            meta = json.loads(path.read_text()).get("conditions")
        if meta:
            parts.append(f"`results/{name}`: {conditions.describe(meta)}")
        else:       # (no git-derived text here: a generated block must not depend on the clone's history)
            parts.append(f"`results/{name}`: conditions not recorded (measured before they were)")
    return "Source: " + "; ".join(parts) + "."


def is_noisy(results: Path, name: str) -> bool:
    meta = conditions.read_meta(results / name)
    return bool(meta and meta.get("noisy"))


def missing(name: str, command: str) -> str:
    return f"_Not measured yet: `{command}` writes `results/{name}`._\n"


def md(df: pd.DataFrame, floatfmt: str | tuple[str, ...] = ".1f", index: bool = False) -> str:
    """Markdown with missing values left blank; ``floatfmt`` may be one format per column."""
    return df.astype(object).where(df.notna(), None).to_markdown(index=index, floatfmt=floatfmt, missingval="")


# ------------------------------------------------------------------ latency (the buffer suites)

def latency_block(results: Path) -> str:
    """The full latency tables of the suites (pytest-benchmark JSON), with the figures."""
    from pal_bench import report

    try:
        tidy, machine = report.load_all(results)
    except FileNotFoundError:
        return missing("latency_vs_capacity.json", "make bench")
    figs = "\n".join(f"![{n}](../results/figures/{n}.png)" for n in ("latency_vs_capacity", "latency_vs_fanout"))
    files = sorted(f.name for pattern in report.SUITE_FILES for f in results.glob(pattern))
    return figs + "\n\n" + report.tables_markdown(tidy, machine).strip() + "\n\n" + source(results, *files) + "\n"


HEADLINE_OPS = ("insert_one", "insert_batch", "sample_update")


def latency_headline(results: Path) -> str:
    """README's table: PAL's latency and its speedup over each peer at the largest capacity both ran."""
    from pal_bench import report

    path = results / "latency_vs_capacity.json"
    if not path.exists():
        return missing("latency_vs_capacity.json", "make bench")
    df, _ = report.load(path)
    ok = df[df.status == "ok"]
    rows = []
    for op in HEADLINE_OPS:
        pal = ok[(ok.peer == "pal") & (ok.op == op)]
        if pal.empty:
            continue
        for peer in sorted(p for p in ok.peer.unique() if p not in ("pal", "pal-uniform", "pal-tree")):
            theirs = ok[(ok.peer == peer) & (ok.op == op)]
            caps = sorted(set(theirs.capacity) & set(pal.capacity))
            if not caps:
                continue
            n = caps[-1]
            p_us = float(pal[pal.capacity == n].median_us.iloc[0])
            q_us = float(theirs[theirs.capacity == n].median_us.iloc[0])
            rows.append({"operation": report.op_label(op, 256), "peer": peer, "capacity": f"N={report.fmt_n(n)}",
                         "PAL µs": p_us, "peer µs": q_us,
                         "PAL speedup [95% CI]": fmt_ci(*report.speedup_ci(df, peer, op, n), 1)})
    if not rows:
        return missing("latency_vs_capacity.json", "make bench")
    return ("Median latency, full buffer, LunarLander-sized transitions, alpha 0.6, beta 0.4, at the largest capacity "
            "both ran (quick profile: RLlib up to 1e5). Speedup = peer median / PAL median in the same run, with a "
            "bootstrap 95% interval over the timed rounds.\n\n" + md(pd.DataFrame(rows), ".2f") + "\n\n"
            + source(results, "latency_vs_capacity.json") + "\n")


def shared_vs_private_block(results: Path) -> str:
    """PAL's buffer with ``shared=True`` against the private one, per operation: the cost of shared memory."""
    from pal_bench import report

    path = results / "shared_vs_private.json"
    if not path.exists():
        return missing("shared_vs_private.json", "python -m pal_bench.bench.run --suite shared_vs_private")
    df, _ = report.load(path)
    ok = df[df.status == "ok"]
    rows = []
    for (op, n), g in ok.groupby(["op", "capacity"], sort=False):
        mine, ref = g[g.peer == "pal-shared"], g[g.peer == "pal"]
        if mine.empty or ref.empty:
            continue
        a, b = mine.iloc[0], ref.iloc[0]
        ci = (ratio_ci(a.sample_us, b.sample_us) if isinstance(a.sample_us, list) and isinstance(b.sample_us, list)
              else (a.median_us / b.median_us, math.nan, math.nan))
        rows.append({"operation": report.op_label(op, 256), "capacity": f"N={report.fmt_n(n)}",
                     "private µs": b.median_us, "shared µs": a.median_us, "shared / private [95% CI]": fmt_ci(*ci)})
    return ("Single-process latency of PAL's buffer in a shared-memory segment (`shared=True`) against the private "
            "one, same run (target: within 10%).\n\n" + md(pd.DataFrame(rows), ".2f") + "\n\n"
            + source(results, "shared_vs_private.json") + "\n")


def sequence_block(results: Path) -> str:
    """R2D2's batch (64 sequences of 80 steps, sampled and updated): PAL's sequence mode against the same steps
    drawn as transitions and against RLlib's episode buffers, per stored steps."""
    from pal_bench import report

    path = results / "sequence_replay.json"
    if not path.exists():
        return missing("sequence_replay.json", "python -m pal_bench.bench.run --suite sequence_replay")
    df, _ = report.load(path)
    rows = []
    for n, g in df.groupby("capacity", sort=True):
        med = {r.peer: r.median_us for r in g.itertuples() if r.status == "ok"}
        why = {r.peer: r.reason for r in g.itertuples() if r.status != "ok"}
        seq = med.get("pal-seq")
        row = {"stored steps": f"N={report.fmt_n(n)}", "pal-seq µs": seq,
               "pal-transitions µs (5120 steps)": med.get("pal-transitions"),
               "rllib-episode µs": med.get("rllib-episode"),
               "rllib-episode-uniform µs (sample only)": med.get("rllib-episode-uniform")}
        row["transitions / seq"] = med["pal-transitions"] / seq if seq and "pal-transitions" in med else None
        row["rllib / seq"] = med["rllib-episode"] / seq if seq and "rllib-episode" in med else None
        row["rllib uniform / seq"] = (med["rllib-episode-uniform"] / seq if seq and "rllib-episode-uniform" in med
                                      else None)
        row["not run"] = "; ".join(f"{p}: {w}" for p, w in why.items())
        rows.append(row)
    return ("Sample 64 sequences of 80 steps and update their priorities (R2D2's learner step), median µs; "
            "`transitions / seq` is what drawing the same 5120 steps as single transitions costs against one "
            "sequence batch; `rllib uniform / seq` is RLlib's uniform episode buffer sampling the same sequences "
            "(no priorities, no update) against PAL's prioritized sample and update.\n\n"
            + md(pd.DataFrame(rows), ".1f") + "\n\n" + source(results, "sequence_replay.json") + "\n")


def fanout_block(results: Path) -> str:
    """The interleaved fan-out study: median µs per K and the ratio to the default K with a 95% interval."""
    from pal_bench import DEFAULT_FANOUT

    path = results / "fanout.csv"
    if not path.exists():
        return missing("fanout.csv", "python -m pal_bench.studies.fanout")
    df = pd.read_csv(path)
    ops = [op for op in ("insert_one", "sample", "update", "sample_update") if op in set(df.op)]
    rows = []
    for k, g in df.groupby("fanout"):
        row: dict = {"K": k}
        for op in ops:
            mine = g[g.op == op].us_per_call
            ref = df[(df.fanout == DEFAULT_FANOUT) & (df.op == op)].us_per_call
            row[f"{op} µs"] = mine.median()
            if k != DEFAULT_FANOUT and len(ref):
                row[f"{op} vs K={DEFAULT_FANOUT}"] = fmt_ci(*ratio_ci(mine, ref), 2)
            else:
                row[f"{op} vs K={DEFAULT_FANOUT}"] = "1 (default)" if k == DEFAULT_FANOUT else ""
        rows.append(row)
    n, rounds = int(df.capacity.iloc[0]), df["round"].nunique()
    return (f"Median µs per call at capacity {n:.0e}, batch {int(df.batch.iloc[0])}, every K timed in each of {rounds} "
            f"interleaved rounds ({int(df[df.op != 'insert_one'].calls.iloc[0])} calls per block, "
            f"{int(df[df.op == 'insert_one'].calls.iloc[0])} for insert_one); ratio = this K's median / the default's, "
            "bootstrap 95% interval over rounds (below 1: faster than the default).\n\n"
            + md(pd.DataFrame(rows), ".2f") + "\n\n" + source(results, "fanout.csv") + "\n")


def instructions_block(results: Path) -> str:
    path = results / "regression_baseline.json"
    if not path.exists():
        return missing("regression_baseline.json", "python -m pal_bench.bench.regression --update-baseline")
    b = json.loads(path.read_text())
    rows = [{"operation": op, "calls counted": b["calls"][op],
             "instructions/call (project code)": b["instructions"][op],
             "instructions/call (all code)": b["total_instructions"][op],
             f"spread over {b['repeats']} runs": f"{b['relative_spread'][op]:.2%}"} for op in b["instructions"]]
    tc = b["toolchain"]
    return (f"Instruction-count baseline of the regression check (capacity {b['capacity']:.0e}, batch {b['batch']}; "
            f"made {b['made']} on {b['cpu']}, commit {b['commit']}; {tc['compiler']}, Python {tc['python']}, "
            f"numpy {tc['numpy']}, Cython {tc['cython']}, {tc['valgrind']}).\n\n" + md(pd.DataFrame(rows), ".0f")
            + "\n\nSource: `results/regression_baseline.json`.\n")


# ------------------------------------------------------------------ trainer

def training_block(results: Path) -> str:
    path = results / "training.csv"
    if not path.exists():
        return missing("training.csv", "make train-results")
    df = pd.read_csv(path)
    t = pd.DataFrame({
        "run": df.run, "algorithm": df.algo, "env": df.env, "actors / learners": df.actors.astype(str) + " / "
        + df.learners.astype(str), "env steps": df.env_steps, "updates": df.updates,
        "final eval return": df.final_eval_return, "best eval return": df.best_eval_return,
        "target": df.target.map(lambda v: f">= {v:g}"), "reached": df.reached.map({True: "yes", False: "**no**"}),
    })
    return ("Evaluation return (mean of the run's greedy evaluation episodes) of the reference runs; each run's "
            "command is in `results/training.md`, its curve in `results/runs/<run>/learning_curve.png`.\n\n"
            + md(t) + "\n\n" + source(results, "training.csv") + "\n")


def learning_sweeps_block(results: Path) -> str:
    path = results / "learning_sweeps.csv"
    if not path.exists():
        return missing("learning_sweeps.csv", "python tests/learning_runs.py RUN --seeds 0-9")
    df = pd.read_csv(path)
    rows = []
    for run, g in df.groupby("run", sort=False):
        row = {"run": run, "seeds": len(g), "best: min": g.best.min(), "best: median": g.best.median(),
               "best: max": g.best.max()}
        if "final" in g and g.final.notna().any():
            row |= {"final: min": g.final.min(), "final: median": g.final.median()}
        row |= {"CPU": ", ".join(sorted(set(g.cpu.astype(str)))), "noisy seeds": int(g.noisy.sum()),
                "dates": f"{str(g.date.min())[:10]}"}
        rows.append(row)
    return ("Seed sweeps of the learning tests (`python tests/learning_runs.py RUN --seeds ...`): the asserted "
            "quantity over seeds; each test's threshold sits below the minimum with a margin (its docstring says "
            "which).\n\n" + md(pd.DataFrame(rows)) + "\n\nSource: `results/learning_sweeps.csv` (one row per seed, "
            "with load before/after, CPU and commit).\n")


# ------------------------------------------------------------------ scaling, core split, concurrency

def _reps(cell) -> list[float]:
    return [float(v) for v in str(cell).split()] if isinstance(cell, str) else []


def _curves(df: pd.DataFrame) -> pd.DataFrame:
    """f_a / f_l rows; the speedup over 1 worker with a bootstrap interval where the repetitions are stored."""
    speedups = []
    for r in df.itertuples():
        base = df[(df.curve == r.curve) & (df.threads == 1)]
        mine, ref = _reps(getattr(r, "throughput_reps", None)), _reps(base.iloc[0].get("throughput_reps"))
        speedups.append(fmt_ci(*ratio_ci(mine, ref)) if r.threads > 1 and mine and ref else f"{r.speedup:.2f}")
    t = pd.DataFrame({"curve": df.curve, "workers": df.threads, "throughput": df.throughput,
                      "speedup [95% CI]": speedups, "efficiency": df.efficiency})
    if "cores_used" in df and df.cores_used.notna().any():
        t["cores used"] = df.cores_used
    t["oversubscribed"] = df.oversubscribed.map({True: "yes", False: ""})
    if "load1" in df:
        t["load"] = df.load1
    return t


def scaling_block(results: Path) -> str:
    parts = []
    for name, what in (("scaling.csv", "environments in the actor threads"),
                       ("scaling_async_env.csv", "environments in subprocesses (`--env-backend async`)")):
        # (speedup intervals: bootstrap over the interleaved rounds of `--repeats`, where stored)
        if (results / name).exists():
            df = pd.read_csv(results / name)
            parts.append(f"Thread backend, {df.algo.iloc[0]} on {df.env.iloc[0]}, {what}: f_a in transitions/s, "
                         f"f_l in updates/s.\n\n" + md(_curves(df), ".2f") + "\n\n" + source(results, name) + "\n")
    return "\n".join(parts) if parts else missing("scaling.csv", "make scaling")


def dse_block(results: Path) -> str:
    path = results / "dse_validation.csv"
    if not path.exists():
        return missing("dse_validation.csv", "make scaling")
    from pal_bench.studies import dse

    v = pd.read_csv(path)
    return dse.validation_text(v) + "\n" + source(results, "dse_validation.csv") + "\n"


def end_to_end_block(results: Path, name: str = "end_to_end.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "python -m pal_bench.studies.scaling --end-to-end 5000")
    df = pd.read_csv(path)
    df["split"] = df.actors.astype(str) + " + " + df.learners.astype(str) + df.oversubscribed.map(
        {True: " (oversubscribed)", False: ""})
    df["variant"] = df.aggregation + ", env " + df.env_backend
    t = df.pivot_table(index="split", columns="variant", values="measured_transitions_per_s", aggfunc="first",
                       sort=False)
    u = df.pivot_table(index="split", columns="variant", values="measured_updates_per_s", aggfunc="first", sort=False)
    cell = t.round(0).astype("Int64").astype(str) + " / " + u.round(0).astype("Int64").astype(str)
    backend = df.backend.iloc[0] if "backend" in df else "threads"
    return (f"The whole trainer ({backend} backend) at each split: env steps/s / updates/s, one run per cell.\n\n"
            + cell.reset_index().to_markdown(index=False) + "\n\n" + source(results, name) + "\n")


def concurrency_block(results: Path) -> str:
    path = results / "buffer_concurrency.csv"
    if not path.exists():
        return missing("buffer_concurrency.csv", "python -m pal_bench.studies.concurrency")
    df = pd.read_csv(path)
    t = pd.DataFrame({"buffer": df.impl, "writer threads": df.writers, "sampler threads": df.samplers,
                      "inserts/s": df.inserts_per_s.round(0),
                      "sample+update batches/s": df.sample_updates_per_s.round(0),
                      "lock acquisitions contended": df.lock_contended_share.map(
                          lambda v: f"{v:.1%}" if pd.notna(v) else "")})
    return ("Buffer-only concurrency at capacity 1e5 (threads in one process; tianshou behind one lock).\n\n"
            + md(t, ".0f") + "\n\n" + source(results, "buffer_concurrency.csv") + "\n")


def shared_throughput_block(results: Path) -> str:
    path = results / "shared_throughput.csv"
    if not path.exists():
        return missing("shared_throughput.csv", "python -m pal_bench.studies.shared_buffer")
    df = pd.read_csv(path)
    t = df.pivot_table(index=["writers", "samplers"], columns="impl",
                       values=["inserts_per_s", "sample_updates_per_s"], aggfunc="first")
    rows = []
    for (w, s), r in t.iterrows():
        row = {"writer processes": w, "sampler processes": s}
        for impl in sorted(df.impl.unique()):
            row[f"{impl} inserts/s"] = r.get(("inserts_per_s", impl), float("nan"))
            row[f"{impl} sample+update/s"] = r.get(("sample_updates_per_s", impl), float("nan"))
        if {"pal", "cpprb"} <= set(df.impl):
            for col, label in (("inserts_per_s", "inserts"), ("sample_updates_per_s", "sample+update")):
                a, b = r.get((col, "pal")), r.get((col, "cpprb"))
                row[f"PAL / cpprb {label}"] = f"{a / b:.1f}x" if a and b else ""
        rows.append(row)
    return (f"One buffer (capacity 1e5, LunarLander transitions) used by spawned processes at once: writers insert "
            f"chunks of 64 transitions per call, samplers sample 256 and update their priorities; totals over all "
            f"processes, {df.seconds.iloc[0]:g} s per point. PAL: `shared=True` + `attach`; cpprb: "
            f"`MPPrioritizedReplayBuffer`.\n\n" + md(pd.DataFrame(rows), ".0f") + "\n\n"
            + source(results, "shared_throughput.csv") + "\n")


# ------------------------------------------------------------------ backends

def backends_block(results: Path) -> str:
    t_path, r_path = results / "scaling.csv", results / "scaling_ray.csv"
    if not (t_path.exists() and r_path.exists()):
        return missing("scaling_ray.csv", "python -m pal_bench.studies.scaling --backend ray")
    from pal_bench.studies.scaling import overhead_table

    m = overhead_table(pd.read_csv(t_path), pd.read_csv(r_path))
    unit = {"f_a": "transition", "f_l": "update"}
    t = pd.DataFrame({"curve": m.curve, "workers": m.threads, "threads": m.throughput_threads, "Ray": m.throughput_ray,
                      "Ray / threads": m.ray_over_threads,
                      "Ray's extra cost": [f"{v:+.0f} µs per {unit[c]}" for c, v in zip(m.curve, m.overhead_us)]})
    return ("DQN on CartPole-v1: f_a (transitions/s) and f_l (updates/s) on the thread backend and on Ray.\n\n"
            + md(t, ".2f") + "\n\n" + source(results, "scaling.csv", "scaling_ray.csv") + "\n")


def end_to_end_ray_block(results: Path) -> str:
    return end_to_end_block(results, "end_to_end_ray.csv")


def end_to_end_processes_block(results: Path) -> str:
    return end_to_end_block(results, "end_to_end_processes.csv")


def processes_block(results: Path) -> str:
    """f_a and f_l of actor processes against threads, per worker count, with the issue's targets' ratios; and of
    learner processes (``scaling_learner_processes.csv``) where measured."""
    t_path, p_path = results / "scaling.csv", results / "scaling_processes.csv"
    if not (t_path.exists() and p_path.exists()):
        return missing("scaling_processes.csv", "python -m pal_bench.studies.scaling --backend processes")
    t, p = pd.read_csv(t_path), pd.read_csv(p_path)
    cols = ["curve", "threads", "throughput", "throughput_reps"]
    m = t.reindex(columns=cols).merge(p.reindex(columns=cols + ["speedup"]), on=["curve", "threads"],
                                      suffixes=("_threads", "_processes"))
    out = pd.DataFrame({"curve": m.curve, "workers": m.threads, "threads": m.throughput_threads,
                        "processes": m.throughput_processes,
                        "processes / threads [95% CI]": _paired(m.throughput_reps_processes, m.throughput_reps_threads,
                                                                m.throughput_processes / m.throughput_threads),
                        "processes: speedup over 1": m.speedup})
    sources = ["scaling.csv", "scaling_processes.csv"]
    note = "the process backend's learners are driver threads, as the thread backend's"
    lp_path = results / "scaling_learner_processes.csv"
    if lp_path.exists():
        lp = pd.read_csv(lp_path).reindex(columns=cols)
        lp = lp[lp.curve == "f_l"].set_index("threads")
        fl = out.curve == "f_l"
        out["learner processes"] = out.workers.map(lp.throughput).where(fl)
        ratio = _paired(out.workers.map(lp.throughput_reps), m.throughput_reps_threads,
                        out["learner processes"] / out.threads)
        out["learner processes / threads [95% CI]"] = ratio.where(fl, "")
        sources.append("scaling_learner_processes.csv")
        note += "; the last two columns: f_l with learner processes (`learner_processes = true`)"
    return ("DQN on CartPole-v1: f_a (transitions/s, actors only) and f_l (updates/s, learners only) with actor "
            f"processes on the shared buffer against actor threads ({note}). Throughputs are medians over the "
            "rounds of `--repeats`; a ratio is the median over rounds of the two measured side by side in that "
            "round (each round measures every backend at that point, one after the other), with a bootstrap "
            "interval over rounds.\n\n" + md(out, ".2f") + "\n\n" + source(results, *sources) + "\n")


def _paired(mine: pd.Series, ref: pd.Series, plain: pd.Series) -> pd.Series:
    """Per row: the median over rounds of mine[i] / ref[i] (round i of each stored repetition list) with a
    bootstrap interval, or ``plain`` (the ratio of medians) where the repetitions are not stored or differ in
    number."""
    out = []
    for a, b, c in zip(mine, ref, plain):
        a, b = _reps(a), _reps(b)
        if a and len(a) == len(b):
            out.append(fmt_ci(*median_ci([x / y for x, y in zip(a, b)])))
        else:
            out.append("" if pd.isna(c) else f"{c:.2f}")
    return pd.Series(out, index=plain.index)


# ------------------------------------------------------------------ plug-in benchmark and race

def plugin_block(results: Path) -> str:
    path = results / "plugin.csv"
    if not path.exists():
        return missing("plugin.csv", "make plugin-bench")
    from pal_bench.studies.plugin import speedup_table

    t = speedup_table(pd.read_csv(path))
    out = pd.DataFrame({
        "framework": t.framework, "env": t.env, "batch": t.batch_size, "env runners": t.env_runners,
        "default ms": t.default_ms, "PAL ms": t.pal_ms,
        "speedup [95% CI]": [fmt_ci(*x) for x in zip(t.speedup, t.speedup_low, t.speedup_high)],
        "buffer share default -> PAL": [f"{a:.0%} -> {b:.0%}" for a, b in zip(t.buffer_share_default,
                                                                             t.buffer_share_pal)],
        "Amdahl bound": t.bound, "note": t.note})
    return ("Median training-iteration time with the framework's own prioritized buffer and with PAL's drop-in "
            "(same seed and config, iterations alternating ABBA). The bound is the speedup if the buffer took no "
            "time (1 / (1 - default share)); a speedup whose interval lies above it is a measurement problem, "
            "flagged, not a result, unless the drop-in also changes work outside the buffer (RLlib: its columnar "
            "samples cut the learner connector's per-episode reads; noted). Intervals: bootstrap over the timed "
            "iterations (where stored).\n\n"
            + md(out, ".2f") + "\n\n" + source(results, "plugin.csv") + "\n")


def race_target_block(results: Path, track: str, task_name: str = "full") -> str:
    """Steps and wall time to target per contestant of one track, with the probe spread of the runs compared."""
    from pal_bench.studies.race import results as race_results
    from pal_bench.studies.race import suffix
    from pal_bench.studies.race.probe import probe_spread
    from pal_bench.studies.race.task import TASKS

    name = f"race{suffix(task_name)}.csv"
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench race" + (" --quick" if task_name == "quick" else ""))
    df = pd.read_csv(path)
    df = df[df.track == track]
    if df.empty:
        return missing(name, f"pal-bench race --track {track}" + (" --quick" if task_name == "quick" else ""))
    task = TASKS[task_name]
    t = race_results.target_table(df)
    med, lo, hi = probe_spread(df.probe_s.dropna())
    ref = race_results.best_pal(df)
    return (f"{track.capitalize()} track, {task.env} to a mean greedy return of {task.target:g} ({task.eval_episodes} "
            f"episodes every {task.eval_interval:,} env steps; budget {task.max_steps:,} env steps or "
            f"{task.max_wall_s / 60:.0f} minutes of training). Medians over seeds with the exact order-statistic "
            f"interval of the median (95% or more; its true coverage in brackets where the seeds are too few); a "
            f"run that never reached the target counts at its stop (`>=`: a lower bound). Wall to target: set-up "
            f"plus training, evaluation excluded (every contestant's training stands still while it is evaluated); "
            f"'with eval' adds the evaluations before the target. Ratios: the contestant's median over "
            f"`{ref}`'s (PAL's best matched contestant here), the range over every pairing of seeds, and a "
            f"bootstrap 95% interval where both have at least 10 seeds. Speed probes of these runs: median "
            f"{med:.1f} s, {lo:.2f}-{hi:.2f}x of it.\n\n" + md(t, "") + "\n\n" + source(results, name) + "\n")


def race_speed_block(results: Path, track: str = "matched", task_name: str = "full") -> str:
    from pal_bench.studies.race import results as race_results
    from pal_bench.studies.race import suffix
    from pal_bench.studies.race.task import TASKS

    name = f"race{suffix(task_name)}_speed.csv"
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench race --speed")
    sp = pd.read_csv(path)
    sp = sp[sp.track == track]
    if sp.empty:
        return missing(name, f"pal-bench race --speed --track {track}")
    task = TASKS[task_name]
    return (f"Env steps per second of training in one sitting, {track} track: each round runs every contestant for "
            f"{task.speed_span:,} env steps after learning starts ({task.learning_starts:,}), one after the other in "
            f"an order rotated by one each round; medians over the rounds with the range (with fewer than 10 rounds "
            f"the range, not an interval). Updates/s: the run's measured updates per env step times its env steps "
            f"per second.\n\n" + md(race_results.speed_table(sp), "") + "\n\n" + source(results, name) + "\n")


def race_settings_block(results: Path, track: str = "matched", task_name: str = "full") -> str:
    from pal_bench.studies.race import results as race_results
    from pal_bench.studies.race.orchestrate import load_runs, runs_dir

    where = runs_dir(results, task_name, track)
    runs = load_runs(where)
    if not runs:
        return missing(f"{where.relative_to(results)}/", f"pal-bench race --track {track}")
    return (f"What each {track} contestant built, read back from its framework's own objects when it was built "
            f"(not from our configuration), and its measured updates per env step (median over its runs).\n\n"
            + md(race_results.settings_table(runs), "") + "\n")


def race_headline_block(results: Path) -> str:
    """README's one sentence on the race: the matched track's best PAL contestant against each peer that raced."""
    from pal_bench.studies.race import results as race_results

    path = results / "race.csv"
    if not path.exists():
        return missing("race.csv", "pal-bench race")
    df = pd.read_csv(path)
    df = df[df.track == "matched"]
    ref = race_results.best_pal(df)
    if ref is None:
        return missing("race.csv", "pal-bench race --only pal pal-processes")
    mine = df[df.contestant == ref]
    parts = []
    for name, g in df[~df.contestant.isin(race_results.PAL_MATCHED)].groupby("contestant"):
        bound = "at least " if not g.reached.all() else ""
        parts.append(f"{bound}{g.wall_to_target_s.median() / mine.wall_to_target_s.median():.1f}x sooner than "
                     f"{name} ({int(g.reached.sum())} of {len(g)} seeds reached; median "
                     f"{g.steps_to_target.median() / 1000:.0f}k steps, {g.wall_to_target_s.median():.0f} s)")
    return (f"**The race** (matched track: every contestant trains the same Double DQN on the same data rhythm; "
            f"LunarLander-v3 to 200): PAL's `{ref}` reached the target in {int(mine.reached.sum())} of {len(mine)} "
            f"seeds, in a median {mine.steps_to_target.median() / 1000:.0f}k env steps and "
            f"{mine.wall_to_target_s.median():.0f} s of set-up and training: " + "; ".join(parts)
            + ". Ratios of medians; intervals, the speed table and the tuned track: [docs/race.md](docs/race.md).\n")


def race_blocks(results: Path, task_name: str = "full") -> str:
    """Every race table of a task (what ``pal-bench race`` prints)."""
    parts = [race_target_block(results, track, task_name) for track in ("matched", "tuned")]
    if task_name == "full":
        parts.append(race_speed_block(results))
    return "\n".join(parts)


# ------------------------------------------------------------------ long-haul and aggregation

def longhaul_block(results: Path, name: str = "longhaul.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench longhaul --quick")
    df = pd.read_csv(path)
    t = pd.DataFrame({"link": df.link, "topology": df.topology, "env steps": df.env_steps, "updates": df.updates,
                      "final loss": df.loss_final,
                      "crossed priority": df.crossed_priority,
                      "MB to learner / back": [f"{a / 1e6:.1f} / {b / 1e6:.1f}"
                                               for a, b in zip(df.bytes_to_learner, df.bytes_to_buffer)],
                      "learner idle": df.learner_idle_frac.map(lambda v: f"{v:.0%}"),
                      "eval return": df.final_eval_return, "wall s": df.wall_s})
    fmt = tuple(".4f" if c == "final loss" else ".2f" for c in t.columns)
    return (f"DQN on {df.env.iloc[0]}, one seed per row: learner-side replay (learner-replay) against replay at the "
            "buffer node (buffer-replay) over each modelled link.\n\n" + md(t, fmt) + "\n\n"
            + source(results, name) + "\n")


def longhaul_full_block(results: Path) -> str:
    return longhaul_block(results, "full/longhaul.csv")


def aggregation_block(results: Path, name: str = "aggregation.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench aggregation --quick")
    df = pd.read_csv(path)
    df["cell"] = [f"{s * 1e3:.1f} ({a:.0%})" for s, a in zip(df.iteration_s, df.aggregation_share)]
    df["size"] = df.hidden + " (" + df.params.map(lambda p: f"{p / 1e6:.2f}M" if p >= 1e5 else f"{p / 1e3:.0f}k") + ")"
    parts = []
    for learners, g in df.groupby("learners"):
        t = g.pivot_table(index="scheme", columns="size", values="cell", aggfunc="first", sort=False)
        t = t[sorted(t.columns, key=lambda c: int(g[g["size"] == c].params.iloc[0]))]
        parts.append(f"**{learners} learner{'s' if learners > 1 else ''}**: ms per iteration (share aggregating)\n\n"
                     + t.reset_index().to_markdown(index=False))
    return ("Gradient aggregation per scheme, learner count and Q-network size (hidden layers, parameters).\n\n"
            + "\n\n".join(parts) + "\n\n" + source(results, name) + "\n")


def aggregation_full_block(results: Path) -> str:
    return aggregation_block(results, "full/aggregation.csv")


def step_costs_block(results: Path, name: str = "step_costs.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "python -m pal_bench.bench.step_costs")
    df = pd.read_csv(path)
    cap = df.capacity.iloc[0]
    t = df[df.capacity == cap].pivot_table(index="step", columns="label", values="instructions", aggfunc="first",
                                           sort=False)
    labels = list(dict.fromkeys(df.label))                       # the builds in the order they were measured
    t = t[labels].fillna(0).astype(int)
    t = t.loc[t.max(axis=1).sort_values(ascending=False).index]
    t.loc["total"] = t.sum()
    if len(labels) > 1:
        first, last = labels[0], labels[-1]
        t[f"{last} / {first}"] = [f"{a / b:.2f}" if b else "new" for a, b in zip(t[last], t[first])]
    return (f"Instructions per `sample(256)` + `update_priorities(256)` at capacity {float(cap):.0e}, counted by "
            "callgrind and attributed to steps from the source line each instruction was generated for "
            "(`python -m pal_bench.bench.step_costs --tree DIR --label NAME`; deterministic, whatever the load).\n\n"
            + t.reset_index().to_markdown(index=False)
            + f"\n\nSource: `results/{name}` (instruction counts: the same on a busy or a quiet machine, so no load "
            "is recorded).\n")


TABLES: dict[str, Callable[[Path], str]] = {
    "latency-headline": latency_headline,
    "latency": latency_block,
    "fanout": fanout_block,
    "shared-vs-private": shared_vs_private_block,
    "step-costs": step_costs_block,
    "sequence-replay": sequence_block,
    "instructions": instructions_block,
    "training": training_block,
    "learning-sweeps": learning_sweeps_block,
    "scaling": scaling_block,
    "dse": dse_block,
    "end-to-end": end_to_end_block,
    "concurrency": concurrency_block,
    "shared-throughput": shared_throughput_block,
    "backends": backends_block,
    "end-to-end-ray": end_to_end_ray_block,
    "processes": processes_block,
    "end-to-end-processes": end_to_end_processes_block,
    "plugin": plugin_block,
    "race-quick": lambda results: race_target_block(results, "matched", "quick"),
    "race-headline": race_headline_block,
    "race-matched": lambda results: race_target_block(results, "matched"),
    "race-tuned": lambda results: race_target_block(results, "tuned"),
    "race-speed": race_speed_block,
    "race-settings": race_settings_block,
    "race-settings-tuned": lambda results: race_settings_block(results, "tuned"),
    "longhaul-quick": longhaul_block,
    "longhaul-full": longhaul_full_block,
    "aggregation-quick": aggregation_block,
    "aggregation-full": aggregation_full_block,
}


DOC_ORDER = ("latency", "trainer", "scaling", "backends", "plugin", "race", "longhaul", "aggregation", "measuring")


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, then the study pages in reading order (pages not listed in ``DOC_ORDER`` last)."""
    pages = sorted((root / "docs").glob("*.md"), key=lambda p: (DOC_ORDER.index(p.stem) if p.stem in DOC_ORDER
                                                                else len(DOC_ORDER), p.stem))
    return [root / "README.md", *pages]


def regenerate(files: list[Path] | None = None, results: Path = ROOT / "results",
               check: bool = False) -> list[str]:
    """Rebuild every generated block of ``files``; returns ``file:name`` of the blocks that changed
    (with ``check``, nothing is written). An unknown block name raises ``KeyError``."""
    changed: list[str] = []
    cache: dict[str, str] = {}
    for path in files or doc_files():
        text = path.read_text()

        def body(m: re.Match, path=path) -> str:
            name = m.group("name")
            if name not in TABLES:
                raise KeyError(f"{path}: unknown generated block {name!r}; known: {', '.join(TABLES)}")
            if name not in cache:
                cache[name] = TABLES[name](results).rstrip("\n") + "\n"
            new = cache[name]
            if path.parent.name != "docs":      # README links from the root, the docs pages from docs/
                new = new.replace("](../results/", "](results/")
            if new != m.group("body"):
                changed.append(f"{path.name}:{name}")
            return m.group(1) + new + m.group(4)

        new_text = BLOCK.sub(body, text)
        if not check and new_text != text:
            conditions.atomic_write_text(path, new_text)
    return changed


def names_in(path: Path) -> list[str]:
    return [m.group("name") for m in BLOCK.finditer(path.read_text())]

