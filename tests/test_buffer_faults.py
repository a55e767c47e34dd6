"""What hostile or careless use of the buffer gives (issue 35): a clear error and nothing changed, never a crash,
a hang, a leak or a segment removed from under its owner. Crashes and hangs run in a subprocess with a timeout,
so that a regression fails the test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import LUNAR_FIELDS, lunar_batch

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer

SHM = Path("/dev/shm")
needs_shm = pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory (/dev/shm)")


def pal_segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith("pal-")} if SHM.is_dir() else set()


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm():
    before = pal_segments()
    yield
    assert pal_segments() - before == set(), "a test left a segment in /dev/shm"


def run_script(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (the tests directory on its path); a hang fails, a signal shows in
    the return code."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout, cwd=Path(__file__).parent)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the script hung for {timeout} s; output so far:\n{e.stdout}\n{e.stderr}") from None


def assert_clean_exit(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"exit status {done.returncode} (negative: killed by that signal)\n" \
                                 f"{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------------------------------------- close in flight

@pytest.mark.parametrize("op", ["sample", "add_batch", "update_priorities", "save", "get", "add"])
@pytest.mark.parametrize("shared", [False, True])
def test_close_while_another_thread_is_inside_a_call(op, shared):
    """A call in flight when another thread closes the buffer finishes or raises 'closed'; nothing touches
    freed memory (this segfaulted for sample, add_batch and update_priorities)."""
    done = run_script(f"""
        import io, threading, time
        import numpy as np
        from conftest import LUNAR_FIELDS, lunar_batch
        from pal_bench import PrioritizedReplayBuffer
        errors, calls = [], [0]
        for round in range(20):
            buf = PrioritizedReplayBuffer(20_000, LUNAR_FIELDS, seed=round, shared={shared})
            ids = buf.add_batch(**lunar_batch(20_000))
            batch = lunar_batch(4096)
            go = threading.Event()
            def work():
                go.set()
                while True:
                    try:
                        if "{op}" == "sample":
                            buf.sample(4096)
                        elif "{op}" == "add_batch":
                            buf.add_batch(**batch)
                        elif "{op}" == "update_priorities":
                            buf.update_priorities(ids[:4096], np.ones(4096))
                        elif "{op}" == "save":
                            buf.save(io.BytesIO())
                        elif "{op}" == "get":
                            buf.get(ids[-4096:])
                        else:
                            buf.add(obs=np.ones(8, np.float32), act=1, rew=0.5, next_obs=np.ones(8, np.float32),
                                    done=False)
                        calls[0] += 1
                    except ValueError as e:
                        if "closed" not in str(e):
                            errors.append(repr(e))
                        return
            t = threading.Thread(target=work)
            t.start()
            go.wait()
            time.sleep(0.002 * (round % 5))
            buf.close()
            t.join(30)
            assert not t.is_alive(), "a call did not return after close"
        assert not errors, errors
        print("ok", calls[0])
        """)
    assert_clean_exit(done)


def test_every_call_after_close_raises_a_clear_error():
    buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, seed=0)
    ids = buf.add_batch(**lunar_batch(4))
    buf.close()
    calls = [lambda: buf.sample(2), lambda: buf.add_batch(**lunar_batch(2)), lambda: buf.get(ids),
             lambda: buf.update_priorities(ids, np.ones(4)), lambda: buf.get_priorities(ids), lambda: buf.storage,
             lambda: buf.lock_stats(), lambda: buf.total_added, lambda: buf.total_priority(), lambda: len(buf),
             lambda: buf.save(os.devnull)]
    for call in calls:
        with pytest.raises(ValueError, match="closed"):
            call()
    buf.close()                                             # idempotent
    assert "closed" in repr(buf)


# ---------------------------------------------------------------------------------------------- sample(out=...)

@pytest.mark.parametrize("alias", ["weights-on-indices", "field-is-indices", "field-on-field"])
def test_sample_into_overlapping_out_arrays_is_refused_before_writing(alias):
    """Out arrays that share memory made sample loop forever at 100% CPU, deaf to Ctrl-C."""
    done = run_script(f"""
        import numpy as np
        from conftest import lunar_batch
        from pal_bench import PrioritizedReplayBuffer
        fields = {{"obs": ((8,), np.float32), "act": ((), np.int64), "rew": ((), np.float32),
                  "next_obs": ((8,), np.float32), "done": ((), np.bool_)}}
        buf = PrioritizedReplayBuffer(100, fields, seed=0)
        buf.add_batch(**lunar_batch(100))
        o = buf.sample(16)
        alias = "{alias}"
        if alias == "weights-on-indices":
            o["weights"] = o["indices"].view(np.float64)
        elif alias == "field-is-indices":
            o["act"] = o["indices"]
        else:
            o["next_obs"] = o["obs"]
        snapshot = {{k: v.copy() for k, v in o.items()}}
        try:
            buf.sample(16, out=o)
        except ValueError as e:
            assert "overlap" in str(e) or "share" in str(e), e
            for k, v in o.items():
                assert (v.view(np.uint8) == snapshot[k].view(np.uint8)).all(), f"{{k}} was written"
            print("refused")
        else:
            raise SystemExit("accepted overlapping out arrays")
        """, timeout=30)
    assert_clean_exit(done)
    assert "refused" in done.stdout


def test_ctrl_c_reaches_a_sample_that_waits_on_a_writer_that_never_commits():
    done = run_script("""
        import os, signal, threading, time
        from conftest import LUNAR_FIELDS, lunar_batch
        from pal_bench import PrioritizedReplayBuffer
        buf = PrioritizedReplayBuffer(64, LUNAR_FIELDS, seed=0)
        buf.add_batch(**lunar_batch(64))
        buf._debug_copy_pause_s = 600.0                 # a writer stuck between reserve and commit
        threading.Thread(target=buf.add_batch, kwargs=lunar_batch(64), daemon=True).start()
        time.sleep(0.5)
        signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C raises here even when the test run
                                                                   # was started with SIGINT ignored (a background job)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            buf.sample(16)
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - t0:.1f} s", flush=True)
            os._exit(0)
        os._exit(3)
        """, timeout=60)
    assert_clean_exit(done)
    assert "interrupted" in done.stdout


# ---------------------------------------------------------------------------------------------- shared segments

@needs_shm
def test_a_buffer_larger_than_the_free_space_of_dev_shm_is_refused_at_creation():
    """The segment is sparse: creation succeeded and the first rows past the free space died of SIGBUS."""
    st = os.statvfs(SHM)
    if st.f_blocks == 0:
        pytest.skip("/dev/shm has no size limit here")
    free = st.f_bavail * st.f_frsize
    row = 8 * 64
    capacity = free // row + (1 << 20)          # a little more than what is free
    done = run_script(f"""
        import numpy as np
        from pal_bench import ReplayBuffer
        try:
            ReplayBuffer({capacity}, {{"x": ((64,), np.float64)}}, shared=True, name="pal-test-too-big-{os.getpid()}")
        except OSError as e:
            print("refused:", e)
        else:
            raise SystemExit("created a segment larger than the free space")
        """, timeout=120)
    assert_clean_exit(done)
    assert "free" in done.stdout and "MB" in done.stdout, done.stdout


@needs_shm
def test_a_forked_child_leaves_its_parents_segment_in_place():
    """The child's copy of the handle is not the creator: exiting normally or dropping it must not unlink."""
    done = run_script("""
        import gc, os, sys
        from conftest import LUNAR_FIELDS, lunar_batch
        from pal_bench import PrioritizedReplayBuffer
        buf = PrioritizedReplayBuffer(100, LUNAR_FIELDS, seed=0, shared=True)
        buf.add_batch(**lunar_batch(10))
        name = buf.shared_name
        for how in ("drop", "close", "exit"):
            pid = os.fork()
            if pid == 0:
                if how == "drop":
                    del buf
                    gc.collect()
                    os._exit(0)
                if how == "close":
                    buf.close()
                    os._exit(0)
                sys.exit(0)                 # a normal exit: atexit handlers run in the child
            _, status = os.waitpid(pid, 0)
            assert status == 0, status
            other = PrioritizedReplayBuffer.attach(name)
            assert len(other) == 10, how
            other.close()
        buf.close()
        assert not os.path.exists(f"/dev/shm/{name}")
        print("ok")
        """)
    assert_clean_exit(done)


