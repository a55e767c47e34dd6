"""Memory safety of the buffer: add() stores what add_batch() stores for every dtype, load() of any file
either restores a consistent buffer or raises ValueError with bounded memory, totals cannot overflow,
fork, pickling, atomic saves and the sum tree's lock."""

import copy
import io
import json
import os
import pickle
import signal
import threading
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from conftest import LUNAR_FIELDS, lunar_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer, SumTree

# ---------------------------------------------------------------------------------------------- add vs add_batch

DTYPES = (hnp.boolean_dtypes() | hnp.integer_dtypes(endianness="?") | hnp.unsigned_integer_dtypes(endianness="?")
          | hnp.floating_dtypes(endianness="?") | hnp.complex_number_dtypes(endianness="?")
          | hnp.datetime64_dtypes(endianness="?") | hnp.timedelta64_dtypes(endianness="?")
          | hnp.byte_string_dtypes(endianness="?", max_len=6) | hnp.unicode_string_dtypes(endianness="?", max_len=3))
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)


@st.composite
def field_and_value(draw):
    """A field (shape, stored dtype) and a value for one row: an array, a numpy scalar or a Python scalar,
    of the field's dtype or of another one."""
    shape = draw(SHAPES)
    stored = draw(DTYPES)
    given_dtype = draw(st.one_of(st.just(stored), DTYPES))
    arr = draw(hnp.arrays(given_dtype, shape))
    kinds = ["array"] + (["numpy scalar", "python scalar"] if shape == () else [])
    kind = draw(st.sampled_from(kinds))
    value = arr if kind == "array" else arr[()] if kind == "numpy scalar" else arr.item()
    return shape, stored, value


def stored_bytes(buf, tid) -> dict:
    return {k: np.ascontiguousarray(v).tobytes() for k, v in buf.get([tid]).items()}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(field_and_value(), min_size=1, max_size=3), st.sampled_from([PrioritizedReplayBuffer, ReplayBuffer]))
def test_add_stores_exactly_what_add_batch_stores(fields, cls):
    specs = {f"f{i}": (shape, dtype) for i, (shape, dtype, _) in enumerate(fields)}
    row = {f"f{i}": value for i, (_, _, value) in enumerate(fields)}
    one, batch = cls(4, specs, seed=0), cls(4, specs, seed=0)
    try:
        batch_ids = batch.add_batch(**{k: np.asarray(v)[None] for k, v in row.items()})
    except (TypeError, ValueError, OverflowError) as e:
        with pytest.raises(type(e)):
            one.add(**row)
        assert len(one) == 0 and one.total_added == 0
        return
    tid = one.add(**row)
    assert tid == batch_ids[0] == 0
    assert stored_bytes(one, 0) == stored_bytes(batch, 0)


@pytest.mark.parametrize("stored, value", [
    ("c16", np.complex128(1 + 2j)),                 # 16-byte scalar: used to spill into the next field
    ("S4", np.bytes_(b"ab")),                       # flexible types: used to store pointer bytes
    ("S10", np.array(b"abc", dtype="S1")),          # 'S1'[3] into 'S10'[3]: used to read past the source
    ("M8[s]", np.datetime64(1500, "ms")),           # the unit: used to be ignored
    (">f8", 1.5),                                   # byte order: used to store 3.1e-319
])
def test_reported_fast_path_cases_store_what_add_batch_stores(stored, value):
    shape = np.shape(value) if isinstance(value, np.ndarray) else ()
    specs = {"x": (shape, stored), "y": ((), "f8")}
    one, batch = ReplayBuffer(2, specs, seed=0), ReplayBuffer(2, specs, seed=0)
    one.add(x=value, y=7.0)
    batch.add_batch(x=np.asarray(value)[None], y=np.array([7.0]))
    assert stored_bytes(one, 0) == stored_bytes(batch, 0)
    assert one.get([0])["y"][0] == 7.0


# ---------------------------------------------------------------------------------------------- load

