"""Files that are never left half-written: write beside the target, flush to disk, rename over it."""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` on a temporary file beside ``path`` (same directory, so the rename is atomic),
    renamed over ``path`` when the block ends without an error. On an error, or a kill before the rename,
    the previous file stays as it was and the temporary file is removed (or left under a dot-name).

    The temporary name is unique per call (process id, thread id and random bits, created exclusively), so
    that several threads or processes writing the same path never share one: the last rename wins, whole."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes whole files (mode 'w' or 'wb'), got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, mode.replace("w", "x"), **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through ``atomic_open``."""
    with atomic_open(path, "w") as f:
        f.write(text)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename or a new file in it) to disk; a no-op where directories cannot be
    opened (not POSIX)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
