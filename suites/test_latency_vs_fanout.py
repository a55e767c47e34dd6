"""Which fan-out K makes PAL's sum tree fastest? (K-sweep; the default K comes from this suite)

PAL's ``PrioritizedReplayBuffer`` at capacity 1e6 (1e5 too in the full sweep), batch 256.
Ids read ``test_latency_vs_fanout[<op>-N=<capacity>-K=<fanout>]``.
"""

import pytest
from conftest import BATCH, SWEEP, fmt_n, run_case

FANOUTS = [2, 4, 8, 16, 32, 64]
SIZES = [10**6] if SWEEP == "quick" else [10**5, 10**6]
OPS = ["insert_one", "sample", "update", "sample_update"]
CASES = [pytest.param(op, n, k, id=f"{op}-N={fmt_n(n)}-K={k}") for n in SIZES for k in FANOUTS for op in OPS]


@pytest.mark.parametrize("op, capacity, fanout", CASES)
def test_latency_vs_fanout(benchmark, op, capacity, fanout):
    run_case(benchmark, "pal", op, capacity, BATCH, fanout=fanout)