@needs_shm
@pytest.mark.parametrize("bad", ["real\x00garbage", "x\x00tail", "a/b", "", "../x"])
def test_names_with_a_nul_or_a_slash_are_refused(bad):
    with PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name=f"pal-test-{os.getpid()}-real") as real:
        for call in (lambda: PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name=bad),
                     lambda: PrioritizedReplayBuffer.attach(bad),
                     lambda: PrioritizedReplayBuffer.attach(real.shared_name + bad[4:]) if bad[:4] == "real" else
                     PrioritizedReplayBuffer.attach(bad),
                     lambda: PrioritizedReplayBuffer.cleanup(bad)):
            with pytest.raises(ValueError, match="name"):
                call()
    assert not any("\x00" in n or n in ("x", "tail") for n in os.listdir(SHM))


@needs_shm
@pytest.mark.parametrize("word,value", [("sums_offset", 2**40), ("mins_offset", -8), ("records_offset", 16),
                                        ("spec_bytes", 2**40), ("capacity", 2**41), ("next_id", -5),
                                        ("size", 10**9), ("inflight", 3)])
def test_attach_refuses_a_header_whose_offsets_or_counters_do_not_fit(word, value):
    """A valid magic, version and size with one offset or counter off made attach (or the next call) segfault."""
    done = run_script(f"""
        import mmap, struct
        from conftest import LUNAR_FIELDS, lunar_batch
        from pal_bench import PrioritizedReplayBuffer, _segment
        buf = PrioritizedReplayBuffer(1000, LUNAR_FIELDS, seed=0, shared=True)
        buf.add_batch(**lunar_batch(100))
        off = _segment.header_offsets()["{word}"]
        with open(f"/dev/shm/{{buf.shared_name}}", "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
            struct.pack_into("<q", mm, off, {value})
            mm.close()
        try:
            other = PrioritizedReplayBuffer.attach(buf.shared_name)
        except ValueError as e:
            assert "{word}" in str(e), e
            print("refused:", e)
        else:
            raise SystemExit("attached to a corrupted header")
        buf.close()
        """)
    assert_clean_exit(done)
    assert "refused" in done.stdout


