"""Policy weights published through shared memory under a seqlock: one writer, any number of readers, no pickling.

Layout of the segment (``/dev/shm/<name>``): a 64-byte header (int64 words: the sequence counter, a magic
number, the creator's pid, the pid of the process that last began a publish), then every tensor of the state
dict, each 64-byte aligned, in the state dict's order. The writer makes the counter odd, copies the tensors
in, and makes it even again; a reader copies the tensors out between two reads of the counter and keeps the
copy only if both reads are the same even value, so it never loads a half-written set.
Version = counter / 2 (0: nothing published yet).

The ordering argument relies on x86-64's total store order (stores become visible in program order,
loads are not reordered with other loads), which is what every machine this project runs on has;
each counter read and write is one aligned 8-byte access.

The creator owns the segment: ``close()`` (or garbage collection, or interpreter exit) of the creator
unlinks it; handles made by ``attach`` in other processes, and a forked child's copy of the creator's, only
unmap it. Its pages are reserved at creation, so too little /dev/shm is an ``OSError`` there, never a
SIGBUS at a later write.

A reader gives up on a counter that stays odd (a writer killed mid-copy) after ``READ_TIMEOUT_S`` of its own
CPU time spent retrying, so time it was stopped itself (SIGSTOP, a debugger, a swapped-out machine) does not
count; while the writer is stopped mid-copy the reader waits for it.
"""

from __future__ import annotations

import atexit
import fcntl
import math
import mmap
import os
import secrets
import stat
import time
import weakref
from pathlib import Path

import numpy as np
import torch

HEADER = 64
MAGIC = 0x31544757534C4150            # "PALSWGT1": marks a weights block (``segment_info``, ``attach``)
SHM_DIR = Path("/dev/shm")
READ_TIMEOUT_S = 10.0                 # ``read`` default: CPU seconds of retrying before a stuck writer is an error
STOPPED_POLL_S = 0.01                 # ``read``'s poll period while the writer is stopped mid-copy (s)
_TORCH_TO_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                torch.int64: np.int64, torch.int32: np.int32, torch.uint8: np.uint8, torch.bool: np.bool_}


def _layout(spec: list[tuple[str, tuple[int, ...], str]]) -> tuple[list[int], int]:
    offsets, pos = [], HEADER
    for _, shape, dtype in spec:
        offsets.append(pos)
        pos += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        pos = (pos + 63) // 64 * 64
    return offsets, max(pos, HEADER)


def _path(name: str) -> Path:
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", ".."):
        raise ValueError(f"shared weights name must be non-empty without '/' or NUL, got {name!r}")
    return SHM_DIR / name


MAGIC_OFFSET, PID_OFFSET, WRITER_OFFSET = 8, 16, 24      # header bytes of the magic, the creator's and the writer's pid


def _process_stopped(pid: int) -> bool:
    """Whether process ``pid`` (of this pid namespace) is stopped: SIGSTOP, a job-control stop, a debugger
    (state ``T`` or ``t`` in ``/proc/<pid>/stat``). False if it is unknown, running, or gone."""
    if not 0 < pid < 2**31:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read(4096)
    except OSError:
        return False
    state = stat_line[stat_line.rfind(b")") + 2:][:1]         # "pid (comm) S ...": comm may hold spaces or ')'
    return state in (b"T", b"t")


def segment_info(name: str) -> dict | None:
    """``{"name", "bytes", "creator_pid", "creator_alive"}`` of the weights block ``/dev/shm/<name>``, read without
    mapping it; None if it is not one. Alive: the creator's flock is held, or its pid is a live process here."""
    from pal_bench._segment import creator_alive as _creator_alive

    try:
        if not stat.S_ISREG(os.lstat(_path(name)).st_mode):
            return None
        fd = os.open(_path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 24, 0) if st.st_size >= HEADER and stat.S_ISREG(st.st_mode) else b""
        if len(head) != 24:
            return None
        _, magic, pid = (int(w) for w in np.frombuffer(head, dtype=np.int64))
        if magic != MAGIC:
            return None
        alive = _creator_alive(fd, pid)
    finally:
        os.close(fd)
    return {"name": name, "bytes": st.st_size, "creator_pid": pid, "creator_alive": alive}


