"""sample() without ``out=`` reuses big output arrays only when no caller holds them (issue 51: big rows must not
pay fresh pages on every call), and never hands one batch's arrays to two callers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer

BIG = {"obs": ((1024,), np.float32), "act": ((), np.int64)}       # 4 KB rows: a batch of 64 is pooled


def filled(cls, n=2000):
    buf = cls(n, BIG, seed=0)
    rng = np.random.default_rng(0)
    buf.add_batch(obs=rng.standard_normal((n, 1024), dtype=np.float32), act=np.arange(n))
    return buf


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_reused_only_when_no_one_holds_it(cls):
    torch = pytest.importorskip("torch")
    buf = filled(cls)
    a = buf.sample(64)
    first = a["obs"]
    first_id = id(first)
    b = buf.sample(64)
    assert b["obs"] is not first                                   # ``a`` still holds it
    del a, first
    c = buf.sample(64)
    reused = c["obs"]
    assert id(reused) == first_id                                  # the pool kept it alive: the same object
    del c, reused
    for what in ("dict", "view", "array", "tensor"):
        batch = buf.sample(64)
        target = id(batch["obs"])
        keep = {"dict": batch, "view": batch["obs"][:2], "array": batch["obs"],
                "tensor": torch.from_numpy(batch["obs"])}[what]
        del batch
        for _ in range(5):                                         # more calls than the pool keeps
            d = buf.sample(64)
            assert id(d["obs"]) != target, f"reused while a {what} of it was held"
            del d
        del keep
    small = cls(100, {"x": ((), np.float32)}, seed=0)
    small.add_batch(x=np.arange(100, dtype=np.float32))
    s1 = small.sample(8)["x"]
    assert small.sample(8)["x"] is not s1                          # small batches are never pooled


def test_pooled_arrays_come_back():
    buf = filled(PrioritizedReplayBuffer)
    ids = set()
    for _ in range(20):
        batch = buf.sample(64)
        ids.add(id(batch["obs"]))
    assert len(ids) <= 3                                           # the pool's size per batch size


def test_threads_never_share_a_batch():
    """Four threads sample and keep each batch while sampling the next: every kept batch still equals the rows
    its indices name (nothing is inserted meanwhile), so no two callers were handed the same arrays."""
    buf = filled(PrioritizedReplayBuffer)
    errors = []

    def worker():
        try:
            prev = None
            for _ in range(150):
                cur = buf.sample(64)
                if prev is not None:
                    np.testing.assert_array_equal(prev["obs"], buf.get(prev["indices"])["obs"])
                    np.testing.assert_array_equal(prev["act"], prev["indices"])
                prev = cur
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_sample_only_some_fields():
    buf = filled(PrioritizedReplayBuffer)
    got = buf.sample(16, fields=["act"])
    assert set(got) == {"act", "indices", "weights"}
    np.testing.assert_array_equal(got["act"], got["indices"])     # act was stored as the row's id
    for bad in (["nope"], ["act", "act"], []):
        with pytest.raises(ValueError, match="fields"):
            buf.sample(16, fields=bad)


def test_frame_buffer_reuses_its_window_only_when_free():
    from pal_bench.frame_replay import FrameReplayBuffer
    from pal_bench.workloads import get_workload

    w = get_workload("atari")
    buf = FrameReplayBuffer(400, w.fields, stack=4)
    rows = w.batch(300, seed=1)
    buf.add_batch(**rows)
    a = buf.sample(32)
    base = id(a["obs"].base)
    b = buf.sample(32)
    assert id(b["obs"].base) != base                                # a's views still hold it
    del a
    c = buf.sample(32)
    assert id(c["obs"].base) == base                                # kept alive by the pool: the same array
    np.testing.assert_array_equal(c["next_obs"][:, :-1], c["obs"][:, 1:])


def test_sample_some_fields_into_out():
    buf = filled(PrioritizedReplayBuffer)
    out = buf.sample(16, fields="act")
    again = buf.sample(16, out=out, fields="act")
    assert again is out and set(out) == {"act", "indices", "weights"}
    np.testing.assert_array_equal(out["act"], out["indices"])


def test_an_array_a_caller_changed_is_not_reused():
    """(weak references: an id can be reused once the pool drops the array)"""
    import weakref

    buf = filled(PrioritizedReplayBuffer)
    for change in ("readonly", "shape"):
        a = buf.sample(64)
        if change == "readonly":
            a["obs"].flags.writeable = False
        else:
            a["obs"].shape = (64 * 1024,)
        ref = weakref.ref(a["obs"])
        del a
        for _ in range(5):
            b = buf.sample(64)
            assert b["obs"] is not ref(), f"an array whose {change} a caller changed was handed out again"
            assert b["obs"].flags.writeable and b["obs"].shape == (64, 1024)
            del b


def test_the_pool_keeps_a_few_batch_sizes_only():
    """32 batch sizes sampled and dropped: what stays alive (in the pool) is a few batch sizes' arrays, not 32."""
    import weakref

    buf = filled(PrioritizedReplayBuffer)
    refs = [weakref.ref(buf.sample(b)["obs"]) for b in range(64, 96)]
    alive = sum(r() is not None for r in refs)
    assert 1 <= alive <= 4
