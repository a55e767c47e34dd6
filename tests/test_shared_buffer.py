"""One buffer shared by several processes: attach, writers and samplers at once, a writer or a lock holder
killed with SIGKILL, per-process random streams, and nothing left in /dev/shm."""

import multiprocessing as mp
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import LUNAR_FIELDS, assert_rows_consistent, lunar_batch
from scipy.stats import chisquare

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs POSIX shared memory (/dev/shm)")
SPAWN = mp.get_context("spawn")


def shm_names() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("pal-")}


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm():
    before = shm_names()
    yield
    assert shm_names() - before == set(), "a test left a segment in /dev/shm"


def run(target, *args) -> int:
    p = SPAWN.Process(target=target, args=args)
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError(f"{target.__name__} did not finish")
    return p.exitcode


# ---------------------------------------------------------------------------------------------- workers (spawned)

def _writer(name: str, start: int, seconds: float, chunk: int) -> None:
    buf = PrioritizedReplayBuffer.attach(name, seed=start)
    t0, v = time.monotonic(), start
    while time.monotonic() - t0 < seconds:
        buf.add_batch(**lunar_batch(chunk, start=v))
        v += chunk
    buf.close()


def _sampler(name: str, seed: int, seconds: float, out) -> None:
    buf = PrioritizedReplayBuffer.attach(name, seed=seed)
    rng = np.random.default_rng(seed)
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        b = buf.sample(64)
        assert_rows_consistent(b)            # raises in the child: exit code 1
        buf.update_priorities(b["indices"], rng.random(64) * 3)
        n += 1
    out.put(n)
    buf.close()


def _count_draws(name: str, seed: int, n: int, out) -> None:
    buf = PrioritizedReplayBuffer.attach(name, seed=seed)
    counts = np.zeros(buf.capacity, dtype=np.int64)
    for _ in range(n):
        np.add.at(counts, buf.sample(256)["indices"] % buf.capacity, 1)
    out.put(counts)
    buf.close()


def _hold_lock(name: str, ready) -> None:
    buf = PrioritizedReplayBuffer.attach(name)
    ready.set()
    buf._debug_hold_lock(60.0)


def _stall_in_copy(name: str, ready) -> None:
    buf = PrioritizedReplayBuffer.attach(name)
    buf._debug_copy_pause_s = 60.0
    ready.set()
    buf.add_batch(**lunar_batch(40, start=10_000))


def _create_and_wait(name: str, ready) -> None:
    buf = PrioritizedReplayBuffer(100, LUNAR_FIELDS, shared=True, name=name)
    buf.add_batch(**lunar_batch(10))
    ready.set()
    time.sleep(60)


def _read_pickled(data: bytes, out) -> None:
    buf = pickle.loads(data)
    out.put((buf.shared_name, len(buf), buf.get([3])["act"].tolist()))
    buf.close()


def _attach_and_exit(name: str) -> None:
    buf = ReplayBuffer.attach(name)
    buf.add(**{k: v[0] for k, v in lunar_batch(1, start=77).items()})
    # no close(): an attached handle never removes the creator's segment


# ---------------------------------------------------------------------------------------------- tests

def test_attach_in_a_spawned_process_sees_and_adds_to_the_same_buffer():
    with ReplayBuffer(50, LUNAR_FIELDS, seed=0, shared=True) as buf:
        name = buf.shared_name
        assert name in shm_names() and buf.is_creator
        buf.add_batch(**lunar_batch(5))
        assert run(_attach_and_exit, name) == 0
        assert len(buf) == 6 and buf.get([5])["act"].tolist() == [77]
        assert name in shm_names()          # the attached process exited without removing it
    assert name not in shm_names()          # the creator's close removed it
    with pytest.raises(ValueError, match="closed"):
        buf.sample(1)
    with pytest.raises(FileNotFoundError, match=name):
        ReplayBuffer.attach(name)