def saved(tmp_path, cls=PrioritizedReplayBuffer, n=40, capacity=32, **kw) -> tuple:
    buf = cls(capacity, LUNAR_FIELDS, seed=3, **kw)
    ids = buf.add_batch(**lunar_batch(n))
    if cls is PrioritizedReplayBuffer:
        buf.update_priorities(ids[-capacity:], np.linspace(0.1, 3, capacity))
    path = tmp_path / "ok.pal"
    buf.save(path)
    return buf, path


def members(path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def npy(arr) -> bytes:
    fh = io.BytesIO()
    np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)
    return fh.getvalue()


def rewrite(path, out, meta=None, arrays=None, raw=None, deflate=()):
    """A copy of a saved file with metadata keys, members (as arrays, or raw .npy bytes) replaced."""
    files = members(path)
    if meta is not None:
        m = json.loads(np.lib.format.read_array(io.BytesIO(files["__meta__.npy"])).tobytes())
        m.update(meta)
        files["__meta__.npy"] = npy(np.frombuffer(json.dumps(m).encode(), dtype=np.uint8))
    for name, arr in (arrays or {}).items():
        files[f"{name}.npy"] = npy(arr)
    files.update(raw or {})
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return out


def load_peak(path, cls=PrioritizedReplayBuffer):
    """``cls.load(path)``'s outcome and its peak traced allocation (bytes)."""
    tracemalloc.start()
    try:
        try:
            out = cls.load(path)
        except ValueError as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("change, match", [
    (dict(next_id=-5), "next_id"),
    (dict(next_id=2**63 - 10), "next_id"),
    (dict(next_id=10), "slot table"),
    (dict(capacity=10**9), "capacity 1000000000 needs|declare"),
    (dict(capacity=5 * 10**7), "capacity 50000000 needs|declare"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(alpha=2.0), "alpha"),
    (dict(eps=-1.0), "eps"),
    (dict(fanout=1), "fanout"),
    (dict(fanout=True), "fanout"),
    (dict(max_priority=-1.0), "max_priority"),
    (dict(max_priority=float("inf")), "max_priority"),
    (dict(kind="uniform"), "ReplayBuffer"),
    (dict(fields=[["obs", [8], "|O"]]), "cannot be stored|members"),
    (dict(fields="obs"), "field"),
    (dict(extra=1), "metadata keys"),
])
def test_crafted_metadata_is_rejected_with_bounded_memory(tmp_path, change, match):
    _, path = saved(tmp_path)
    bad = rewrite(path, tmp_path / "bad.pal", meta=change)
    out, peak = load_peak(bad)
    assert isinstance(out, ValueError) and __import__("re").search(match, str(out)), out
    assert peak < 8 << 20, peak


def test_crafted_members_are_rejected(tmp_path):
    _, path = saved(tmp_path)
    cases = {
        "zero live priority": dict(arrays={"priorities": np.zeros(32)}),
        "all-zero rng": dict(arrays={"rng_state": np.zeros(4, dtype=np.uint64)}),
        "negative priority": dict(arrays={"priorities": -np.ones(32)}),
        "huge priority": dict(arrays={"priorities": np.full(32, 1e307)}),   # 32 of them overflow
        "foreign slot ids": dict(arrays={"slot_ids": np.arange(32) + 1}),
        "short field": dict(arrays={"field.obs": np.zeros((31, 8), np.float32)}),
        "wrong dtype": dict(arrays={"field.obs": np.zeros((32, 8), np.float64)}),
        "missing member": dict(raw={}),
    }
    for name, kw in cases.items():
        bad = rewrite(path, tmp_path / "bad.pal", **kw)
        if name == "missing member":
            with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
                for i in src.infolist():
                    if i.filename != "rng_state.npy":
                        dst.writestr(i, src.read(i))
        out, peak = load_peak(bad)
        assert isinstance(out, ValueError), (name, out)
        assert peak < 8 << 20, (name, peak)


