"""Files that are never left half-written: write beside the target, flush to disk, rename over it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` on a temporary file beside ``path`` (same directory, so the rename is atomic),
    renamed over ``path`` when the block ends without an error. On an error, or a kill before the rename,
    the previous file stays as it was and the temporary file is removed (or left under a dot-name)."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes whole files (mode 'w' or 'wb'), got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **kwargs) as f:
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
