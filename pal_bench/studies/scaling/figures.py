"""The scaling study's figures: f_a and f_l against workers (``draw``), the backends side by side
(``draw_backends``, ``backends_figure``) and the whole trainer per split (``draw_end_to_end``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.conditions import usable_cores
from pal_bench.stored_tables import read_csv


def draw(df: pd.DataFrame, path: Path) -> Path:
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    labels = {"f_a": "f_a: transitions/s (actors)", "f_l": "f_l: updates/s (learners)"}
    ray = "backend" in df and df.backend.iloc[0] == "ray"
    unit = "Ray processes" if ray else "threads"
    for kind, g in df.groupby("curve"):
        axes[0].plot(g.threads, g.throughput, marker="o", label=labels[kind])
        axes[1].plot(g.threads, g.speedup, marker="o", label=kind)
        axes[2].plot(g.threads, g.efficiency, marker="o", label=kind)
    xs = sorted(df.threads.unique())
    axes[1].plot(xs, xs, "k--", lw=1, label="ideal")
    cores = int(df.cores.iloc[0])
    for ax, title, ylabel in zip(axes, (f"throughput vs {unit}", "speedup", "parallel efficiency"),
                                 ("per second", "speedup over 1 worker", f"speedup / {unit}")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"{unit} (cores)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if df.oversubscribed.any():
            ax.axvspan(cores + 0.5, max(xs) + 0.5, color="gray", alpha=0.12, label="oversubscribed")
        ax.legend(fontsize=7)
    backend = df.backend.iloc[0] if "backend" in df else "threads"
    fig.text(0.99, 0.01, f"{df.algo.iloc[0]} {df.env.iloc[0]}, backend {backend}, {cores} usable cores", ha="right",
             fontsize=6, color="gray")
    return save_figure(fig, path)


def draw_backends(threads: pd.DataFrame, ray: pd.DataFrame, path: Path,
                  e2e: dict[str, pd.DataFrame] | None = None, processes: pd.DataFrame | None = None) -> Path:
    """f_a and f_l of the thread backend (``results/scaling.csv``) and the Ray backend
    (``results/scaling_ray.csv``) on one figure: throughput vs workers (threads or processes; log
    scale, so both curves read), speedup over one worker with the ideal line, and the Ray path's
    cost per transition / per update (1/f_ray - 1/f_threads, µs) at each worker count. With ``processes``
    (``results/scaling_processes.csv``) the process backend's curves join the first two panels; with ``e2e``
    (backend -> ``end_to_end`` table) a fourth panel: the whole trainer's env steps/s vs workers."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    e2e = {k: v for k, v in (e2e or {}).items() if v is not None and len(v)}
    fig, axes = plt.subplots(1, 4 if e2e else 3, figsize=(17 if e2e else 13, 3.8))
    colors = {"f_a": "#1f77b4", "f_l": "#d62728"}
    styles = {"threads": ("-", "o", "threads"), "ray": ("--", "s", "Ray processes"),
              "processes": ("-.", "^", "actor processes")}
    labels = {"f_a": "f_a transitions/s", "f_l": "f_l updates/s"}
    frames = {"threads": threads, "ray": ray} | ({"processes": processes} if processes is not None else {})
    for backend, df in frames.items():
        ls, marker, name = styles[backend]
        for kind, g in df.sort_values("threads").groupby("curve"):
            axes[0].plot(g.threads, g.throughput, ls=ls, marker=marker, color=colors[kind],
                         label=f"{labels[kind]}, {name}")
            axes[1].plot(g.threads, g.speedup, ls=ls, marker=marker, color=colors[kind], label=f"{kind}, {name}")
    xs = sorted({int(x) for df in frames.values() for x in df.threads})
    axes[1].plot(xs, xs, "k:", lw=1, label="ideal")
    t = threads.set_index(["curve", "threads"]).throughput
    r = ray.set_index(["curve", "threads"]).throughput
    both = t.index.intersection(r.index)
    width = 0.38
    # f_a's overhead (µs per transition) on the left axis, f_l's (ms per update) on the right: they differ
    # by orders of magnitude
    ax_l = axes[2].twinx()
    for j, (kind, ax, scale, unit) in enumerate((("f_a", axes[2], 1e6, "µs per transition"),
                                                 ("f_l", ax_l, 1e3, "ms per update"))):
        keys = [k for k in both if k[0] == kind]
        over = [(1 / r[k] - 1 / t[k]) * scale for k in keys]
        bars = ax.bar([k[1] + (j - 0.5) * width for k in keys], over, width, color=colors[kind],
                      label=f"{kind}: {unit}")
        ax.bar_label(bars, fmt="%.0f" if kind == "f_a" else "%.1f", fontsize=7)
        ax.axhline(0, color=colors[kind], lw=0.6)
        ax.set_ylabel(unit, fontsize=8, color=colors[kind])
    axes[0].set_yscale("log")
    cores = int(threads.cores.iloc[0])
    for ax, title, ylabel in zip(axes, ("throughput vs workers", "speedup over 1 worker",
                                        "Ray's extra cost: 1/f_ray - 1/f_threads"),
                                 ("per second (log)", "speedup", None)):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("workers (threads or Ray processes)", fontsize=8)
        if ylabel:
            ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        if max(xs) > cores:
            ax.axvspan(cores + 0.5, max(xs) + 0.5, color="gray", alpha=0.12, label="oversubscribed")
        if ax is not axes[2]:
            ax.legend(fontsize=6.5)
    handles = [h for a in (axes[2], ax_l) for h in a.get_legend_handles_labels()[0]]
    ax_l.legend(handles, [h.get_label() for h in handles], fontsize=6.5, loc="upper right")
    if e2e:
        _draw_e2e_backends(axes[3], e2e, styles, cores)
    loads = [f"{name} load {df.load1.min():.1f}-{df.load1.max():.1f}" for name, df in frames.items() if "load1" in df]
    fig.text(0.99, 0.01, f"{threads.algo.iloc[0]} {threads.env.iloc[0]}, {cores} usable cores; threads: "
             f"results/scaling.csv, Ray: results/scaling_ray.csv"
             + (", processes: results/scaling_processes.csv" if processes is not None else "")
             + (f" (1-min {', '.join(loads)})" if loads else ""),
             ha="right", fontsize=6, color="gray")
    return save_figure(fig, path)


