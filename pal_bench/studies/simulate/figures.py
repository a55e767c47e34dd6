"""The paper-style figure of the predictions: f_a and f_l against cores (measured points solid, predicted curves
dashed with their interval band, points past a shared resource's knee marked), and the whole trainer at the
split the curves give."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.stored_tables import read_csv


def measured_curves(results: Path, backend: str) -> pd.DataFrame:
    """The stored f_a / f_l points of ``backend`` (empty when none)."""
    from pal_bench.studies.simulate.validate import SCALING

    path = results / SCALING[backend]
    if not path.exists():
        return pd.DataFrame(columns=["curve", "threads", "throughput"])
    df = read_csv(path)
    return df[df.get("env_backend", "sync") == "sync"]


def draw_predictions(df: pd.DataFrame, results: Path, backend: str) -> Path:
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    measured = measured_curves(results, backend)
    titles = {"f_a": "f_a: env steps/s (actors only)", "f_l": "f_l: updates/s (learners only)",
              "end_to_end": "whole trainer: env steps/s at the chosen split"}
    for ax, curve in zip(axes, ("f_a", "f_l", "end_to_end")):
        p = df[df.curve == curve].sort_values("cores")
        ax.plot(p.cores, p.predicted, "--", color="#1f77b4", label="predicted")
        if "lo90" in p:
            ax.fill_between(p.cores, p.lo90, p.hi90, color="#1f77b4", alpha=0.15,
                            label="stated 90% (inputs and model error)")
        if "lo" in p:
            ax.fill_between(p.cores, p.lo, p.hi, color="#1f77b4", alpha=0.3, label="resampled inputs alone")
        past = p[p.limit.fillna("") != ""]
        if len(past):
            ax.plot(past.cores, past.predicted, "x", color="#d62728", label="past a shared resource's knee")
        m = measured[measured.curve == curve] if curve != "end_to_end" else measured.iloc[0:0]
        if len(m):
            ax.plot(m.threads, m.throughput, "o-", color="black", label="measured")
        ax.set_xscale("log", base=2)
        ax.set_title(titles[curve], fontsize=9)
        ax.set_xlabel("cores", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.text(0.99, 0.01, f"DQN CartPole-v1, backend {backend}: simulated (pal_bench.studies.simulate)", ha="right",
             fontsize=6, color="gray")
    return save_figure(fig, results / "figures" / f"simulation_{backend.replace('-', '_')}.png")
