"""The replay buffer's fields and record layout, checked in Python before the Cython core
(``pal_bench._replay``) allocates anything: what a field may be, where each field sits in a transition's
record, and what a shared segment may be called."""

from __future__ import annotations

import json
import math

import numpy as np

RESERVED_NAMES = ("indices", "weights", "priorities")
MAX_ROW_BYTES = 1 << 32                # one field of one transition
MAX_DIMS = 16                          # dimensions of a field's shape (the core's MAX_DIMS)
# a bool field of this name marks rows that are stored but never drawn and never re-prioritised: the context and
# tail frames of ``pal_bench.frame_replay`` (stored priority 0 in the prioritized buffer, redrawn in the uniform one)
HIDDEN_FIELD = "_hidden"


def normalise_fields(fields) -> dict:
    """``{name: (shape tuple, numpy dtype)}`` of a buffer's ``fields``; ValueError naming the field otherwise."""
    if not isinstance(fields, dict) or not fields:
        raise ValueError("fields must be a non-empty dict {name: (shape, dtype)}")
    out = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"field name {name!r} must be a Python identifier")
        if name in RESERVED_NAMES:
            raise ValueError(f"field name {name!r} is reserved")
        try:
            shape, dtype = spec
        except (TypeError, ValueError):
            raise ValueError(f"field {name!r}: spec must be (shape, dtype), got {spec!r}") from None
        try:
            shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as e:
            raise ValueError(f"field {name!r}: bad shape or dtype in {spec!r} ({e})") from None
        while dtype.subdtype is not None:       # a subarray dtype (float32, (3,)): its shape joins the field's
            dtype, sub = dtype.subdtype
            shape = shape + tuple(int(s) for s in sub)
        if dtype.names is not None:
            raise ValueError(f"field {name!r}: structured dtype {dtype} is not supported (add and add_batch could "
                             f"not fill it); store each of its members {list(dtype.names)} as a field of its own")
        if len(shape) > MAX_DIMS or any(s < 1 for s in shape):
            raise ValueError(f"field {name!r}: shape {shape} must have at most {MAX_DIMS} positive dimensions")
        if math.prod(shape) * max(dtype.itemsize, 1) > MAX_ROW_BYTES:
            raise ValueError(f"field {name!r}: shape {shape} of {dtype} takes more than {MAX_ROW_BYTES} bytes per "
                             f"transition")
        if dtype.hasobject or dtype.itemsize == 0:
            raise ValueError(f"field {name!r}: dtype {dtype} cannot be stored")
        out[name] = (shape, dtype)
    return out


def record_layout(specs: dict) -> tuple[dict, int]:
    """``({name: offset in the record}, record bytes)``: fields in order, each aligned to its dtype's
    alignment (at most 16 bytes), the record to 8 bytes (16 if a field needs it)."""
    offsets, pos, align_max = {}, 0, 8
    for name, (shape, dtype) in specs.items():
        align = max(1, min(dtype.alignment, 16))
        align_max = max(align_max, align)
        pos = (pos + align - 1) // align * align
        offsets[name] = pos
        pos += dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    return offsets, max(align_max, (pos + align_max - 1) // align_max * align_max)


def spec_json(specs: dict, offsets: dict) -> bytes:
    """The fields as a shared segment stores them (JSON: name, shape, dtype, offset)."""
    return json.dumps([[n, list(s), d.str, offsets[n]] for n, (s, d) in specs.items()]).encode()


def segment_path(name) -> str:
    """``/<name>`` for ``shm_open``; ValueError for a name that is not a plain file name."""
    if (not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", "..")
            or len(name) > 200):
        raise ValueError(f"shared buffer name must be a non-empty string of at most 200 characters without '/' "
                         f"or NUL, got {name!r}")
    return "/" + name