def _draw_e2e_backends(ax, e2e: dict[str, pd.DataFrame], styles: dict, cores: int) -> None:
    """Per backend, the best env steps/s over the (actors, learners) splits and the aggregation
    modes of each worker count (in-thread environments), split and mode annotated."""
    top = 0.0
    for backend, df in e2e.items():
        ls, marker, name = styles[backend]
        d = df[df.env_backend == "sync"].assign(workers=df.actors + df.learners)
        best = d.loc[d.groupby("workers").measured_transitions_per_s.idxmax()].sort_values("workers")
        ax.plot(best.workers, best.measured_transitions_per_s, ls=ls, marker=marker, color="#2ca02c", label=name)
        top = max(top, best.measured_transitions_per_s.max())
        for r in best.itertuples():
            ax.annotate(f"{r.actors}a/{r.learners}l {r.aggregation}", (r.workers, r.measured_transitions_per_s),
                        fontsize=6.5, textcoords="offset points", xytext=(3, -10))
    xs = sorted({int(a + b) for df in e2e.values() for a, b in zip(df.actors, df.learners)})
    if max(xs) > cores:
        ax.axvspan(cores + 0.5, max(xs) + 0.5, color="gray", alpha=0.12, label="oversubscribed")
    ax.set_xticks(xs)
    ax.set_title("whole trainer (best split and aggregation)", fontsize=9)
    ax.set_xlabel("workers: actors + learners", fontsize=8)
    ax.set_ylabel("env steps/s", fontsize=8)
    ax.set_ylim(0, 1.15 * top)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5)


def backends_figure(results: Path) -> Path | None:
    """``figures/scaling_backends.png`` from the stored CSVs in ``results`` (None without both
    scaling CSVs); the end-to-end panel when ``end_to_end.csv`` and ``end_to_end_ray.csv`` exist."""
    threads_csv, ray_csv = results / "scaling.csv", results / "scaling_ray.csv"
    if not (threads_csv.exists() and ray_csv.exists()):
        return None
    e2e = {b: read_csv(results / f"end_to_end{s}.csv")
           for b, s in (("threads", ""), ("ray", "_ray"), ("processes", "_processes"))
           if (results / f"end_to_end{s}.csv").exists()}
    processes_csv = results / "scaling_processes.csv"
    return draw_backends(read_csv(threads_csv), read_csv(ray_csv), results / "figures" / "scaling_backends.png",
                         e2e if {"threads", "ray"} <= set(e2e) else None,
                         read_csv(processes_csv) if processes_csv.exists() else None)


def overhead_table(threads: pd.DataFrame, ray: pd.DataFrame) -> pd.DataFrame:
    """Per curve and worker count: both throughputs, their ratio and the Ray path's extra cost per
    transition (f_a) or update (f_l), 1/f_ray - 1/f_threads in µs."""
    m = threads[["curve", "threads", "throughput"]].merge(ray[["curve", "threads", "throughput"]],
                                                          on=["curve", "threads"], suffixes=("_threads", "_ray"))
    m["ray_over_threads"] = m.throughput_ray / m.throughput_threads
    m["overhead_us"] = (1 / m.throughput_ray - 1 / m.throughput_threads) * 1e6
    return m


def draw_end_to_end(df: pd.DataFrame, path: Path) -> Path:
    """Bars of env steps/s and updates/s per (actors, learners) split, one bar per aggregation x
    env backend; oversubscribed splits (actors + learners > cores) are hatched."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    df = df.sort_values(["threads", "actors"])
    splits = list(dict.fromkeys(zip(df.actors, df.learners)))
    variants = list(dict.fromkeys(zip(df.aggregation, df.env_backend)))
    width = 0.8 / len(variants)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for ax, col, title in zip(axes, ("measured_transitions_per_s", "measured_updates_per_s"),
                              ("env steps/s (whole trainer)", "updates/s (whole trainer)")):
        for j, (agg, backend) in enumerate(variants):
            g = df[(df.aggregation == agg) & (df.env_backend == backend)].set_index(["actors", "learners"])
            xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(splits))]
            ys = [g[col].get(s, float("nan")) for s in splits]
            bars = ax.bar(xs, ys, width, label=f"aggregation {agg}, env {backend}")
            for bar, s in zip(bars, splits):
                if bool(g.oversubscribed.get(s, False)):
                    bar.set_hatch("//")
        ax.set_xticks(range(len(splits)), [f"{a}+{b}" for a, b in splits], fontsize=8)
        ax.set_xlabel("actors + learners (hatched: more threads than cores)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    backend = df.backend.iloc[0] if "backend" in df else "threads"
    fig.text(0.99, 0.01, f"backend {backend}; {int(df.threads.max())} workers max, {usable_cores()} usable cores "
             "when drawn", ha="right", fontsize=6, color="gray")
    return save_figure(fig, path)
