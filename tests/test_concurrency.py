"""Several writer and sampler threads at once: no torn rows, no lost ids, invariants hold."""

import threading
import time

import numpy as np
import pytest
from conftest import LUNAR_FIELDS, assert_rows_consistent, lunar_batch

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer

DURATION_S = 2.0


def run_threads(targets):
    errors = []

    def wrap(fn):
        def inner():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported to the test below
                errors.append(e)
        return inner

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
@pytest.mark.parametrize("capacity", [64, 5000])
def test_writers_and_samplers(cls, capacity):
    buf = cls(capacity, LUNAR_FIELDS, seed=0)
    buf.add_batch(**lunar_batch(8, start=10_000_000))
    stop = time.monotonic() + DURATION_S
    written = {}  # transition id -> value written with it
    lock = threading.Lock()
    n_samples = [0]

    def writer(w):
        def run():
            r = 0
            while time.monotonic() < stop:
                start = w * 1_000_000 + r
                if r % 3 == 0:
                    b = lunar_batch(1, start=start)
                    ids = [buf.add(**{k: v[0] for k, v in b.items()})]
                    n = 1
                else:
                    n = 1 + r % 37
                    ids = buf.add_batch(**lunar_batch(n, start=start))
                with lock:
                    written.update(zip((int(i) for i in ids), range(start, start + n)))
                r += n
        return run

    def sampler():
        rng = np.random.default_rng()
        while time.monotonic() < stop:
            b = buf.sample(int(rng.integers(1, 300)), beta=0.5)
            assert_rows_consistent(b)  # no row mixes two inserts
            with lock:
                for i, v in zip(b["indices"], b["act"]):
                    if int(i) in written:  # id -> the very transition inserted under it
                        assert written[int(i)] == v
            buf.update_priorities(b["indices"], rng.random(len(b["indices"])) * 5)
            n_samples[0] += 1

    run_threads([writer(0), writer(1), sampler, sampler])
    assert n_samples[0] > 10
    assert buf.total_added == len(written) + 8
    buf._check_invariants()
    overwritten = np.arange(buf.total_added - capacity)
    assert buf.update_priorities(overwritten, np.ones(len(overwritten))) == 0


def test_stale_updates_dropped_under_concurrency():
    """A learner updating ids that writers overwrite meanwhile never changes new occupants."""
    cap = 32
    buf = PrioritizedReplayBuffer(cap, LUNAR_FIELDS, alpha=1.0, eps=0.0, seed=0)
    buf.add_batch(priorities=np.full(cap, 0.5), **lunar_batch(cap))
    stop = time.monotonic() + DURATION_S

    def writer():
        while time.monotonic() < stop:
            buf.add_batch(priorities=np.full(4, 0.5), **lunar_batch(4))

    applied = []

    def learner():
        while time.monotonic() < stop:
            b = buf.sample(16)
            # each id gets its own odd priority; one applied to a stale id would land on a new
            # occupant whose id does not match it
            applied.append(buf.update_priorities(b["indices"], 2.0 * b["indices"] + 1))
            live = np.arange(buf.total_added - cap, buf.total_added)
            pr = buf.get_priorities(live)
            ok = np.isnan(pr) | (pr == 0.5) | (pr == 2.0 * live + 1)  # NaN: overwritten meanwhile
            assert ok.all(), (live[~ok], pr[~ok])

    run_threads([writer, learner])
    buf._check_invariants()
    live = np.arange(buf.total_added - cap, buf.total_added)
    pr = buf.get_priorities(live)
    assert ((pr == 0.5) | (pr == 2.0 * live + 1)).all()
    assert sum(applied) > 0 and sum(applied) < 16 * len(applied)  # some applied, some dropped


def test_lock_stats_count_waits_and_holds():
    import threading

    import numpy as np

    from pal_bench import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(1000, {"x": ((4,), np.float32)}, seed=0)
    assert buf.lock_stats() == {"acquisitions": 0, "contended": 0, "wait_s": 0.0, "hold_s": 0.0, "repairs": 0}
    buf.add_batch(x=np.zeros((500, 4), np.float32))

    def sampler():
        for _ in range(300):
            b = buf.sample(32)
            buf.update_priorities(b["indices"], np.ones(32))

    threads = [threading.Thread(target=sampler) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = buf.lock_stats()
    assert s["acquisitions"] >= 1 + 3 * 300 * 3        # add_batch (reserve, commit) + sample (2) + update (1)
    assert 0 <= s["contended"] <= s["acquisitions"]
    assert s["hold_s"] > 0 and s["wait_s"] >= 0


def test_concurrency_measure_counts_both_sides():
    from pal_bench.studies.concurrency import measure

    r = measure("pal", writers=1, samplers=1, seconds=0.3)
    assert r["inserts_per_s"] > 0 and r["sample_updates_per_s"] > 0
    assert 0 <= r["lock_contended_share"] <= 1