def test_two_writers_and_two_samplers_on_a_small_ring():
    """Heavy wrap-around (capacity 500, chunks of 37): no torn row, invariants hold at the end."""
    with PrioritizedReplayBuffer(500, LUNAR_FIELDS, seed=0, shared=True) as buf:
        buf.add_batch(**lunar_batch(500))
        out = SPAWN.Queue()
        procs = [SPAWN.Process(target=_writer, args=(buf.shared_name, s, 3.0, 37)) for s in (10**6, 2 * 10**6)]
        procs += [SPAWN.Process(target=_sampler, args=(buf.shared_name, s, 3.0, out)) for s in (1, 2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
        batches = [out.get(timeout=10) for _ in range(2)]
        assert min(batches) > 10
        assert buf.total_added > 2_000 and len(buf) == 500
        assert_rows_consistent(buf.get(np.arange(buf.total_added - 500, buf.total_added)))
        buf._check_invariants()
        assert buf.lock_stats()["acquisitions"] > 100


def test_a_process_killed_while_holding_the_lock_does_not_block_the_others():
    with PrioritizedReplayBuffer(200, LUNAR_FIELDS, seed=0, shared=True) as buf:
        buf.add_batch(**lunar_batch(150))
        ready = SPAWN.Event()
        p = SPAWN.Process(target=_hold_lock, args=(buf.shared_name, ready))
        p.start()
        assert ready.wait(60)
        time.sleep(0.5)                     # inside the critical section by now
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        t0 = time.monotonic()
        buf.add_batch(**lunar_batch(100, start=1000))      # takes the lock: EOWNERDEAD, repaired
        assert time.monotonic() - t0 < 5
        assert buf.lock_stats()["repairs"] >= 1
        assert_rows_consistent(buf.sample(64))
        buf._check_invariants()


def test_a_writer_killed_during_its_copy_leaves_no_stuck_slots():
    with PrioritizedReplayBuffer(100, LUNAR_FIELDS, seed=0, shared=True) as buf:
        buf.add_batch(**lunar_batch(100))
        ready = SPAWN.Event()
        p = SPAWN.Process(target=_stall_in_copy, args=(buf.shared_name, ready))
        p.start()
        assert ready.wait(60)
        time.sleep(0.5)                     # its 40 slots are reserved and in flight
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        t0 = time.monotonic()
        buf.add_batch(**lunar_batch(100, start=5000))      # the same slots again: waits, reaps, goes on
        b = buf.sample(64)
        assert time.monotonic() - t0 < 10
        assert_rows_consistent(b)
        assert buf.lock_stats()["repairs"] >= 1
        buf._check_invariants()
        assert len(buf) == 100


def test_each_process_draws_its_own_stream_in_proportion_to_priority():
    """Two sampling processes (seeds 1 and 2): different draws, and their pooled counts follow the
    priorities (chi-square)."""
    with PrioritizedReplayBuffer(64, LUNAR_FIELDS, alpha=1.0, eps=0.0, seed=0, shared=True) as buf:
        ids = buf.add_batch(**lunar_batch(64))
        p = np.arange(1, 65, dtype=np.float64)
        buf.update_priorities(ids, p)
        out = SPAWN.Queue()
        procs = [SPAWN.Process(target=_count_draws, args=(buf.shared_name, s, 200, out)) for s in (1, 2)]
        for proc in procs:
            proc.start()
        counts = [out.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(60)
        assert not np.array_equal(counts[0], counts[1])
        total = counts[0] + counts[1]
        assert chisquare(total, total.sum() * p / p.sum()).pvalue > 1e-3


def test_a_stale_segment_of_a_killed_creator_is_replaced_or_cleaned_up():
    name = f"pal-test-{os.getpid()}-stale"
    ready = SPAWN.Event()
    p = SPAWN.Process(target=_create_and_wait, args=(name, ready))
    p.start()
    assert ready.wait(60)
    with pytest.raises(FileExistsError, match="alive"):
        PrioritizedReplayBuffer(100, LUNAR_FIELDS, shared=True, name=name)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert name in shm_names()              # SIGKILL: nobody could remove it
    buf = PrioritizedReplayBuffer(100, LUNAR_FIELDS, shared=True, name=name)     # replaces the stale one
    assert len(buf) == 0
    buf.close()
    p = SPAWN.Process(target=_create_and_wait, args=(name, ready := SPAWN.Event()))
    p.start()
    assert ready.wait(60)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert PrioritizedReplayBuffer.cleanup(name) is True and name not in shm_names()
    assert PrioritizedReplayBuffer.cleanup(name) is False


def test_a_shared_buffer_pickles_as_a_reference_and_garbage_collection_removes_it():
    buf = PrioritizedReplayBuffer(50, LUNAR_FIELDS, seed=0, shared=True)
    buf.add_batch(**lunar_batch(10))
    name = buf.shared_name
    out = SPAWN.Queue()
    p = SPAWN.Process(target=_read_pickled, args=(pickle.dumps(buf), out))
    p.start()
    assert out.get(timeout=60) == (name, 10, [3])
    p.join(60)
    assert p.exitcode == 0
    del buf                                  # the creator's last reference: the segment goes with it
    assert name not in shm_names()


def test_attach_rejects_the_wrong_kind_and_bad_names():
    with PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True) as buf:
        with pytest.raises(ValueError, match="PrioritizedReplayBuffer.attach"):
            ReplayBuffer.attach(buf.shared_name)
    for bad in ("", "a/b", 3):
        with pytest.raises(ValueError, match="name"):
            PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name=bad)
    with pytest.raises(ValueError, match="shared=True"):
        PrioritizedReplayBuffer(10, LUNAR_FIELDS, name="x")


def test_shared_and_private_buffers_store_and_sample_the_same():
    private = PrioritizedReplayBuffer(300, LUNAR_FIELDS, seed=5)
    with PrioritizedReplayBuffer(300, LUNAR_FIELDS, seed=5, shared=True) as shared:
        for buf in (private, shared):
            ids = buf.add_batch(**lunar_batch(400))
            buf.update_priorities(ids[-300:], np.linspace(0.1, 2, 300))
        a, b = private.sample(128), shared.sample(128)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("impl", ["pal", "cpprb"])
def test_the_process_throughput_benchmark_runs(impl):
    pytest.importorskip(impl if impl == "cpprb" else "pal_bench")
    from pal_bench.studies import shared_buffer as shared_bench

    r = shared_bench.measure(impl, 1, 1, 0.3)
    assert r["inserts_per_s"] > 0 and r["sample_updates_per_s"] > 0


# ------------------------------------------------------------------ the control block (counters and a lock by name)

def _add_under_lock(name: str, n: int) -> None:
    from pal_bench._segment import SharedControl

    c = SharedControl.attach(name)
    for _ in range(n):
        with c.lock:
            c.words[0] += 1
    c.close()


def test_control_block_counts_exactly_across_processes_and_is_removed_by_its_creator():
    from pal_bench import shm
    from pal_bench._segment import SharedControl

    name = f"pal-test-ctl-{os.getpid()}"
    c = SharedControl.create(name, 4)
    assert list(c.words) == [0, 0, 0, 0]
    assert any(s["name"] == name and s["kind"] == "control block, 4 words" for s in shm.segments())
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_add_under_lock, args=(name, 2000)) for _ in range(2)]
    for p in procs:
        p.start()
    _add_under_lock(name, 2000)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert c.words[0] == 6000
    c.close()
    assert not os.path.exists(f"/dev/shm/{name}")
    with pytest.raises(ValueError, match="closed"):
        _ = c.words