def spec_of(state_dict: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """``[(name, shape, numpy dtype str)]`` of a state dict: what ``SharedWeights.create`` and ``attach`` need."""
    spec = []
    for name, t in state_dict.items():
        if t.dtype not in _TORCH_TO_NP:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} cannot be shared "
                            f"(supported: {sorted(map(str, _TORCH_TO_NP))})")
        spec.append((name, tuple(t.shape), np.dtype(_TORCH_TO_NP[t.dtype]).str))
    return spec


class SharedWeights:
    """A seqlocked block holding one state dict. ``create(spec)`` in the publishing process, ``attach(name, spec)``
    in readers (``spec`` from ``spec_of``; it travels once, at start-up, with the name)."""

    def __init__(self, name: str, mm: mmap.mmap, spec, creator: bool, lock_fd: int = -1):
        self._name, self._mm, self.spec, self.creator = name, mm, [(n, tuple(s), d) for n, s, d in spec], creator
        offsets, size = _layout(self.spec)
        if len(mm) < size:
            mm.close()
            raise ValueError(f"shared weights {name!r}: segment has {len(mm)} bytes, the spec needs {size}")
        self._seq = np.ndarray((1,), dtype=np.int64, buffer=mm, offset=0)
        words = np.ndarray((3,), dtype=np.int64, buffer=mm, offset=MAGIC_OFFSET)
        if creator:
            words[:2] = MAGIC, os.getpid()
        elif int(words[0]) != MAGIC:
            del words, self._seq
            mm.close()
            raise ValueError(f"/dev/shm/{name} is not a PAL-Bench weights block")
        self._writer = words[2:]
        self._views = {n: np.ndarray(s, dtype=np.dtype(d), buffer=mm, offset=o)
                       for (n, s, d), o in zip(self.spec, offsets)}
        self._closed = False
        self._finalizer = weakref.finalize(self, SharedWeights._release, mm, _path(name) if creator else None,
                                           os.getpid(), lock_fd)
        if creator:
            atexit.register(self._finalizer)

    @classmethod
    def create(cls, spec, name: str | None = None) -> SharedWeights:
        """A new block (``FileExistsError`` if ``name`` is taken)."""
        _, size = _layout(spec)
        name = name or f"pal_w_{os.getpid()}_{secrets.token_hex(4)}"
        fd = os.open(_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)     # held while the creator lives: `pal-bench shm` tells it is alive
            os.ftruncate(fd, size)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                st = os.statvfs(SHM_DIR)
                raise OSError(e.errno, f"cannot reserve {size / 1e6:.1f} MB for shared weights {name!r}: "
                                       f"{e.strerror} ({st.f_bavail * st.f_frsize / 1e6:.1f} MB free in {SHM_DIR})"
                              ) from None
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(_path(name))
            raise
        return cls(name, mm, spec, creator=True, lock_fd=fd)

    @classmethod
    def attach(cls, name: str, spec) -> SharedWeights:
        """A handle on an existing block (``FileNotFoundError`` if there is none)."""
        fd = os.open(_path(name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return cls(name, mm, spec, creator=False)

    @staticmethod
    def _release(mm: mmap.mmap, unlink: Path | None, creator_pid: int, lock_fd: int) -> None:
        try:
            mm.close()
        except BufferError:          # a view still exported: the mapping goes at process exit
            pass
        if unlink is not None and os.getpid() == creator_pid:       # not a forked child's copy
            try:
                unlink.unlink()
            except FileNotFoundError:
                pass
        if lock_fd >= 0:
            os.close(lock_fd)

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int:
        """Versions published so far (the latest complete one); an odd counter means one is being written."""
        return int(self._seq[0]) // 2

    def publish(self, state_dict: dict[str, torch.Tensor], partial: bool = False) -> int:
        """Copy ``state_dict`` in (one writer only); returns the new version. With ``partial``, ``state_dict`` may
        name a subset of the block's tensors: the others keep the bytes of the previous version (for tensors the
        writer knows did not change)."""
        self._check()
        unknown = [k for k in state_dict if k not in self._views]
        if unknown or (not partial and len(state_dict) != len(self._views)):
            raise KeyError(f"state dict keys {sorted(state_dict)} differ from the shared block's {sorted(self._views)}")
        for k, t in state_dict.items():               # validate everything before the counter goes odd
            if tuple(t.shape) != self._views[k].shape:
                raise ValueError(f"tensor {k!r}: shape {tuple(t.shape)}, the shared block holds {self._views[k].shape}")
            if t.dtype not in _TORCH_TO_NP or np.dtype(_TORCH_TO_NP[t.dtype]) != self._views[k].dtype:
                raise TypeError(f"tensor {k!r}: dtype {t.dtype}, the shared block holds {self._views[k].dtype}")
        seq = int(self._seq[0])
        self._writer[0] = os.getpid()               # who a reader waits for while the counter is odd
        self._seq[0] = seq + 1                       # odd: being written
        for k, t in state_dict.items():
            self._views[k][...] = t.detach().cpu().numpy()
        self._seq[0] = seq + 2                       # even: complete
        return (seq + 2) // 2

    def read(self, out: dict[str, torch.Tensor] | None = None, min_version: int = 1,
             timeout_s: float | None = None) -> tuple[int, dict[str, torch.Tensor]] | None:
        """A consistent copy of the latest version ``>= min_version``: ``(version, tensors)``, copied into
        ``out``'s tensors if given (same shapes; its names may be a subset of the block's, and only those are
        copied), else into new tensors. None if no such version yet.
        Retries while the writer is mid-copy, for up to ``timeout_s`` seconds (default ``READ_TIMEOUT_S``) of
        this thread's CPU time (``time.thread_time``), then RuntimeError: time this process was stopped or
        waiting for a CPU does not count, and while the writer is stopped (its pid in ``/proc`` in state T)
        the reader waits for it and starts its count again when it resumes. A writer that publishes back to
        back with no pause can starve readers; the parameter server publishes once per update (milliseconds
        apart), far slower than a copy."""
        self._check()
        budget = READ_TIMEOUT_S if timeout_s is None else timeout_s
        if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {budget!r}")
        start = time.thread_time()
        while True:
            s1 = int(self._seq[0])
            if s1 // 2 < min_version:
                return None
            if not s1 & 1:
                if out is None:
                    copy = {k: torch.from_numpy(v.copy()) for k, v in self._views.items()}
                else:
                    for k, dst in out.items():
                        dst.numpy()[...] = self._views[k]
                    copy = out
                if int(self._seq[0]) == s1:
                    return s1 // 2, copy
            if time.thread_time() - start >= budget:
                writer = int(self._writer[0])
                if not _process_stopped(writer):
                    raise RuntimeError(f"shared weights {self.name!r}: no consistent read in {budget} s of "
                                       f"retrying (writer pid {writer} died or hung mid-copy, or publishes "
                                       f"faster than a copy)")
                while _process_stopped(writer):
                    time.sleep(STOPPED_POLL_S)
                start = time.thread_time()
            os.sched_yield()

    def load_into(self, module: torch.nn.Module, current_version: int = 0) -> int:
        """Load the latest version into ``module`` if it is newer than ``current_version``; returns the version
        the module now holds."""
        with torch.no_grad():
            got = self.read(min_version=current_version + 1)
            if got is None:
                return current_version
            version, tensors = got
            module.load_state_dict(tensors)
            return version

    def _check(self) -> None:
        if self._closed:
            raise ValueError("shared weights handle is closed")

    def close(self) -> None:
        """Detach (creator: also unlink the segment). Idempotent."""
        if not self._closed:
            self._closed = True
            self._views.clear()
            self._seq = self._writer = None
            self._finalizer()

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
