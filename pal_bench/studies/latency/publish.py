"""The buffer suites' publication: README's latency headline, docs/latency.md's tables (latency, shared vs
private, sequence replay, the regression check's instruction counts and the step costs), and the derived files
``results/latency.csv`` (tidy rows, skipped cases with their reason), ``results/latency_tables.md`` and the
latency figures."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pal_bench.bench import suite_json
from pal_bench.bench.publishing import Publication, esc, md, missing, source
from pal_bench.bench.stats import fmt_ci, ratio_ci
from pal_bench.conditions import atomic_write_text
from pal_bench.stored_tables import read_csv, read_json
from pal_bench.studies.latency.figures import draw_all
from pal_bench.studies.latency.tables import fmt_n, median_ratio, op_label, speedup_ci, tables_markdown


def latency_block(results: Path) -> str:
    """The full latency tables of the suites (pytest-benchmark JSON), with the figures."""
    try:
        tidy, machine = suite_json.load_all(results)
    except FileNotFoundError:
        return missing("latency_vs_capacity.json", "make bench")
    figs = "\n".join(f"![{n}](../results/figures/{n}.png)" for n in ("latency_vs_capacity", "latency_vs_fanout"))
    files = sorted(f.name for pattern in suite_json.SUITE_FILES for f in results.glob(pattern))
    return figs + "\n\n" + tables_markdown(tidy, machine).strip() + "\n\n" + source(results, *files) + "\n"


HEADLINE_OPS = ("insert_one", "insert_batch", "sample_update")


def latency_headline(results: Path) -> str:
    """README's table: PAL's latency and its speedup over each peer at the largest capacity both ran."""
    path = results / "latency_vs_capacity.json"
    if not path.exists():
        return missing("latency_vs_capacity.json", "make bench")
    df, _ = suite_json.load(path)
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
            rows.append({"operation": op_label(op, 256), "peer": peer, "capacity": f"N={fmt_n(n)}",
                         "PAL µs": p_us, "peer µs": q_us,
                         "PAL speedup [95% CI]": fmt_ci(*speedup_ci(df, peer, op, n), 1)})
    if not rows:
        return missing("latency_vs_capacity.json", "make bench")
    return ("Median latency, full buffer, LunarLander-sized transitions, alpha 0.6, beta 0.4, at the largest capacity "
            "both ran (quick sweep: RLlib up to 1e5). Speedup = peer median / PAL median in the same run, with a "
            "bootstrap 95% interval over the timed rounds.\n\n" + md(pd.DataFrame(rows), ".2f") + "\n\n"
            + source(results, "latency_vs_capacity.json") + "\n")


def shared_vs_private_block(results: Path) -> str:
    """PAL's buffer with ``shared=True`` against the private one, per operation: the cost of shared memory."""
    path = results / "shared_vs_private.json"
    if not path.exists():
        return missing("shared_vs_private.json", "python -m pal_bench.bench.run --suite shared_vs_private")
    df, _ = suite_json.load(path)
    ok = df[df.status == "ok"]
    rows = []
    for (op, n), g in ok.groupby(["op", "capacity"], sort=False):
        mine, ref = g[g.peer == "pal-shared"], g[g.peer == "pal"]
        if mine.empty or ref.empty:
            continue
        a, b = mine.iloc[0], ref.iloc[0]
        ci = (ratio_ci(a.sample_us, b.sample_us) if isinstance(a.sample_us, list) and isinstance(b.sample_us, list)
              else (a.median_us / b.median_us, math.nan, math.nan))
        rows.append({"operation": op_label(op, 256), "capacity": f"N={fmt_n(n)}",
                     "private µs": b.median_us, "shared µs": a.median_us, "shared / private [95% CI]": fmt_ci(*ci)})
    return ("Single-process latency of PAL's buffer in a shared-memory segment (`shared=True`) against the private "
            "one, same run (target: within 10%).\n\n" + md(pd.DataFrame(rows), ".2f") + "\n\n"
            + source(results, "shared_vs_private.json") + "\n")


