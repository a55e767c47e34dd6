"""A replay buffer's file (``save``'s zip of stored .npy members): writing one (``save_buffer``, streamed field by
field with the buffer's lock held), and reading one as data, never as code (``load_buffer``): the source is
checked to be a regular file or a seekable binary object before anything is read, the metadata and every
member's size are checked against each other and the file, and the arrays are read in bounded chunks into the
buffer's own memory. ``check_invariants`` is the tests' check of a buffer's tree and slot table. The Cython core
(``pal_bench._replay``) calls these from ``save``, ``load`` and ``_check_invariants``, and gives them its state
through ``_quiescent()``, ``_fields_to_fill()`` and ``_set_state()``."""

from __future__ import annotations

import io
import json
import math
import os
import stat
import sys
import zipfile

import numpy as np

from pal_bench.atomic import atomic_open
from pal_bench.replay_layout import HIDDEN_FIELD, normalise_fields

FILE_FORMAT = "pal_bench.replay"
FILE_VERSION = 1
DBL_MAX = sys.float_info.max
SLOT_EMPTY = -1          # the slot table's word for an empty slot (pyx/_common.pxd)


def save_buffer(buf, target) -> None:
    """Write ``buf`` to ``target`` (a path: atomically, beside it and renamed over it; or a writable binary file
    object) with its lock held at a quiescent moment, so the file is one consistent state."""
    if isinstance(target, (str, os.PathLike)):
        with atomic_open(target, "wb") as fh:
            _write(buf, fh)
    else:
        _write(buf, target)


def _write(buf, fh) -> None:
    with buf._quiescent() as state:
        meta = json.dumps({"format": FILE_FORMAT, "version": FILE_VERSION, **state["meta"]}).encode()
        arrays = {"__meta__": np.frombuffer(meta, dtype=np.uint8), "slot_ids": state["slot_ids"],
                  "rng_state": state["rng_state"]}
        if state["priorities"] is not None:
            arrays["priorities"] = state["priorities"]
        for name, arr in state["fields"].items():
            arrays[f"field.{name}"] = arr
        np.savez(fh, **arrays)


def load_buffer(source, want_prioritized: bool, kinds: dict, shared: bool, name):
    """A buffer rebuilt from the file ``source`` (a path or a readable binary file object): ``kinds`` maps the
    file's kind (``"prioritized"``/``"uniform"``) to the class that makes it. ValueError naming the file for any
    file that is not one ``save`` wrote; the buffer made for it is closed again."""
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<file>"
    fh = open_source(source, label)
    try:
        with zipfile.ZipFile(fh) as zf:
            meta = validated_meta(zf, want_prioritized, file_size(fh, zf))
            fields = {n: (tuple(s), np.dtype(d)) for n, s, d in meta["fields"]}
            if meta["kind"] == "prioritized":
                buf = kinds["prioritized"](meta["capacity"], fields, alpha=meta["alpha"], fanout=meta["fanout"],
                                           eps=meta["eps"], seed=0, shared=shared, name=name)
            else:
                buf = kinds["uniform"](meta["capacity"], fields, seed=0, shared=shared, name=name)
            try:
                _restore(buf, zf, meta)
            except BaseException:
                buf.close()
                raise
            return buf
    except (zipfile.BadZipFile, EOFError, KeyError, TypeError, OverflowError, json.JSONDecodeError,
            UnicodeDecodeError, NotImplementedError, RuntimeError) as e:
        raise ValueError(f"{label}: not a PAL-Bench replay buffer file, or truncated ({e!r})") from e
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from e
    finally:
        if fh is not source:
            fh.close()


def _restore(buf, zf, meta: dict) -> None:
    """Read the validated file's members into ``buf`` (just made with the file's capacity and fields), checking
    the slot table, RNG state and priorities against each other before ``_set_state`` puts them in place."""
    cap, next_id = buf.capacity, int(meta["next_id"])
    slot_ids = read_member(zf, "slot_ids", np.empty(cap, dtype=np.int64))
    # the only consistent slot table of a quiescent buffer: the last min(next_id, cap) ids, each in its slot
    expected = np.full(cap, SLOT_EMPTY, dtype=np.int64)
    live_ids = np.arange(max(0, next_id - cap), next_id, dtype=np.int64)
    expected[live_ids % cap] = live_ids
    if not np.array_equal(slot_ids, expected):
        raise ValueError("inconsistent slot table (it must hold exactly the last capacity ids)")
    rng_state = read_member(zf, "rng_state", np.empty(4, dtype=np.uint64))
    if not rng_state.any():
        raise ValueError("invalid RNG state (all zero)")
    leaves = None
    live = slot_ids >= 0
    if meta["kind"] == "prioritized":
        leaves = read_member(zf, "priorities", np.empty(cap, dtype=np.float64))
        if not (np.isfinite(leaves).all() and (leaves >= 0).all() and (leaves[~live] == 0).all()):
            raise ValueError("invalid priorities")
        if (leaves > DBL_MAX / (2.0 * cap)).any():
            raise ValueError("priorities too large: their sum could overflow")
        if HIDDEN_FIELD not in buf.fields:
            _check_zero_priorities(leaves, live, np.zeros(cap, dtype=np.bool_), meta["eps"])
    targets = buf._fields_to_fill()
    for name, arr in targets.items():
        read_member(zf, f"field.{name}", arr)
    if leaves is not None and HIDDEN_FIELD in buf.fields:     # the rows' own flags say which may have priority 0
        _check_zero_priorities(leaves, live, _hidden_rows(targets, live), meta["eps"])
    buf._set_state(slot_ids, leaves, next_id, float(meta["max_priority"]), rng_state)


