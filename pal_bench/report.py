"""Everything published, rebuilt from stored results: ``python -m pal_bench.report`` (``make figures``).

Reads only the files in ``results/`` (never re-measures), so it can be re-run at any time:
``results/latency.csv`` (one row per suite x peer x operation x capacity x batch [x fan-out], with
median, IQR and rounds; skipped cases as rows with their reason), ``results/latency_tables.md``,
every figure (``pal_bench.bench.figures`` and each study's drawer, for the stored CSVs that exist), and
every generated block of README.md and ``docs/*.md`` (``pal_bench.bench.tables``). ``--html`` (``pal-bench
report``) also writes the static page ``results/report/index.html`` (``pal_bench.bench.html_report``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from pal_bench.bench import figures as figs

ROOT = Path(__file__).resolve().parent.parent
OP_LABELS = {
    "insert_one": "insert 1",
    "insert_batch": "add_batch B",
    "sample": "sample B",
    "update": "update B",
    "sample_update": "sample+update B",
}
SUITE_FILES = "latency_vs_*.json", "tree_vs_buffer.json", "shared_vs_private.json"


def op_label(op: str, batch: int | None = None) -> str:
    label = OP_LABELS.get(op, op)
    return label.replace(" B", f" {batch}") if batch else label


def fmt_n(n: float) -> str:
    n = int(n)
    return f"1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else str(n)


def load(path: Path) -> tuple[pd.DataFrame, dict]:
    """One row per benchmark (median/IQR/min in µs, rounds, and ``sample_us``: the stored sample of round
    times kept by ``pal_bench.bench.run`` for bootstrap intervals, or None) and one per skipped case (with reason)."""
    data = json.loads(path.read_text())
    rows = []
    for b in data["benchmarks"]:
        info, st = b["extra_info"], b["stats"]
        rows.append({
            "suite": path.stem, "name": b["name"], "peer": info["peer"], "op": info["op"],
            "capacity": info["capacity"], "batch": info["batch"], "fanout": info.get("fanout"),
            "median_us": st["median"] * 1e6, "iqr_us": st["iqr"] * 1e6, "min_us": st["min"] * 1e6,
            "rounds": st["rounds"], "profile": info.get("profile"), "status": "ok", "reason": "",
            "sample_us": [x * 1e6 for x in st["data_sample"]] if st.get("data_sample") else None,
        })
    for s in data.get("skipped", []):
        rows.append({"suite": path.stem, "name": "", "peer": s["peer"], "op": s["op"], "capacity": s["capacity"],
                     "batch": s["batch"], "fanout": s.get("fanout"), "profile": s.get("profile"),
                     "status": "skipped", "reason": s["reason"]})
    return pd.DataFrame(rows), data["machine_info"] | {"datetime": data.get("datetime", "")}


def load_all(results: Path) -> tuple[pd.DataFrame, dict]:
    files = sorted({f for pattern in SUITE_FILES for f in results.glob(pattern)})
    if not files:
        raise FileNotFoundError(f"no results in {results}: run `make bench` first")
    frames, machine = [], {}
    for f in files:
        df, machine = load(f)
        frames.append(df)
    return pd.concat(frames, ignore_index=True), machine


def machine_line(machine: dict) -> str:
    cpu = machine.get("cpu", {})
    when = machine.get("datetime", "")[:10]
    return (f"{cpu.get('brand_raw', machine.get('processor', '?'))}, {cpu.get('count', '?')} cores, "
            f"Python {machine.get('python_version', '?')}" + (f", {when}" if when else ""))


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def pal_table(df: pd.DataFrame) -> pd.DataFrame:
    """PAL's own latency (median µs) per operation and capacity."""
    t = ok(df[df.peer == "pal"]).pivot_table(index="op", columns="capacity", values="median_us", aggfunc="first")
    t = t.reindex([op for op in OP_LABELS if op in t.index])
    t.index = [op_label(op, int(df.batch.iloc[0])) for op in t.index]
    t.columns = [f"N={fmt_n(c)}" for c in t.columns]
    return t


def speedup_ci(df: pd.DataFrame, peer: str, op: str, capacity: int) -> tuple[float, float, float]:
    """PAL's speedup over ``peer`` (peer median / PAL median) with a bootstrap 95% interval over the stored
    round samples; (point, nan, nan) where a sample was not kept."""
    from pal_bench.bench.stats import ratio_ci

    rows = ok(df)[(ok(df).op == op) & (ok(df).capacity == capacity)].set_index("peer")
    theirs, ours = rows.loc[peer], rows.loc["pal"]
    if isinstance(theirs.get("sample_us"), list) and isinstance(ours.get("sample_us"), list):
        return ratio_ci(theirs.sample_us, ours.sample_us)
    return theirs.median_us / ours.median_us, float("nan"), float("nan")