@needs_shm
def test_fuzz_every_header_word_with_hostile_values():
    """Every 8-byte word of the header (a reservation entry stands for all 64) set to hostile values: attach
    either refuses with ValueError or gives a handle whose calls raise or work; never a crash or a hang."""
    done = run_script("""
        import io, math, mmap, struct, sys
        import numpy as np
        from conftest import LUNAR_FIELDS, lunar_batch
        from pal_bench import PrioritizedReplayBuffer, ReplayBuffer, _replay, _segment
        _segment.ATTACH_LOCK_TIMEOUT_S = 0.2
        offsets = _segment.header_offsets()
        words = sorted(set(offsets.values()))
        res0, step = offsets["res"], 24
        words += [res0 + 24 * 7 + k for k in (0, 8, 16)]       # a reservation in the middle
        mutex = offsets["mutex"]
        words = [w for w in words if w < mutex] + [mutex + 8 * k for k in range(5)]
        as_double = lambda x: struct.unpack("<q", struct.pack("<d", x))[0]
        values = [0, 1, -1, 7, 2**31, 2**40, 2**62, 2**63 - 1, -2**63, 16384, 4096 * 3,
                  as_double(float("nan")), as_double(float("inf")), as_double(-1.0), as_double(1e308)]
        outcomes = {"refused": 0, "attached": 0}
        for cls in (PrioritizedReplayBuffer, ReplayBuffer):
            buf = cls(300, LUNAR_FIELDS, seed=0, shared=True)
            ids = buf.add_batch(**lunar_batch(200))
            path = f"/dev/shm/{buf.shared_name}"
            with open(path, "r+b") as f:
                mm = mmap.mmap(f.fileno(), 0)
            good = bytes(mm)                   # the whole block: a handle that attached may have added rows
            for w in words:
                for v in values:
                    print(cls.__name__, w, v, flush=True)
                    struct.pack_into("<q", mm, w, v)
                    try:
                        h = cls.attach(buf.shared_name, seed=1)
                    except (ValueError, TimeoutError) as e:
                        outcomes["refused"] += 1
                    else:
                        outcomes["attached"] += 1
                        for call in (lambda: h.sample(16), lambda: h.add_batch(**lunar_batch(8)),
                                     lambda: h.add(**{k: v[0] for k, v in lunar_batch(1).items()}),
                                     lambda: h.update_priorities(ids[-4:], np.ones(4)),
                                     lambda: h.get(ids[-4:]), lambda: h.get_priorities(ids[-4:]),
                                     lambda: h.save(io.BytesIO()), lambda: h.lock_stats(), lambda: len(h)):
                            try:
                                call()
                            except (ValueError, KeyError, IndexError, TimeoutError):
                                pass
                        h.close()
                    mm[:] = good
            mm.close()
            buf.close()
        print(outcomes)
        """, timeout=600)
    assert_clean_exit(done)
    outcomes = eval(done.stdout.strip().splitlines()[-1])
    assert outcomes["refused"] > 0 and outcomes["attached"] > 0, outcomes     # both paths were exercised