def _check_zero_priorities(leaves: np.ndarray, live: np.ndarray, hidden: np.ndarray, eps: float) -> None:
    """Live rows have a priority (when eps > 0), hidden rows none."""
    if eps > 0 and (leaves[live & ~hidden] <= 0).any():
        raise ValueError("a stored transition has priority 0 although eps > 0")
    if (leaves[hidden] != 0).any():
        raise ValueError(f"a hidden row ({HIDDEN_FIELD} set) has a priority: it could be drawn")


def _hidden_rows(fields: dict, live: np.ndarray) -> np.ndarray:
    """bool[capacity]: live rows whose ``_hidden`` field is set (none when the buffer has no such field)."""
    flags = fields.get(HIDDEN_FIELD)
    if flags is None:
        return np.zeros(live.shape, dtype=np.bool_)
    return live & (np.asarray(flags).view(np.uint8) != 0)


def check_invariants(buf) -> None:
    """The tests' check of a buffer at a quiescent moment: the slot table holds exactly live ids in their slots,
    the size counts them, and (prioritized) every tree level agrees with its children, empty slots have no
    priority, live ones have some (eps > 0) and the total matches an exact sum. AssertionError otherwise."""
    with buf._quiescent() as state:
        ids, meta = state["slot_ids"].copy(), state["meta"]
        live = ids >= 0
        assert int(live.sum()) == state["size"], f"size {state['size']} != live slots {int(live.sum())}"
        assert (ids[live] % meta["capacity"] == np.nonzero(live)[0]).all(), "slot table holds foreign ids"
        assert (ids[live] < meta["next_id"]).all(), "slot table holds future ids"
        assert (ids >= SLOT_EMPTY).all(), "slot table holds in-flight slots while quiescent"
        leaves = state["priorities"]
        if leaves is not None:
            assert state["tree_bad_level"] == -1, f"tree level {state['tree_bad_level']} disagrees with its children"
            hidden = _hidden_rows(state["fields"], live)
            assert (leaves[~live] == 0).all(), "an empty slot has a priority"
            assert (leaves[live & ~hidden] > 0).all() or meta["eps"] == 0, "a live slot has zero priority"
            assert (leaves[hidden] == 0).all(), "a hidden row has a priority"
            exact = math.fsum(leaves)
            assert math.isfinite(exact), "the total overflowed"
            assert abs(state["total"] - exact) <= 1e-9 * max(exact, 1e-300), "total drifted"