def test_a_member_declaring_a_terabyte_is_rejected_before_allocating(tmp_path):
    _, path = saved(tmp_path)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**11,)})
    bad = rewrite(path, tmp_path / "tb.pal", raw={"priorities.npy": header.getvalue() + b"\0" * 64})
    out, peak = load_peak(bad)
    assert isinstance(out, ValueError) and peak < 8 << 20


def test_a_deflate_bomb_is_rejected_before_inflating(tmp_path):
    """Members are read stored only: a compressed one is refused before a byte of it is inflated."""
    n = 200_000
    small = PrioritizedReplayBuffer(4, {"x": ((50,), np.float64)}, seed=0)
    small.add_batch(x=np.ones((4, 50)))
    small.save(tmp_path / "small.pal")
    m = json.loads(np.lib.format.read_array(io.BytesIO(members(tmp_path / "small.pal")["__meta__.npy"])).tobytes())
    m["capacity"] = n
    files = {"__meta__.npy": npy(np.frombuffer(json.dumps(m).encode(), dtype=np.uint8)),
             "slot_ids.npy": npy(np.full(n, -1, np.int64)), "rng_state.npy": npy(np.ones(4, np.uint64)),
             "priorities.npy": npy(np.zeros(n)), "field.x.npy": npy(np.zeros((n, 50)))}      # 80 MB of zeros
    bomb = tmp_path / "bomb.pal"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    del files
    assert bomb.stat().st_size < 1 << 20
    out, peak = load_peak(bomb)
    assert isinstance(out, ValueError) and "compressed" in str(out) and peak < 8 << 20


def test_mutated_files_load_consistently_or_raise(tmp_path):
    """A mutation loop over a valid file: every load restores a buffer whose invariants hold, or raises
    ValueError (never a crash, a hang, or a buffer that breaks later)."""
    _, path = saved(tmp_path, n=45)
    data = path.read_bytes()
    rng = np.random.default_rng(0)
    loaded = 0
    for _ in range(400):
        b = bytearray(data)
        for pos in rng.integers(0, len(b), rng.integers(1, 4)):
            b[pos] = rng.integers(0, 256)
        try:
            buf = PrioritizedReplayBuffer.load(io.BytesIO(bytes(b)))
        except ValueError:
            continue
        loaded += 1
        buf._check_invariants()
        buf.sample(16)
        buf.add_batch(**lunar_batch(5))
        buf._check_invariants()
    assert loaded > 20          # many mutations hit row data, which any bytes are valid for


def test_save_and_load_accept_file_objects(tmp_path):
    buf, _ = saved(tmp_path)
    fh = io.BytesIO()
    buf.save(fh)
    fh.seek(0)
    other = PrioritizedReplayBuffer.load(fh)
    np.testing.assert_array_equal(other.get([30])["obs"], buf.get([30])["obs"])
    assert other.total_priority() == buf.total_priority()


def test_a_failed_save_leaves_the_previous_file(tmp_path, monkeypatch):
    buf, path = saved(tmp_path)
    before = path.read_bytes()

    def broken(fh, **arrays):
        fh.write(b"PK partial")
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["ok.pal"]


# ---------------------------------------------------------------------------------------------- overflow

def test_priorities_whose_sum_would_overflow_are_rejected_and_change_nothing():
    buf = PrioritizedReplayBuffer(64, LUNAR_FIELDS, alpha=1.0, seed=0)
    ids = buf.add_batch(**lunar_batch(64))
    total = buf.total_priority()
    with pytest.raises(ValueError, match="too large"):
        buf.update_priorities(ids[:4], [1e308] * 4)
    with pytest.raises(ValueError, match="too large"):
        buf.add_batch(**lunar_batch(2), priorities=[1e308, 1.0])
    assert buf.total_priority() == total and buf.max_priority == 1.0 and len(buf) == 64
    buf.update_priorities(ids[:4], [1e300] * 4)        # large but bounded: the total stays finite
    assert np.isfinite(buf.total_priority())
    assert len(set(buf.sample(64)["indices"].tolist())) > 1
    buf._check_invariants()
    tree = SumTree(8)
    with pytest.raises(ValueError, match="overflow"):
        tree.update([0, 1, 2, 3], [1e308] * 4)
    assert tree.total() == 0


