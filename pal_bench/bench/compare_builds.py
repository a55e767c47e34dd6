"""Time two builds of the buffer side by side: the same calls, each build in its own process, alternated.

``python -m pal_bench.bench.compare_builds OLD_DIR NEW_DIR [--capacity 1e6] [--rounds 3]`` fills a
``PrioritizedReplayBuffer`` of ``capacity`` LunarLander rows with each checkout's build (the directory
first on ``sys.path``; build it there with ``python setup.py build_ext --inplace``) and times
``sample(256)``, ``update_priorities(256)``, the two together, ``add_batch(256)`` and ``add`` (median of
``--calls`` calls, µs). One round runs every build once, in alternation, so drift of a shared machine
lands on both; the printed figure is the median over rounds. Instruction counts of the same step, which
do not drift, come from ``pal_bench.bench.step_costs --tree DIR``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CASE = """
import sys, json, time
sys.path.insert(0, {tree!r})
import numpy as np
from pal_bench import PrioritizedReplayBuffer
from pal_bench.bench.adapters.base import BETA, LUNAR_FIELDS, lunar_batch
N, B, CALLS = {capacity}, 256, {calls}
buf = PrioritizedReplayBuffer(N, LUNAR_FIELDS, seed=0)
rows = lunar_batch(B, seed=1)
for _ in range(-(-N // B)):
    buf.add_batch(**rows)
prio = np.random.default_rng(0).random(B) + 0.1
one = {{k: v[0] for k, v in rows.items()}}
s = buf.sample(B, beta=BETA)

def median_us(fn, n=CALLS):
    t = []
    for _ in range(n):
        a = time.perf_counter_ns()
        fn()
        t.append(time.perf_counter_ns() - a)
    return float(np.median(t)) / 1e3

def both():
    buf.update_priorities(buf.sample(B, beta=BETA)["indices"], prio)

print(json.dumps({{
    "sample": median_us(lambda: buf.sample(B, beta=BETA)),
    "update": median_us(lambda: buf.update_priorities(s["indices"], prio)),
    "sample+update": median_us(both),
    "add_batch": median_us(lambda: buf.add_batch(**rows)),
    "add": median_us(lambda: buf.add(**one), 10 * CALLS),
}}))
"""


def time_build(tree: Path, capacity: int, calls: int) -> dict[str, float]:
    """Medians (µs) of each call for the build in ``tree``, measured in a fresh process."""
    code = CASE.format(tree=str(tree.resolve()), capacity=capacity, calls=calls)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"timing the build in {tree} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(trees: list[Path], capacity: int, rounds: int, calls: int, progress=print) -> dict[str, dict]:
    got: dict[str, list[dict]] = {str(t): [] for t in trees}
    for r in range(rounds):
        for t in trees:
            got[str(t)].append(time_build(t, capacity, calls))
        progress(f"round {r + 1}/{rounds} done")
    return {t: {k: statistics.median(d[k] for d in runs) for k in runs[0]} for t, runs in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path, help="checkouts with a built extension (old first)")
    ap.add_argument("--capacity", type=float, default=1e6, help="buffer capacity, filled (default 1e6)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the builds (default 3)")
    ap.add_argument("--calls", type=int, default=3000, help="timed calls per figure (default 3000)")
    args = ap.parse_args(argv)
    for t in args.trees:
        if not (t / "pal_bench").is_dir():
            ap.error(f"{t} is not a checkout of pal-bench (no pal_bench/ in it)")
    if args.rounds < 1 or args.calls < 1:
        ap.error("--rounds and --calls must be >= 1")
    res = compare(args.trees, int(args.capacity), args.rounds, args.calls)
    print(f"median µs over {args.rounds} rounds, capacity {args.capacity:.0e}, batch 256")
    for t, row in res.items():
        print(f"{t}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