def open_source(source, label: str):
    """``load``'s source as a binary file object, checked to be a regular file (a path, opened here once, without
    blocking: a FIFO cannot stall it), or a seekable binary file object, before anything is read: a device, a
    FIFO or a directory is a ValueError (``/dev/zero`` would be read until memory runs out)."""
    if isinstance(source, (str, os.PathLike)):
        if "\x00" in os.fspath(source):
            raise ValueError(f"{label!r}: a path with a NUL byte")
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # FileNotFoundError etc. as they are
        except IsADirectoryError:
            raise ValueError(f"{label}: not a regular file (a PAL-Bench buffer file is)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{label}: not a regular file (a PAL-Bench buffer file is)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    if isinstance(source, io.TextIOBase) or not hasattr(source, "read"):
        raise ValueError(f"{label}: expected a path or a binary file object opened for reading, got "
                         f"{type(source).__name__}")
    try:
        seekable = source.seekable()
    except (AttributeError, OSError, ValueError):
        seekable = False
    if not seekable:
        raise ValueError(f"{label}: the file object is not seekable (load needs to seek: pass a path, a regular "
                         f"file or io.BytesIO)")
    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return source                           # in memory (io.BytesIO): its size is what it holds
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError(f"{label}: not a regular file (a PAL-Bench buffer file is)")
    return source


def file_size(source, zf) -> int:
    """The file's size in bytes (for a source without one, what its members hold plus 1 MiB)."""
    try:
        if isinstance(source, (str, os.PathLike)):
            return os.path.getsize(source)
        return zf.fp.seek(0, 2)
    except (OSError, AttributeError, ValueError):
        return sum(i.compress_size for i in zf.infolist()) + (1 << 20)


META_KEYS = {"format", "version", "kind", "capacity", "fields", "alpha", "eps", "fanout", "next_id", "max_priority"}


def validated_meta(zf, want_prioritized: bool, file_size: int) -> dict:
    """The file's metadata, every field checked, and every member checked against it and against the
    file (stored, not compressed; exactly the bytes its shape needs; all of them within the file)."""
    info = {i.filename: i for i in zf.infolist()}
    m = info.get("__meta__.npy")
    if m is None or m.file_size > 1 << 20:
        raise ValueError("not a PAL-Bench replay buffer file (no metadata member, or an oversized one)")
    meta = json.loads(read_member(zf, "__meta__", None, max_bytes=1 << 20).tobytes())
    if not isinstance(meta, dict) or meta.get("format") != FILE_FORMAT:
        raise ValueError("not a PAL-Bench replay buffer file")
    if meta.get("version") != FILE_VERSION:
        raise ValueError(f"unsupported file version {meta.get('version')!r}")
    if set(meta) != META_KEYS:
        raise ValueError(f"unexpected metadata keys {sorted(set(meta) ^ META_KEYS)}")
    kind = meta["kind"]
    if kind not in ("prioritized", "uniform"):
        raise ValueError(f"unknown buffer kind {kind!r}")
    if (kind == "prioritized") != want_prioritized:
        holds, use = (("PrioritizedReplayBuffer", "PrioritizedReplayBuffer") if kind == "prioritized"
                      else ("ReplayBuffer", "ReplayBuffer"))
        raise ValueError(f"file holds a {holds}; use {use}.load")

    def integer(key, lo, hi):
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"invalid {key} {v!r} (an int in [{lo}, {hi}])")
        return v

    def real(key, lo, hi):
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and lo <= v <= hi):
            raise ValueError(f"invalid {key} {v!r} (a finite number in [{lo}, {hi}])")
        return float(v)

    cap = integer("capacity", 1, 2**40)
    integer("next_id", 0, 2**62)
    real("max_priority", 0.0, DBL_MAX)
    if kind == "prioritized":
        real("alpha", 0.0, 1.0)
        real("eps", 0.0, DBL_MAX)
        integer("fanout", 2, 4096)
    fields = meta["fields"]
    if not isinstance(fields, list) or not fields or not all(isinstance(f, list) and len(f) == 3 for f in fields):
        raise ValueError("invalid field list")
    if len({f[0] for f in fields}) != len(fields):
        raise ValueError("duplicate field names")
    specs = normalise_fields({f[0]: (f[1], f[2]) for f in fields})
    expected = {"__meta__.npy", "slot_ids.npy", "rng_state.npy"} | {f"field.{n}.npy" for n in specs}
    if kind == "prioritized":
        expected.add("priorities.npy")
    if set(info) != expected:
        raise ValueError(f"unexpected members: missing {sorted(expected - set(info))}, "
                         f"extra {sorted(set(info) - expected)}")
    sizes = {"slot_ids.npy": 8 * cap, "rng_state.npy": 32, "priorities.npy": 8 * cap}
    for n, (shape, dtype) in specs.items():
        sizes[f"field.{n}.npy"] = cap * dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    declared = 0
    for member, nbytes in sizes.items():
        if member not in info:
            continue
        i = info[member]
        if i.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"member {member!r} is compressed (save writes stored members only)")
        if not nbytes <= i.file_size <= nbytes + 65536 or i.compress_size != i.file_size:
            raise ValueError(f"member {member!r} holds {i.file_size} bytes; capacity {cap} needs {nbytes} "
                             f"plus its header")
        declared += i.file_size
    if declared > file_size:
        raise ValueError(f"the members declare {declared} bytes but the file has {file_size}")
    return meta


def read_member(zf, name: str, target, max_bytes=None):
    """Read array ``name`` of an npz zip into ``target`` (same shape and dtype; strided targets are
    filled in chunks), or into a new array when ``target`` is None (at most ``max_bytes``)."""
    with zf.open(name + ".npy") as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"member {name!r}: unsupported .npy version {version}")
        if fortran or dtype.hasobject:
            raise ValueError(f"member {name!r} has an unexpected layout")
        if target is None:
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if max_bytes is not None and nbytes > max_bytes:
                raise ValueError(f"member {name!r} is too large")
            target = np.empty(shape, dtype=dtype)
        elif tuple(shape) != target.shape or dtype != target.dtype:
            raise ValueError(f"member {name!r}: expected {target.shape} {target.dtype}, got {shape} {dtype}")
        if target.flags.c_contiguous:
            read_into(fh, memoryview(target.reshape(-1).view(np.uint8)), name)
        else:
            rows = max(1, (1 << 24) // max(1, target[:1].nbytes))
            chunk = np.empty((rows,) + target.shape[1:], dtype=target.dtype)
            for r0 in range(0, target.shape[0], rows):
                part = chunk[:min(rows, target.shape[0] - r0)]
                read_into(fh, memoryview(part.reshape(-1).view(np.uint8)), name)
                target[r0:r0 + part.shape[0]] = part
    return target


def read_into(fh, view, name: str) -> None:
    """Fill ``view`` from ``fh`` in 64 MiB reads; ValueError if the member ends first."""
    pos, step = 0, 1 << 26
    while pos < len(view):
        got = fh.readinto(view[pos:pos + step])
        if not got:
            raise ValueError(f"member {name!r} is truncated")
        pos += got
