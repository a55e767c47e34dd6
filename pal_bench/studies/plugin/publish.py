"""The plug-in benchmark's publication: the speedup table (docs/plugin.md's ``plugin`` block) and figure, from
the stored ``results/plugin.csv``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.bench.publishing import Publication, Unusable, md, missing, source
from pal_bench.bench.stats import fmt_ci, ratio_ci
from pal_bench.stored_tables import read_csv


def _times(cell) -> list[float]:
    return [float(x) for x in str(cell).split()] if isinstance(cell, str) and cell.strip() else []


def speedup_table(df: pd.DataFrame, path: Path | str = "plugin.csv") -> pd.DataFrame:
    """One row per configuration: median ms with each buffer, speedup default / PAL with a bootstrap 95%
    interval over the timed iterations (``speedup_low``/``_high``; NaN for results stored without their
    iteration times), buffer shares, the Amdahl bound, and a ``note`` where the speedup exceeds the bound.
    ``Unusable`` (naming ``path``) where a configuration has one buffer's row but not the other's (an interrupted
    ``plugin-bench``)."""

    keys = ["framework", "env", "batch_size", "env_runners"]
    d = df[df.buffer == "default"].set_index(keys)
    p = df[df.buffer == "pal"].set_index(keys)
    unmatched = [*p.index.difference(d.index), *d.index.difference(p.index)]
    if unmatched:
        key = unmatched[0]
        lacking, other = ("default", "pal") if key in p.index else ("pal", "default")
        raise Unusable(f"{path}: no {lacking!r} buffer row for {', '.join(f'{k} {v}' for k, v in zip(keys, key))}: "
                       f"its {other!r} row has nothing to be compared with")
    t = pd.DataFrame({"default_ms": d.iteration_s * 1e3, "pal_ms": p.iteration_s * 1e3,
                      "speedup": d.iteration_s / p.iteration_s,
                      "buffer_share_default": d.buffer_share, "buffer_share_pal": p.buffer_share}).reset_index()
    # the speedup if the buffer took no time at all (Amdahl bound for replacing the buffer)
    t["bound"] = 1 / (1 - t.buffer_share_default)
    lows, highs = [], []
    for key in zip(*(t[k] for k in keys)):
        a = _times(d.loc[key].get("times_s")) if "times_s" in d else []
        b = _times(p.loc[key].get("times_s")) if "times_s" in p else []
        _, lo, hi = ratio_ci(a, b) if a and b else (np.nan, np.nan, np.nan)
        lows.append(lo)
        highs.append(hi)
    t["speedup_low"], t["speedup_high"] = lows, highs
    t["note"] = [_note(f, s, lo, bound) for f, s, lo, bound in zip(t.framework, t.speedup, t.speedup_low, t.bound)]
    return t


# drop-ins that change work outside the buffer's own methods, so their speedup may exceed the buffer-only bound
_RLLIB_COLUMNAR = ("above the buffer-only bound, as expected: PAL's columnar samples also cut RLlib's "
                   "learner-connector work (profile in docs/plugin.md)")
BEYOND_THE_BUFFER = {"rllib-dqn": _RLLIB_COLUMNAR, "rllib-sac": _RLLIB_COLUMNAR}


def _note(framework: str, speedup: float, low: float, bound: float) -> str:
    """Why a speedup above the Amdahl bound is expected (a drop-in that changes work outside the buffer) or
    a measurement problem (any other); empty when it is within the bound."""
    above = low > bound if np.isfinite(low) else speedup > bound
    if not above:
        return ""
    if framework in BEYOND_THE_BUFFER:
        return BEYOND_THE_BUFFER[framework]
    return ("interval above the Amdahl bound: a measurement problem, not a result" if np.isfinite(low)
            else "above the Amdahl bound (no interval stored): not a result")


def draw(t: pd.DataFrame, path: Path) -> Path:
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    labels = [f"{r.framework}\nB={r.batch_size} runners={r.env_runners}" for r in t.itertuples()]
    x = np.arange(len(t))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(t) + 2), 4))
    ax.bar(x - 0.2, t.default_ms, 0.4, label="framework's own buffer")
    ax.bar(x + 0.2, t.pal_ms, 0.4, label="PAL drop-in")
    for xi, r in zip(x, t.itertuples()):
        ax.text(xi, max(r.default_ms, r.pal_ms) * 1.02, f"{r.speedup:.2f}x", ha="center", fontsize=7)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("median time per training iteration (ms)")
    ax.set_title("training iteration: default buffer vs PAL's drop-in", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plugin_block(results: Path) -> str:
    path = results / "plugin.csv"
    if not path.exists():
        return missing("plugin.csv", "make plugin-bench")
    t = speedup_table(read_csv(path), path)
    out = pd.DataFrame({
        "framework": t.framework, "env": t.env, "batch": t.batch_size, "env runners": t.env_runners,
        "default ms": t.default_ms, "PAL ms": t.pal_ms,
        "speedup [95% CI]": [fmt_ci(*x) for x in zip(t.speedup, t.speedup_low, t.speedup_high)],
        "buffer share default -> PAL": [f"{a:.0%} -> {b:.0%}" for a, b in zip(t.buffer_share_default,
                                                                             t.buffer_share_pal)],
        "Amdahl bound": t.bound, "note": t.note})
    return ("Median training-iteration time with the framework's own prioritized buffer and with PAL's drop-in "
            "(same seed and config, iterations alternating ABBA). The bound is the speedup if the buffer took no "
            "time (1 / (1 - default share)); a speedup whose interval lies above it is a measurement problem, "
            "flagged, not a result, unless the drop-in also changes work outside the buffer (RLlib: its columnar "
            "samples cut the learner connector's per-episode reads; noted). Intervals: bootstrap over the timed "
            "iterations (where stored).\n\n"
            + md(out, ".2f") + "\n\n" + source(results, "plugin.csv") + "\n")


def outputs(results: Path, figures: bool) -> list[Path]:
    path = results / "plugin.csv"
    if not (figures and path.exists()):
        return []
    return [draw(speedup_table(read_csv(path), path), results / "figures" / "plugin.png")]


PUBLICATION = Publication("plugin", {"plugin": plugin_block}, outputs)
