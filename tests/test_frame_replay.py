"""FrameReplayBuffer (memory modes): sampled stacks and next observations are exactly those a naive buffer that
stores every stacked row in full would return, for interleaved streams with episode ends, ring wrap-around,
shared memory, save/load in the middle, and several writers at once."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pal_bench.frame_replay import FrameReplayBuffer

FRAME = (3, 5)


def fields(stack: int) -> dict:
    obs_shape = (stack, *FRAME) if stack > 1 else FRAME
    return {"obs": (obs_shape, np.uint8), "act": ((), np.int64), "rew": ((), np.float32),
            "next_obs": (obs_shape, np.uint8), "done": ((), np.bool_)}


def frame(stream: int, step: int, reset: bool = False) -> np.ndarray:
    """A frame that names its stream and step (and whether it is an episode's reset frame)."""
    f = np.full(FRAME, 7, np.uint8)
    f[0, 0], f[0, 1], f[0, 2], f[0, 3] = stream, step % 256, step // 256, reset
    return f


class Stream:
    """One environment stream as a frame-stacking wrapper shows it: stacks of ``k`` frames, oldest first, an
    episode starting with its reset frame repeated (``padding="reset"``) or zero frames before it."""

    def __init__(self, sid: int, k: int, ep_lens, padding: str = "reset"):
        self.sid, self.k, self.padding = sid, k, padding
        self.ep_lens = list(ep_lens)
        self.step = 0
        self.left = self.ep_lens[0]
        self.stack = self._reset()

    def _reset(self) -> list[np.ndarray]:
        first = frame(self.sid, self.step, reset=True)
        pad = first if self.padding == "reset" else np.zeros(FRAME, np.uint8)
        return [pad] * (self.k - 1) + [first]

    def next_row(self) -> dict:
        self.step += 1
        nxt = self.stack[1:] + [frame(self.sid, self.step)]
        self.left -= 1
        done = self.left == 0
        row = dict(obs=self._shape(self.stack), next_obs=self._shape(nxt), act=self.sid * 1_000_000 + self.step,
                   rew=np.float32(self.step), done=done)
        if done:
            self.ep_lens = self.ep_lens[1:] or [3]
            self.left = self.ep_lens[0]
            self.stack = self._reset()
        else:
            self.stack = nxt
        return row

    def _shape(self, frames):
        return np.stack(frames) if self.k > 1 else frames[0].copy()


def _interleave(sids: list[int], rng) -> list[int]:
    """A random order of the rows ``0..n-1`` that keeps the rows of each stream in their own order."""
    queues = {s: [i for i, x in enumerate(sids) if x == s] for s in set(sids)}
    picks = rng.permutation(sids)                 # which stream's next row goes in each position
    return [queues[s].pop(0) for s in picks]


def as_batch(rows, k) -> dict:
    return {name: np.stack([np.asarray(r[name]) for r in rows]) for name in fields(k)}


def check_sample(buf, ref: dict, n: int = 64) -> None:
    got = buf.sample(n)
    for j, tid in enumerate(got["indices"]):
        row = ref[int(tid)]
        np.testing.assert_array_equal(got["obs"][j], row["obs"])
        np.testing.assert_array_equal(got["next_obs"][j], row["next_obs"])
        assert got["act"][j] == row["act"] and got["done"][j] == row["done"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([1, 2, 4]), n_streams=st.integers(1, 4), capacity=st.integers(12, 90),
       chunks=st.lists(st.integers(1, 9), min_size=3, max_size=12), seed=st.integers(0, 2**16),
       padding=st.sampled_from(["reset", "zero"]), prioritized=st.booleans(), save_at=st.integers(0, 11))
def test_same_rows_as_a_naive_buffer(tmp_path_factory, k, n_streams, capacity, chunks, seed, padding, prioritized,
                                     save_at):
    """Any interleaving of streams, chunk sizes and episode lengths, with wrap-around (capacity 12-90 rows) and a
    save/load in the middle: every sampled step's obs and next_obs equal the full stacked rows it was inserted
    with, and its other fields too."""
    capacity = max(capacity, max(chunks) * n_streams * (k + 1))   # one call's rows, at worst a segment each
    rng = np.random.default_rng(seed)
    streams = [Stream(s, k, rng.integers(1, 8, 20), padding) for s in range(n_streams)]
    buf = FrameReplayBuffer(capacity, fields(k), stack=k, prioritized=prioritized, seed=seed)
    ref: dict[int, dict] = {}
    for c, size in enumerate(chunks):
        rows, sids = [], []
        for s in rng.permutation(n_streams):          # each stream's steps in order, streams interleaved
            part = [streams[s].next_row() for _ in range(size)]
            rows += part
            sids += [s] * size
        order = _interleave(sids, rng)             # streams interleaved, each stream's steps in order
        rows = [rows[i] for i in order]
        ids = buf.add_batch(stream=np.array([sids[i] for i in order]), **as_batch(rows, k))
        ref.update({int(t): r for t, r in zip(ids, rows)})
        check_sample(buf, ref)
        if c == save_at:
            path = tmp_path_factory.mktemp("frames") / "buf.npz"
            buf.save(path)
            buf = FrameReplayBuffer.load(path, fields(k), stack=k, prioritized=prioritized)
            check_sample(buf, ref)
    assert 0 < buf.transitions() <= len(buf) <= capacity


def test_memory_per_step_is_one_frame():
    """Stack 4, one stream, 50-step chunks: each stored row holds one frame, and 54 rows hold 50 steps."""
    k = 4
    s = Stream(0, k, [1000])
    buf = FrameReplayBuffer(540, fields(k), stack=k)
    for _ in range(10):
        buf.add_batch(**as_batch([s.next_row() for _ in range(50)], k))
    assert len(buf) == 540 and buf.transitions() == 500
    assert buf._buf.fields["obs__frames_of_4"] == (FRAME, np.dtype(np.uint8))
    assert "next_obs" not in buf._buf.fields


def test_hidden_rows_are_never_drawn_or_reprioritised():
    k = 4
    for prioritized in (True, False):
        s = Stream(0, k, [5, 5, 5])
        buf = FrameReplayBuffer(200, fields(k), stack=k, prioritized=prioritized)
        ids = buf.add_batch(**as_batch([s.next_row() for _ in range(15)], k))
        hidden = np.setdiff1d(np.arange(len(buf)), ids)
        assert hidden.size == 3 * k                          # 3 segments: k - 1 context rows and 1 tail row each
        assert not np.isin(buf.sample(2000)["indices"], hidden).any()
        if prioritized:
            assert buf.update_priorities(hidden, np.full(hidden.size, 5.0)) == 0
            assert (buf.get_priorities(hidden) == 0).all()
            assert buf.update_priorities(ids, np.full(ids.size, 2.0)) == ids.size


def test_bad_rows_change_nothing():
    k = 4
    s = Stream(0, k, [50])
    buf = FrameReplayBuffer(100, fields(k), stack=k)
    buf.add_batch(**as_batch([s.next_row() for _ in range(5)], k))
    before = (len(buf), buf.transitions())
    batch = as_batch([s.next_row() for _ in range(5)], k)
    bad = dict(batch, next_obs=batch["next_obs"].copy())
    bad["next_obs"][2, 0] += 1                                   # not obs advanced by one frame
    with pytest.raises(ValueError, match="row 2"):
        buf.add_batch(**bad)
    with pytest.raises(ValueError, match="priorities"):
        buf.add_batch(priorities=np.r_[1.0, np.nan, 1, 1, 1], **batch)
    with pytest.raises(ValueError, match="stream"):
        buf.add_batch(stream=np.zeros(4, int), **batch)
    with pytest.raises(ValueError, match="shape"):
        buf.add_batch(**dict(batch, obs=batch["obs"][:, :2]))
    with pytest.raises(ValueError, match="capacity"):
        buf.add_batch(**as_batch([s.next_row() for _ in range(97)], k))
    assert (len(buf), buf.transitions()) == before
    with pytest.raises(ValueError, match="_hidden"):
        FrameReplayBuffer(10, dict(fields(k), _hidden=((), np.bool_)), stack=k)
    with pytest.raises(ValueError, match="stack"):
        FrameReplayBuffer(10, fields(1), stack=4)


def test_threads_insert_interleaved_chunks_while_others_sample():
    """Four writer threads (two streams each) insert 6-step chunks into a 300-row ring while two threads sample:
    every sampled step equals its full stacked rows (recorded by its writer before the insert)."""
    k = 4
    buf = FrameReplayBuffer(300, fields(k), stack=k)
    ref: dict[int, dict] = {}
    lock = threading.Lock()
    errors = []
    stop = threading.Event()

    def writer(w):
        rng = np.random.default_rng(w)
        ss = [Stream(2 * w, k, rng.integers(1, 9, 50)), Stream(2 * w + 1, k, rng.integers(1, 9, 50))]
        by_tag = {}
        for _ in range(60):
            rows = [ss[0].next_row() for _ in range(6)] + [ss[1].next_row() for _ in range(6)]
            for r in rows:
                by_tag[int(r["act"])] = r
            with lock:
                ref.update(by_tag)
            buf.add_batch(stream=np.repeat([2 * w, 2 * w + 1], 6), **as_batch(rows, k))

    def reader():
        try:
            while not stop.is_set():
                if len(buf) < 10:
                    continue
                got = buf.sample(32)
                for j in range(32):
                    row = ref[int(got["act"][j])]
                    np.testing.assert_array_equal(got["obs"][j], row["obs"])
                    np.testing.assert_array_equal(got["next_obs"][j], row["next_obs"])
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[0]


def _process_writer(name: str, w: int, k: int) -> None:
    buf = FrameReplayBuffer.attach(name, fields(k), stack=k)
    s = Stream(10 + w, k, [4, 9, 2, 6] * 20)
    for _ in range(40):
        buf.add_batch(**as_batch([s.next_row() for _ in range(5)], k))
    buf.close()


def test_processes_insert_into_a_shared_buffer():
    """Two spawned processes insert into a shared 150-row buffer (wrapping it several times) while this one
    samples; each sampled step's frames are those its stream generated (recomputed here from the step's tag)."""
    k = 4
    with FrameReplayBuffer(150, fields(k), stack=k, shared=True) as buf:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_process_writer, args=(buf.shared_name, w, k)) for w in range(2)]
        for p in procs:
            p.start()
        # the expected rows of every step of both streams, from the same deterministic streams
        ref = {}
        for w in range(2):
            s = Stream(10 + w, k, [4, 9, 2, 6] * 20)
            for _ in range(200):
                r = s.next_row()
                ref[int(r["act"])] = r
        checked = 0
        while any(p.is_alive() for p in procs) or checked == 0:
            if len(buf) > 10:
                got = buf.sample(16)
                for j in range(16):
                    row = ref[int(got["act"][j])]
                    np.testing.assert_array_equal(got["obs"][j], row["obs"])
                    np.testing.assert_array_equal(got["next_obs"][j], row["next_obs"])
                checked += 1
        for p in procs:
            p.join(60)
            assert p.exitcode == 0


