"""How do data collection f_a and data consumption f_l scale with threads? (the PAL paper's scaling figure)

x = 1..M threads (M = usable cores; ``PAL_BENCH_MAX_THREADS`` may go past it: oversubscribed rows
are marked). DQN on CartPole-v1 by default (``PAL_BENCH_SCALING_ENV``). The throughput is in
``extra_info`` (transitions/s for f_a, updates/s for f_l); pytest-benchmark's time is the wall
time of one measurement. ``python -m pal_bench.studies.scaling`` runs the same measurements and draws them.
Ids read ``test_scaling[<curve>-x=<threads>]``.
"""

import os

import pytest
from conftest import SWEEP

from pal_bench.conditions import usable_cores
from pal_bench.studies.scaling.measure import measure_fa, measure_fl
from pal_bench.train import make_config

CORES = usable_cores()
MAX = int(os.environ.get("PAL_BENCH_MAX_THREADS", CORES))
ENV = os.environ.get("PAL_BENCH_SCALING_ENV", "CartPole-v1")
STEPS, UPDATES = (10_000, 500) if SWEEP == "quick" else (50_000, 3_000)
CASES = [pytest.param(c, x, id=f"{c}-x={x}") for x in range(1, MAX + 1) for c in ("f_a", "f_l")]


@pytest.mark.parametrize("curve, threads", CASES)
def test_scaling(benchmark, curve, threads):
    cfg = make_config("dqn", ENV)
    fn, n = (measure_fa, STEPS) if curve == "f_a" else (measure_fl, UPDATES)
    result = benchmark.pedantic(fn, args=(cfg, threads, n), rounds=1, iterations=1)
    benchmark.extra_info.update(curve=curve, threads=threads, throughput=result, cores=CORES,
                                oversubscribed=threads > CORES, env=ENV, sweep=SWEEP)
