"""Paper-style figures of the buffer suites, from the tidy latency rows (``publish.outputs`` calls ``draw_all``).

Log-log latency vs buffer size, one line per implementation (the PAL paper's latency figure), one
file per operation plus a panel of all of them; latency vs batch size; the fan-out sweep; the tree
alone vs the full buffer. PNG files in ``results/figures/``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pandas as pd

from pal_bench.plotting import pyplot, save_figure

OPS = ["insert_one", "insert_batch", "sample", "update", "sample_update"]
TITLES = {"insert_one": "insert 1 transition", "insert_batch": "add_batch (B transitions)",
          "sample": "sample B", "update": "update B priorities", "sample_update": "sample B + update B"}
STYLE = {  # peer -> (colour, marker); PAL in bold colours, peers in muted ones
    "pal": ("#d62728", "o"), "pal-uniform": ("#ff9896", "s"), "pal-tree": ("#9467bd", "^"),
    "tianshou": ("#1f77b4", "v"), "cpprb": ("#2ca02c", "D"), "rllib": ("#7f7f7f", "P"),
    "rllib-episode": ("#bcbd22", "X"), "sb3": ("#8c564b", "<"), "floor-gather": ("#000000", "_"),
    "pal-out": ("#e377c2", "o"),
}
# a user's buffers (``pal-bench latency --impl mypkg.buf:MyBuffer``): a colour each, picked from the name
USER_STYLES = [("#ff7f0e", "*"), ("#17becf", "*"), ("#9edae5", "h"), ("#c49c94", "p")]
README_FIGURES = {"latency_vs_capacity", "latency_vs_fanout"}


def _style(peer: str) -> dict:
    colour, marker = STYLE.get(peer) or USER_STYLES[zlib.crc32(peer.encode()) % len(USER_STYLES)]
    return dict(color=colour, marker=marker, lw=2.2 if peer == "pal" else 1.4, ms=5, label=peer)


def _lines(ax, df: pd.DataFrame, x: str) -> None:
    for peer, g in df.groupby("peer", sort=False):
        g = g.sort_values(x)
        ax.plot(g[x], g.median_us, **_style(peer))
        ax.fill_between(g[x], g.median_us - g.iqr_us / 2, g.median_us + g.iqr_us / 2,
                        color=_style(peer)["color"], alpha=0.15, lw=0)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {p: i for i, p in enumerate(STYLE)}
    return df.assign(_r=df.peer.map(lambda p: rank.get(p, 99))).sort_values("_r").drop(columns="_r")


def latency_vs_capacity(df: pd.DataFrame, out: Path, note: str) -> list[Path]:
    """One log-log figure per operation, and a panel of all operations."""
    plt = pyplot()
    df = _order(df)
    ops = [op for op in OPS if op in set(df.op)]
    paths = []
    batch = int(df.batch.iloc[0])
    for op in ops:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        _lines(ax, df[df.op == op], "capacity")
        _axes(ax, f"{TITLES[op].replace('B', str(batch))}", "buffer size (transitions)")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out / f"latency_vs_capacity_{op}.png", note))
    ncol = 3
    nrow = -(-(len(ops) + 1) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.1 * nrow), squeeze=False)
    flat = list(axes.flat)
    for ax, op in zip(flat, ops):
        _lines(ax, df[df.op == op], "capacity")
        _axes(ax, TITLES[op].replace("B", str(batch)), "buffer size (transitions)")
    seen: dict[str, object] = {}
    for ax in flat[:len(ops)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    handles, labels = list(seen.values()), list(seen)
    for ax in flat[len(ops):]:
        ax.axis("off")
    flat[len(ops)].legend(handles, labels, loc="center", fontsize=9, title="implementation")
    paths.append(save_figure(fig, out / "latency_vs_capacity.png", note))
    return paths


def _axes(ax, title: str, xlabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("median latency (µs)", fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    ax.tick_params(labelsize=7)


def latency_vs_batch(df: pd.DataFrame, out: Path, note: str) -> Path:
    plt = pyplot()
    df = _order(df[df.capacity == df.capacity.min()])
    ops = [op for op in OPS if op in set(df.op)]
    fig, axes = plt.subplots(1, len(ops), figsize=(3.3 * len(ops), 3.4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        _lines(ax, df[df.op == op], "batch")
        _axes(ax, f"{TITLES[op]}, N={int(df.capacity.iloc[0]):.0e}", "batch size B")
        ax.set_xscale("log", base=2)
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, out / "latency_vs_batch.png", note)


def latency_vs_fanout(df: pd.DataFrame, out: Path, note: str) -> Path:
    plt = pyplot()
    df = df[df.capacity == df.capacity.max()]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for op, g in df.groupby("op"):
        g = g.sort_values("fanout")
        ax.plot(g.fanout, g.median_us, marker="o", label=TITLES[op].replace("B", "256"))
    _axes(ax, f"PAL sum tree: fan-out K at N={int(df.capacity.iloc[0]):.0e}", "fan-out K")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "latency_vs_fanout.png", note)


def tree_vs_buffer(df: pd.DataFrame, out: Path, note: str) -> Path:
    plt = pyplot()
    df = _order(df)
    ops = [op for op in ("sample", "update", "sample_update") if op in set(df.op)]
    fig, axes = plt.subplots(1, len(ops), figsize=(3.3 * len(ops), 3.4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        _lines(ax, df[df.op == op], "capacity")
        _axes(ax, TITLES[op].replace("B", "256"), "buffer size")
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, out / "tree_vs_buffer.png", note)


def draw_all(tidy: pd.DataFrame, out: Path, machine: str) -> list[Path]:
    """Draw every figure whose suite has results; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    ok = tidy[tidy.status == "ok"]
    note = f"PAL-Bench, {machine}"
    paths: list[Path] = []
    suites = {s: ok[ok.suite == s] for s in ok.suite.unique()}
    if "latency_vs_capacity" in suites:
        paths += latency_vs_capacity(suites["latency_vs_capacity"], out, note)
    if "latency_vs_batch" in suites:
        paths.append(latency_vs_batch(suites["latency_vs_batch"], out, note))
    if "latency_vs_fanout" in suites:
        paths.append(latency_vs_fanout(suites["latency_vs_fanout"], out, note))
    if "tree_vs_buffer" in suites:
        paths.append(tree_vs_buffer(suites["tree_vs_buffer"], out, note))
    return paths
