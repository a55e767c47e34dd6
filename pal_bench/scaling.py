"""Throughput of data collection f_a(x) and data consumption f_l(x) against thread counts.

- ``measure_fa(cfg, x, steps)``: transitions/s into the buffer with x actor threads and no
  learning (``learning_starts`` is set past the budget, so learners never start);
- ``measure_fl(cfg, x, updates)``: learner updates/s (sample + loss + gradients + parameter
  server + priority update) with x learner threads on a buffer pre-filled with real environment
  transitions, and no actors.

Both run the real trainer's worker loops and parameter server. ``python -m pal_bench.scaling``
measures x = 1..M (M = usable cores by default; ``--max-threads`` may go past it, and those rows
are marked ``oversubscribed``), writes ``results/scaling.csv`` and draws ``results/figures/scaling.png``
(throughput vs threads with f_a and f_l on one plot, speedup with the ideal line, parallel
efficiency).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd

from pal_bench.train import Trainer, make_config, make_trainer
from pal_bench.train.rate import RateController
from pal_bench.train.workers import learner_loop

ROOT = Path(__file__).resolve().parent.parent


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _quiet(cfg, out_dir: str, **kw):
    return dataclasses.replace(cfg, progress=False, eval_episodes=0, eval_interval=0, checkpoint_interval=0,
                               deterministic=False, out_dir=out_dir, **kw)


# CPU cores the process kept busy during the last measurement (process CPU time / wall time):
# about 1.0 with several threads means they were serialised (the GIL), not spread over cores
last_cores_used: dict[str, float] = {}


def measure_fa(cfg, actors: int, steps: int) -> float:
    """Transitions/s collected by ``actors`` actor threads, or Ray actor processes for ``cfg.backend``
    "ray" (no learning)."""
    with tempfile.TemporaryDirectory(prefix="pal-scaling-") as out:
        cfg = _quiet(cfg, out, actors=actors, learners=1, steps=steps, learning_starts=steps,
                     buffer_capacity=max(cfg.buffer_capacity, steps), batch_size=min(cfg.batch_size, steps))
        with make_trainer(cfg) as tr:
            cpu0 = time.process_time()
            s = tr.run()
            last_cores_used["f_a"] = (time.process_time() - cpu0) / max(1e-9, tr.wall())
    return s["env_steps"] / s["wall_s"]


def prefill(tr: Trainer, n: int, seed: int = 0) -> None:
    """Fill the trainer's buffer with ``n`` real transitions from random actions."""
    env = gym.make(tr.cfg.env, **tr.cfg.env_kwargs)
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("obs", "act", "rew", "next_obs", "done", "disc")}
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        if tr.algo.CONTINUOUS:
            a = rng.uniform(-1, 1, tr.act_dim).astype(np.float32)
        else:
            a = int(rng.integers(tr.action_space.n))
        nxt, r, term, trunc, _ = env.step(tr.env_actions(a))
        for k, v in zip(rows, (obs, a, r, nxt, float(term), tr.cfg.gamma)):
            rows[k].append(v)
        obs = env.reset()[0] if term or trunc else nxt
    env.close()
    tr.buffer.add_batch(**{k: np.asarray(v) for k, v in rows.items()})


def measure_fl(cfg, learners: int, updates: int, filled: int = 20_000) -> float:
    """Learner updates/s with ``learners`` learner threads on a pre-filled buffer (no actors)."""
    with tempfile.TemporaryDirectory(prefix="pal-scaling-") as out:
        return _measure_fl(_quiet(cfg, out, actors=1, learners=learners,
                                  buffer_capacity=max(cfg.buffer_capacity, filled)), updates, filled)


def _measure_fl(cfg, updates: int, filled: int) -> float:
    learners = cfg.learners
    tr = Trainer(cfg)
    try:
        prefill(tr, filled)
        # every update may start at once: `updates` updates over a budget of `filled` transitions
        tr.rate = RateController(updates / filled, 0, filled, slack=0, lockstep=False)
        tr.rate.restore(filled, 0)
        tr.actors_finished.set()
        tr._spawn("parameter-server", tr.ps.serve, tr.stop)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(learners):
            tr._spawn(f"learner{i}", learner_loop, tr, i, tr.stop)
        learner_threads = tr.threads[1:]
        while any(t.is_alive() for t in learner_threads) and not tr.errors:
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        last_cores_used["f_l"] = (time.process_time() - cpu0) / wall
        done = tr.rate.done
    finally:
        tr.stop.set()
        tr._join()
    return done / wall


def end_to_end(cfg, max_threads: int, steps: int, progress=print) -> pd.DataFrame:
    """Env steps/s and updates/s of the whole trainer for every (actors, learners) split with
    actors + learners <= max_threads, sync and async aggregation, env backend sync and async."""
    from pal_bench.dse import validate

    cores = usable_cores()
    splits = [(a, b) for a in range(1, max_threads) for b in range(1, max_threads) if a + b <= max_threads]
    frames = []
    for aggregation in ("sync", "async"):
        for backend in ("sync", "async"):
            c = dataclasses.replace(cfg, aggregation=aggregation, env_backend=backend)
            df = validate(c, splits, steps, progress=lambda m, a=aggregation, b=backend: progress(f"{a}/{b} {m}"))
            frames.append(df.assign(aggregation=aggregation, env_backend=backend))
    out = pd.concat(frames, ignore_index=True)
    out["threads"] = out.actors + out.learners
    out["oversubscribed"] = out.threads > cores
    return out