def sequence_block(results: Path) -> str:
    """R2D2's batch (64 sequences of 80 steps, sampled and updated): PAL's sequence mode against the same steps
    drawn as transitions and against RLlib's episode buffers, per stored steps."""
    path = results / "sequence_replay.json"
    if not path.exists():
        return missing("sequence_replay.json", "python -m pal_bench.bench.run --suite sequence_replay")
    df, _ = suite_json.load(path)
    rows = []
    for n, g in df.groupby("capacity", sort=True):
        med = {r.peer: r.median_us for r in g.itertuples() if r.status == "ok"}
        why = {r.peer: r.reason for r in g.itertuples() if r.status != "ok"}
        seq = med.get("pal-seq")
        row = {"stored steps": f"N={fmt_n(n)}", "pal-seq µs": seq,
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


def instructions_block(results: Path) -> str:
    path = results / "regression_baseline.json"
    if not path.exists():
        return missing("regression_baseline.json", "python -m pal_bench.bench.regression --update-baseline")
    b = read_json(path)
    rows = [{"operation": op, "calls counted": b["calls"][op],
             "instructions/call (project code)": b["instructions"][op],
             "instructions/call (all code)": b["total_instructions"][op],
             f"spread over {b['repeats']} runs": f"{b['relative_spread'][op]:.2%}"} for op in b["instructions"]]
    tc = {k: esc(v) for k, v in b["toolchain"].items()}
    return (f"Instruction-count baseline of the regression check (capacity {b['capacity']:.0e}, batch "
            f"{esc(b['batch'])}; made {esc(b['made'])} on {esc(b['cpu'])}, commit {esc(b['commit'])}; "
            f"{tc['compiler']}, Python {tc['python']}, numpy {tc['numpy']}, Cython {tc['cython']}, "
            f"{tc['valgrind']}).\n\n" + md(pd.DataFrame(rows), ".0f")
            + "\n\nSource: `results/regression_baseline.json`.\n")


def step_costs_block(results: Path, name: str = "step_costs.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "python -m pal_bench.bench.step_costs")
    df = read_csv(path)
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
            + md(t.reset_index(), "g")
            + f"\n\nSource: `results/{name}` (instruction counts: the same on a busy or a quiet machine, so no load "
            "is recorded).\n")


WORKLOAD_OPS = ("sample_update", "sample", "insert_batch", "insert_one")


def workload_latency_block(results: Path) -> str:
    """Per workload other than LunarLander (``results/workloads/<name>/``): median µs of every implementation per
    capacity, PAL's default call and its ``out=`` call against the gather floor, and each peer's median over
    PAL's, with bootstrap 95% intervals, all from one run of the suite."""
    root = results / "workloads"
    dirs = sorted(d for d in root.iterdir() if (d / "latency_vs_capacity.json").exists()) if root.is_dir() else []
    if not dirs:
        return missing("workloads/<name>/latency_vs_capacity.json", "make bench WORKLOAD=atari")
    parts = []
    for d in dirs:
        df, machine = suite_json.load(d / "latency_vs_capacity.json")
        good = df[df.status == "ok"]
        batch = int(df.batch.iloc[0])
        parts.append(f"#### {esc(d.name)} ({esc(suite_json.machine_line(machine))})")
        med = good.pivot_table(index=["op", "capacity"], columns="peer", values="median_us", aggfunc="first")
        med = med.reindex([i for op in WORKLOAD_OPS for i in med.index if i[0] == op])
        med.index = [f"{op_label(op, batch)}, N={fmt_n(c)}" for op, c in med.index]
        parts.append("Median µs per call:\n\n" + md(med.reset_index().rename(columns={"index": "operation"}), ".1f"))
        rows = []
        for c in sorted(good[good.op == "sample_update"].capacity.unique()):
            row = {"capacity": f"N={fmt_n(c)}"}
            here = good[(good.op == "sample_update") & (good.capacity == c)].set_index("peer")
            if "floor-gather" in here.index:
                for impl in ("pal", "pal-out"):
                    if impl in here.index:
                        row[f"{impl} / floor"] = fmt_ci(*median_ratio(here, impl, "floor-gather"), 2)
            if "pal" in here.index:
                for peer in sorted(p for p in here.index if p not in ("pal", "floor-gather")):
                    row[f"{peer} / pal"] = fmt_ci(*median_ratio(here, peer, "pal"), 2)
            rows.append(row)
        parts.append(f"{op_label('sample_update', batch)}: ratios of medians [bootstrap 95% interval] (impl / floor "
                     "above 1: slower than the floor; peer / pal above 1: PAL faster):\n\n"
                     + md(pd.DataFrame(rows).fillna(""), ".2f"))
        parts.append(source(results, f"workloads/{esc(d.name)}/latency_vs_capacity.json"))
    return "\n\n".join(parts) + "\n"


def gather_floor_block(results: Path) -> str:
    """PAL's sample+update (default call, ``out=``) and the C gather, alternated round by round
    (``python -m pal_bench.bench.gather_floor --against-pal``)."""
    path = results / "gather_floor.csv"
    if not path.exists():
        return missing("gather_floor.csv", "python -m pal_bench.bench.gather_floor --against-pal --out results")
    df = read_csv(path)
    floor = df[df.impl == "floor-gather"].us_per_call
    rows = [{"implementation": impl, "median µs": g.us_per_call.median(),
             "/ floor [95% CI]": fmt_ci(*ratio_ci(g.us_per_call, floor), 2)}
            for impl, g in df.groupby("impl", sort=False)]
    w, n, r = df.workload.iloc[0], int(df.capacity.iloc[0]), df["round"].nunique()
    caption = (f"{esc(w)} rows at capacity {fmt_n(n)}: sample+update 256 of PAL's buffer (default call, keeping the "
               "previous batch while drawing the next; and `out=`) and the C gather of 256 rows, alternated in each "
               f"of {r} rounds (medians of the rounds' blocks; bootstrap 95% interval over rounds).")
    return caption + "\n\n" + md(pd.DataFrame(rows), ".1f") + "\n\n" + source(results, "gather_floor.csv") + "\n"


def outputs(results: Path, figures: bool) -> list[Path]:
    """``latency.csv`` and ``latency_tables.md`` from the stored suite JSON, and (``figures``) the latency
    figures; nothing when no suite has run."""
    try:
        tidy, machine = suite_json.load_all(results)
    except FileNotFoundError:
        return []
    atomic_write_text(results / "latency.csv",
                      tidy.drop(columns="sample_us").to_csv(index=False, float_format="%.4f"))
    atomic_write_text(results / "latency_tables.md", tables_markdown(tidy, machine))
    written = [results / "latency.csv", results / "latency_tables.md"]
    if figures:
        written += draw_all(tidy, results / "figures", suite_json.machine_line(machine))
    return written


PUBLICATION = Publication("latency", {
    "latency-headline": latency_headline,
    "latency": latency_block,
    "shared-vs-private": shared_vs_private_block,
    "step-costs": step_costs_block,
    "sequence-replay": sequence_block,
    "instructions": instructions_block,
    "workload-latency": workload_latency_block,
    "gather-floor": gather_floor_block,
}, outputs)
