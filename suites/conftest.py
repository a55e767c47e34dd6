"""Shared fixtures of the benchmark suites: the sweep (quick or full), the peer list, and a cache of filled buffers.

Sweep: ``PAL_BENCH_SWEEP=quick`` (default) or ``full``; ``PAL_BENCH_CAPACITIES`` (comma separated) replaces
the sweep's capacities. Peers: ``PAL_BENCH_PEERS`` (comma separated, default: every adapter in
``pal_bench.bench.adapters.ADAPTERS``; any buffer name ``pal_bench.bench.protocol`` resolves: an entry point of
``pal_bench.buffers`` or ``module:Class``). Cases that cannot run (a
peer not installed, too large for the sweep, no native batch insert) are skipped with a reason;
when ``PAL_BENCH_SKIPS`` names a file, the skipped cases and their reasons are written there as
JSON, so that the results record them (``pal_bench.bench.run`` merges them into the suite's JSON).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import numpy as np
import pytest

from pal_bench.bench.adapters import ADAPTERS, available, make_adapter
from pal_bench.conditions import meminfo_bytes
from pal_bench.workloads import get_workload

SWEEP = os.environ.get("PAL_BENCH_SWEEP", "quick")
if SWEEP not in ("quick", "full"):
    raise pytest.UsageError(f"PAL_BENCH_SWEEP must be quick or full, got {SWEEP!r}")
try:
    WORKLOAD = get_workload(os.environ.get("PAL_BENCH_WORKLOAD", "lunarlander"))
except ValueError as e:
    raise pytest.UsageError(f"PAL_BENCH_WORKLOAD: {e}") from None
# big rows: PAL's default call and its ``out=`` call, and the bandwidth floor, beside the buffers
_EXTRA = ["pal-out", "floor-gather"] if WORKLOAD.name != "lunarlander" else []
PEERS = [p for p in os.environ.get("PAL_BENCH_PEERS", ",".join([*ADAPTERS, *_EXTRA])).split(",") if p]
# a buffer is filled only if its rows stored in full fit in this share of the memory available at the start
MEMORY_SHARE = 0.4
CAPACITIES = [10**3, 10**4, 10**5, 10**6] + ([10**7] if SWEEP == "full" else [])
if os.environ.get("PAL_BENCH_CAPACITIES"):      # pal-bench latency --capacity: a comma-separated list of integers
    try:
        _caps = [float(c) for c in os.environ["PAL_BENCH_CAPACITIES"].split(",")]
    except ValueError:
        _caps = []
    if not _caps or not all(c.is_integer() and 1 <= c <= 1e9 for c in _caps):
        raise pytest.UsageError(f"PAL_BENCH_CAPACITIES: {os.environ['PAL_BENCH_CAPACITIES']!r} is not a "
                                "comma-separated list of whole capacities in [1, 1e9]")
    CAPACITIES = sorted({int(c) for c in _caps})
BATCH = 256
POOL = 64  # pre-generated priority arrays, cycled: no RNG inside the timed region


def fmt_n(n: int) -> str:
    e = int(np.log10(n))
    return f"1e{e}" if 10**e == n else str(n)


_cache: dict[tuple, object] = {}


def get_adapter(peer: str, capacity: int, **kwargs):
    """A filled adapter, reused across the benchmarks of one (peer, capacity); one at a time."""
    why = available(peer)
    if why:
        pytest.skip(f"{peer}: {why}")
    from pal_bench.bench.adapters.registry import adapter_class

    cls = adapter_class(peer)
    limit = cls.QUICK_MAX_CAPACITY if SWEEP == "quick" and cls.QUICK_MAX_CAPACITY else cls.MAX_CAPACITY
    if limit is not None and capacity > limit[0]:
        pytest.skip(f"{peer} at N={fmt_n(capacity)}: {limit[1]}")
    need = capacity * WORKLOAD.row_bytes
    budget = MEMORY_SHARE * (meminfo_bytes("MemAvailable") or 1 << 62)
    if need > budget:
        pytest.skip(f"{peer} at N={fmt_n(capacity)}: {WORKLOAD.name} rows in full need {need / 2**30:.1f} GiB, over "
                    f"{MEMORY_SHARE:.0%} of the {budget / MEMORY_SHARE / 2**30:.1f} GiB available")
    key = (peer, capacity, tuple(sorted(kwargs.items())))
    if key not in _cache:
        _cache.clear()
        gc.collect()
        if WORKLOAD.name != "lunarlander":
            kwargs = dict(kwargs, workload=WORKLOAD)
        _cache[key] = make_adapter(peer, capacity, **kwargs)
    return _cache[key]


def priority_pool(batch: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.random(batch) * 2.0 for _ in range(POOL)]


_skipped: list[dict] = []


def run_case(benchmark, peer: str, op: str, capacity: int, batch: int, **kwargs) -> None:
    """Fill (or reuse) ``peer`` at ``capacity`` and benchmark ``op``; a skip is recorded with its reason."""
    case = dict(peer=peer, op=op, capacity=capacity, batch=batch, sweep=SWEEP, **kwargs)
    try:
        run_op(benchmark, get_adapter(peer, capacity, **kwargs), op, batch, **kwargs)
    except pytest.skip.Exception as e:
        _skipped.append(dict(case, reason=str(e.msg)))
        raise


def pytest_sessionfinish(session):
    path = os.environ.get("PAL_BENCH_SKIPS")
    if path:
        with open(path, "w") as f:
            json.dump(_skipped, f, indent=1)


_progress = {"n": 0, "i": 0, "t0": 0.0}


# the suites that take any workload; the others measure LunarLander rows only (pal_bench.bench.run.WORKLOAD_SUITES)
WORKLOAD_SUITE_FILES = ("test_latency_vs_capacity.py", "test_latency_vs_batch.py")


def pytest_collection_modifyitems(items):
    if WORKLOAD.name != "lunarlander":
        skip = pytest.mark.skip(reason=f"this suite measures LunarLander rows only, not {WORKLOAD.name}")
        for item in items:
            if item.path.name not in WORKLOAD_SUITE_FILES:
                item.add_marker(skip)
    _progress.update(n=len(items), t0=time.perf_counter())


def pytest_runtest_logstart(nodeid):
    """One progress line per case: which case, how many are done and left, time so far."""
    _progress["i"] += 1
    i, n = _progress["i"], _progress["n"]
    sys.stderr.write(f"[{i}/{n}, {n - i} left, {time.perf_counter() - _progress['t0']:.0f} s] "
                     f"{nodeid.split('::')[-1]}\n")


def run_op(benchmark, adapter, op: str, batch: int, **info) -> None:
    """Benchmark ``op`` on ``adapter`` and record what was measured in ``extra_info``."""
    benchmark.extra_info.update(peer=adapter.name, op=op, batch=batch, capacity=adapter.capacity,
                                sweep=SWEEP, workload=WORKLOAD.name, **info)
    if op in ("insert_one", "insert_batch") and not adapter.INSERTS:
        pytest.skip(f"{adapter.name} stores no transitions")
    if op == "insert_one" and not adapter.SINGLE_INSERT:
        pytest.skip(f"{adapter.name} has no one-row add (optional in the buffer protocol)")
    if op == "insert_one":
        row = WORKLOAD.row()
        benchmark(adapter.insert_one, row)
    elif op == "insert_batch":
        if not adapter.NATIVE_BATCH_INSERT:
            pytest.skip(f"{adapter.name} has no native batch insert")
        data = WORKLOAD.batch(batch, seed=7)
        benchmark(adapter.insert_batch, data)
    elif op in ("sample", "update", "sample_update"):
        pool = priority_pool(batch)
        state = {"i": 0}
        if op == "sample":
            benchmark(adapter.sample, batch)
            return
        if op == "update":
            idx = adapter.sample(batch)

            def update():
                state["i"] = (state["i"] + 1) % POOL
                adapter.update(idx, pool[state["i"]])

            benchmark(update)
            return

        def sample_update():
            state["i"] = (state["i"] + 1) % POOL
            adapter.update(adapter.sample(batch), pool[state["i"]])

        benchmark(sample_update)
    else:
        raise ValueError(op)
