"""The long-haul study's publication: learner-side against buffer-side replay per link (docs/longhaul.md's
blocks) and its figures, from the stored CSVs (quick in ``results/``, full in ``results/full/``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.bench.publishing import Publication, esc, md, missing, source
from pal_bench.stored_tables import read_csv
from pal_bench.studies.longhaul import TOPOLOGIES


def draw(summary, timeline, fig_dir: Path) -> list[Path]:
    """``longhaul.png`` (loss, crossed priority, eval return vs wall time; a column per link) and
    ``longhaul_traffic.png`` (MB each way and learner idle share per run)."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    links = list(dict.fromkeys(summary.link))
    metrics = [("loss", "training loss"), ("crossed_priority", "avg priority crossing the link"),
               ("eval_return", "eval return")]
    fig, axes = plt.subplots(len(metrics), len(links), figsize=(4.2 * len(links), 8), squeeze=False, sharex="col")
    for j, link in enumerate(links):
        for i, (m, label) in enumerate(metrics):
            ax = axes[i][j]
            for topo in TOPOLOGIES:
                d = timeline[(timeline.link == link) & (timeline.topology == topo) & (timeline.metric == m)]
                ax.plot(d.t_s, d.value, marker="o" if m == "eval_return" else None, ms=3, label=topo)
            if i == 0:
                ax.set_title(link)
            if j == 0:
                ax.set_ylabel(label)
            if i == len(metrics) - 1:
                ax.set_xlabel("wall time (s)")
    axes[0][0].legend(fontsize=8)
    curves = save_figure(fig, fig_dir / "longhaul.png")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r.link}\n{r.topology}" for r in summary.itertuples()]
    x = np.arange(len(summary))
    a1.bar(x - 0.2, summary.bytes_to_learner / 1e6, 0.4, label="to learner")
    a1.bar(x + 0.2, summary.bytes_to_buffer / 1e6, 0.4, label="to buffer node")
    a1.set_ylabel("MB over the link")
    a1.legend(fontsize=8)
    a2.bar(x, summary.learner_idle_frac * 100)
    a2.set_ylabel("learner idle (% of run)")
    for a in (a1, a2):
        a.set_xticks(x, labels, fontsize=7)
    traffic = save_figure(fig, fig_dir / "longhaul_traffic.png")
    return [curves, traffic]


def longhaul_block(results: Path, name: str = "longhaul.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench longhaul --quick")
    df = read_csv(path)
    t = pd.DataFrame({"link": df.link, "topology": df.topology, "env steps": df.env_steps, "updates": df.updates,
                      "final loss": df.loss_final,
                      "crossed priority": df.crossed_priority,
                      "MB to learner / back": [f"{a / 1e6:.1f} / {b / 1e6:.1f}"
                                               for a, b in zip(df.bytes_to_learner, df.bytes_to_buffer)],
                      "learner idle": df.learner_idle_frac.map(lambda v: f"{v:.0%}"),
                      "eval return": df.final_eval_return, "wall s": df.wall_s})
    fmt = tuple(".4f" if c == "final loss" else ".2f" for c in t.columns)
    return (f"DQN on {esc(df.env.iloc[0])}, one seed per row: learner-side replay (learner-replay) against replay at "
            "the buffer node (buffer-replay) over each modelled link.\n\n" + md(t, fmt) + "\n\n"
            + source(results, name) + "\n")


def longhaul_full_block(results: Path) -> str:
    return longhaul_block(results, "full/longhaul.csv")


def outputs(results: Path, figures: bool) -> list[Path]:
    out: list[Path] = []
    for base in (results, results / "full"):
        if figures and (base / "longhaul.csv").exists() and (base / "longhaul_timeline.csv").exists():
            out += draw(read_csv(base / "longhaul.csv"), read_csv(base / "longhaul_timeline.csv"),
                        base / "figures")
    return out


PUBLICATION = Publication("longhaul", {"longhaul-quick": longhaul_block, "longhaul-full": longhaul_full_block},
                          outputs)