def test_a_file_that_gives_a_hidden_row_a_priority_is_refused(tmp_path):
    """A saved frame buffer edited so that a context row has a priority (it could then be drawn as a step) is
    refused on load, and so is one whose step rows were marked hidden."""
    k = 4
    buf = FrameReplayBuffer(100, fields(k), stack=k)
    ids = buf.add_batch(**as_batch([Stream(0, k, [50]).next_row() for _ in range(20)], k))
    buf.save(tmp_path / "ok.pal")
    with np.load(tmp_path / "ok.pal") as z:
        arrays = {name: z[name] for name in z.files}
    hidden_slot = int(np.setdiff1d(np.arange(len(buf)), ids)[0])
    bad = dict(arrays, priorities=arrays["priorities"].copy())
    bad["priorities"][hidden_slot] = 1.0
    with open(tmp_path / "bad.pal", "wb") as f:
        np.savez(f, **bad)
    with pytest.raises(ValueError, match="hidden row"):
        FrameReplayBuffer.load(tmp_path / "bad.pal", fields(k), stack=k)
    flipped = dict(arrays, **{"field._hidden": np.ones_like(arrays["field._hidden"])})
    with open(tmp_path / "flipped.pal", "wb") as f:
        np.savez(f, **flipped)
    with pytest.raises(ValueError, match="hidden row"):
        FrameReplayBuffer.load(tmp_path / "flipped.pal", fields(k), stack=k)
    assert FrameReplayBuffer.load(tmp_path / "ok.pal", fields(k), stack=k).transitions() == 20


