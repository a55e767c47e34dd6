# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A buffer's block as a named POSIX shared-memory segment (``/dev/shm/<name>``): making one with every page
reserved, where each part of a block starts, reading a segment's header without mapping it
(``segment_info``), removing segments whose creator is gone (``remove_if_dead``, for ``pal-bench shm
--clean``), and ``SegmentHandle``: one process's mapping of a block, closing it while calls are in flight,
noticing a fork, and the block's robust lock (repair of what a dead holder left is the buffer's, ``_repair``)."""

import atexit
import fcntl
import mmap
import os
import stat
import weakref

import numpy as np

from pal_bench.replay_layout import segment_path

from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport EEXIST, ESRCH, errno
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset
from posix.fcntl cimport O_CREAT, O_EXCL, O_RDWR
from posix.mman cimport shm_open, shm_unlink
from posix.signal cimport kill
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec
from posix.unistd cimport close as c_close
from posix.unistd cimport ftruncate, getpid

from _lock cimport (
    EBUSY,
    EDEADLK,
    EOWNERDEAD,
    ETIMEDOUT,
    mutex_init,
    pthread_atfork,
    pthread_mutex_consistent,
    pthread_mutex_lock,
    pthread_mutex_timedlock,
    pthread_mutex_trylock,
    pthread_mutex_unlock,
)
from _tree_core cimport TreeLayout, tree_layout


cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, long offset, long length)

SEGMENT_MAGIC = 0x3146554252534c50    # "PLSRBUF1"
SEGMENT_VERSION = 1
SHM_DIR = "/dev/shm"
KIND_UNIFORM, KIND_PRIORITIZED, KIND_CONTROL = 0, 1, 2     # the header's ``kind``: two buffers, a control block
MAX_CONTROL_WORDS = 1 << 20


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
    kind = {KIND_PRIORITIZED: "prioritized", KIND_UNIFORM: "uniform", KIND_CONTROL: "control"}.get(h.kind, "unknown")
    return {"name": name, "bytes": st.st_size, "kind": kind,
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


ATTACH_LOCK_TIMEOUT_S = 10.0           # attach waits at most this long for the segment's lock (s)

# fork generation: incremented in every child right after fork (pthread_atfork), so a handle notices
cdef int64_t _fork_generation = 0

cdef void _after_fork_child() noexcept nogil:
    global _fork_generation
    _fork_generation += 1

pthread_atfork(NULL, NULL, _after_fork_child)


cdef int64_t fork_generation() noexcept nogil:
    """How many forks led to this process (since the module was loaded): a handle whose recorded generation
    differs runs in a forked child."""
    return _fork_generation


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


_created = weakref.WeakSet()      # creators of live shared segments, closed (and unlinked) at exit


@atexit.register
def _close_created_segments():
    for handle in list(_created):
        try:
            handle.close()
        except Exception:
            pass


cdef class SegmentHandle:
    """One mapping of a block with its life and its lock. Subclasses bind the block's contents
    (``_repair``: undo what a dead holder left; ``_forked``: what a forked child's handle resets)."""

    def __cinit__(self, *args, **kwargs):
        self._h = NULL
        self._name = ""
        self._closed = True
        self._lock_fd = -1

    def __dealloc__(self):
        if self._owns_segment() and not self._closed:
            shm_unlink(segment_path(self._name).encode())
        if self._lock_fd >= 0:
            c_close(self._lock_fd)

    # ------------------------------------------------------------------ mapping

    cdef object _create_segment(self, str name, int64_t total):
        """Create the named segment, replacing a stale one whose creator is gone; map it."""
        path = segment_path(name).encode()
        cdef int fd = shm_create(path, total)
        if fd == -1:
            found = remove_if_dead(name, SEGMENT_MAGIC, 0, CREATOR_PID_OFFSET)
            if found == "alive":
                raise FileExistsError(f"a shared buffer named {name!r} exists and its creator is alive; "
                                      f"attach to it with attach({name!r}) or choose another name")
            if found == "foreign":
                raise FileExistsError(f"{SHM_DIR}/{name} exists and is not a PAL-Bench buffer; choose another name")
            fd = shm_create(path, total)
            if fd == -1:
                raise FileExistsError(f"a shared buffer named {name!r} was created meanwhile")
        try:
            mm = mmap.mmap(fd, total)
        except BaseException:
            c_close(fd)
            shm_unlink(path)
            raise
        self._lock_fd = fd          # kept open: its flock says the creator is alive
        self._creator = True
        self._creator_pid = getpid()
        _created.add(self)
        return mm

    cdef _map(self, mm):
        self._mm = mm
        self._mv = mm
        self._base = <char*>&self._mv[0]
        self._h = <Header*>self._base
        self._closed = False
        self._pid = getpid()
        self._gen = _fork_generation

    cdef int64_t _open_named(self, str name, str what) except -1:
        """(attach) Map the existing named segment ``name`` (a ``what``: "buffer", "control block") into this handle;
        returns its size in bytes. FileNotFoundError when there is none, ValueError when it cannot hold a header;
        the caller checks every header word it uses."""
        path = segment_path(name).encode()
        cdef int fd = shm_open(path, O_RDWR, 0)
        if fd < 0:
            raise FileNotFoundError(f"no shared {what} named {name!r} ({SHM_DIR}/{name})")
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise ValueError(f"{SHM_DIR}/{name} is not a PAL-Bench {what} (too small)")
            mm = mmap.mmap(fd, size)
        finally:
            c_close(fd)
        self._map(mm)
        self._name = name
        return size

    cdef int _join_lock(self) except -1:
        """(attach) Take the lock, waiting at most ``ATTACH_LOCK_TIMEOUT_S`` (TimeoutError), repairing first if its
        holder died (``_repair`` only writes slots inside the table and drops impossible reservations)."""
        cdef Header* h = self._h
        cdef timespec ts
        cdef int rc
        cdef double timeout = ATTACH_LOCK_TIMEOUT_S
        clock_gettime(CLOCK_REALTIME, &ts)
        ts.tv_sec += <long>timeout
        ts.tv_nsec += <long>((timeout - <long>timeout) * 1e9)
        if ts.tv_nsec >= 1000000000:
            ts.tv_sec += 1
            ts.tv_nsec -= 1000000000
        with nogil:
            rc = pthread_mutex_timedlock(&h.mutex, &ts)
        if rc == ETIMEDOUT:
            raise TimeoutError(f"shared buffer {self._name!r}: its lock has been held for {timeout:g} s (a hung or "
                               f"stopped process? `pal-bench shm` lists the segments and their creators)")
        if rc != 0 and rc != EOWNERDEAD:
            raise ValueError(f"shared buffer {self._name!r} is corrupted: its lock is unusable ({os.strerror(rc)})")
        if rc == EOWNERDEAD:
            self._repair(True)
            pthread_mutex_consistent(&h.mutex)
        return 0

    @staticmethod
    def cleanup(name) -> bool:
        """Remove the shared segment ``name`` (after its creator was killed); True if one was removed.
        Handles still mapping it keep working until they close."""
        return shm_unlink(segment_path(name).encode()) == 0

    cdef bint _owns_segment(self) noexcept:
        """This handle created its shared segment in this very process (a forked child's copy does not own it)."""
        return self._creator and bool(self._name) and self._creator_pid == getpid()

    def close(self) -> None:
        """Detach; the creator of a shared buffer (the process that made it, not a forked child) also removes
        its segment from /dev/shm. Idempotent. Every later call raises ValueError; a call already in flight in
        another thread finishes (the mapping is released when the last one returns). Numpy views taken from
        the buffer stay valid."""
        if self._closed:
            return
        self._closed = True
        if self._owns_segment():
            shm_unlink(segment_path(self._name).encode())
        if self._lock_fd >= 0:
            c_close(self._lock_fd)
            self._lock_fd = -1
        _created.discard(self)
        if self._users == 0 or self._users_gen != _fork_generation:
            self._release()

    cdef void _release(self):
        """Drop this handle's references to the mapping: it is unmapped once no numpy view holds it."""
        self._h = NULL
        self._mv = None
        self._mm = None

    cdef int _enter(self) except -1:
        """Start a call that uses the mapping (GIL held): refused once closed; counted, so that a close() from
        another thread meanwhile leaves the mapping in place until ``_leave``."""
        if self._closed:
            raise ValueError("the buffer is closed")
        if self._users_gen != _fork_generation:     # calls in flight in the parent's threads are not ours
            self._users = 0
            self._users_gen = _fork_generation
        self._users += 1
        return 0

    cdef void _leave(self):
        self._users -= 1
        if self._users == 0 and self._closed and self._mm is not None:
            self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def shared_name(self):
        """The shared segment's name (for ``attach``), or None for a private buffer."""
        return self._name or None

    @property
    def is_creator(self) -> bool:
        return self._creator or not self._name

    cdef int _check_open(self) except -1:
        if self._closed:
            raise ValueError("the buffer is closed")
        return 0

    # ------------------------------------------------------------------ the lock

    cdef int _lock(self) except -1 nogil:
        """Take the mutex (GIL not held); time the wait only when contended; repair after a dead holder
        or a fork. Raises (taking the GIL) when it cannot be taken: this thread holds it already, or it is
        unusable."""
        cdef Header* h = self._h
        cdef int64_t t0 = 0
        cdef int rc
        if self._gen != _fork_generation:
            self._after_fork()
        rc = pthread_mutex_trylock(&h.mutex)
        if rc == EBUSY:
            t0 = _now_ns()
            rc = pthread_mutex_lock(&h.mutex)
        return self._locked(rc, t0)

    cdef int _lock_gil(self) except -1:
        """Take the mutex while holding the GIL (wait with the GIL released only if it is busy)."""
        cdef int64_t t0 = 0
        cdef int rc
        if self._gen != _fork_generation:
            self._after_fork()
        rc = pthread_mutex_trylock(&self._h.mutex)
        if rc == EBUSY:
            with nogil:
                t0 = _now_ns()
                rc = pthread_mutex_lock(&self._h.mutex)
        return self._locked(rc, t0)

    cdef int _locked(self, int rc, int64_t t0) except -1 nogil:
        cdef Header* h = self._h
        if rc == EOWNERDEAD:
            self._repair(True)
            pthread_mutex_consistent(&h.mutex)
        elif rc != 0:
            self._lock_failed(rc)
        if t0:
            h.lock_wait_ns += _now_ns() - t0
            h.lock_contended += 1
        # the hold time is timed on one section in 16 (a clock read costs ~50-100 ns) and scaled
        h.lock_count += 1
        h.lock_t0 = _now_ns() if (h.lock_count & 15) == 0 else 0
        return 0

    cdef int _lock_failed(self, int rc) except -1 with gil:
        if rc == EDEADLK:
            raise RuntimeError("this thread already holds the buffer's lock: a signal handler or a callback (a file "
                               "object's write() during save) called into the buffer while it was in use")
        raise OSError(rc, f"the buffer's lock is unusable ({os.strerror(rc)}): the shared segment is corrupted")

    cdef void _unlock(self) noexcept nogil:
        cdef Header* h = self._h
        if h.lock_t0:
            h.lock_hold_ns += _now_ns() - h.lock_t0
            h.lock_hold_sampled += 1
            h.lock_t0 = 0
        pthread_mutex_unlock(&h.mutex)

    def lock_stats(self) -> dict:
        """Contention on the buffer's mutex since creation (all processes of a shared buffer):
        ``acquisitions``, ``contended`` (had to wait), ``wait_s`` (total time spent waiting),
        ``hold_s`` (total time held, estimated from one section in 16, timed, and scaled) and
        ``repairs`` (dead holders or writers cleaned up). A snapshot read without the lock."""
        self._enter()
        try:
            return self._lock_stats_impl()
        finally:
            self._leave()

    cdef object _lock_stats_impl(self):
        cdef Header* h = self._h
        cdef double hold = h.lock_hold_ns * (<double>h.lock_count / h.lock_hold_sampled) \
            if h.lock_hold_sampled else 0.0
        return {"acquisitions": h.lock_count, "contended": h.lock_contended,
                "wait_s": h.lock_wait_ns * 1e-9, "hold_s": max(hold, 0.0) * 1e-9, "repairs": h.repairs}

    cdef void _after_fork(self) noexcept nogil:
        """First use in a forked child: a private block is a copy whose mutex may have been held by a
        parent thread, and whose in-flight slots have no writer here; both get reset. Shared blocks
        stay as they are. ``_forked`` runs either way (the buffer gives the child its own random stream)."""
        cdef int64_t pid = getpid()
        cdef int r
        self._gen = _fork_generation
        if pid == self._pid:
            return
        if not self._name:
            mutex_init(&self._h.mutex, True)
            for r in range(MAX_RESERVATIONS):
                self._h.res[r].pid = 0
            self._repair(True)
        self._forked(pid)
        self._pid = pid

    cdef void _forked(self, int64_t pid) noexcept nogil:
        """(subclasses) What a handle resets in a forked child, after the block's own reset."""
        pass

    cdef void _repair(self, bint holder_died) noexcept nogil:
        """(subclasses; lock held) Undo what dead writers left in the block."""
        pass


cdef class SharedControl(SegmentHandle):
    """A small named block of int64 words behind the segment's robust lock: the control block (counters, flags)
    that the processes of one node share, whoever started them (``multiprocessing`` or Ray); attached by name, so
    it travels as a string. ``words`` is a numpy view; ``lock`` a reusable context manager around the lock (a
    holder that dies inside leaves it usable: the next taker repairs it)."""

    cdef object _words
    cdef object _held

    @classmethod
    def create(cls, str name, n_words) -> SharedControl:
        """A new block of ``n_words`` zeroed words named ``name`` (a stale one whose creator is gone is replaced);
        this handle owns it and removes it on ``close``."""
        if isinstance(n_words, bool) or not isinstance(n_words, int) or not 1 <= n_words <= MAX_CONTROL_WORDS:
            raise ValueError(f"n_words must be an int in [1, {MAX_CONTROL_WORDS}], got {n_words!r}")
        segment_path(name)                  # validates the name
        cdef SharedControl c = cls.__new__(cls)
        cdef int64_t total = HEADER_BYTES + 8 * <int64_t>n_words
        c._name = name
        c._map(c._create_segment(name, total))
        cdef Header* h = c._h
        h.magic = SEGMENT_MAGIC
        h.version = SEGMENT_VERSION
        h.kind = KIND_CONTROL
        h.capacity = n_words
        h.total_bytes = total
        h.creator_pid = getpid()
        if mutex_init(&h.mutex, True) != 0:
            c.close()
            raise OSError("cannot initialise the control block's mutex")
        c._bind_words()
        h.ready = 1
        return c

    @classmethod
    def attach(cls, str name) -> SharedControl:
        """A handle on the control block ``name`` another process created; every header word it uses is checked
        against the segment's size (ValueError otherwise). ``close`` detaches it."""
        cdef SharedControl c = cls.__new__(cls)
        size = c._open_named(name, "control block")
        cdef Header* h = c._h
        try:
            if h.magic != SEGMENT_MAGIC or h.version != SEGMENT_VERSION or h.kind != KIND_CONTROL:
                raise ValueError(f"{SHM_DIR}/{name} is not a PAL-Bench control block of this version")
            if not h.ready:
                raise ValueError(f"control block {name!r} is not initialised yet")
            if not 1 <= h.capacity <= MAX_CONTROL_WORDS or h.total_bytes != size \
                    or size != HEADER_BYTES + 8 * h.capacity:
                raise ValueError(f"control block {name!r} is corrupted: {h.capacity} words in {size} bytes")
            c._bind_words()
        except BaseException:
            c._closed = True
            c._release()
            raise
        return c

    cdef _bind_words(self):
        self._words = np.frombuffer(self._mm, dtype=np.int64, count=self._h.capacity, offset=HEADER_BYTES)
        self._held = _Held(self)

    cdef void _release(self):
        self._words = None
        self._held = None
        SegmentHandle._release(self)

    @property
    def words(self):
        """The block's words (numpy int64 view: read and write them under ``lock`` where several processes
        write one)."""
        self._check_open()
        return self._words

    @property
    def lock(self):
        """``with block.lock:`` holds the block's lock (process-shared, robust; not re-entrant: the same thread
        taking it twice gets RuntimeError)."""
        self._check_open()
        return self._held


cdef class _Held:
    """``SharedControl.lock``: the lock held inside a ``with`` block."""
    cdef SharedControl _c

    def __cinit__(self, SharedControl c):
        self._c = c

    def __enter__(self):
        self._c._enter()
        try:
            self._c._lock_gil()
        except BaseException:
            self._c._leave()
            raise
        return self

    def __exit__(self, *exc):
        self._c._unlock()
        self._c._leave()
        return False