def speedup_table(df: pd.DataFrame, ops=("insert_one", "insert_batch", "sample_update")) -> pd.DataFrame:
    """Rows: peer and operation; columns: capacity; cells: peer median / PAL median (with a bootstrap 95%
    interval where round samples were kept), or why not run."""
    from pal_bench.bench.stats import fmt_ci

    med = ok(df).pivot_table(index=["op", "capacity"], columns="peer", values="median_us", aggfunc="first")
    if "pal" not in med.columns:
        return pd.DataFrame()
    skipped = df[df.status == "skipped"].set_index(["peer", "op", "capacity"]).reason
    caps = sorted(df.capacity.unique())
    batch = int(df.batch.iloc[0])
    rows = {}
    for peer in sorted(p for p in df.peer.unique() if p != "pal"):
        for op in ops:
            cells = {}
            for c in caps:
                if (op, c) in med.index and peer in med.columns and pd.notna(med.loc[(op, c), peer]):
                    cells[f"N={fmt_n(c)}"] = fmt_ci(*speedup_ci(df, peer, op, c), 1)
                elif (peer, op, c) in skipped.index:
                    why = skipped.loc[(peer, op, c)]
                    why = why.iloc[0] if isinstance(why, pd.Series) else why
                    cells[f"N={fmt_n(c)}"] = "no batch insert" if "batch insert" in why else "skipped"
            if any(v != "" for v in cells.values()) and cells:
                rows[f"{peer}: {op_label(op, batch)}"] = cells
    return pd.DataFrame.from_dict(rows, orient="index").fillna("")


