"""The hardware floor of a prioritized sample+update, next to PAL's buffer, in the same run.

``python -m pal_bench.bench.floor [--capacity 1e3 1e6] [--rounds 5]`` builds ``floor.c`` (the same K = 16
tree operations in plain C: stratified descent with prefetch, gather of 80-byte rows, leaf writes with the
parents recomputed; no Python call, no lock, no min tree, no weights) with the C compiler that builds the
extension, and times it against ``PrioritizedReplayBuffer.sample(256)`` + ``update_priorities(256)`` on a full
buffer of LunarLander rows, the two alternated round by round so that a shared machine's drift lands on both.
Prints one line per capacity: medians over rounds (µs) and PAL / floor. The speed target of the buffer
(sample+update at 1e6 within 20 µs) was set from such a floor; this measures it on the machine at hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("floor.c")
BATCH = 256


def build(workdir: Path) -> Path:
    """Compile ``floor.c`` with ``$CC`` (else cc/gcc) at -O3, the extension's flags; returns the binary."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("pal_bench.bench.floor: no C compiler found (set CC)")
    exe = workdir / "floor"
    done = subprocess.run([cc, "-O3", "-o", str(exe), str(SOURCE)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pal_bench.bench.floor: {cc} failed:\n{done.stderr}")
    return exe


def floor_us(exe: Path, capacity: int, calls: int) -> dict[str, float]:
    """The C floor's median µs per sample (descent + gather) and per update, in a fresh process."""
    out = subprocess.run([str(exe), str(capacity), str(BATCH), str(calls)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    return {"sample": r["sample_ns"] / 1e3, "update": r["update_ns"] / 1e3}


def pal_us(buf, prio: np.ndarray, calls: int) -> dict[str, float]:
    """PAL's median µs per ``sample(256)`` and per ``update_priorities(256)`` of the batch just sampled."""
    ts, tu = [], []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        s = buf.sample(BATCH, beta=0.4)
        t1 = time.perf_counter_ns()
        buf.update_priorities(s["indices"], prio)
        tu.append(time.perf_counter_ns() - t1)
        ts.append(t1 - t0)
    return {"sample": float(np.median(ts)) / 1e3, "update": float(np.median(tu)) / 1e3}


def filled_buffer(capacity: int):
    from pal_bench import PrioritizedReplayBuffer
    from pal_bench.bench.adapters.base import LUNAR_FIELDS, lunar_batch

    buf = PrioritizedReplayBuffer(capacity, LUNAR_FIELDS, seed=0)
    rows = lunar_batch(BATCH, seed=1)
    for _ in range(-(-capacity // BATCH)):
        buf.add_batch(**rows)
    rng = np.random.default_rng(0)
    for _ in range(-(-capacity // 4096)):      # varied priorities, as a learner leaves them
        ids = rng.integers(0, capacity, 4096)
        buf.update_priorities(ids + buf.total_added - capacity, rng.random(4096) + 0.1)
    return buf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=float, nargs="+", default=[1e3, 1e6])
    ap.add_argument("--rounds", type=int, default=5, help="alternations of floor and PAL (default 5)")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per figure (default 2000)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="pal-floor-") as tmp:
        exe = build(Path(tmp))
        for cap in (int(c) for c in args.capacity):
            buf = filled_buffer(cap)
            prio = rng.random(BATCH) + 0.1
            rounds = []
            for r in range(args.rounds):
                rounds.append({"floor": floor_us(exe, cap, args.calls), "pal": pal_us(buf, prio, args.calls)})
                print(f"capacity {cap:.0e}: round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            med = {who: {op: statistics.median(x[who][op] for x in rounds) for op in ("sample", "update")}
                   for who in ("floor", "pal")}
            fl, pal = med["floor"], med["pal"]
            print(f"capacity {cap:.0e}, batch {BATCH}, median of {args.rounds} rounds (µs): "
                  f"floor sample {fl['sample']:.1f} + update {fl['update']:.1f} = {fl['sample'] + fl['update']:.1f}; "
                  f"PAL sample {pal['sample']:.1f} + update {pal['update']:.1f} = {pal['sample'] + pal['update']:.1f}; "
                  f"PAL / floor {(pal['sample'] + pal['update']) / (fl['sample'] + fl['update']):.2f}", flush=True)
            buf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