def test_a_handle_with_another_stack_is_refused(tmp_path):
    """Stack 2 and stack 4 store the same one frame per row: the stack is in the stored field's name, so neither
    load nor attach takes one for the other."""
    buf = FrameReplayBuffer(100, fields(2), stack=2, shared=True)
    try:
        buf.add_batch(**as_batch([Stream(0, 2, [50]).next_row() for _ in range(10)], 2))
        buf.save(tmp_path / "two.pal")
        with pytest.raises(ValueError, match="frame buffer of this layout"):
            FrameReplayBuffer.attach(buf.shared_name, fields(4), stack=4)
        with pytest.raises(ValueError, match="frame buffer of this layout"):
            FrameReplayBuffer.load(tmp_path / "two.pal", fields(4), stack=4)
    finally:
        buf.close()


def test_an_edited_kind_is_refused_on_load_even_without_priorities(tmp_path):
    """A uniform buffer has no priorities to cross-check: a tail edited into a step would be drawn with frames
    of the next segment. The rows' kinds are checked against the layout on load."""
    k = 4
    buf = FrameReplayBuffer(200, fields(k), stack=k, prioritized=False)
    s = Stream(0, k, [6, 6, 6, 6])
    for _ in range(4):
        buf.add_batch(**as_batch([s.next_row() for _ in range(5)], k))
    buf.save(tmp_path / "ok.pal")
    with np.load(tmp_path / "ok.pal") as z:
        arrays = {name: z[name] for name in z.files}
    kinds = arrays["field._hidden"]
    for edit in (2, 1):                               # a tail made a step; a context frame made a step
        bad = kinds.copy()
        bad[np.flatnonzero(kinds == edit)[0]] = 0
        with open(tmp_path / "bad.pal", "wb") as f:
            np.savez(f, **dict(arrays, **{"field._hidden": bad}))
        with pytest.raises(ValueError, match="frame layout"):
            FrameReplayBuffer.load(tmp_path / "bad.pal", fields(k), stack=k, prioritized=False)
    assert FrameReplayBuffer.load(tmp_path / "ok.pal", fields(k), stack=k, prioritized=False).transitions() == 20


