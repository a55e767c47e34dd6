"""How much of PAL's buffer cost is the sum tree? The tree alone vs the full buffer vs no tree.

``pal-tree``: ``SumTree.find`` on B targets and ``SumTree.update`` of B leaves (no weights, no
gather, no transition ids); ``pal``: the full ``PrioritizedReplayBuffer``; ``pal-uniform``: the
buffer without a tree (uniform ``ReplayBuffer``). Batch 256, default fan-out.
Ids read ``test_tree_vs_buffer[<op>-N=<capacity>-<impl>]``.
"""

import pytest
from conftest import BATCH, CAPACITIES, fmt_n, run_case

IMPLS = ["pal-tree", "pal", "pal-uniform"]
OPS = ["sample", "update", "sample_update"]
CASES = [pytest.param(op, n, impl, id=f"{op}-N={fmt_n(n)}-{impl}")
         for n in CAPACITIES for impl in IMPLS for op in OPS]


@pytest.mark.parametrize("op, capacity, impl", CASES)
def test_tree_vs_buffer(benchmark, op, capacity, impl):
    run_case(benchmark, impl, op, capacity, BATCH)
