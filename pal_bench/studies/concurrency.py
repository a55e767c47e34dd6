"""Buffer-only concurrency: aggregate operations/s with inserting and sampling threads.

``measure(impl, writers, samplers, seconds)``: ``writers`` threads each insert one LunarLander
transition per call, ``samplers`` threads each sample 256 and update their priorities, all on one
full buffer of capacity 1e5, for ``seconds``. PAL's buffer is thread-safe by itself; tianshou's has
no locking of its own, so it is wrapped in one ``threading.Lock`` around every call, as a user
would. Returns inserts/s, sample+update/s and the buffer's own lock statistics where it has them.
``python -m pal_bench.studies.concurrency`` prints the grid and writes ``results/buffer_concurrency.csv``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import choice_list, duration
from pal_bench.bench.adapters import ADAPTERS, lunar_row, make_adapter
from pal_bench.bench.publishing import Publication, md, missing, show, source, store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import read_csv

CAPACITY = 10**5
BATCH = 256
GRID = [(1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2)]


class Locked:
    """Wrap an adapter's operations in one lock (for buffers that are not thread-safe)."""

    def __init__(self, adapter):
        self.adapter, self.lock = adapter, threading.Lock()

    def insert_one(self, row):
        with self.lock:
            self.adapter.insert_one(row)

    def sample_update(self, priorities):
        with self.lock:
            self.adapter.update(self.adapter.sample(BATCH), priorities)


class Direct:
    def __init__(self, adapter):
        self.adapter = adapter

    def insert_one(self, row):
        self.adapter.insert_one(row)

    def sample_update(self, priorities):
        self.adapter.update(self.adapter.sample(BATCH), priorities)


_adapters: dict[str, object] = {}


def _get(impl: str):
    if impl not in _adapters:
        _adapters.clear()
        _adapters[impl] = make_adapter(impl, CAPACITY)
    return _adapters[impl]


def measure(impl: str, writers: int, samplers: int, seconds: float = 1.0) -> dict:
    adapter = _get(impl)
    ops = Direct(adapter) if impl.startswith("pal") else Locked(adapter)
    stop = threading.Event()
    counts = {"insert": [0] * writers, "sample_update": [0] * samplers}
    errors: list[BaseException] = []
    row = lunar_row()
    pool = [np.random.default_rng(i).random(BATCH) * 2 for i in range(16)]

    def writer(i):
        try:
            n = 0
            while not stop.is_set():
                ops.insert_one(row)
                n += 1
            counts["insert"][i] = n
        except BaseException as e:   # noqa: BLE001 - reported to the caller below
            errors.append(e)
            stop.set()

    def sampler(i):
        try:
            n = 0
            while not stop.is_set():
                ops.sample_update(pool[n % 16])
                n += 1
            counts["sample_update"][i] = n
        except BaseException as e:   # noqa: BLE001
            errors.append(e)
            stop.set()

    lock_before = adapter.buf.lock_stats() if hasattr(adapter.buf, "lock_stats") else None
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    threads += [threading.Thread(target=sampler, args=(i,)) for i in range(samplers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    try:
        stop.wait(seconds)
    finally:
        stop.set()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    out = {"impl": impl, "writers": writers, "samplers": samplers, "seconds": wall,
           "inserts_per_s": sum(counts["insert"]) / wall, "sample_updates_per_s": sum(counts["sample_update"]) / wall}
    if lock_before is not None:
        after = adapter.buf.lock_stats()
        acq = after["acquisitions"] - lock_before["acquisitions"]
        out["lock_contended_share"] = (after["contended"] - lock_before["contended"]) / max(1, acq)
        out["lock_wait_s"] = after["wait_s"] - lock_before["wait_s"]
        out["lock_hold_s"] = after["hold_s"] - lock_before["hold_s"]
    return out


def draw(df: pd.DataFrame, path: Path) -> Path:
    """Inserts/s and sample+update/s per (writers, samplers) mix, one bar per implementation."""
    from pal_bench.plotting import pyplot, save_figure

    plt = pyplot()

    mixes = list(dict.fromkeys(zip(df.writers, df.samplers)))
    impls = list(dict.fromkeys(df.impl))
    width = 0.8 / len(impls)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, col, title in zip(axes, ("inserts_per_s", "sample_updates_per_s"),
                              ("inserts/s (1 transition per call)", f"sample {BATCH} + update per s")):
        for j, impl in enumerate(impls):
            g = df[df.impl == impl].set_index(["writers", "samplers"])[col]
            xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(mixes))]
            ax.bar(xs, [g.get(m, float("nan")) for m in mixes], width,
                   label=impl + ("" if impl == "pal" else " (one lock around it)"))
        ax.set_xticks(range(len(mixes)), [f"{w}w+{s}s" for w, s in mixes], fontsize=8)
        ax.set_xlabel("writer threads + sampler threads", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.text(0.99, 0.01, f"capacity {CAPACITY:.0e}, full buffer", ha="right", fontsize=6, color="gray")
    return save_figure(fig, path)


def concurrency_block(results: Path) -> str:
    path = results / "buffer_concurrency.csv"
    if not path.exists():
        return missing("buffer_concurrency.csv", "python -m pal_bench.studies.concurrency")
    df = read_csv(path)
    t = pd.DataFrame({"buffer": df.impl, "writer threads": df.writers, "sampler threads": df.samplers,
                      "inserts/s": df.inserts_per_s.round(0),
                      "sample+update batches/s": df.sample_updates_per_s.round(0),
                      "lock acquisitions contended": df.lock_contended_share.map(
                          lambda v: f"{v:.1%}" if pd.notna(v) else "")})
    return ("Buffer-only concurrency at capacity 1e5 (threads in one process; tianshou behind one lock).\n\n"
            + md(t, ".0f") + "\n\n" + source(results, "buffer_concurrency.csv") + "\n")



def outputs(results: Path, figures: bool) -> list[Path]:
    """The concurrency figure from the stored ``buffer_concurrency.csv``."""
    path = results / "buffer_concurrency.csv"
    if not (figures and path.exists()):
        return []
    return [draw(read_csv(path), results / "figures" / "buffer_concurrency.png")]


PUBLICATION = Publication("concurrency", {"concurrency": concurrency_block}, outputs)

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench concurrency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", type=choice_list(ADAPTERS), default=["pal", "tianshou"],
                    help=f"comma-separated, of {', '.join(ADAPTERS)} (default: pal,tianshou)")
    ap.add_argument("--seconds", type=duration, default=1.0, help="measured seconds per point (default 1)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    if refuse_if_busy("pal_bench.studies.concurrency", args.force):
        return 2
    measured = Conditions("buffer concurrency")
    rows = []
    for impl in args.impls:
        for w, s in GRID:
            print(f"[{impl} writers={w} samplers={s}]", file=sys.stderr, flush=True)
            rows.append(measure(impl, w, s, args.seconds))
    df = pd.DataFrame(rows)
    store(df, args.out / "buffer_concurrency.csv", measured)
    show(PUBLICATION, args.out, "concurrency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