def test_only_obs_and_next_obs():
    f = {"obs": ((3,), np.float32), "next_obs": ((3,), np.float32)}
    buf = FrameReplayBuffer(50, f)
    o = np.arange(30, dtype=np.float32).reshape(10, 3)
    buf.add_batch(obs=o[:-1], next_obs=o[1:])
    got = buf.sample(8)
    assert set(got) == {"obs", "next_obs", "indices", "weights"}
    np.testing.assert_array_equal(got["next_obs"], got["obs"] + 3)


def test_a_step_whose_window_the_ring_cut_is_hidden_not_redrawn_for_ever():
    """The oldest steps lose their context frames to the ring; one with a dominant priority must not make every
    sample fail: it is hidden the first time its window is found cut."""
    k = 4
    buf = FrameReplayBuffer(30, fields(k), stack=k, alpha=1.0)
    s = Stream(0, k, [1000])
    ids = buf.add_batch(**as_batch([s.next_row() for _ in range(20)], k))     # rows 0..23
    buf.update_priorities(ids[2:3], [1e6])                                     # step id 5 dominates
    buf.add_batch(**as_batch([s.next_row() for _ in range(2)], k))            # 6 rows: ids 24..29, ring full
    buf.add_batch(**as_batch([s.next_row() for _ in range(1)], k))            # 5 rows overwrite ids 0..4
    assert ids[2] == 5 and buf.get_priorities(ids[2:3])[0] > 1000              # alive, its context (id 2) gone
    for _ in range(20):
        got = buf.sample(16)
        assert ids[2] not in got["indices"]
    assert buf.get_priorities(ids[2:3])[0] == 0                                # hidden: never drawn again
    assert buf.update_priorities(ids[2:3], [5.0]) == 0
