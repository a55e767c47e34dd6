"""The buffer suites' stored results: pytest-benchmark JSON (written by ``pal_bench.bench.run``) as one
tidy frame, a row per benchmark and one per skipped case."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

SUITE_FILES = "latency_vs_*.json", "tree_vs_buffer.json", "shared_vs_private.json"


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
            "rounds": st["rounds"], "sweep": info.get("sweep", info.get("profile")), "status": "ok", "reason": "",
            "sample_us": [x * 1e6 for x in st["data_sample"]] if st.get("data_sample") else None,
        })
    for s in data.get("skipped", []):
        rows.append({"suite": path.stem, "name": "", "peer": s["peer"], "op": s["op"], "capacity": s["capacity"],
                     "batch": s["batch"], "fanout": s.get("fanout"), "sweep": s.get("sweep", s.get("profile")),
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
