import numpy as np
import pytest

from pal_bench.bench.adapters.base import LUNAR_FIELDS  # the fields every suite and test uses


def lunar_batch(n: int, start: int = 0) -> dict:
    """A batch whose every field encodes the row's value ``start + r`` (so torn rows show)."""
    v = np.arange(start, start + n)
    return {
        "obs": np.repeat(v[:, None], 8, axis=1).astype(np.float32),
        "act": v.astype(np.int64),
        "rew": v.astype(np.float32),
        "next_obs": np.repeat(v[:, None] + 0.5, 8, axis=1).astype(np.float32),
        "done": (v % 2 == 0),
    }


def assert_rows_consistent(batch: dict) -> None:
    """Every sampled row is one whole transition written by ``lunar_batch``."""
    v = batch["act"]
    np.testing.assert_array_equal(batch["obs"], np.repeat(v[:, None], 8, axis=1).astype(np.float32))
    np.testing.assert_array_equal(batch["rew"], v.astype(np.float32))
    np.testing.assert_array_equal(batch["next_obs"], np.repeat(v[:, None] + 0.5, 8, axis=1).astype(np.float32))
    np.testing.assert_array_equal(batch["done"], v % 2 == 0)


@pytest.fixture
def fields():
    return dict(LUNAR_FIELDS)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance of this process (2 CPUs) shared by a module's tests (Ray takes seconds
    to start); skips where Ray is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
