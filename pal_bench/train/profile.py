"""Where does a run's time go? ``pal-bench profile results/runs/<name>``.

Reads the per-phase seconds every worker recorded (``summary.json``: ``phase_seconds``), prints
one table per worker role (seconds and share of the worker's time per phase, averaged over the
workers of that role) and draws them as stacked bars (``profile.png`` in the run directory).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

PHASE_ORDER = ["setup", "rate_wait", "weights_pull", "inference", "env_step", "buffer_insert", "sample",
               "forward_backward", "priority_update", "aggregation_wait", "apply", "aggregate", "publish", "idle"]


def phases(run_dir: str | Path) -> pd.DataFrame:
    """One row per worker and phase: worker, role, phase, seconds, share of that worker's total."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: profile a finished run directory (results/runs/<name>)")
    summary = json.loads(path.read_text())
    try:
        return phase_frame(summary.get("phase_seconds", {}))
    except ValueError:
        raise ValueError(f"{path} holds no per-phase times") from None


def phase_frame(phase_seconds: dict[str, dict[str, float]]) -> pd.DataFrame:
    """``phase_seconds`` (worker -> phase -> s, as in ``summary.json``) as one row per worker and phase:
    worker, role, phase, seconds, share of that worker's total. ValueError if it holds no times."""
    rows = []
    for worker, ph in phase_seconds.items():
        total = sum(ph.values()) or 1.0
        role = re.sub(r"\d+$", "", worker)
        for phase, s in ph.items():
            rows.append({"worker": worker, "role": role, "phase": phase, "seconds": s, "share": s / total})
    if not rows:
        raise ValueError("no per-phase times")
    return pd.DataFrame(rows)


def role_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds and mean share per role and phase (phases in pipeline order)."""
    t = df.groupby(["role", "phase"], as_index=False)[["seconds", "share"]].mean()
    t["order"] = t.phase.map(lambda p: PHASE_ORDER.index(p) if p in PHASE_ORDER else 99)
    return t.sort_values(["role", "order"]).drop(columns="order")


def draw(df: pd.DataFrame, path: Path) -> Path:
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    t = role_table(df).pivot_table(index="role", columns="phase", values="share", aggfunc="first").fillna(0)
    t = t[[p for p in PHASE_ORDER if p in t.columns] + [p for p in t.columns if p not in PHASE_ORDER]]
    fig, ax = plt.subplots(figsize=(8.5, 1.4 + 0.55 * len(t)))
    (t * 100).plot.barh(stacked=True, ax=ax, colormap="tab20", width=0.7)
    ax.set_xlabel("share of the worker's time (%)")
    ax.set_ylabel("")
    ax.set_xlim(0, 100)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(path.parent.name, fontsize=9)
    return save_figure(fig, path, dpi=100)


def lock_line(run_dir: str | Path) -> str | None:
    """The buffer mutex's contention: is the buffer (wait >> 0) or the GIL the bottleneck?"""
    s = json.loads((Path(run_dir) / "summary.json").read_text()).get("buffer_lock")
    if not s:
        return None
    share = s["contended"] / max(1, s["acquisitions"])
    return (f"buffer lock: {s['acquisitions']} acquisitions, {share:.1%} contended, waited {s['wait_s']:.3f} s, "
            f"held {s['hold_s']:.3f} s in total")


def main(run_dir: str, out: str | None = None) -> int:
    """Print the per-phase table of the run in ``run_dir``; draw profile.png into ``out`` (default: the run)."""
    df = phases(run_dir)
    t = role_table(df)
    t["share"] = (t.share * 100).round(1)
    print(t.rename(columns={"share": "share_%"}).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    line = lock_line(run_dir)
    if line:
        print(line)
    print(f"figure: {draw(df, Path(out or run_dir) / 'profile.png')}")
    return 0
