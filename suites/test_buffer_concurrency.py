"""How many buffer operations/s do inserting and sampling threads get together, PAL vs tianshou?

Capacity 1e5, LunarLander transitions; writers insert one transition per call, samplers sample
256 and update their priorities. tianshou is wrapped in one lock (it has none). Throughputs are
in ``extra_info``. Ids read ``test_buffer_concurrency[w=<writers>-s=<samplers>-<impl>]``.
"""

import pytest
from conftest import PEERS, SWEEP

from pal_bench.studies.concurrency import GRID, measure

SECONDS = 1.0 if SWEEP == "quick" else 3.0
IMPLS = [p for p in ("pal", "tianshou") if p in PEERS]
CASES = [pytest.param(impl, w, s, id=f"w={w}-s={s}-{impl}") for impl in IMPLS for w, s in GRID]


@pytest.mark.parametrize("impl, writers, samplers", CASES)
def test_buffer_concurrency(benchmark, impl, writers, samplers):
    result = benchmark.pedantic(measure, args=(impl, writers, samplers, SECONDS), rounds=1, iterations=1)
    benchmark.extra_info.update(result, sweep=SWEEP)