def test_control_block_lock_survives_a_holder_killed_inside():
    from pal_bench._segment import SharedControl

    name = f"pal-test-ctl-dead-{os.getpid()}"
    c = SharedControl.create(name, 1)
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_hold_control_lock, args=(name,))
    p.start()
    deadline = time.monotonic() + 30
    while c.words[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.kill()
    p.join()
    with c.lock:                  # the dead holder's lock is repaired, not left held
        c.words[0] += 1
    assert c.words[0] == 2
    c.close()


def _hold_control_lock(name: str) -> None:
    from pal_bench._segment import SharedControl

    c = SharedControl.attach(name)
    with c.lock:
        c.words[0] = 1
        time.sleep(60)


def test_control_block_refuses_bad_input_and_foreign_segments():
    from pal_bench import PrioritizedReplayBuffer
    from pal_bench._segment import SharedControl

    for bad in (0, -1, True, 1.5, 1 << 21):
        with pytest.raises(ValueError, match="n_words"):
            SharedControl.create(f"pal-test-ctl-bad-{os.getpid()}", bad)
    with pytest.raises(FileNotFoundError):
        SharedControl.attach(f"pal-test-ctl-none-{os.getpid()}")
    buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True)
    with pytest.raises(ValueError, match="not a PAL-Bench control block"):
        SharedControl.attach(buf.shared_name)
    buf.close()