# ---------------------------------------------------------------------------------------------- fork

@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_fork_while_other_threads_use_the_buffer():
    """Children forked while two threads insert, sample and update use their copy normally; none hangs."""
    buf = PrioritizedReplayBuffer(512, LUNAR_FIELDS, seed=0)
    buf.add_batch(**lunar_batch(512))
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            buf.add_batch(**lunar_batch(64))

    def sampler():
        while not stop.is_set():
            b = buf.sample(64)
            buf.update_priorities(b["indices"], np.ones(64))

    threads = [threading.Thread(target=f) for f in (writer, sampler)]
    for t in threads:
        t.start()
    children = []
    try:
        for _ in range(12):
            time.sleep(0.01)
            pid = os.fork()
            if pid == 0:            # the child: its own copy, repaired on first use
                code = 1
                try:
                    signal.alarm(20)
                    buf.add_batch(**lunar_batch(8))
                    buf.sample(32)
                    buf.save(io.BytesIO())
                    buf._check_invariants()
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join()
    deadline = time.monotonic() + 30
    codes = {}
    while len(codes) < len(children) and time.monotonic() < deadline:
        for pid in children:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    for pid in children:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert len(codes) == len(children), f"{len(children) - len(codes)} children hung"
    assert set(codes.values()) == {0}, codes
    buf._check_invariants()


# ---------------------------------------------------------------------------------------------- pickling

@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_buffers_pickle_and_deepcopy_by_value(cls, how):
    buf = cls(50, LUNAR_FIELDS, seed=7)
    ids = buf.add_batch(**lunar_batch(70))
    buf.update_priorities(ids[-10:], np.arange(10.0))
    other = pickle.loads(pickle.dumps(buf)) if how == "pickle" else copy.deepcopy(buf)
    assert type(other) is cls and len(other) == len(buf) and other.total_added == buf.total_added
    np.testing.assert_array_equal(other.get_priorities(ids[-50:]), buf.get_priorities(ids[-50:]))
    a, b = buf.sample(32), other.sample(32)        # the RNG state was copied too
    np.testing.assert_array_equal(a["indices"], b["indices"])
    other.add_batch(**lunar_batch(5))              # independent
    assert other.total_added == buf.total_added + 5
    other._check_invariants()


def test_sum_tree_pickles_and_deepcopies_by_value():
    tree = SumTree(37, fanout=3)
    tree.update(np.arange(37), np.linspace(0, 2, 37))
    for other in (pickle.loads(pickle.dumps(tree)), copy.deepcopy(tree)):
        assert (other.capacity, other.fanout, other.total()) == (37, 3, tree.total())
        np.testing.assert_array_equal(other.leaves(), tree.leaves())
        other.update([0], [5.0])
        assert tree.leaves()[0] == 0.0
        other.check()


# ---------------------------------------------------------------------------------------------- the tree's lock

def test_sum_tree_is_safe_under_concurrent_updates_and_finds():
    tree = SumTree(10_000, fanout=5)
    tree.update(np.arange(10_000), np.ones(10_000))
    errors = []

    def updater(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            tree.update(rng.integers(0, 10_000, 512), rng.random(512) + 0.01)

    def finder():
        for _ in range(300):
            try:
                total = tree.total()
                leaves = tree.find(np.linspace(0, total, 512, endpoint=False))
                assert (leaves >= 0).all() and (leaves < 10_000).all()
            except ValueError as e:        # a target past a total that shrank meanwhile
                if "within [0, total" not in str(e):
                    errors.append(e)

    threads = [threading.Thread(target=updater, args=(s,)) for s in range(2)] + [threading.Thread(target=finder)
                                                                                  for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tree.check()
