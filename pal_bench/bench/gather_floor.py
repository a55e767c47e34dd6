"""The memory-bandwidth floor for big rows (``gather_floor.c``): a plain-C gather of B random rows of a workload's
size into one preallocated destination, and the machine's copy bandwidth.

``python -m pal_bench.bench.gather_floor [--workload atari] [--capacity 1e5]`` prints the copy bandwidth (GB/s)
and the median µs of a gather of 256 rows, with what that is in GB/s. The latency suites run the gather as the
``floor-gather`` implementation beside the buffers (``pal_bench.bench.adapters.floor``), in the same run but each
case in its own block; ``--against-pal --rounds 20 --out results`` alternates PAL's sample+update (default call and
``out=``) with the gather in every round instead (``results/gather_floor.csv``), for ratios that a shared
machine's drift between blocks does not move.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("gather_floor.c")
COMPILE_TIMEOUT_S = 120
_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """``gather_floor.c`` compiled with ``$CC`` (else cc/gcc) at -O3 into a private temporary folder, once per
    process."""
    global _lib
    if _lib is not None:
        return _lib
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not cc[0]:
        raise RuntimeError("the gather floor needs a C compiler (set CC)")
    with tempfile.TemporaryDirectory(prefix="pal-gather-floor-") as tmp:
        so = Path(tmp) / "gather_floor.so"
        try:
            done = subprocess.run([*cc, "-O3", "-shared", "-fPIC", "-o", str(so), str(SOURCE)], capture_output=True,
                                  text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"cannot compile {SOURCE.name} with CC={' '.join(cc)!r}: {e}") from None
        if done.returncode:
            raise RuntimeError(f"{' '.join(cc)} failed on {SOURCE.name}:\n{done.stderr}")
        try:
            lib = ctypes.CDLL(str(so))          # mapped: the file may go
        except OSError as e:
            raise RuntimeError(f"{' '.join(cc)} built no loadable library from {SOURCE.name}: {e}") from None
    lib.pal_gather_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.pal_gather_rows.restype = None
    lib.pal_copy_bandwidth.argtypes = [ctypes.c_int64, ctypes.c_int]
    lib.pal_copy_bandwidth.restype = ctypes.c_double
    _lib = lib
    return lib


def gather(records: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """``out[b] = records[idx[b]]`` in C: ``records`` C-contiguous [N, R] uint8, ``idx`` int64[B] in [0, N),
    ``out`` C-contiguous [B, R] uint8 (checked here, before any copy)."""
    if not all(isinstance(a, np.ndarray) for a in (records, idx, out)):
        raise ValueError("gather: records, idx and out must be numpy arrays")
    if (records.dtype != np.uint8 or out.dtype != np.uint8 or records.ndim != 2 or idx.ndim != 1
            or out.shape != (len(idx), records.shape[1]) or not records.flags.c_contiguous
            or not out.flags.c_contiguous or not out.flags.writeable or idx.dtype != np.int64
            or not idx.flags.c_contiguous):
        raise ValueError("gather: records [N, R] uint8, idx int64[B], out [B, R] uint8 and writable, all "
                         "C-contiguous")
    if np.shares_memory(out, idx) or np.shares_memory(out, records):
        raise ValueError("gather: out shares memory with idx or records")
    if len(idx) and (idx.min() < 0 or idx.max() >= len(records)):
        raise IndexError("gather: an index is out of range")
    library().pal_gather_rows(records.ctypes.data, records.shape[1], idx.ctypes.data, len(idx), out.ctypes.data)


def copy_bandwidth(nbytes: int = 1 << 30, rounds: int = 5) -> float:
    """Best-of-``rounds`` memcpy bandwidth over ``nbytes`` (bytes copied per second)."""
    bw = library().pal_copy_bandwidth(nbytes, rounds)
    if bw < 0:
        raise MemoryError(f"cannot allocate 2 x {nbytes} bytes for the copy bandwidth")
    return bw


def interleaved(workload: str, capacity: int, rounds: int, calls: int, progress=print) -> list[dict]:
    """PAL's ``sample(256)`` + ``update_priorities(256)`` (the default call, keeping the previous batch while the
    next is drawn, as a learner loop does; and ``out=``), and the C gather of 256 random rows of the same size,
    timed in blocks of ``calls`` calls, the three alternated in every round (shuffled order), so that a shared
    machine's drift lands on all of them: one row per block (µs per call)."""
    from pal_bench import PrioritizedReplayBuffer
    from pal_bench.workloads import get_workload

    w = get_workload(workload)
    buf = PrioritizedReplayBuffer(capacity, w.fields, seed=0)
    chunk = max(1, min(capacity, (64 << 20) // w.row_bytes))
    for start in range(0, capacity, chunk):
        buf.add_batch(**w.batch(min(chunk, capacity - start), seed=start))
    records = np.ones((capacity, w.row_bytes), dtype=np.uint8)
    out_rows = np.empty((256, w.row_bytes), dtype=np.uint8)
    rng = np.random.default_rng(0)
    idx_pool = [rng.integers(0, capacity, 256) for _ in range(64)]
    prio = [rng.random(256) * 2 for _ in range(64)]
    kept = {"batch": buf.sample(256)}
    out = buf.sample(256)

    def pal_default(i):
        kept["batch"] = buf.sample(256)            # the previous batch is still held while this one is drawn
        buf.update_priorities(kept["batch"]["indices"], prio[i % 64])

    def pal_out(i):
        buf.sample(256, out=out)
        buf.update_priorities(out["indices"], prio[i % 64])

    def floor(i):
        gather(records, idx_pool[i % 64], out_rows)

    impls = {"pal": pal_default, "pal-out": pal_out, "floor-gather": floor}
    for f in impls.values():                        # warm-up
        for i in range(calls):
            f(i)
    rows = []
    for r in range(rounds):
        for name in rng.permutation(list(impls)):
            f = impls[name]
            t0 = time.perf_counter()
            for i in range(calls):
                f(i)
            rows.append({"workload": workload, "capacity": capacity, "impl": str(name), "round": r,
                         "us_per_call": (time.perf_counter() - t0) / calls * 1e6})
        if (r + 1) % max(1, rounds // 5) == 0:
            progress(f"[gather floor] round {r + 1}/{rounds}")
    buf.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    from pal_bench.argtypes import Range, number, positive_int
    from pal_bench.workloads import WORKLOADS, get_workload

    ap = argparse.ArgumentParser(prog="python -m pal_bench.bench.gather_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=list(WORKLOADS), default="atari")
    ap.add_argument("--capacity", type=number(Range(256, 10**8)), default=10**5)
    ap.add_argument("--calls", type=positive_int, default=200)
    ap.add_argument("--against-pal", action="store_true",
                    help="time PAL's sample+update (default call and out=) and the gather alternately in --rounds "
                         "rounds of --calls calls; writes --out/gather_floor.csv")
    ap.add_argument("--rounds", type=number(Range(2, 10**6)), default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    w = get_workload(args.workload)
    if args.against_pal:
        import pandas as pd

        from pal_bench.bench.publishing import store
        from pal_bench.bench.stats import fmt_ci, ratio_ci
        from pal_bench.conditions import Conditions

        with Conditions(f"gather floor against PAL, {args.workload}") as c:
            df = pd.DataFrame(interleaved(args.workload, args.capacity, args.rounds, args.calls,
                                          progress=lambda m: print(m, file=sys.stderr, flush=True)))
        if args.out is not None:
            store(df, args.out / "gather_floor.csv", c)
        floor = df[df.impl == "floor-gather"].us_per_call
        for impl in ("pal", "pal-out", "floor-gather"):
            mine = df[df.impl == impl].us_per_call
            print(f"{impl:>12}: {mine.median():8.1f} µs median of {len(mine)} blocks; / floor "
                  f"{fmt_ci(*ratio_ci(mine, floor), 2)}")
        return 0
    row = w.row_bytes
    print(f"copy bandwidth (memcpy of 1 GiB, best of 5): {copy_bandwidth() / 1e9:.1f} GB/s")
    records = np.ones((args.capacity, row), dtype=np.uint8)
    out = np.empty((256, row), dtype=np.uint8)
    rng = np.random.default_rng(0)
    ts = []
    for _ in range(args.calls):
        idx = rng.integers(0, args.capacity, 256)
        t0 = time.perf_counter()
        gather(records, idx, out)
        ts.append(time.perf_counter() - t0)
    med = float(np.median(ts))
    print(f"gather of 256 random {row:,}-byte rows of {args.capacity:,} ({w.name}): {med * 1e6:,.0f} µs median "
          f"({256 * row / med / 1e9:.1f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