def batch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median sample+update latency (µs) per peer and batch size."""
    su = ok(df[df.op == "sample_update"])
    t = su.pivot_table(index="peer", columns="batch", values="median_us", aggfunc="first")
    t.columns = [f"B={b}" for b in t.columns]
    return t


def skipped_table(df: pd.DataFrame) -> pd.DataFrame:
    s = df[df.status == "skipped"]
    if s.empty:
        return s
    g = s.groupby(["peer", "reason"]).agg(cases=("op", "size"), suites=("suite", lambda x: ", ".join(sorted(set(x)))))
    return g.reset_index()[["peer", "cases", "suites", "reason"]]


def tables_markdown(tidy: pd.DataFrame, machine: dict) -> str:
    md = [f"Median latency in µs, full buffer, LunarLander fields (obs 8 x float32, action, reward, next obs, "
          f"done), alpha 0.6, beta 0.4. Machine: {machine_line(machine)}.", ""]
    cap = tidy[tidy.suite == "latency_vs_capacity"]
    if not ok(cap).empty:
        md += ["### PAL PrioritizedReplayBuffer, latency vs capacity (batch 256)", "",
               pal_table(cap).to_markdown(floatfmt=".2f"), ""]
        sp = speedup_table(cap)
        if not sp.empty:
            md += ["### Speedup of PAL over each peer (peer median / PAL median, same run; bootstrap 95% interval "
                   "over the stored rounds where kept)", "",
                   sp.to_markdown(), ""]
    bat = tidy[tidy.suite == "latency_vs_batch"]
    if not ok(bat).empty:
        n = fmt_n(bat.capacity.min())
        md += [f"### sample+update latency vs batch size at N={n} (µs)", "",
               batch_table(bat[bat.capacity == bat.capacity.min()]).to_markdown(floatfmt=".1f"), ""]
    fan = ok(tidy[tidy.suite == "latency_vs_fanout"])
    if not fan.empty:
        n = fan.capacity.max()
        t = fan[fan.capacity == n].pivot_table(index="fanout", columns="op", values="median_us", aggfunc="first")
        t = t[[op for op in OP_LABELS if op in t.columns]]
        t.columns = [op_label(op, 256) for op in t.columns]
        md += [f"### PAL fan-out sweep at N={fmt_n(n)} (µs)", "", t.to_markdown(floatfmt=".2f"), ""]
    tree = ok(tidy[tidy.suite == "tree_vs_buffer"])
    if not tree.empty:
        t = tree.pivot_table(index=["op", "peer"], columns="capacity", values="median_us", aggfunc="first")
        t.columns = [f"N={fmt_n(c)}" for c in t.columns]
        t.index = [f"{op_label(op, 256)}: {peer}" for op, peer in t.index]
        md += ["### The tree alone (pal-tree) vs the full buffer (pal) vs no tree (pal-uniform), µs", "",
               t.to_markdown(floatfmt=".2f"), ""]
    sk = skipped_table(tidy)
    if not sk.empty:
        md += ["### Cases not run, and why", "", sk.to_markdown(index=False), ""]
    return "\n".join(md)


def draw_trainer_figures(results: Path) -> list[Path]:
    """Redraw the trainer-scaling and buffer-concurrency figures from whichever stored CSVs exist."""
    from pal_bench.studies import concurrency
    from pal_bench.studies.scaling import backends_figure, draw_end_to_end
    from pal_bench.studies.scaling import draw as draw_scaling

    out, figures = results / "figures", []
    if (results / "scaling_async_env.csv").exists():
        figures.append(draw_scaling(pd.read_csv(results / "scaling_async_env.csv"), out / "scaling_async_env.png"))
    if (results / "scaling_ray.csv").exists():
        figures.append(draw_scaling(pd.read_csv(results / "scaling_ray.csv"), out / "scaling_ray.png"))
        if (fig := backends_figure(results)) is not None:      # thread and Ray backends side by side
            figures.append(fig)
    for name in ("end_to_end", "end_to_end_ray"):
        if (results / f"{name}.csv").exists():
            figures.append(draw_end_to_end(pd.read_csv(results / f"{name}.csv"), out / f"{name}.png"))
    if (results / "buffer_concurrency.csv").exists():
        conc = pd.read_csv(results / "buffer_concurrency.csv")
        figures.append(concurrency.draw(conc, out / "buffer_concurrency.png"))
    return figures


def draw_study_figures(results: Path) -> list[Path]:
    """Redraw the figures of the other studies from whichever stored CSVs exist."""
    figures: list[Path] = []
    if (results / "plugin.csv").exists():
        from pal_bench.studies.plugin import draw as draw_plugin
        from pal_bench.studies.plugin import speedup_table

        table = speedup_table(pd.read_csv(results / "plugin.csv"))
        figures.append(draw_plugin(table, results / "figures" / "plugin.png"))
    for task in ("quick", "full"):
        suffix = "" if task == "full" else f"_{task}"
        if (results / f"race{suffix}_curves.csv").exists():
            from pal_bench.studies.race import TASKS
            from pal_bench.studies.race.figure import draw as draw_race

            curves = pd.read_csv(results / f"race{suffix}_curves.csv")
            for track, c in curves.groupby("track"):
                figures.append(draw_race(c, track, TASKS[task], results / "figures" / f"race{suffix}_{track}.png"))
    for base in (results, results / "full"):
        if (base / "longhaul.csv").exists() and (base / "longhaul_timeline.csv").exists():
            from pal_bench.studies.longhaul.experiment import draw as draw_longhaul

            figures += draw_longhaul(pd.read_csv(base / "longhaul.csv"), pd.read_csv(base / "longhaul_timeline.csv"),
                                     base / "figures")
        if (base / "aggregation.csv").exists():
            from pal_bench.studies.aggregation import draw as draw_aggregation

            figures += draw_aggregation(pd.read_csv(base / "aggregation.csv"), base / "figures")
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="where README.md and docs/ are (their generated blocks are rebuilt)")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    ap.add_argument("--no-docs", action="store_true", help="leave README.md and docs/ alone")
    ap.add_argument("--html", action="store_true", help="also write the HTML page (see --out)")
    ap.add_argument("--out", type=Path, help="where the HTML page goes (default: <results>/report)")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        ap.error(f"argument --results: {args.results} is not a directory")
    from pal_bench.bench import tables

    try:
        tidy, machine = load_all(args.results)
    except FileNotFoundError as e:
        print(f"pal-bench report: {e}", file=sys.stderr)
        return 2
    tidy.drop(columns="sample_us").to_csv(args.results / "latency.csv", index=False, float_format="%.4f")
    text = tables_markdown(tidy, machine)
    (args.results / "latency_tables.md").write_text(text)
    figures: list[Path] = []
    if not args.no_figures:
        figures = figs.draw_all(tidy, args.results / "figures", machine_line(machine))
        if (args.results / "scaling.csv").exists():
            from pal_bench.studies.scaling import draw as draw_scaling

            figures.append(draw_scaling(pd.read_csv(args.results / "scaling.csv"),
                                        args.results / "figures" / "scaling.png"))
        figures += draw_trainer_figures(args.results)
        figures += draw_study_figures(args.results)
    for f in figures:
        print(f"figure: {f}")
    if not args.no_docs:
        files = tables.doc_files(args.root)
        changed = tables.regenerate([f for f in files if f.exists()], args.results)
        print(f"generated blocks rebuilt in {len([f for f in files if f.exists()])} files; changed: "
              + (", ".join(changed) if changed else "none"))
    if args.html:
        from pal_bench.bench import html_report

        print(f"report: {html_report.write(args.root, args.results, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
