"""How does each buffer's latency grow with its size? (the PAL paper's latency-vs-size figure)

Full buffer, LunarLander-sized transitions, batch 256, alpha 0.6, beta 0.4.
Ids read ``test_latency_vs_capacity[<op>-N=<capacity>-<peer>]``.
"""

import pytest
from conftest import BATCH, CAPACITIES, PEERS, fmt_n, run_case

OPS = ["insert_one", "insert_batch", "sample", "update", "sample_update"]
CASES = [pytest.param(op, n, peer, id=f"{op}-N={fmt_n(n)}-{peer}")
         for n in CAPACITIES for peer in PEERS for op in OPS]


@pytest.mark.parametrize("op, capacity, peer", CASES)
def test_latency_vs_capacity(benchmark, op, capacity, peer):
    run_case(benchmark, peer, op, capacity, BATCH)