def sweep(cfg, max_threads: int, steps: int, updates: int, progress=print) -> pd.DataFrame:
    cores = usable_cores()
    rows = []
    for x in range(1, max_threads + 1):
        for kind, fn, n in (("f_a", measure_fa, steps), ("f_l", measure_fl, updates)):
            progress(f"[{kind} x={x}/{max_threads}] measuring ...")
            v = fn(cfg, x, n)
            rows.append({"curve": kind, "threads": x, "throughput": v, "cores_used": last_cores_used.get(kind),
                         "cores": cores, "oversubscribed": x > cores, "algo": cfg.algo, "env": cfg.env,
                         "env_backend": cfg.env_backend})
            progress(f"[{kind} x={x}/{max_threads}] {v:.0f} {'transitions' if kind == 'f_a' else 'updates'}/s")
    df = pd.DataFrame(rows)
    base = df[df.threads == 1].set_index("curve").throughput
    df["speedup"] = df.throughput / df.curve.map(base)
    df["efficiency"] = df.speedup / df.threads
    # Amdahl's serial fraction implied by the speedup at x threads: 0 = perfectly parallel, 1 = serial
    x = df.threads.clip(upper=cores)
    df["serial_fraction"] = ((x / df.speedup - 1) / (x - 1)).where(x > 1)
    return df


def draw(df: pd.DataFrame, path: Path, ratio: float | None = None, chosen=None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    labels = {"f_a": "f_a: transitions/s (actors)", "f_l": "f_l: updates/s (learners)"}
    for kind, g in df.groupby("curve"):
        axes[0].plot(g.threads, g.throughput, marker="o", label=labels[kind])
        axes[1].plot(g.threads, g.speedup, marker="o", label=kind)
        axes[2].plot(g.threads, g.efficiency, marker="o", label=kind)
    xs = sorted(df.threads.unique())
    axes[1].plot(xs, xs, "k--", lw=1, label="ideal")
    cores = int(df.cores.iloc[0])
    for ax, title, ylabel in zip(axes, ("throughput vs threads", "speedup", "parallel efficiency"),
                                 ("per second", "speedup over 1 thread", "speedup / threads")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("threads (cores)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if df.oversubscribed.any():
            ax.axvspan(cores + 0.5, max(xs) + 0.5, color="gray", alpha=0.12, label="oversubscribed")
        ax.legend(fontsize=7)
    fig.text(0.99, 0.01, f"{df.algo.iloc[0]} {df.env.iloc[0]}, {cores} usable cores", ha="right", fontsize=6,
             color="gray")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_end_to_end(df: pd.DataFrame, path: Path) -> Path:
    """Bars of env steps/s and updates/s per (actors, learners) split, one bar per aggregation x
    env backend; oversubscribed splits (actors + learners > cores) are hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.text(0.99, 0.01, f"{int(df.threads.max())} threads max, {usable_cores()} usable cores when drawn",
             ha="right", fontsize=6, color="gray")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="dqn")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--max-threads", type=int, default=usable_cores())
    ap.add_argument("--steps", type=int, default=20_000, help="transitions per f_a point")
    ap.add_argument("--updates", type=int, default=1_000, help="updates per f_l point")
    ap.add_argument("--env-backend", choices=["sync", "async"], default="sync",
                    help="async: actors step their environments in subprocesses (outside the GIL)")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--end-to-end", type=int, metavar="STEPS", default=0,
                    help="instead, measure the whole trainer at every split (results/end_to_end.csv)")
    args = ap.parse_args(argv)
    cfg = make_config(args.algo, args.env, env_backend=args.env_backend)
    if args.end_to_end:
        e2e = end_to_end(cfg, max(2, args.max_threads), args.end_to_end, progress=lambda m: print(m, file=sys.stderr))
        args.out.mkdir(parents=True, exist_ok=True)
        e2e.to_csv(args.out / "end_to_end.csv", index=False, float_format="%.2f")
        print(e2e.to_string(index=False))
        print(f"figure: {draw_end_to_end(e2e, args.out / 'figures' / 'end_to_end.png')}")
        return 0
    df = sweep(cfg, args.max_threads, args.steps, args.updates, progress=lambda m: print(m, file=sys.stderr))
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scaling.csv" if args.env_backend == "sync" else "scaling_async_env.csv"
    df.to_csv(args.out / name, index=False, float_format="%.3f")
    print(df.to_string(index=False))
    print(f"figure: {draw(df, args.out / 'figures' / name.replace('.csv', '.png'))}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "main"
    sys.exit(main())
