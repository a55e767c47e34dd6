"""How does each buffer's latency grow with the batch size? (B = 32, 256, 1024)

Full buffer at capacity 1e5 (1e6 too in the full sweep), LunarLander-sized transitions.
Ids read ``test_latency_vs_batch[<op>-N=<capacity>-B=<batch>-<peer>]``.
"""

import pytest
from conftest import PEERS, SWEEP, fmt_n, run_case

BATCHES = [32, 256, 1024]
SIZES = [10**5] if SWEEP == "quick" else [10**5, 10**6]
OPS = ["insert_batch", "sample", "update", "sample_update"]
CASES = [pytest.param(op, n, b, peer, id=f"{op}-N={fmt_n(n)}-B={b}-{peer}")
         for n in SIZES for peer in PEERS for b in BATCHES for op in OPS]


@pytest.mark.parametrize("op, capacity, batch, peer", CASES)
def test_latency_vs_batch(benchmark, op, capacity, batch, peer):
    run_case(benchmark, peer, op, capacity, batch)
