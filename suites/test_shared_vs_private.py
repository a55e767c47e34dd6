"""What does living in shared memory cost a single process? PAL's buffer with ``shared=True`` against
the private one, every operation, capacity 1e5 and 1e6 (target: within 10%).
Ids read ``test_shared_vs_private[<op>-N=<capacity>-<impl>]``.
"""

import pytest
from conftest import BATCH, fmt_n, run_case

IMPLS = ["pal", "pal-shared"]
OPS = ["insert_one", "insert_batch", "sample", "update", "sample_update"]
CASES = [pytest.param(op, n, impl, id=f"{op}-N={fmt_n(n)}-{impl}")
         for n in (10**5, 10**6) for impl in IMPLS for op in OPS]


@pytest.mark.parametrize("op, capacity, impl", CASES)
def test_shared_vs_private(benchmark, op, capacity, impl):
    run_case(benchmark, impl, op, capacity, BATCH)