# ---------------------------------------------------------------------------------------------- files

def test_load_refuses_what_is_not_a_regular_file_before_reading(tmp_path):
    """load('/dev/zero') read until memory ran out."""
    done = run_script("""
        import io, os, tempfile
        from pal_bench import PrioritizedReplayBuffer
        d = tempfile.mkdtemp()
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)

        class Stream(io.RawIOBase):          # readable, not seekable
            def readable(self): return True
            def readinto(self, b): b[:] = bytes(len(b)); return len(b)
            def seekable(self): return False

        for source in ("/dev/zero", d, fifo, Stream(), io.StringIO("x")):
            try:
                PrioritizedReplayBuffer.load(source)
            except ValueError as e:
                print("refused:", e)
            else:
                raise SystemExit(f"loaded {source!r}")
        """, timeout=30)
    assert_clean_exit(done)
    assert done.stdout.count("refused") == 5


# ---------------------------------------------------------------------------------------------- dtypes and arguments

def test_a_structured_dtype_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="'pair'.*structured"):
        PrioritizedReplayBuffer(10, {"obs": ((2,), np.float32), "pair": ((), [("a", "<i4"), ("b", "<f8")])})


def test_a_subarray_dtype_becomes_the_fields_shape():
    buf = ReplayBuffer(10, {"v": ((2,), (np.float32, (3,))), "s": ((), (np.int16, (4,)))}, seed=0)
    assert buf.fields == {"v": ((2, 3), np.dtype(np.float32)), "s": ((4,), np.dtype(np.int16))}
    v = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.arange(4, dtype=np.int16)
    i = buf.add(v=v, s=s)
    j = buf.add_batch(v=v[None], s=s[None])[0]
    a, b = buf.get([i]), buf.get([j])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(a["v"][0], v)


@pytest.mark.parametrize("kw,match", [({"alpha": True}, "alpha"), ({"eps": True}, "eps"), ({"alpha": "0.5"}, "alpha"),
                                      ({"alpha": float("nan")}, "alpha")])
def test_bool_and_string_hyperparameters_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        PrioritizedReplayBuffer(10, LUNAR_FIELDS, **kw)


@pytest.mark.parametrize("beta", ["0.5", None, [0.5], True, float("nan"), 2.0, -0.1])
def test_sample_names_beta_when_it_is_not_a_number_in_range(beta):
    buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, seed=0)
    buf.add_batch(**lunar_batch(5))
    with pytest.raises((TypeError, ValueError), match="beta"):
        buf.sample(2, beta=beta)


# ---------------------------------------------------------------------------------------------- pal-bench shm

