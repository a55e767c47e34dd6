"""Reading a file a user may have been handed (results folders, run directories and configs are exchanged): the
bytes of a small regular file, or a ``UsageError`` naming it, never a hang on a FIFO or a read of /dev/zero."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from pal_bench.argtypes import UsageError

MAX_BYTES = 16 << 20            # results tables are a few kB, configs under one; 16 MiB is far past any of them


def read_bytes(path: Path, max_bytes: int = MAX_BYTES, label: str | None = None, follow_links: bool = False) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (not a FIFO, device or directory, and unless
    ``follow_links``, not a link); ``label`` names it in the error (default: the path). Opened without blocking:
    a FIFO cannot stall the caller, a link to /dev/zero cannot fill its memory."""
    label = label or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    except OSError as e:
        why = "a symbolic link; it must be a regular file" if e.errno == errno.ELOOP else \
            f"cannot be opened ({e.strerror or e})"
        raise UsageError(f"{label}: {why}") from None
    except ValueError:                                  # a NUL in the path
        raise UsageError(f"{label!r}: not a file name (it holds a NUL byte)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a plain file")
            raise UsageError(f"{label}: {what}; it must be a regular file")
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise UsageError(f"{label}: cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise UsageError(f"{label}: larger than {max_bytes:,} bytes; not a file of this kind")
    return b"".join(chunks)
