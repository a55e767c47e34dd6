"""The bandwidth floor (gather_floor.c through ctypes) and the interleaved-streams check of the memory modes."""

from __future__ import annotations

import numpy as np
import pytest

from pal_bench.bench.adapters import make_adapter
from pal_bench.bench.gather_floor import gather
from pal_bench.studies.memory import interleaving_check
from pal_bench.workloads import get_workload


def test_gather_copies_the_named_rows():
    rng = np.random.default_rng(0)
    records = rng.integers(0, 256, (500, 1000), dtype=np.uint8)
    idx = rng.integers(0, 500, 64)
    out = np.empty((64, 1000), dtype=np.uint8)
    gather(records, idx, out)
    np.testing.assert_array_equal(out, records[idx])


@pytest.mark.parametrize("bad", ["dtype", "shape", "negative", "past_end", "strided", "idx_dtype", "readonly",
                                 "idx_2d", "aliased"])
def test_gather_refuses_what_it_cannot_copy_safely(bad):
    records = np.zeros((100, 64), dtype=np.uint8)
    idx = np.arange(8, dtype=np.int64)
    out = np.zeros((8, 64), dtype=np.uint8)
    if bad == "dtype":
        records = records.astype(np.int16)
    elif bad == "shape":
        out = np.zeros((8, 32), dtype=np.uint8)
    elif bad == "negative":
        idx[3] = -1
    elif bad == "past_end":
        idx[3] = 100
    elif bad == "strided":
        records = np.zeros((100, 128), dtype=np.uint8)[:, ::2]
    elif bad == "idx_dtype":
        idx = idx.astype(np.int32)
    elif bad == "readonly":
        out.flags.writeable = False
    elif bad == "idx_2d":
        idx = idx.reshape(4, 2)
    else:                                   # out overlaps idx: a copied row would rewrite the next index
        block = np.zeros(8 * 64 + 64, dtype=np.uint8)
        out = block[:512].reshape(8, 64)
        idx = block[448:512].view(np.int64)
    with pytest.raises((ValueError, IndexError)):
        gather(records, idx, out)
    assert not out.any()


def test_floor_adapter_samples_rows_of_the_workload_size():
    a = make_adapter("floor-gather", 300, workload=get_workload("humanoid"))
    assert a.records.shape == (300, get_workload("humanoid").row_bytes)
    idx = a.sample(32)
    assert len(idx) == 32 and idx.max() < 300


@pytest.mark.parametrize("mode", ["next-ref", "stack"])
def test_pal_memory_modes_are_right_with_interleaved_streams(mode):
    r = interleaving_check("pal", "atari", mode, capacity=600, draws=300)
    assert r["wrong"] == 0 and r["draws"] == 300


def test_the_interleaving_check_sees_wrong_next_observations(monkeypatch):
    """A buffer that hands back another row's next observation is caught."""
    from pal_bench.frame_replay import FrameReplayBuffer

    real = FrameReplayBuffer.sample

    def shuffled(self, *a, **k):
        got = real(self, *a, **k)
        return dict(got, next_obs=got["next_obs"][::-1])

    monkeypatch.setattr(FrameReplayBuffer, "sample", shuffled)
    r = interleaving_check("pal", "lunarlander", "next-ref", capacity=600, draws=300)
    assert r["wrong"] > 250
