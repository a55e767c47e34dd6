"""Reading a replay buffer file (``save``'s zip of stored .npy members) as data, never as code: the source is
checked to be a regular file or a seekable binary object before anything is read, the metadata and every
member's size are checked against each other and the file, and the arrays are read in bounded chunks into the
buffer's own memory. The Cython core (``pal_bench._replay``) calls these from ``load``."""

from __future__ import annotations

import io
import json
import math
import os
import stat
import sys
import zipfile

import numpy as np

from pal_bench.replay_layout import normalise_fields

FILE_FORMAT = "pal_bench.replay"
FILE_VERSION = 1
DBL_MAX = sys.float_info.max


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
