"""Tidy CSV and Markdown tables from stored pytest-benchmark JSON: ``python -m pal_bench.report``.

Reads only files in ``results/`` (never re-measures), so it can be re-run at any time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
OP_LABELS = {
    "insert_one": "insert 1",
    "insert_batch": "add_batch 256",
    "sample": "sample 256",
    "update": "update 256",
    "sample_update": "sample+update 256",
}


def load(path: Path) -> tuple[pd.DataFrame, dict]:
    """One row per benchmark: peer, op, capacity, batch, fanout, median/IQR/min in µs, rounds."""
    data = json.loads(path.read_text())
    rows = []
    for b in data["benchmarks"]:
        info, st = b["extra_info"], b["stats"]
        rows.append({
            "suite": path.stem, "name": b["name"], "peer": info["peer"], "op": info["op"],
            "capacity": info["capacity"], "batch": info["batch"], "fanout": info.get("fanout"),
            "median_us": st["median"] * 1e6, "iqr_us": st["iqr"] * 1e6, "min_us": st["min"] * 1e6,
            "rounds": st["rounds"], "profile": info.get("profile"),
        })
    return pd.DataFrame(rows), data["machine_info"]


def machine_line(machine: dict) -> str:
    cpu = machine.get("cpu", {})
    return (f"{cpu.get('brand_raw', machine.get('processor', '?'))}, {cpu.get('count', '?')} cores, "
            f"Python {machine.get('python_version', '?')}")


def pal_table(df: pd.DataFrame) -> pd.DataFrame:
    """PAL's own latency (median µs) per operation and capacity."""
    pal = df[df.peer == "pal"]
    t = pal.pivot_table(index="op", columns="capacity", values="median_us", aggfunc="first")
    t = t.reindex([op for op in OP_LABELS if op in t.index])
    t.index = [OP_LABELS[op] for op in t.index]
    t.columns = [f"N=1e{len(str(c)) - 1}" for c in t.columns]
    return t


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows: peer and operation; columns: capacity; cells: peer median / PAL median."""
    med = df.pivot_table(index=["op", "capacity"], columns="peer", values="median_us", aggfunc="first")
    if "pal" not in med.columns:
        return pd.DataFrame()
    rows = {}
    for peer in [p for p in med.columns if p != "pal"]:
        for op in ("insert_one", "insert_batch", "sample_update"):
            if op not in med.index.get_level_values(0):
                continue
            r = (med.loc[op, peer] / med.loc[op, "pal"]).dropna()
            if not r.empty:
                rows[(peer, OP_LABELS[op])] = {f"N=1e{len(str(c)) - 1}": v for c, v in r.items()}
    t = pd.DataFrame.from_dict(rows, orient="index")
    t.index = [f"{p}: {o}" for p, o in t.index]
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    files = sorted(args.results.glob("latency_*.json"))
    if not files:
        print(f"no results in {args.results}: run `make bench` first", file=sys.stderr)
        return 1
    frames, machine = [], {}
    for f in files:
        df, machine = load(f)
        frames.append(df)
    tidy = pd.concat(frames, ignore_index=True)
    tidy.to_csv(args.results / "latency.csv", index=False, float_format="%.4f")
    md = [f"Median latency in µs, full buffer, LunarLander fields; machine: {machine_line(machine)}.", ""]
    cap = tidy[tidy.suite == "latency_vs_capacity"]
    if not cap.empty:
        md += ["### PAL PrioritizedReplayBuffer, latency vs capacity", "",
               pal_table(cap).to_markdown(floatfmt=".2f"), ""]
        sp = speedup_table(cap)
        if not sp.empty:
            md += ["### Speedup of PAL over each peer (peer median / PAL median, same run)", "",
                   sp.to_markdown(floatfmt=".1f"), ""]
    fan = tidy[tidy.suite == "latency_vs_fanout"]
    if not fan.empty:
        t = fan.pivot_table(index="fanout", columns="op", values="median_us", aggfunc="first")
        t = t[[op for op in OP_LABELS if op in t.columns]].rename(columns=OP_LABELS)
        n = int(fan.capacity.max())
        md += [f"### PAL fan-out sweep at N=1e{len(str(n)) - 1}", "", t.to_markdown(floatfmt=".2f"), ""]
    text = "\n".join(md)
    (args.results / "latency_tables.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