@needs_shm
def test_pal_bench_shm_lists_segments_and_cleans_those_whose_creator_was_killed(capsys):
    """SIGKILL leaves a buffer and a weights block behind; `pal-bench shm` shows them with a dead creator and
    `--clean` removes them and nothing else (a live creator's segment stays)."""
    import signal

    from pal_bench.cli import main

    tag = f"pal-test-{os.getpid()}-shm"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, torch
        from conftest import LUNAR_FIELDS
        from pal_bench import PrioritizedReplayBuffer
        from pal_bench.train.shared_weights import SharedWeights, spec_of
        buf = PrioritizedReplayBuffer(1000, LUNAR_FIELDS, shared=True, name="{tag}-buf")
        w = SharedWeights.create(spec_of({{"w": torch.zeros(4)}}), name="{tag}-w")
        print("ready", flush=True)
        time.sleep(120)
        """)], cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name=f"{tag}-live") as live:
            assert main(["shm"]) == 0
            out = capsys.readouterr().out
            for name in (f"{tag}-buf", f"{tag}-w", f"{tag}-live"):
                line = next(ln for ln in out.splitlines() if ln.startswith(name))
                assert f" {os.getpid() if name.endswith('live') else child.pid} " in line and " yes " in line, line
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            assert {f"{tag}-buf", f"{tag}-w"} <= set(os.listdir(SHM))          # nobody could remove them
            assert main(["shm"]) == 0
            out = capsys.readouterr().out
            assert " no " in next(ln for ln in out.splitlines() if ln.startswith(f"{tag}-buf"))
            assert "--clean" in out
            assert main(["shm", "--clean"]) == 0
            out = capsys.readouterr().out
            assert f"removed {tag}-buf" in out and f"removed {tag}-w" in out
            assert not {f"{tag}-buf", f"{tag}-w"} & set(os.listdir(SHM))
            assert live.shared_name in os.listdir(SHM) and len(live) == 0     # the live one was kept
    finally:
        child.kill()
        child.wait()
        for suffix in ("buf", "w"):
            Path(SHM, f"{tag}-{suffix}").unlink(missing_ok=True)


@needs_shm
def test_shared_weights_stay_with_their_creator_after_fork():
    done = run_script("""
        import gc, os, sys, torch
        from pal_bench.train.shared_weights import SharedWeights, spec_of
        w = SharedWeights.create(spec_of({"w": torch.zeros(4)}))
        for how in ("drop", "exit"):
            pid = os.fork()
            if pid == 0:
                if how == "drop":
                    w.close()
                    os._exit(0)
                sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
            assert os.path.exists(f"/dev/shm/{w.name}"), how
        w.close()
        assert not os.path.exists(f"/dev/shm/{w.name}")
        print("ok")
        """)
    assert_clean_exit(done)


# ---------------------------------------------------------------------------------------------- found by review

@needs_shm
def test_a_process_killed_inside_add_leaves_a_lock_the_next_attach_repairs():
    """add() copies its row under the lock: a kill there leaves the lock owner-dead with a slot in flight. The next
    attach must repair first (as every lock does) so that the lock stays usable; checking first made it
    unrecoverable and the creator's next call segfaulted."""
    done = run_script("""
        import random, signal, subprocess, sys, time
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer
        for round in range(3):
            buf = PrioritizedReplayBuffer(64, {"x": ((1 << 20,), np.float32)}, shared=True, seed=0)
            actor = subprocess.Popen([sys.executable, "-c", f'''
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer
        b = PrioritizedReplayBuffer.attach({buf.shared_name!r})
        row = np.ones(1 << 20, np.float32)
        print("go", flush=True)
        while True:
            b.add(x=row)
        '''], stdout=subprocess.PIPE, text=True)
            actor.stdout.readline()
            time.sleep(0.3 + random.random() * 0.2)
            actor.send_signal(signal.SIGKILL)
            actor.wait()
            again = subprocess.run([sys.executable, "-c", f'''
        from pal_bench import PrioritizedReplayBuffer
        b = PrioritizedReplayBuffer.attach({buf.shared_name!r})
        b.add(x=__import__("numpy").zeros(1 << 20, "float32"))
        print("restarted actor added", len(b))
        '''], capture_output=True, text=True, timeout=60)
            assert again.returncode == 0, again.stderr
            buf.add(x=np.zeros(1 << 20, np.float32))
            buf._check_invariants()
            buf.close()
        print("ok")
        """, timeout=180)
    assert_clean_exit(done)


def test_replacing_an_out_array_while_sample_writes_into_it_is_safe():
    """sample(out=d) held only the data pointers of d's arrays: another thread replacing d["x"] freed the array
    being written (a segfault). It now holds its own references."""
    done = run_script("""
        import threading
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer
        B, W = 8192, 1024
        buf = PrioritizedReplayBuffer(256, {"x": ((W,), np.float64)}, seed=0)
        buf.add_batch(x=np.ones((256, W)))
        d = buf.sample(B)
        stop = False
        def swap():
            while not stop:
                d["x"] = np.empty((B, W))
        t = threading.Thread(target=swap)
        t.start()
        try:
            for i in range(30):
                buf.sample(B, out=d)
        finally:
            stop = True
            t.join()
        print("ok")
        """, timeout=120)
    assert_clean_exit(done)


@needs_shm
def test_init_twice_is_refused_and_leaks_nothing():
    buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, seed=0, shared=True)
    with pytest.raises(RuntimeError, match="already initialised"):
        buf.__init__(5, LUNAR_FIELDS, shared=True)
    assert buf.capacity == 10
    buf.close()


