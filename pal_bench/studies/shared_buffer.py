"""One buffer, several processes: inserts/s and sample+update batches/s, PAL's shared buffer vs cpprb's
``MPPrioritizedReplayBuffer``: ``python -m pal_bench.studies.shared_buffer``.

``measure(impl, writers, samplers, seconds)``: one full buffer of capacity 1e5 (LunarLander
transitions), created in this process; ``writers`` spawned processes each insert chunks of
``CHUNK`` transitions per call, ``samplers`` spawned processes each sample 256 and update their
priorities, all at once for ``seconds`` after every process is ready (attached, imports done). PAL's
workers ``attach`` to the segment by name; cpprb's receive the buffer object, as cpprb documents.
Writes ``results/shared_throughput.csv`` (with its conditions beside it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import choice_list, duration
from pal_bench.bench.adapters.base import ALPHA, BETA, LUNAR_FIELDS, lunar_batch
from pal_bench.bench.publishing import Publication, md, missing, show, source, store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import read_csv

CAPACITY = 10**5
BATCH = 256
CHUNK = 64
GRID = [(1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2)]
IMPLS = ("pal", "cpprb")
CPPRB_ENV = {"obs": {"shape": 8, "dtype": np.float32}, "act": {"dtype": np.int64}, "rew": {"dtype": np.float32},
             "next_obs": {"shape": 8, "dtype": np.float32}, "done": {"dtype": np.bool_}}


def _open(impl: str, handle):
    if impl == "pal":
        from pal_bench import PrioritizedReplayBuffer

        return PrioritizedReplayBuffer.attach(handle)
    return handle


def _worker(impl: str, handle, role: str, index: int, seconds: float, ready, go, out) -> None:
    """A spawned writer or sampler: open the buffer, wait for the start, count calls for ``seconds``."""
    buf = _open(impl, handle)
    rng = np.random.default_rng(index)
    data = lunar_batch(CHUNK, seed=index)
    pool = [rng.random(BATCH) * 2 for _ in range(16)]
    key = "indices" if impl == "pal" else "indexes"
    ready.release()
    go.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if role == "writer":
            buf.add_batch(**data) if impl == "pal" else buf.add(**data)
        else:
            b = buf.sample(BATCH, beta=BETA)
            buf.update_priorities(b[key], pool[n % 16])
        n += 1
    out.put((role, n, time.perf_counter() - t0))
    if impl == "pal":
        buf.close()


def make_buffer(impl: str, ctx):
    """(the buffer, what a worker needs to open it), filled to capacity."""
    fill = lunar_batch(CAPACITY, seed=1)
    if impl == "pal":
        from pal_bench import PrioritizedReplayBuffer

        buf = PrioritizedReplayBuffer(CAPACITY, LUNAR_FIELDS, alpha=ALPHA, seed=0, shared=True)
        buf.add_batch(**fill)
        return buf, buf.shared_name
    import cpprb

    buf = cpprb.MPPrioritizedReplayBuffer(CAPACITY, CPPRB_ENV, alpha=ALPHA, ctx=ctx)
    buf.add(**fill)
    return buf, buf


def measure(impl: str, writers: int, samplers: int, seconds: float = 2.0) -> dict:
    """Inserts/s (transitions) and sample+update batches/s of all processes together."""
    ctx = mp.get_context("spawn")
    buf, handle = make_buffer(impl, ctx)
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    roles = ["writer"] * writers + ["sampler"] * samplers
    procs = [ctx.Process(target=_worker, args=(impl, handle, role, i, seconds, ready, go, out), daemon=True)
             for i, role in enumerate(roles)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            if not ready.acquire(timeout=120):
                raise RuntimeError(f"a {impl} worker did not start")
        go.set()
        results = [out.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(60)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"{impl} worker exit codes {[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if impl == "pal":
            buf.close()
    rows = sum(n * CHUNK / s for role, n, s in results if role == "writer")
    batches = sum(n / s for role, n, s in results if role == "sampler")
    return {"impl": impl, "writers": writers, "samplers": samplers, "seconds": seconds,
            "inserts_per_s": rows, "sample_updates_per_s": batches}


def shared_throughput_block(results: Path) -> str:
    path = results / "shared_throughput.csv"
    if not path.exists():
        return missing("shared_throughput.csv", "python -m pal_bench.studies.shared_buffer")
    df = read_csv(path)
    t = df.pivot_table(index=["writers", "samplers"], columns="impl",
                       values=["inserts_per_s", "sample_updates_per_s"], aggfunc="first")
    rows = []
    for (w, s), r in t.iterrows():
        row = {"writer processes": w, "sampler processes": s}
        for impl in sorted(df.impl.unique()):
            row[f"{impl} inserts/s"] = r.get(("inserts_per_s", impl), float("nan"))
            row[f"{impl} sample+update/s"] = r.get(("sample_updates_per_s", impl), float("nan"))
        if {"pal", "cpprb"} <= set(df.impl):
            for col, label in (("inserts_per_s", "inserts"), ("sample_updates_per_s", "sample+update")):
                a, b = r.get((col, "pal")), r.get((col, "cpprb"))
                row[f"PAL / cpprb {label}"] = f"{a / b:.1f}x" if a and b else ""
        rows.append(row)
    return (f"One buffer (capacity 1e5, LunarLander transitions) used by spawned processes at once: writers insert "
            f"chunks of 64 transitions per call, samplers sample 256 and update their priorities; totals over all "
            f"processes, {df.seconds.iloc[0]:g} s per point. PAL: `shared=True` + `attach`; cpprb: "
            f"`MPPrioritizedReplayBuffer`.\n\n" + md(pd.DataFrame(rows), ".0f") + "\n\n"
            + source(results, "shared_throughput.csv") + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench shared-buffer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", type=choice_list(IMPLS), default=list(IMPLS),
                    help=f"comma-separated, of {', '.join(IMPLS)} (default: all)")
    ap.add_argument("--seconds", type=duration, default=2.0, help="measured seconds per point (default 2)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    impls = args.impls
    if refuse_if_busy("pal_bench.studies.shared_buffer", args.force):
        return 2
    rows = []
    with Conditions("buffer shared by processes") as c:
        for impl in impls:
            for w, s in GRID:
                print(f"[{impl} writer processes={w} sampler processes={s}]", file=sys.stderr, flush=True)
                rows.append(measure(impl, w, s, args.seconds))
    df = pd.DataFrame(rows)
    store(df, args.out / "shared_throughput.csv", c, "%.2f")
    show(PUBLICATION, args.out, "shared-throughput")
    return 0


PUBLICATION = Publication("shared_buffer", {"shared-throughput": shared_throughput_block})


if __name__ == "__main__":
    sys.exit(main())
