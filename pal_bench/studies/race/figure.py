"""The race's figure: greedy return against wall time (set-up plus training, evaluation excluded) per contestant,
the median over seeds with the range shaded, from the stored curves."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.studies.race.contestants import CONTESTANTS
from pal_bench.studies.race.task import Task

COLORS = dict(zip(CONTESTANTS, ("#d62728", "#ff7f0e", "#8c564b", "#2ca02c", "#1f77b4", "#9467bd")))


def return_bands(curves: pd.DataFrame, points: int = 400) -> pd.DataFrame:
    """Greedy return against wall time per contestant, over seeds: on a common time grid (``points``, log-spaced),
    each seed holds its latest evaluation (a run that stopped holds its last one, up to the contestant's longest
    run); median, min and max over the seeds that have evaluated by then. Columns: contestant, wall_s, median, low,
    high, seeds."""
    curves = curves.assign(wall_s=curves.setup_s + curves.train_s)
    grid = np.geomspace(max(float(curves.wall_s.min()), 1e-3), float(curves.wall_s.max()), points)
    out = []
    for name, g in curves.groupby("contestant", sort=False):
        held = []
        for _, run in g.groupby("seed"):
            run = run.sort_values("wall_s")
            i = np.searchsorted(run.wall_s.to_numpy(), grid, side="right") - 1
            held.append(np.where(i >= 0, run.mean_return.to_numpy()[np.maximum(i, 0)], np.nan))
        held = np.asarray(held)
        have = np.isfinite(held).sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)        # all-NaN columns before the first evaluation
            out.append(pd.DataFrame({"contestant": name, "wall_s": grid, "median": np.nanmedian(held, axis=0),
                                     "low": np.nanmin(held, axis=0), "high": np.nanmax(held, axis=0),
                                     "seeds": have})[(have > 0) & (grid <= g.wall_s.max())])
    return pd.concat(out, ignore_index=True)


def draw(curves: pd.DataFrame, track: str, task: Task, path: Path, cpus: int | None = None) -> Path:
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, b in return_bands(curves).groupby("contestant", sort=False):
        seeds = curves[curves.contestant == name].seed.nunique()
        ax.plot(b.wall_s, b["median"], color=COLORS.get(name), label=f"{name} (median of {seeds})")
        ax.fill_between(b.wall_s, b.low, b.high, color=COLORS.get(name), alpha=0.15, lw=0)
    ax.axhline(task.target, color="k", ls="--", lw=1, label=f"target {task.target:g}")
    ax.set_xscale("log")
    ax.set_xlabel("wall time, s (set-up + training; evaluation excluded; log scale)")
    ax.set_ylabel(f"mean greedy return ({task.eval_episodes} episodes)")
    budget = f", {cpus} CPU{'s' if cpus != 1 else ''} each" if cpus else ""
    ax.set_title(f"{track} track{budget}, {task.env}: return against wall time; shaded: range over seeds",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