def test_calling_into_the_buffer_from_inside_its_own_save_is_an_error_not_a_deadlock():
    """save() holds the lock while numpy writes the file: a file object's write() or a signal handler that calls
    the buffer again used to wait on itself for ever. The lock checks its owner: a clear RuntimeError."""
    done = run_script("""
        import io
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer
        buf = PrioritizedReplayBuffer(1 << 12, {"obs": ((64,), np.float32)}, seed=0)
        buf.add_batch(obs=np.zeros((1 << 12, 64), np.float32))

        class Sink(io.RawIOBase):
            def writable(self):
                return True
            def write(self, b):
                buf.sample(1)
                return len(b)
        try:
            buf.save(Sink())
        except RuntimeError as e:
            assert "already holds" in str(e), e
            print("refused")
        buf.sample(4)                   # the lock was released on the way out
        buf.save(io.BytesIO())
        """, timeout=60)
    assert_clean_exit(done)
    assert "refused" in done.stdout


@pytest.mark.parametrize("op", ["add", "add_batch", "save"])
def test_ctrl_c_reaches_add_add_batch_and_save_waiting_on_a_stuck_writer(op):
    done = run_script(f"""
        import io, os, signal, threading, time
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer
        buf = PrioritizedReplayBuffer(16, {{"x": ((), np.float64)}}, seed=0)
        buf.add_batch(x=np.arange(16.0))
        buf._debug_copy_pause_s = 600.0                 # a writer stuck between reserve and commit (slots 0-3)
        threading.Thread(target=buf.add_batch, kwargs={{"x": np.ones(4)}}, daemon=True).start()
        time.sleep(0.5)
        buf._debug_copy_pause_s = 0.0
        signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C raises here even when the test run
                                                                   # was started with SIGINT ignored (a background job)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            if "{op}" == "add":
                for i in range(40):
                    buf.add(x=float(i))                 # wraps onto slot 0, in flight
            elif "{op}" == "add_batch":
                buf.add_batch(x=np.ones(16))
            else:
                buf.save(io.BytesIO())
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            os._exit(0)
        os._exit(3)
        """, timeout=60)
    assert_clean_exit(done)
    assert "interrupted" in done.stdout


@needs_shm
def test_attach_refuses_a_tree_that_weights_an_empty_slot():
    """Such a tree passed attach and sample then drew the empty slot for ever."""
    done = run_script("""
        import os, struct
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer, _segment
        buf = PrioritizedReplayBuffer(16, {"x": ((), np.float64)}, shared=True, seed=0)
        buf.add_batch(x=np.arange(8.0))                 # slots 0..7 live, 8..15 empty
        off = _segment.header_offsets()
        fd = os.open(f"/dev/shm/{buf.shared_name}", os.O_RDWR)
        q = lambda w: struct.unpack("q", os.pread(fd, 8, off[w]))[0]
        so, mo = q("sums_offset"), q("mins_offset")
        sums = np.frombuffer(os.pread(fd, mo - so, so), np.float64).copy()
        p = sums[sums > 0].min()
        leaves = np.flatnonzero(sums == p)
        root = np.flatnonzero(sums == sums.max())[0]
        sums[leaves[-1] + 4] = 1e12                     # an empty slot gets a priority, and the root agrees
        sums[root] += 1e12
        os.pwrite(fd, sums.tobytes(), so)
        os.close(fd)
        try:
            PrioritizedReplayBuffer.attach(buf.shared_name)
        except ValueError as e:
            print("refused:", e)
        buf.close()
        """, timeout=60)
    assert_clean_exit(done)
    assert "refused" in done.stdout


@needs_shm
@pytest.mark.parametrize("which", ["next_id", "uniform_next_id", "capacity"])
def test_a_header_scribbled_on_after_attach_gives_errors_not_crashes(which):
    done = run_script(f"""
        import os, struct
        import numpy as np
        from pal_bench import PrioritizedReplayBuffer, ReplayBuffer, _segment
        cls = ReplayBuffer if "{which}" == "uniform_next_id" else PrioritizedReplayBuffer
        buf = cls(4096, {{"x": ((), np.float64)}}, shared=True)
        buf.add_batch(x=np.arange(10.0))
        other = cls.attach(buf.shared_name)
        off = _segment.header_offsets()
        fd = os.open(f"/dev/shm/{{buf.shared_name}}", os.O_RDWR)
        if "{which}" == "capacity":
            os.pwrite(fd, struct.pack("q", 2**40), off["capacity"])
            os.pwrite(fd, struct.pack("q", 2**39), off["next_id"])
        else:
            os.pwrite(fd, struct.pack("q", -(2**62) + 1), off["next_id"])
        os.close(fd)
        for call in (lambda: other.add(x=1.0), lambda: other.add_batch(x=np.ones(3)), lambda: other.sample(64)):
            try:
                call()
            except ValueError as e:
                print("error:", e)
        buf.close()
        print("ok")
        """, timeout=60)
    assert_clean_exit(done)


