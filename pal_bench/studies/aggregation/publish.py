"""The aggregation study's publication: ms per iteration and the share spent aggregating, per scheme, learner
count and network size (docs/aggregation.md's blocks), and its two figures, from the stored CSVs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pal_bench.bench.publishing import Publication, esc, md, missing, source
from pal_bench.stored_tables import read_csv

SCHEMES = ("threads-ps", "ps-sync", "ps-async", "allreduce", "hierarchical")


def draw(df, fig_dir: Path) -> list[Path]:
    """``aggregation_breakdown.png`` (stacked phases vs learners, one panel per scheme and size) and
    ``aggregation_share.png`` (share vs parameters, one line per scheme, at the most learners)."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    schemes = [s for s in SCHEMES if s in set(df.scheme)]
    sizes = sorted(set(df.params))
    fig, axes = plt.subplots(len(sizes), len(schemes), figsize=(3.2 * len(schemes), 2.8 * len(sizes)),
                             squeeze=False, sharex=True)
    colors = {"compute_s": "#4c72b0", "communicate_s": "#dd8452", "apply_s": "#55a868"}
    for i, p in enumerate(sizes):
        for j, s in enumerate(schemes):
            ax, d = axes[i][j], df[(df.params == p) & (df.scheme == s)].sort_values("learners")
            bottom = np.zeros(len(d))
            for k, c in colors.items():
                ax.bar(d.learners, d[k] * 1e3, bottom=bottom, color=c, label=k.removesuffix("_s"))
                bottom += d[k].to_numpy() * 1e3
            ax.set_title(f"{s}, {p:,} params", fontsize=9)
            ax.set_xticks(sorted(set(df.learners)))
            if j == 0:
                ax.set_ylabel("ms / iteration")
            if i == len(sizes) - 1:
                ax.set_xlabel("learners")
    axes[0][0].legend(fontsize=7)
    breakdown = save_figure(fig, fig_dir / "aggregation_breakdown.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    top = df.learners.max()
    for s in schemes:
        d = df[(df.scheme == s) & (df.learners == top)].sort_values("params")
        ax.plot(d.params, d.aggregation_share * 100, marker="o", label=s)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("aggregation share of iteration (%)")
    ax.set_title(f"gradient aggregation share, {top} learners")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    share = save_figure(fig, fig_dir / "aggregation_share.png")
    return [breakdown, share]


def aggregation_block(results: Path, name: str = "aggregation.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench aggregation --quick")
    df = read_csv(path)
    df["cell"] = [f"{s * 1e3:.1f} ({a:.0%})" for s, a in zip(df.iteration_s, df.aggregation_share)]
    df["size"] = df.hidden + " (" + df.params.map(lambda p: f"{p / 1e6:.2f}M" if p >= 1e5 else f"{p / 1e3:.0f}k") + ")"
    parts = []
    for learners, g in df.groupby("learners"):
        t = g.pivot_table(index="scheme", columns="size", values="cell", aggfunc="first", sort=False)
        t = t[sorted(t.columns, key=lambda c: int(g[g["size"] == c].params.iloc[0]))]
        parts.append(f"**{esc(learners)} learner{'s' if learners > 1 else ''}**: ms per iteration (share "
                     "aggregating)\n\n" + md(t.reset_index(), "g"))
    return ("Gradient aggregation per scheme, learner count and Q-network size (hidden layers, parameters).\n\n"
            + "\n\n".join(parts) + "\n\n" + source(results, name) + "\n")


def aggregation_full_block(results: Path) -> str:
    return aggregation_block(results, "full/aggregation.csv")


def outputs(results: Path, figures: bool) -> list[Path]:
    """Both figures for the quick (``results/``) and full (``results/full/``) stored CSVs."""
    out: list[Path] = []
    for base in (results, results / "full"):
        if figures and (base / "aggregation.csv").exists():
            out += draw(read_csv(base / "aggregation.csv"), base / "figures")
    return out


PUBLICATION = Publication("aggregation", {"aggregation-quick": aggregation_block,
                                          "aggregation-full": aggregation_full_block}, outputs)
