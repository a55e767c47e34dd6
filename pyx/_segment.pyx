# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A buffer's block as a named POSIX shared-memory segment (``/dev/shm/<name>``): making one with every page
reserved, where each part of a block starts, reading a segment's header without mapping it
(``segment_info``), and removing segments whose creator is gone (``remove_if_dead``, for ``pal-bench shm
--clean``). The buffer itself (``pal_bench._replay``) maps, locks and repairs the segment."""

import fcntl
import os
import stat

import numpy as np

from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport EEXIST, ESRCH, errno
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset
from posix.fcntl cimport O_CREAT, O_EXCL, O_RDWR
from posix.mman cimport shm_open, shm_unlink
from posix.signal cimport kill
from posix.unistd cimport close as c_close
from posix.unistd cimport ftruncate, getpid

from _tree_core cimport TreeLayout, tree_layout


cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, long offset, long length)

SEGMENT_MAGIC = 0x3146554252534c50    # "PLSRBUF1"
SEGMENT_VERSION = 1
SHM_DIR = "/dev/shm"


cdef bint pid_dead(int64_t pid) noexcept nogil:
    return pid > 0 and kill(<int>pid, 0) != 0 and errno == ESRCH


cdef int shm_create(bytes path, int64_t nbytes) except -2:
    """A new segment of ``nbytes`` (zero-filled) with every page reserved, so that running out of space is an
    error here and not a SIGBUS at the first write to a page past the free space; -1 if the name exists.
    Returns the fd. On failure nothing is left behind."""
    cdef int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0o600)
    cdef int rc
    cdef Header h
    if fd < 0:
        if errno == EEXIST:
            return -1
        raise OSError(errno, f"shm_open({path.decode()!r}) failed: {os.strerror(errno)}")
    # the creator holds a shared flock on the segment for its lifetime: that (not a pid, which another pid
    # namespace or a reused pid makes ambiguous) is what tells a cleaner that the creator is alive
    fcntl.flock(fd, fcntl.LOCK_SH)
    if ftruncate(fd, nbytes) != 0:
        err = errno
        c_close(fd)
        shm_unlink(path)
        raise OSError(err, f"cannot size shared segment {path.decode()!r} to {nbytes} bytes: {os.strerror(err)}")
    # magic and creator before the (slow) reservation: a concurrent creator of the same name sees one in use
    memset(&h, 0, sizeof(Header))
    h.magic = SEGMENT_MAGIC
    h.creator_pid = getpid()
    os.pwrite(fd, (<char*>&h)[:sizeof(Header)], 0)
    with nogil:
        rc = posix_fallocate(fd, 0, nbytes)
    if rc != 0:
        c_close(fd)
        shm_unlink(path)
        try:
            st = os.statvfs(SHM_DIR)
            free = f"{st.f_bavail * st.f_frsize / 1e6:.1f} MB free in {SHM_DIR}"
        except OSError:
            free = f"the free space of {SHM_DIR} unknown"
        raise OSError(rc, f"cannot reserve {nbytes / 1e6:.1f} MB for shared buffer {path.decode()[1:]!r}: "
                          f"{os.strerror(rc)} ({free}; a smaller capacity, or a larger {SHM_DIR}, e.g. Docker's "
                          f"--shm-size, would fit)")
    return fd


cdef dict block_layout(int64_t capacity, int64_t spec_bytes, int64_t record_bytes, bint prioritized,
                        int64_t fanout):
    """Where each part of a block starts (bytes from its start) and its total size: the header, the field spec
    (JSON), the slot table, the records, then the tree's sums, minima and stamps, each on a 64-byte boundary.
    ValueError when the block would not be addressable."""
    cdef TreeLayout t
    n_sums = n_mins = n_stamps = 0
    if prioritized:
        n_sums, n_mins, n_stamps = tree_layout(&t, capacity, fanout)
    up = lambda n: (n + 63) // 64 * 64
    out = {"spec_offset": HEADER_BYTES}
    out["slots_offset"] = up(HEADER_BYTES + spec_bytes)
    out["records_offset"] = up(out["slots_offset"] + 8 * capacity)
    out["sums_offset"] = up(out["records_offset"] + record_bytes * capacity)
    out["mins_offset"] = up(out["sums_offset"] + 8 * n_sums)
    out["stamps_offset"] = up(out["mins_offset"] + 8 * n_mins)
    out["total_bytes"] = up(out["stamps_offset"] + 8 * n_stamps)
    if out["total_bytes"] > 1 << 60:
        raise ValueError(f"capacity {capacity} x {record_bytes} bytes per transition is too large to address")
    return out


cdef class ReadOnlyBlock:
    """The block's bytes as a buffer that refuses writable requests: the base of the arrays ``storage`` hands out,
    so that no one can set them writable (numpy looks through a read-only memoryview to the writable mapping)."""

    def __cinit__(self, mm):
        cdef unsigned char[::1] mv = mm
        self._mm = mm
        self._data = <char*>&mv[0]
        self._size = mv.shape[0]
        self._shape[0] = self._size

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("the buffer's storage views are read-only")
        view.buf = self._data
        view.obj = self
        view.len = self._size
        view.readonly = 1
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self._shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass


def header_offsets() -> dict:
    """Byte offset of each word of a segment's header (for the header fuzz test and ``segment_info``)."""
    cdef Header h
    cdef size_t base = <size_t>&h
    return {"magic": <size_t>&h.magic - base, "version": <size_t>&h.version - base, "ready": <size_t>&h.ready - base,
            "kind": <size_t>&h.kind - base, "capacity": <size_t>&h.capacity - base,
            "fanout": <size_t>&h.fanout - base, "alpha": <size_t>&h.alpha - base, "eps": <size_t>&h.eps - base,
            "record_bytes": <size_t>&h.record_bytes - base, "n_fields": <size_t>&h.n_fields - base,
            "spec_offset": <size_t>&h.spec_offset - base, "spec_bytes": <size_t>&h.spec_bytes - base,
            "slots_offset": <size_t>&h.slots_offset - base, "records_offset": <size_t>&h.records_offset - base,
            "sums_offset": <size_t>&h.sums_offset - base, "mins_offset": <size_t>&h.mins_offset - base,
            "stamps_offset": <size_t>&h.stamps_offset - base, "total_bytes": <size_t>&h.total_bytes - base,
            "creator_pid": <size_t>&h.creator_pid - base, "handles": <size_t>&h.handles - base,
            "next_id": <size_t>&h.next_id - base, "size": <size_t>&h.size - base,
            "inflight": <size_t>&h.inflight - base, "max_priority": <size_t>&h.max_priority - base,
            "stamp": <size_t>&h.stamp - base, "lock_count": <size_t>&h.lock_count - base,
            "lock_contended": <size_t>&h.lock_contended - base, "lock_wait_ns": <size_t>&h.lock_wait_ns - base,
            "lock_hold_ns": <size_t>&h.lock_hold_ns - base, "lock_hold_sampled": <size_t>&h.lock_hold_sampled - base,
            "lock_t0": <size_t>&h.lock_t0 - base, "repairs": <size_t>&h.repairs - base,
            "res": <size_t>&h.res[0] - base, "mutex": <size_t>&h.mutex - base}


