"""PAL's actors x learners for a race contestant: the core-split solver's choice from a backend's stored curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]


def dse_split(updates_per_step: float, backend: str = "threads", results: Path = ROOT / "results") -> tuple[int, int]:
    """The design-space exploration's split for this machine from the backend's stored f_a/f_l curves
    (``results/scaling.csv`` for threads, ``scaling_processes.csv`` for processes); (1, 1) when none are stored."""
    from pal_bench.studies import dse, scaling

    curves = results / ("scaling.csv" if backend == "threads" else f"scaling_{backend}.csv")
    if not curves.exists():
        return 1, 1
    c = pd.read_csv(curves)
    if "backend" in c:
        c = c[c.backend.fillna("threads") == backend]
    f = {k: dict(zip(g.threads, g.throughput)) for k, g in c.groupby("curve")}
    best, _, _ = dse.solve(f["f_a"], f["f_l"], updates_per_step, max(2, scaling.usable_cores()))
    return best.actors, best.learners
