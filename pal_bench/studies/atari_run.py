"""The trainer on a real Atari game: throughput and memory of Ape-X on ``ALE/Pong-v5`` with actor processes.
``pal-bench atari-run [--actors 1,2] [--steps 3000] [--repeats 3] [--out results]``.

Each run trains the Ape-X preset (Double DQN, dueling Nature-DQN network, 3-step returns, actor-side priorities)
on the process backend with ``--actors`` actor processes and one learner thread, ``updates_per_step`` 0.25, no
evaluation. While it runs, the resident memory (VmRSS) of the driver and of each of its child processes is read
every 0.25 s from /proc. One row per run in ``DIR/atari_run.csv``: env steps/s and Atari frames/s (4 emulator
frames a step: ``AtariPreprocessing``'s frame skip), learner updates/s, the largest VmRSS of the driver and of the
biggest actor process, and the replay buffer's bytes (capacity x record bytes, in the driver's shared segment).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import WORKERS, int_ranges, positive_int
from pal_bench.bench.publishing import Publication, md, missing, source, store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import read_csv

ENV = "ALE/Pong-v5"
FRAME_SKIP = 4
SAMPLE_S = 0.25


def _rss(pid: int) -> int:
    """VmRSS of ``pid`` in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def one_run(actors: int, steps: int, buffer_capacity: int, out_dir: Path, seed: int) -> dict:
    from pal_bench.train import make_config, make_trainer

    cfg = make_config(None, ENV, preset="apex", backend="processes", actors=actors, steps=steps,
                      learning_starts=min(1000, steps // 2), buffer_capacity=buffer_capacity, batch_size=32,
                      updates_per_step=0.25, eval_episodes=0, checkpoint_interval=0, seed=seed,
                      out_dir=str(out_dir), name=f"pong-{actors}a-{seed}", progress=False)
    peak = {"driver": 0, "child": 0}
    stop = threading.Event()

    def watch():
        me = os.getpid()
        while not stop.is_set():
            peak["driver"] = max(peak["driver"], _rss(me))
            for c in _children(me):
                peak["child"] = max(peak["child"], _rss(c))
            stop.wait(SAMPLE_S)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        with make_trainer(cfg) as tr:
            record = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                         for shape, dtype in tr.buffer.fields.values())
            s = tr.run()
    finally:
        stop.set()
        t.join()
    wall = s["wall_s"]
    return {"env": ENV, "actors": actors, "learners": 1, "steps": s["env_steps"], "updates": s["updates"],
            "wall_s": wall, "env_steps_per_s": s["env_steps"] / wall,
            "frames_per_s": FRAME_SKIP * s["env_steps"] / wall, "updates_per_s": s["updates"] / wall,
            "driver_rss_bytes": peak["driver"], "actor_rss_bytes": peak["child"],
            "buffer_bytes": buffer_capacity * record, "seed": seed}


def atari_block(results: Path) -> str:
    path = results / "atari_run.csv"
    if not path.exists():
        return missing("atari_run.csv", "pal-bench atari-run")
    df = read_csv(path)
    g = df.groupby("actors")
    t = pd.DataFrame({
        "runs": g.size(),
        "env steps/s": g.env_steps_per_s.median(), "frames/s": g.frames_per_s.median(),
        "frames/s per actor": (g.frames_per_s.median() / g.frames_per_s.median().index),
        "updates/s": g.updates_per_s.median(),
        "driver MiB": g.driver_rss_bytes.max() / 2**20, "largest actor MiB": g.actor_rss_bytes.max() / 2**20,
        "buffer MiB": g.buffer_bytes.max() / 2**20,
    }).reset_index()
    text = (f"Ape-X on {ENV} (process backend, one learner thread, batch 32, 0.25 updates per step, "
            f"{int(df.steps.iloc[0])} steps a run; medians over runs, memory the largest VmRSS seen).\n\n"
            + md(t, ".0f") + "\n\n" + source(results, "atari_run.csv") + "\n")
    curves = results / "atari" / "scaling_processes.csv"
    if curves.exists():
        c = read_csv(curves)
        c = c[c.env == ENV]
        f_a, f_l = c[c.curve == "f_a"], c[c.curve == "f_l"]
        rows = [{"workers": int(r.threads), "f_a env steps/s": r.throughput, "f_a frames/s": FRAME_SKIP * r.throughput,
                 "f_l updates/s": float(f_l[f_l.threads == r.threads].throughput.iloc[0])
                 if (f_l.threads == r.threads).any() else float("nan")} for r in f_a.itertuples()]
        text += ("\nThe scaling curves on the same game (`pal-bench scaling --env ALE/Pong-v5 --algo ddqn --backend "
                 "processes --max-threads 2 --steps 2000 --updates 100 --repeats 3 --out results/atari`: actor "
                 "processes alone, learners alone at the config's batch size, 128; medians of 3 repeats):\n\n"
                 + md(pd.DataFrame(rows), ".1f") + "\n\n" + source(results, "atari/scaling_processes.csv") + "\n")
    return text


PUBLICATION = Publication("atari-run", {"atari-run": atari_block})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench atari-run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int_ranges(WORKERS), default=[1, 2], metavar="LIST",
                    help="comma-separated actor process counts (default 1,2)")
    ap.add_argument("--steps", type=positive_int, default=3000)
    ap.add_argument("--buffer-capacity", type=positive_int, default=20_000)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    if refuse_if_busy("atari_run", args.force):
        return 2
    import tempfile

    rows = []
    with Conditions(f"Ape-X on {ENV}") as c, tempfile.TemporaryDirectory(prefix="pal-atari-run-") as tmp:
        for r in range(args.repeats):
            for a in args.actors:
                print(f"[atari] actors={a} repeat {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                rows.append(one_run(a, args.steps, args.buffer_capacity, Path(tmp), seed=r))
                print(f"    {rows[-1]['frames_per_s']:.0f} frames/s, {rows[-1]['updates_per_s']:.1f} updates/s "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    store(pd.DataFrame(rows), args.out / "atari_run.csv", c)
    print(atari_block(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
