"""Which fan-out K should the sum tree default to? ``python -m pal_bench.studies.fanout``.

The pytest-benchmark suite (``suites/test_latency_vs_fanout.py``) times each K in its own block,
so drift of a shared machine between blocks lands on single K values. This study builds one full
buffer per K (capacity 1e6 by default, LunarLander fields) and times them interleaved: in every
round each K runs each operation once (a block of ``--calls`` calls, K order shuffled per round),
so every K sees the same machine. It writes every block's mean µs per call to
``results/fanout.csv`` (with its conditions beside it); the table (``fanout_block``) gives each
K's median and its ratio to the current default with a bootstrap 95% interval over the rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench import DEFAULT_FANOUT, PrioritizedReplayBuffer
from pal_bench.argtypes import CAPACITY, FANOUT, MAX_COUNT, Range, number, number_list, positive_int
from pal_bench.bench.adapters.base import ALPHA, BETA, LUNAR_FIELDS, lunar_batch, lunar_row
from pal_bench.bench.publishing import Publication, md, missing, show, source, store
from pal_bench.bench.stats import fmt_ci, ratio_ci
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import read_csv

OPS = ("insert_one", "sample", "update", "sample_update")
BATCH = 256
INSERT_CALLS = 25     # a one-transition insert takes ~1 µs: its blocks are this many times longer


def filled(capacity: int, fanout: int) -> PrioritizedReplayBuffer:
    buf = PrioritizedReplayBuffer(capacity, LUNAR_FIELDS, alpha=ALPHA, fanout=fanout, seed=0)
    chunk = lunar_batch(8192, seed=1)
    for _ in range(-(-capacity // 8192)):
        buf.add_batch(**chunk)
    rng = np.random.default_rng(2)        # non-uniform priorities, as after some learning
    for _ in range(capacity // 4096):
        buf.update_priorities(buf.sample(4096, beta=BETA)["indices"], rng.random(4096) * 2)
    return buf


def block(buf: PrioritizedReplayBuffer, op: str, calls: int, pool: list[np.ndarray], row: dict,
          idx: np.ndarray) -> float:
    """Mean µs per call of ``op`` over ``calls`` calls (``INSERT_CALLS`` times as many for ``insert_one``)."""
    if op == "insert_one":
        calls *= INSERT_CALLS
    t0 = time.perf_counter()
    if op == "insert_one":
        for _ in range(calls):
            buf.add(**row)
    elif op == "sample":
        for _ in range(calls):
            buf.sample(BATCH, beta=BETA)
    elif op == "update":
        for i in range(calls):
            buf.update_priorities(idx, pool[i % len(pool)])
    else:
        for i in range(calls):
            buf.update_priorities(buf.sample(BATCH, beta=BETA)["indices"], pool[i % len(pool)])
    return (time.perf_counter() - t0) / calls * 1e6


def study(capacity: int, fanouts: list[int], rounds: int, calls: int, progress=print) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    pool = [rng.random(BATCH) * 2 for _ in range(64)]
    row = lunar_row()
    bufs = {}
    for k in fanouts:
        progress(f"[fanout] filling K={k} to {capacity}")
        bufs[k] = filled(capacity, k)
    idx = {k: b.sample(BATCH, beta=BETA)["indices"] for k, b in bufs.items()}
    for k, b in bufs.items():                 # warm-up
        for op in OPS:
            block(b, op, calls, pool, row, idx[k])
    rows = []
    t0 = time.perf_counter()
    for r in range(rounds):
        for op in OPS:
            for k in rng.permutation(fanouts):
                k = int(k)
                rows.append({"fanout": k, "op": op, "round": r, "capacity": capacity, "batch": BATCH,
                             "calls": calls * (INSERT_CALLS if op == "insert_one" else 1),
                             "us_per_call": block(bufs[k], op, calls, pool, row, idx[k])})
        if (r + 1) % max(1, rounds // 10) == 0:
            progress(f"[fanout] round {r + 1}/{rounds}, {time.perf_counter() - t0:.0f} s")
    return pd.DataFrame(rows)


def fanout_block(results: Path) -> str:
    """The interleaved fan-out study: median µs per K and the ratio to the default K with a 95% interval."""
    path = results / "fanout.csv"
    if not path.exists():
        return missing("fanout.csv", "python -m pal_bench.studies.fanout")
    df = read_csv(path)
    ops = [op for op in ("insert_one", "sample", "update", "sample_update") if op in set(df.op)]
    rows = []
    for k, g in df.groupby("fanout"):
        row: dict = {"K": k}
        for op in ops:
            mine = g[g.op == op].us_per_call
            ref = df[(df.fanout == DEFAULT_FANOUT) & (df.op == op)].us_per_call
            row[f"{op} µs"] = mine.median()
            if k != DEFAULT_FANOUT and len(ref):
                row[f"{op} vs K={DEFAULT_FANOUT}"] = fmt_ci(*ratio_ci(mine, ref), 2)
            else:
                row[f"{op} vs K={DEFAULT_FANOUT}"] = "1 (default)" if k == DEFAULT_FANOUT else ""
        rows.append(row)
    n, rounds = int(df.capacity.iloc[0]), df["round"].nunique()
    return (f"Median µs per call at capacity {n:.0e}, batch {int(df.batch.iloc[0])}, every K timed in each of {rounds} "
            f"interleaved rounds ({int(df[df.op != 'insert_one'].calls.iloc[0])} calls per block, "
            f"{int(df[df.op == 'insert_one'].calls.iloc[0])} for insert_one); ratio = this K's median / the default's, "
            "bootstrap 95% interval over rounds (below 1: faster than the default).\n\n"
            + md(pd.DataFrame(rows), ".2f") + "\n\n" + source(results, "fanout.csv") + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench fanout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=number(CAPACITY), default=10**6, help="buffer capacity (default 1e6)")
    ap.add_argument("--fanouts", type=number_list(FANOUT), default=[2, 4, 8, 16, 32, 64],
                    help=f"comma-separated fan-outs K, each {FANOUT} (default 2,4,8,16,32,64)")
    ap.add_argument("--rounds", type=number(Range(2, MAX_COUNT)), default=100, help="interleaved rounds (default 100)")
    ap.add_argument("--calls", type=positive_int, default=20, help="calls per timed block (default 20)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    fanouts = list(dict.fromkeys(args.fanouts))
    if refuse_if_busy("pal_bench.studies.fanout", args.force):
        return 2
    with Conditions("fan-out sweep, interleaved") as c:
        df = study(args.capacity, fanouts, args.rounds, args.calls,
                   progress=lambda m: print(m, file=sys.stderr, flush=True))
    store(df, args.out / "fanout.csv", c)
    show(PUBLICATION, args.out, "fanout")
    print(f"default fan-out now: {DEFAULT_FANOUT}")
    return 0


PUBLICATION = Publication("fanout", {"fanout": fanout_block})


if __name__ == "__main__":
    sys.exit(main())
