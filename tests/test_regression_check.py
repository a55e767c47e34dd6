"""The CI regression check can fail: run against a deliberately slow buffer, it must."""

import importlib.util

import pytest

from pal_bench import regression

needs_peers = pytest.mark.skipif(
    importlib.util.find_spec("tianshou") is None or importlib.util.find_spec("ray") is None,
    reason="tianshou and ray[rllib] are needed (pip install -e '.[peers]')",
)


@needs_peers
def test_regression_check_fails_for_a_slow_buffer():
    ok, lines = regression.check(candidate="naive-numpy", rounds=3)
    assert not ok
    assert any("FAIL" in line for line in lines)