CREATOR_PID_OFFSET = header_offsets()["creator_pid"]


def creator_alive(int fd, int64_t pid) -> bool:
    """Someone holds the creator's flock on the segment open as ``fd``, or ``pid`` is a live process here."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return 0 < pid < 2**31 and not pid_dead(pid)


def segment_info(str name):
    """What the header of ``/dev/shm/<name>`` says, read without mapping or locking it: ``{"name", "bytes",
    "kind", "capacity", "creator_pid", "creator_alive", "size"}``; None if it is not a PAL-Bench segment. The
    counts are a snapshot (read without the lock)."""
    path = os.path.join(SHM_DIR, name)
    cdef Header h
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < HEADER_BYTES:
            return None
        data = os.pread(fd, sizeof(Header), 0)
        if len(data) != sizeof(Header):
            return None
        memcpy(&h, <const char*>data, sizeof(Header))
        if h.magic != SEGMENT_MAGIC:
            return None
        alive = creator_alive(fd, h.creator_pid)
    finally:
        os.close(fd)
    return {"name": name, "bytes": st.st_size, "kind": "prioritized" if h.kind == 1 else "uniform",
            "capacity": h.capacity, "creator_pid": h.creator_pid, "creator_alive": alive, "size": h.size}


def remove_if_dead(str name, int64_t magic, int magic_offset, int pid_offset) -> str:
    """Unlink ``/dev/shm/<name>`` if it is a PAL-Bench segment (``magic`` at byte ``magic_offset`` of its header)
    whose creator is gone: nobody holds the creator's flock on it and its creator pid is not a live process here
    (either says alive: the flock covers creators in another pid namespace, the pid covers segments made before
    the flock). Returns ``"removed"`` (or ``"gone"`` if it vanished meanwhile), ``"alive"`` or ``"foreign"`` (not
    a regular file, or no magic: left alone). The unlink happens under an exclusive flock, after checking that
    the name still refers to the file examined."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "foreign"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "foreign"
        head = os.pread(fd, max(magic_offset, pid_offset) + 8, 0)
        if len(head) < max(magic_offset, pid_offset) + 8:
            return "foreign"
        words = np.frombuffer(head, dtype=np.int64)
        if int(words[magic_offset // 8]) != <int64_t>magic:
            return "foreign"
        pid = int(words[pid_offset // 8])
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "alive"
        if 0 < pid < 2**31 and not pid_dead(pid):
            return "alive"
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return "gone"
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return "alive"                  # replaced meanwhile by a new creator
        os.unlink(path)
        return "removed"
    finally:
        os.close(fd)
