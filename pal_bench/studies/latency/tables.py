"""The buffer suites' tables: PAL's latency, its speedup over each peer, batch and fan-out sweeps, the tree
alone against the full buffer, and the cases not run (from ``pal_bench.bench.suite_json``'s tidy rows)."""

from __future__ import annotations

import pandas as pd

from pal_bench.bench.publishing import esc
from pal_bench.bench.publishing import md as table_md
from pal_bench.bench.stats import fmt_ci, ratio_ci
from pal_bench.bench.suite_json import machine_line

OP_LABELS = {
    "insert_one": "insert 1",
    "insert_batch": "add_batch B",
    "sample": "sample B",
    "update": "update B",
    "sample_update": "sample+update B",
}
def op_label(op: str, batch: int | None = None) -> str:
    label = OP_LABELS.get(op, op)
    return label.replace(" B", f" {batch}") if batch else label


def fmt_n(n: float) -> str:
    n = int(n)
    return f"1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else str(n)


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
    rows = ok(df)[(ok(df).op == op) & (ok(df).capacity == capacity)].set_index("peer")
    return median_ratio(rows, peer, "pal")


def median_ratio(rows: pd.DataFrame, a: str, b: str) -> tuple[float, float, float]:
    """median(a) / median(b) of one case's rows (indexed by implementation) with a bootstrap 95% interval over the
    stored round samples; (point, nan, nan) where a sample was not kept."""
    theirs, ours = rows.loc[a], rows.loc[b]
    if isinstance(theirs.get("sample_us"), list) and isinstance(ours.get("sample_us"), list):
        return ratio_ci(theirs.sample_us, ours.sample_us)
    return theirs.median_us / ours.median_us, float("nan"), float("nan")


def speedup_table(df: pd.DataFrame, ops=("insert_one", "insert_batch", "sample_update")) -> pd.DataFrame:
    """Rows: peer and operation; columns: capacity; cells: peer median / PAL median (with a bootstrap 95%
    interval where round samples were kept), or why not run."""
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
    """``results/latency_tables.md``: every suite's tables, skipped cases with their reason."""
    md = [f"Median latency in µs, full buffer, LunarLander fields (obs 8 x float32, action, reward, next obs, "
          f"done), alpha 0.6, beta 0.4. Machine: {esc(machine_line(machine))}.", ""]
    cap = tidy[tidy.suite == "latency_vs_capacity"]
    if not ok(cap).empty:
        md += ["### PAL PrioritizedReplayBuffer, latency vs capacity (batch 256)", "",
               table_md(pal_table(cap), ".2f", index=True), ""]
        sp = speedup_table(cap)
        if not sp.empty:
            md += ["### Speedup of PAL over each peer (peer median / PAL median, same run; bootstrap 95% interval "
                   "over the stored rounds where kept)", "",
                   table_md(sp, "g", index=True), ""]
    bat = tidy[tidy.suite == "latency_vs_batch"]
    if not ok(bat).empty:
        n = fmt_n(bat.capacity.min())
        md += [f"### sample+update latency vs batch size at N={n} (µs)", "",
               table_md(batch_table(bat[bat.capacity == bat.capacity.min()]), ".1f", index=True), ""]
    fan = ok(tidy[tidy.suite == "latency_vs_fanout"])
    if not fan.empty:
        n = fan.capacity.max()
        t = fan[fan.capacity == n].pivot_table(index="fanout", columns="op", values="median_us", aggfunc="first")
        t = t[[op for op in OP_LABELS if op in t.columns]]
        t.columns = [op_label(op, 256) for op in t.columns]
        md += [f"### PAL fan-out sweep at N={fmt_n(n)} (µs)", "", table_md(t, ".2f", index=True), ""]
    tree = ok(tidy[tidy.suite == "tree_vs_buffer"])
    if not tree.empty:
        t = tree.pivot_table(index=["op", "peer"], columns="capacity", values="median_us", aggfunc="first")
        t.columns = [f"N={fmt_n(c)}" for c in t.columns]
        t.index = [f"{op_label(op, 256)}: {peer}" for op, peer in t.index]
        md += ["### The tree alone (pal-tree) vs the full buffer (pal) vs no tree (pal-uniform), µs", "",
               table_md(t, ".2f", index=True), ""]
    sk = skipped_table(tidy)
    if not sk.empty:
        md += ["### Cases not run, and why", "", table_md(sk, "g"), ""]
    return "\n".join(md)
