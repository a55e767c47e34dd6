"""Learning-curve figure of a run: evaluation return (and training episode returns) vs env steps."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.plotting import pyplot, save_figure


def learning_curve(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    eps = run_dir / "episodes.csv"
    if eps.exists():
        e = pd.read_csv(eps)
        if len(e):
            ax.plot(e.env_steps, e["return"], ".", ms=2, alpha=0.3, color="gray", label="training episodes")
            ax.plot(e.env_steps, e["return"].rolling(20, min_periods=1).mean(), color="gray", lw=1,
                    label="training (mean of 20)")
    ev = pd.read_csv(run_dir / "eval.csv")
    if len(ev):
        ax.errorbar(ev.env_steps, ev.mean_return, yerr=ev.std_return, marker="o", ms=3, color="#d62728",
                    capsize=2, label="evaluation")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(run_dir.name, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, run_dir / "learning_curve.png", dpi=100)
