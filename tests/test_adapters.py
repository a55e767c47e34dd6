"""Every adapter fills, inserts, samples and updates through its peer's API (small capacity)."""

import numpy as np
import pytest

from pal_bench.bench.adapters import ADAPTERS, available, lunar_batch, lunar_row, make_adapter
from pal_bench.bench.adapters.registry import COMPONENTS


@pytest.mark.parametrize("name", list(ADAPTERS) + list(COMPONENTS))
def test_adapter_operations(name):
    if available(name):
        pytest.skip(available(name))
    a = make_adapter(name, 1000)
    if a.INSERTS:
        a.insert_one(lunar_row())
    if a.NATIVE_BATCH_INSERT:
        a.insert_batch(lunar_batch(64, seed=3))
    for batch in (32, 256):
        idx = a.sample(batch)
        assert len(idx) == batch
        a.update(idx, np.random.default_rng(0).random(batch) + 0.1)
        a.update(idx, np.random.default_rng(1).random(batch) + 0.1)  # the suites' update case repeats