@needs_shm
def test_a_file_in_dev_shm_that_is_not_a_pal_segment_is_never_removed(tmp_path):
    """Creating a buffer under a taken name used to unlink whatever was there unless it was a live PAL buffer, and
    to hang on a FIFO."""
    name = f"pal-test-{os.getpid()}-foreign"
    path = SHM / name
    path.write_bytes(b"someone else's shared memory" * 1000)
    try:
        with pytest.raises(FileExistsError, match="not a PAL-Bench buffer"):
            PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name=name)
        assert path.exists()
    finally:
        path.unlink()
    done = run_script(f"""
        import os
        from conftest import LUNAR_FIELDS
        from pal_bench import PrioritizedReplayBuffer
        os.mkfifo("{path}")
        try:
            PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True, name="{name}")
        except FileExistsError as e:
            print("refused:", e)
        finally:
            os.unlink("{path}")
        """, timeout=30)
    assert_clean_exit(done)
    assert "refused" in done.stdout


@needs_shm
def test_a_live_creator_is_told_by_its_flock_not_only_its_pid(capsys):
    """A creator in another pid namespace (containers sharing /dev/shm) has a pid that means nothing here:
    `pal-bench shm --clean` removed its live segment. The creator's flock on the segment says it is alive."""
    from pal_bench import _segment
    from pal_bench.cli import main

    done = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, struct, sys, time
        from conftest import LUNAR_FIELDS
        from pal_bench import PrioritizedReplayBuffer, _segment
        buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, shared=True)
        # as a pid namespace would show it: a pid that is no live process here
        fd = os.open(f"/dev/shm/{buf.shared_name}", os.O_RDWR)
        os.pwrite(fd, struct.pack("q", 2**31 - 7), _segment.header_offsets()["creator_pid"])
        os.close(fd)
        print(buf.shared_name, flush=True)
        sys.stdin.readline()
        print(len(PrioritizedReplayBuffer.attach(buf.shared_name)), flush=True)
        """)], cwd=Path(__file__).parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name = done.stdout.readline().strip()
        assert _segment.segment_info(name)["creator_alive"]
        assert main(["shm", "--clean"]) == 0
        assert name in os.listdir(SHM), capsys.readouterr().out
        done.stdin.write("\n")
        done.stdin.flush()
        assert done.stdout.readline().strip() == "0"           # the creator could still attach
        assert done.wait(30) == 0
    finally:
        done.kill()
        done.wait()


def test_absurd_eps_and_shapes_are_refused_naming_them():
    with pytest.raises(ValueError, match="eps"):
        PrioritizedReplayBuffer(10, LUNAR_FIELDS, alpha=1.0, eps=1e308)
    with pytest.raises(ValueError, match="'x'"):
        PrioritizedReplayBuffer(10, {"x": ((2**63,), np.float32)})
    with pytest.raises(ValueError, match="'x'"):
        PrioritizedReplayBuffer(10, {"x": ((2**31, 2**31), np.float32)})


def test_storage_views_cannot_be_made_writable():
    buf = PrioritizedReplayBuffer(10, LUNAR_FIELDS, seed=0)
    view = buf.storage["obs"]
    with pytest.raises(ValueError):
        view.flags.writeable = True


@needs_shm
def test_a_sequence_buffer_with_subarray_step_fields_attaches_and_loads(tmp_path):
    from pal_bench.sequence_replay import SequenceReplayBuffer

    step = {"obs": ((), (np.float32, (3,))), "act": (2, np.int64)}
    with SequenceReplayBuffer(8, step, seq_len=4, lstm_size=2, shared=True) as seq:
        other = SequenceReplayBuffer.attach(seq.shared_name, 4, 2, step)
        other.close()
        seq.save(tmp_path / "seq.pal")
    SequenceReplayBuffer.load(tmp_path / "seq.pal", 4, 2, step).close()
