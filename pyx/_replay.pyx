# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Replay buffers: ``PrioritizedReplayBuffer`` (K-ary sum tree) and ``ReplayBuffer``, in one process or
shared across processes.

Memory
------
Everything that defines a buffer's state lives in one block: a header (sizes, counters, max
priority, lock statistics, the table of writers' reservations, the mutex), the slot table (slot ->
transition id), the transitions and the sum tree. Transitions are stored row-major: all fields of
one transition in one record (each field aligned to its item size, the record to 8 bytes), so a
sampled row costs one or two cache lines instead of one per field; ``buf.storage[name]`` is a
strided numpy view of one field. A private buffer's block is an anonymous private mapping (copied
on write by ``fork``); ``shared=True`` puts it in a named POSIX shared-memory segment
(``/dev/shm/<name>``) that ``attach(name)`` maps in another process.

Indices
-------
Every transition gets a *transition id*, a number that grows by one per inserted transition and
is never reused. Its slot is ``id % capacity``. ``add``/``add_batch`` return ids, ``sample``
returns ids under ``"indices"``, and ``update_priorities`` takes ids back: an id whose slot has
been overwritten since is *stale*, and its update is dropped (counted in the return value).

Concurrency
-----------
One mutex guards the tree, the slot table and the counters; it is a robust, process-shared POSIX
mutex in the block, and never held around Python-level work. ``add_batch`` reserves its slots under
the lock (recorded in the reservation table with the writer's pid), copies the rows with the lock
and the GIL released, then commits under the lock. ``sample`` draws and descends the tree under the
lock, gathers rows with the lock and the GIL released, then re-checks under the lock that each slot
still holds the id it had when drawn (a seqlock); rows overwritten meanwhile are drawn again, so a
sampled transition is never torn.

A process that dies holding the lock (``EOWNERDEAD``) or in the middle of a reserved copy is
repaired by the next process that needs it: its reserved slots become empty, the tree is rebuilt
from its leaves and the counters from the slot table. After ``os.fork()`` a *private* buffer in the
child is a copy: its mutex is re-initialised (a thread of the parent may have held it) and slots a
parent thread was writing become empty; a *shared* buffer stays shared. Either way the child draws
from a new random stream.
"""

import atexit
import io
import json
import math
import mmap
import fcntl
import os
import stat
import weakref
import zipfile

import numpy as np

from pal_bench.replay_files import (FILE_FORMAT, FILE_VERSION, file_size, open_source, read_member,
                                   validated_meta)
from pal_bench.replay_layout import normalise_fields, record_layout, segment_path, spec_json
from pal_bench._segment import (CREATOR_PID_OFFSET, SEGMENT_MAGIC, SEGMENT_VERSION, SHM_DIR, creator_alive,
                                header_offsets, remove_if_dead, segment_info)

cimport numpy as cnp
from libc.errno cimport EEXIST, ENOENT, ESRCH, errno
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.fcntl cimport O_CREAT, O_EXCL, O_RDONLY, O_RDWR
from posix.mman cimport shm_open, shm_unlink
from posix.signal cimport kill
from cpython.buffer cimport PyBUF_WRITABLE
from cpython.exc cimport PyErr_CheckSignals
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec
from posix.unistd cimport close as c_close
from posix.unistd cimport ftruncate, getpid

from _common cimport DEFAULT_FANOUT_C, MAX_FAST_FIELDS, SCALAR_SCRATCH, SLOT_EMPTY, SLOT_INFLIGHT
from _lock cimport (
    EDEADLK,
    EOWNERDEAD,
    ETIMEDOUT,
    mutex_init,
    mutex_lock_gil,
    pthread_atfork,
    pthread_mutex_consistent,
    pthread_mutex_lock,
    pthread_mutex_t,
    pthread_mutex_timedlock,
    pthread_mutex_trylock,
    pthread_mutex_unlock,
)
from _rng cimport Rng, rng_seed, rng_uniform
from _vmath cimport vpow, vpow1
from pal_bench._segment cimport (
    HEADER_BYTES,
    MAX_RESERVATIONS,
    Header,
    ReadOnlyBlock,
    Reservation,
    block_layout,
    pid_dead,
    shm_create,
)
from _tree_core cimport (
    TreeLayout,
    __builtin_prefetch,
    leaf_pos,
    tree_check,
    tree_find_sorted,
    tree_get,
    tree_layout,
    tree_min_nonzero,
    tree_rebuild,
    tree_set,
    tree_set_batch,
    tree_total,
)

cnp.import_array()

_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)

from _ndarray cimport new_array

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned int usec)

cdef extern from "<float.h>":
    double DBL_MAX

cdef extern from "<errno.h>" nogil:
    enum:
        EBUSY

DEF_FANOUT = DEFAULT_FANOUT_C
cdef int64_t MAX_NEXT_ID = 1 << 62     # transition ids stay below this (no int64 overflow in id arithmetic)
ATTACH_LOCK_TIMEOUT_S = 10.0           # attach waits at most this long for the segment's lock (s)
_CORRUPT_NEXT_ID = "the shared segment's header word next_id was overwritten with an impossible value (corrupted)"

cdef enum:
    SPIN_BEFORE_REAP = 64     # waits on an in-flight slot before checking for dead writers
    SPIN_BEFORE_SIGNALS = 1024    # waits on an in-flight slot before letting Python's signal handlers run
    MAX_DIMS = 16             # dimensions of a field's shape
    MAX_SPEC_BYTES = 1 << 20  # the fields' JSON description in a block


# fork generation: incremented in every child right after fork (pthread_atfork), so a handle notices
cdef int64_t _fork_generation = 0

cdef void _after_fork_child() noexcept nogil:
    global _fork_generation
    _fork_generation += 1

pthread_atfork(NULL, NULL, _after_fork_child)


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline void _prefetch_record(const char* rec, int64_t nbytes) noexcept nogil:
    """Prefetch every cache line the record ``[rec, rec + nbytes)`` touches."""
    cdef const char* p = <const char*>(<size_t>rec & ~(<size_t>63))
    while p < rec + nbytes:
        __builtin_prefetch(p)
        p += 64


cdef inline void _copy(char* dst, const char* src, int64_t n) noexcept nogil:
    # Constant-size memcpy compiles to plain moves for the common row sizes.
    if n == 4:
        memcpy(dst, src, 4)
    elif n == 8:
        memcpy(dst, src, 8)
    elif n == 1:
        memcpy(dst, src, 1)
    elif n == 32:
        memcpy(dst, src, 32)
    else:
        memcpy(dst, src, n)


cdef inline void _gather(char* dst, const char* records, int64_t record_bytes, int64_t off, int64_t n,
                         const int64_t* pending, int64_t n_pending, const int64_t* slots) noexcept nogil:
    """Copy field rows of ``n`` bytes at offset ``off`` of the records in ``slots[pending[q]]`` into row
    ``pending[q]`` of ``dst``: one loop per field, the row size a constant inside it (plain moves)."""
    cdef int64_t q, k
    if n == 4:
        for q in range(n_pending):
            k = pending[q]
            memcpy(dst + 4 * k, records + slots[k] * record_bytes + off, 4)
    elif n == 8:
        for q in range(n_pending):
            k = pending[q]
            memcpy(dst + 8 * k, records + slots[k] * record_bytes + off, 8)
    elif n == 1:
        for q in range(n_pending):
            k = pending[q]
            dst[k] = records[slots[k] * record_bytes + off]
    elif n == 32:
        for q in range(n_pending):
            k = pending[q]
            memcpy(dst + 32 * k, records + slots[k] * record_bytes + off, 32)
    else:
        for q in range(n_pending):
            k = pending[q]
            memcpy(dst + n * k, records + slots[k] * record_bytes + off, n)


cdef inline void _scatter(char* records, int64_t record_bytes, int64_t off, int64_t n, const char* src,
                          int64_t first, int64_t count) noexcept nogil:
    """Copy ``count`` consecutive field rows of ``n`` bytes from ``src`` into the records of slots
    ``first .. first + count - 1``, at offset ``off``: the inverse of ``_gather`` for a run of slots, one
    loop per field with the row size a constant inside it (plain moves)."""
    cdef int64_t r
    cdef char* dst = records + first * record_bytes + off
    if n == 4:
        for r in range(count):
            memcpy(dst + r * record_bytes, src + 4 * r, 4)
    elif n == 8:
        for r in range(count):
            memcpy(dst + r * record_bytes, src + 8 * r, 8)
    elif n == 1:
        for r in range(count):
            dst[r * record_bytes] = src[r]
    elif n == 32:
        for r in range(count):
            memcpy(dst + r * record_bytes, src + 32 * r, 32)
    else:
        for r in range(count):
            memcpy(dst + r * record_bytes, src + n * r, n)


_created = weakref.WeakSet()      # creators of live shared segments, closed (and unlinked) at exit


@atexit.register
def _close_created_segments():
    for buf in list(_created):
        try:
            buf.close()
        except Exception:
            pass


cdef class _ReplayCore:
    """Shared machinery of both buffers; use ``ReplayBuffer`` or ``PrioritizedReplayBuffer``."""

    cdef object __weakref__
    cdef object _mm               # the mapping (mmap.mmap): owns the block; field views hold it too
    cdef unsigned char[::1] _mv   # exported view of the mapping, for the C pointer
    cdef char* _base
    cdef Header* _h
    cdef int64_t* _slot_ids
    cdef char* _records
    cdef readonly int64_t capacity
    cdef int64_t _rb_total        # record bytes
    cdef int _n_fields
    cdef int64_t* _off            # per field: offset in the record, row bytes, type number, ndim
    cdef int64_t* _row_bytes
    cdef int* _typenum
    cdef int* _ndim
    cdef int64_t* _dims           # per field: its shape, MAX_DIMS entries each
    cdef int* _native             # per field: native byte order (add's scalar fast path)
    cdef Rng _rng
    cdef uint64_t _seed
    cdef bint _prioritized
    cdef TreeLayout _tree
    cdef double _alpha
    cdef double _eps
    cdef double _prio_limit       # largest stored priority: capacity of them still sum to a finite total
    cdef double _max_raw          # the header's max_priority when ``_max_stored`` was computed (NaN: never)
    cdef double _max_stored       # its stored value (max_priority + eps)^alpha: one pow per change, not per add
    cdef tuple _names
    cdef dict _specs
    cdef dict _storage
    cdef dict _ro_storage         # the same views on a read-only export of the mapping (``storage``)
    cdef object _slot_ids_arr
    cdef tuple _dtypes            # per field: the numpy dtype (for add's fast path)
    cdef tuple _scalar_types      # per field: the numpy scalar type whose values are exactly that dtype, or None
    cdef str _name                # shared segment name ('' for a private buffer)
    cdef bint _creator
    cdef int64_t _creator_pid     # the process that created the segment: only it unlinks (not a forked child)
    cdef int _lock_fd             # creator: the segment's fd, holding a shared flock while the segment lives
    cdef bint _closed
    cdef int _users               # calls in flight on this handle: close() unmaps only when the last one returns
    cdef int64_t _users_gen       # the fork generation ``_users`` counts in (a forked child starts from none)
    cdef int64_t _pid             # the process this handle last ran in
    cdef int64_t _gen             # fork generation it last ran in
    cdef public double _debug_copy_pause_s    # tests: sleep this long in add_batch between reserve and copy

    def __cinit__(self, *args, **kwargs):
        self._off = NULL
        self._row_bytes = NULL
        self._typenum = NULL
        self._ndim = NULL
        self._dims = NULL
        self._native = NULL
        self._h = NULL
        self._name = ""
        self._closed = True
        self._max_raw = NAN
        self._lock_fd = -1

    def __dealloc__(self):
        if self._owns_segment() and not self._closed:
            shm_unlink(segment_path(self._name).encode())
        if self._lock_fd >= 0:
            c_close(self._lock_fd)
        free(self._off)
        free(self._row_bytes)
        free(self._typenum)
        free(self._ndim)
        free(self._dims)
        free(self._native)

    # ------------------------------------------------------------------ creation and attachment

    cdef _setup(self, capacity, fields, seed, bint prioritized, double alpha, double eps, fanout,
                bint shared, name):
        if self._off != NULL or self._mm is not None:
            raise RuntimeError("this buffer is already initialised (__init__ called twice); make a new one")
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {capacity!r}")
        if capacity < 1 or capacity > 2**40:
            raise ValueError(f"capacity must be in [1, 2**40], got {capacity}")
        specs = normalise_fields(fields)
        seed = self._check_seed(seed)
        if prioritized and not vpow1(1.0 + eps, alpha) <= DBL_MAX / (2.0 * capacity):
            raise ValueError(f"eps {eps!r} too large: (1 + eps) ** alpha must stay below {DBL_MAX / (2.0 * capacity):.3g} "
                             f"so that {capacity} priorities sum to a finite total")
        if name is not None and not shared:
            raise ValueError("name is only for shared=True buffers")
        if name is not None:
            segment_path(name)         # validates it
        offsets, record_bytes = record_layout(specs)
        cdef bytes spec = spec_json(specs, offsets)
        if len(spec) > MAX_SPEC_BYTES:
            raise ValueError(f"fields: their description takes {len(spec)} bytes, more than {MAX_SPEC_BYTES}")
        layout = block_layout(capacity, len(spec), record_bytes, prioritized, fanout if prioritized else 0)
        cdef int64_t spec_offset = layout["spec_offset"], slots_offset = layout["slots_offset"]
        cdef int64_t records_offset = layout["records_offset"], sums_offset = layout["sums_offset"]
        cdef int64_t mins_offset = layout["mins_offset"], stamps_offset = layout["stamps_offset"]
        cdef int64_t total = layout["total_bytes"]
        cdef TreeLayout t
        n_mins = 0
        if prioritized:
            _, n_mins, _ = tree_layout(&t, capacity, fanout)
        if shared:
            self._name = name if name is not None else f"pal-{os.getpid()}-{os.urandom(4).hex()}"
            mm = self._create_segment(self._name, total)
        else:
            mm = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE)
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE") and total >= 4 << 20:
                mm.madvise(mmap.MADV_HUGEPAGE)
        self._map(mm)
        cdef Header* h = self._h
        h.magic = SEGMENT_MAGIC
        h.version = SEGMENT_VERSION
        h.kind = 1 if prioritized else 0
        h.capacity = capacity
        h.fanout = fanout if prioritized else 0
        h.alpha = alpha
        h.eps = eps
        h.record_bytes = record_bytes
        h.n_fields = len(specs)
        h.spec_offset = spec_offset
        h.spec_bytes = len(spec)
        h.slots_offset = slots_offset
        h.records_offset = records_offset
        h.sums_offset = sums_offset
        h.mins_offset = mins_offset
        h.stamps_offset = stamps_offset
        h.total_bytes = total
        h.creator_pid = os.getpid()
        h.handles = 1
        h.next_id = 0
        h.size = 0
        h.inflight = 0
        h.max_priority = 1.0
        h.stamp = 0
        memcpy(self._base + spec_offset, <const char*>spec, len(spec))
        if mutex_init(&h.mutex, True) != 0:
            raise OSError("cannot initialise the buffer's mutex")
        slot_view = np.frombuffer(mm, dtype=np.int64, count=capacity, offset=slots_offset)
        slot_view[:] = SLOT_EMPTY
        if prioritized:
            np.frombuffer(mm, dtype=np.float64, count=n_mins, offset=mins_offset)[:] = INFINITY
        self._bind(seed, 0)
        h.ready = 1

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

    cdef _bind(self, seed, int64_t handle_index):
        """Per-handle view of a mapped, initialised block: field and tree pointers, numpy views, RNG."""
        cdef Header* h = self._h
        spec = json.loads(bytes(self._mv[h.spec_offset:h.spec_offset + h.spec_bytes]))
        self.capacity = h.capacity
        self._prioritized = h.kind == 1
        self._alpha = h.alpha
        self._eps = h.eps
        self._rb_total = h.record_bytes
        self._specs = {n: (tuple(s), np.dtype(d)) for n, s, d, _ in spec}
        self._names = tuple(self._specs)
        self._dtypes = tuple(d for _, (_, d) in self._specs.items())
        # a numpy scalar of type ``d.type`` has dtype ``d`` exactly when ``d`` is native, of fixed size and
        # not flexible (no string length, datetime unit or struct to tell apart): add copies its bytes
        self._scalar_types = tuple(d.type if d.isnative and d.kind not in "SUVOMm" and d.itemsize <= SCALAR_SCRATCH
                                   else None for d in self._dtypes)
        self._n_fields = len(spec)
        self._off = <int64_t*>malloc(self._n_fields * sizeof(int64_t))
        self._row_bytes = <int64_t*>malloc(self._n_fields * sizeof(int64_t))
        self._typenum = <int*>malloc(self._n_fields * sizeof(int))
        self._ndim = <int*>malloc(self._n_fields * sizeof(int))
        self._dims = <int64_t*>malloc(self._n_fields * MAX_DIMS * sizeof(int64_t))
        self._native = <int*>malloc(self._n_fields * sizeof(int))
        if (self._off == NULL or self._row_bytes == NULL or self._typenum == NULL or self._ndim == NULL
                or self._dims == NULL or self._native == NULL):
            raise MemoryError()
        self._slot_ids = <int64_t*>(self._base + h.slots_offset)
        self._records = self._base + h.records_offset
        self._slot_ids_arr = np.frombuffer(self._mm, dtype=np.int64, count=h.capacity, offset=h.slots_offset)
        self._storage = {}
        self._ro_storage = {}
        readonly = ReadOnlyBlock(self._mm)
        cdef int f = 0
        for name, shape, dstr, off in spec:
            dtype = np.dtype(dstr)
            shape = tuple(shape)
            self._off[f] = off
            self._row_bytes[f] = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            self._typenum[f] = dtype.num
            self._ndim[f] = len(shape)
            self._native[f] = dtype.isnative
            for d, size in enumerate(shape):
                self._dims[f * MAX_DIMS + d] = size
            inner = tuple(dtype.itemsize * math.prod(shape[d + 1:]) for d in range(len(shape)))   # C order
            self._storage[name] = np.ndarray((h.capacity,) + shape, dtype=dtype, buffer=self._mm,
                                             offset=h.records_offset + off, strides=(h.record_bytes,) + inner)
            # what ``storage`` hands out: views of a read-only export, which no one can make writable
            self._ro_storage[name] = np.ndarray((h.capacity,) + shape, dtype=dtype, buffer=readonly,
                                                offset=h.records_offset + off, strides=(h.record_bytes,) + inner)
            f += 1
        if self._prioritized:
            tree_layout(&self._tree, h.capacity, h.fanout)
            self._tree.sums = <double*>(self._base + h.sums_offset)
            self._tree.mins = <double*>(self._base + h.mins_offset)
            self._tree.stamps = <uint64_t*>(self._base + h.stamps_offset)
            self._prio_limit = DBL_MAX / (2.0 * h.capacity)
        self._seed = <uint64_t>int(seed)
        self._seed_stream(handle_index)
        self._pid = getpid()
        self._gen = _fork_generation
        self._debug_copy_pause_s = 0.0

    cdef void _seed_stream(self, int64_t index) noexcept nogil:
        """The handle's random stream: splitmix64 of the seed, then ``index`` jumps of the state by
        mixing in a distinct constant (handle 0: exactly ``rng_seed(seed)``, as a private buffer)."""
        rng_seed(&self._rng, self._seed)
        cdef int64_t i
        cdef Rng other
        if index:
            rng_seed(&other, self._seed ^ (<uint64_t>0xD1B54A32D192ED03 * <uint64_t>index))
            for i in range(4):
                self._rng.s[i] ^= other.s[i]
            if self._rng.s[0] == 0 and self._rng.s[1] == 0 and self._rng.s[2] == 0 and self._rng.s[3] == 0:
                self._rng.s[0] = 1

    @staticmethod
    def _check_seed(seed):
        if seed is None:
            return int(np.random.SeedSequence().entropy) & 0xFFFFFFFFFFFFFFFF
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        return int(seed) & 0xFFFFFFFFFFFFFFFF

    @classmethod
    def attach(cls, name, seed=None):
        """A handle on the shared buffer ``name`` created by another process (spawned, or this one).

        The handle has the full API; it only detaches on ``close()`` (the creator owns the segment).
        It samples from its own random stream: ``seed`` and the number of handles opened on the
        segment before it (None: a seed from the OS).

        Nothing in the segment is trusted: every offset and size in its header must be exactly what its
        capacity and fields imply, and every counter, reservation and slot must be possible (ValueError
        naming the header word otherwise). If its lock stays held for ``ATTACH_LOCK_TIMEOUT_S`` (a hung
        or stopped process), ``TimeoutError``.
        """
        path = segment_path(name).encode()
        seed = cls._check_seed(seed)
        cdef int fd = shm_open(path, O_RDWR, 0)
        if fd < 0:
            raise FileNotFoundError(f"no shared buffer named {name!r} ({SHM_DIR}/{name})")
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise ValueError(f"{SHM_DIR}/{name} is not a PAL-Bench buffer (too small)")
            mm = mmap.mmap(fd, size)
        finally:
            c_close(fd)
        cdef _ReplayCore buf = cls.__new__(cls)
        buf._map(mm)
        buf._name = name
        try:
            buf._check_layout(size, cls is PrioritizedReplayBuffer)
            buf._bind(seed, 0)
            buf._seed_stream(buf._join_segment())
        except BaseException:
            buf._closed = True
            buf._release()
            raise
        return buf

    cdef _check_layout(self, int64_t size, bint want_prioritized):
        """(attach) The header's fixed words against the segment's size and the layout that its capacity,
        fan-out and field spec imply: the very words ``_setup`` writes, or ValueError naming the first that is not."""
        cdef Header* h = self._h
        name = self._name
        if h.magic != SEGMENT_MAGIC or h.version != SEGMENT_VERSION:
            raise ValueError(f"{SHM_DIR}/{name} is not a PAL-Bench buffer of this version")
        if not h.ready:
            raise ValueError(f"shared buffer {name!r} is not initialised yet")

        def bad(word, value, expected):
            return ValueError(f"shared buffer {name!r} is corrupted: header word {word} = {value!r}, expected "
                              f"{expected}")

        if h.kind != 0 and h.kind != 1:
            raise bad("kind", h.kind, "0 or 1")
        if (h.kind == 1) != want_prioritized:
            kind = "PrioritizedReplayBuffer" if h.kind == 1 else "ReplayBuffer"
            raise ValueError(f"shared buffer {name!r} is a {kind}; use {kind}.attach")
        if not 1 <= h.capacity <= 2**40:
            raise bad("capacity", h.capacity, "in [1, 2**40]")
        if h.kind == 1:
            if not 2 <= h.fanout <= 4096:
                raise bad("fanout", h.fanout, "in [2, 4096]")
            if not 0.0 <= h.alpha <= 1.0:
                raise bad("alpha", h.alpha, "in [0, 1]")
            if not (0.0 <= h.eps < INFINITY):
                raise bad("eps", h.eps, "finite and >= 0")
        if h.spec_offset != HEADER_BYTES:
            raise bad("spec_offset", h.spec_offset, HEADER_BYTES)
        if not 2 <= h.spec_bytes <= min(MAX_SPEC_BYTES, size - HEADER_BYTES):
            raise bad("spec_bytes", h.spec_bytes, f"in [2, {min(MAX_SPEC_BYTES, size - HEADER_BYTES)}]")
        raw = bytes(self._mv[h.spec_offset:h.spec_offset + h.spec_bytes])
        try:
            spec = json.loads(raw)
            specs = normalise_fields({n: (tuple(s), d) for n, s, d, _ in spec})
            if len(specs) != len(spec):
                raise ValueError("duplicate field names")
        except (ValueError, TypeError) as e:
            raise ValueError(f"shared buffer {name!r} is corrupted: its field spec is unreadable ({e})") from None
        offsets, record_bytes = record_layout(specs)
        if spec_json(specs, offsets) != raw:
            raise ValueError(f"shared buffer {name!r} is corrupted: its field spec is not one this version writes")
        if h.n_fields != len(specs):
            raise bad("n_fields", h.n_fields, len(specs))
        if h.record_bytes != record_bytes:
            raise bad("record_bytes", h.record_bytes, record_bytes)
        layout = block_layout(h.capacity, h.spec_bytes, record_bytes, h.kind == 1, h.fanout if h.kind == 1 else 0)
        words = {"slots_offset": h.slots_offset, "records_offset": h.records_offset, "sums_offset": h.sums_offset,
                 "mins_offset": h.mins_offset, "stamps_offset": h.stamps_offset, "total_bytes": h.total_bytes}
        for word, value in words.items():
            if value != layout[word]:
                raise bad(word, value, layout[word])
        if h.total_bytes != size:
            raise bad("total_bytes", h.total_bytes, f"the segment's size, {size}")

    cdef int64_t _join_segment(self) except? -1:
        """(attach) Take the lock (waiting at most ``ATTACH_LOCK_TIMEOUT_S``), check the words it guards and the
        slot table, count this handle; returns its index (for its random stream)."""
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
        if rc == EOWNERDEAD:        # a holder died: repair first (as every lock does), so that the lock stays usable
            self._repair(True)      # (it only writes slots inside the table; impossible reservations are dropped)
            pthread_mutex_consistent(&h.mutex)
        try:
            self._check_guarded()
        except BaseException:
            pthread_mutex_unlock(&h.mutex)
            raise
        index = h.handles
        h.handles += 1
        h.lock_t0 = 0
        pthread_mutex_unlock(&h.mutex)
        return index

    cdef _check_guarded(self):
        """(attach, lock held) The counters, reservations and slot table are ones this code can leave: every slot
        empty, in flight for a live reservation, or holding the one id of the last ``capacity`` that maps to it;
        ValueError naming the word otherwise. O(capacity)."""
        cdef Header* h = self._h
        cdef int64_t cap = h.capacity, r, i, s, v, live = 0, active = 0, covered = 0
        cdef int64_t* ids = <int64_t*>(self._base + h.slots_offset)
        cdef double leaf
        name = self._name

        def bad(word, value, expected):
            return ValueError(f"shared buffer {name!r} is corrupted: header word {word} = {value!r}, expected "
                              f"{expected}")

        if not 0 <= h.next_id <= 2**62:
            raise bad("next_id", h.next_id, "in [0, 2**62]")
        if not 0 <= h.size <= min(cap, h.next_id):
            raise bad("size", h.size, f"in [0, {min(cap, h.next_id)}]")
        if not (0.0 <= h.max_priority < INFINITY):
            raise bad("max_priority", h.max_priority, "finite and >= 0")
        if h.kind == 1 and not vpow1(h.max_priority + h.eps, h.alpha) <= DBL_MAX / (2.0 * cap):
            raise bad("max_priority", h.max_priority, "small enough that capacity of them sum to a finite total")
        for r in range(MAX_RESERVATIONS):
            if h.res[r].pid == 0:
                continue
            active += 1
            if not 0 < h.res[r].pid < 2**31:
                raise bad(f"res[{r}].pid", h.res[r].pid, "a process id")
            if not 1 <= h.res[r].count <= cap:
                raise bad(f"res[{r}].count", h.res[r].count, f"in [1, {cap}]")
            if not 0 <= h.res[r].first <= h.next_id - h.res[r].count:
                raise bad(f"res[{r}].first", h.res[r].first, f"in [0, next_id - count]")
            for i in range(h.res[r].count):
                if ids[(h.res[r].first + i) % cap] != SLOT_INFLIGHT:
                    raise bad(f"res[{r}]", (h.res[r].first, h.res[r].count), "a run of slots in flight")
            covered += h.res[r].count
        if h.inflight != active:
            raise bad("inflight", h.inflight, f"{active} (the reservations in use)")
        if h.kind == 1 and tree_check(&self._tree) != -1:
            raise ValueError(f"shared buffer {name!r} is corrupted: its sum tree disagrees with its leaves")
        for s in range(cap):
            v = ids[s]
            if h.kind == 1:
                leaf = tree_get(&self._tree, s)
                if not (0.0 <= leaf < INFINITY) or (v == SLOT_EMPTY and leaf != 0.0):
                    raise ValueError(f"shared buffer {name!r} is corrupted: slot {s} ({'empty' if v == SLOT_EMPTY else v}) "
                                     f"has priority {leaf!r}")
            if v >= 0:
                if v % cap != s or v >= h.next_id or v < h.next_id - cap:
                    raise ValueError(f"shared buffer {name!r} is corrupted: slot {s} holds transition id {v}")
                live += 1
            elif v == SLOT_INFLIGHT:
                if not self._reserved_by_live(s):
                    raise ValueError(f"shared buffer {name!r} is corrupted: slot {s} is in flight for no writer")
            elif v != SLOT_EMPTY:
                raise ValueError(f"shared buffer {name!r} is corrupted: slot {s} holds {v}")
        if not live <= h.size <= live + covered:
            raise bad("size", h.size, f"in [{live}, {live + covered}] (live slots, plus those in flight)")

    @staticmethod
    def cleanup(name) -> bool:
        """Remove the shared segment ``name`` (after its creator was killed); True if one was removed.
        Handles still mapping it keep working until they close."""
        return shm_unlink(segment_path(name).encode()) == 0

    cdef inline bint _owns_segment(self) noexcept:
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
        self._storage = {}
        self._ro_storage = {}
        self._slot_ids_arr = None
        self._mv = None
        self._mm = None

    cdef inline int _enter(self) except -1:
        """Start a call that uses the mapping (GIL held): refused once closed; counted, so that a close() from
        another thread meanwhile leaves the mapping in place until ``_leave``."""
        if self._closed:
            raise ValueError("the buffer is closed")
        if self._users_gen != _fork_generation:     # calls in flight in the parent's threads are not ours
            self._users = 0
            self._users_gen = _fork_generation
        self._users += 1
        return 0

    cdef inline void _leave(self):
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

    cdef inline int _check_open(self) except -1:
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

    cdef inline int _locked(self, int rc, int64_t t0) except -1 nogil:
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

    cdef inline void _unlock(self) noexcept nogil:
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
        stay as they are. The child gets its own random stream either way."""
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
        self._seed ^= <uint64_t>pid * <uint64_t>0x9E3779B97F4A7C15
        self._seed_stream(0)
        self._pid = pid

    cdef void _repair(self, bint holder_died) noexcept nogil:
        """(lock held) Undo what dead writers left: reservations of dead processes are dropped and their
        in-flight slots emptied. When a holder died mid-section (``holder_died``), in-flight slots that no
        live writer owns are emptied too, live slots whose leaf is zero get the max priority, and the tree
        and size are rebuilt."""
        cdef Header* h = self._h
        cdef int64_t r, i, s, cap = self.capacity, size = 0, live_res = 0
        cdef bint any_dead = False
        for r in range(MAX_RESERVATIONS):
            if h.res[r].pid and (pid_dead(h.res[r].pid) or h.res[r].first < 0 or not 0 <= h.res[r].count <= cap):
                any_dead = True
        if not any_dead and not holder_died:
            return
        for r in range(MAX_RESERVATIONS):
            if h.res[r].pid and (h.res[r].first < 0 or not 0 <= h.res[r].count <= cap):
                h.res[r].pid = 0                # impossible (scribbled on): dropped, its slots found below
                h.inflight -= 1
            elif h.res[r].pid and pid_dead(h.res[r].pid):
                for i in range(h.res[r].count):
                    s = (h.res[r].first + i) % cap
                    if self._slot_ids[s] == SLOT_INFLIGHT:
                        self._slot_ids[s] = SLOT_EMPTY
                h.res[r].pid = 0
                h.inflight -= 1
        if holder_died:
            # in-flight slots covered by a live reservation stay; any other in-flight slot is orphaned
            for s in range(cap):
                if self._slot_ids[s] == SLOT_INFLIGHT and not self._reserved_by_live(s):
                    self._slot_ids[s] = SLOT_EMPTY
            for r in range(MAX_RESERVATIONS):
                if h.res[r].pid:
                    live_res += 1
            h.inflight = live_res
        for s in range(cap):
            if self._slot_ids[s] >= 0:
                size += 1
            if self._prioritized:
                if self._slot_ids[s] == SLOT_EMPTY:
                    self._tree.sums[leaf_pos(&self._tree, s)] = 0.0
                elif self._slot_ids[s] >= 0 and self._tree.sums[leaf_pos(&self._tree, s)] <= 0 and self._eps > 0:
                    self._tree.sums[leaf_pos(&self._tree, s)] = self._new_priority()
        if self._prioritized:
            tree_rebuild(&self._tree)
        h.size = size
        h.repairs += 1

    cdef bint _reserved_by_live(self, int64_t s) noexcept nogil:
        cdef Header* h = self._h
        cdef int64_t r, cap = self.capacity, k
        for r in range(MAX_RESERVATIONS):
            if h.res[r].pid:
                k = (s - h.res[r].first % cap + cap) % cap
                if k < h.res[r].count:
                    return True
        return False

    # ------------------------------------------------------------------ properties

    def __len__(self) -> int:
        self._check_open()
        return self._h.size

    @property
    def fields(self) -> dict:
        """``{name: (shape, dtype)}`` as stored."""
        return dict(self._specs)

    @property
    def storage(self) -> dict:
        """``{name: array[capacity, *shape]}``: read-only views of each field's slots (row-major records
        underneath, so the views are strided). Rows of empty or in-flight slots are meaningless."""
        self._check_open()
        return {name: arr.view() for name, arr in self._ro_storage.items()}

    @property
    def total_added(self) -> int:
        """Transitions inserted so far (the next transition id)."""
        self._check_open()
        return self._h.next_id

    @property
    def max_priority(self) -> float:
        """Largest raw priority applied so far (1.0 before any update); new transitions get it."""
        self._check_open()
        return self._h.max_priority

    # ------------------------------------------------------------------ validation helpers

    cdef _field_error(self, dict kw):
        missing = [n for n in self._names if n not in kw]
        unknown = [n for n in kw if n not in self._specs]
        if unknown:
            return ValueError(f"unknown field(s) {unknown}; this buffer stores {list(self._names)}")
        return ValueError(f"missing field(s) {missing}; this buffer stores {list(self._names)}")

    cdef object _convert(self, str name, value, bint batch):
        """``value`` as a C-contiguous array of the field's dtype, shape ``[B, *shape]`` when ``batch``."""
        shape, dtype = self._specs[name]
        arr = np.asarray(value)
        if arr.dtype.hasobject or not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise TypeError(f"field {name!r}: cannot cast {arr.dtype} to {dtype} (same_kind rule)")
        if batch:
            if arr.ndim != len(shape) + 1 or arr.shape[1:] != shape:
                raise ValueError(f"field {name!r}: expected shape (B, {', '.join(map(str, shape))})"
                                 f" with a leading batch dimension, got {arr.shape}")
        elif arr.shape != shape:
            raise ValueError(f"field {name!r}: expected shape {shape}, got {arr.shape}")
        return np.ascontiguousarray(arr, dtype=dtype)

    cdef int _check_priorities(self, raw) except -1:
        """Raw priorities (float64[B]) finite, >= 0 and small enough that ``capacity`` stored priorities
        still sum to a finite total (so the tree's root never overflows to inf)."""
        if raw.size and not (np.isfinite(raw).all() and (raw >= 0).all()):
            raise ValueError("priorities must be finite and >= 0 (no NaN, inf or negative values)")
        if self._prioritized and raw.size:
            top = float(raw.max())
            stored = self._stored_priority(top)
            if not stored <= self._prio_limit:
                raise ValueError(f"priority {top!r} too large: (p + eps) ** alpha = {stored!r} exceeds "
                                 f"{self._prio_limit:.3g}, the most that {self.capacity} priorities can hold "
                                 f"without their sum overflowing")
        return 0

    # ------------------------------------------------------------------ insertion

    cdef int _reserve(self, int64_t n_rows, int64_t* first_id, int64_t* n_new, int* entry) noexcept nogil:
        """(lock held) Reserve ``n_rows`` ids; the kept ones (the last ``min(n_rows, capacity)``) are
        marked in-flight and recorded in a reservation entry (``entry``; -1 for none wanted). Returns 1
        if a slot is still being written by another writer, 2 if the reservation table is full (the
        caller retries), 3 if the header's ``next_id`` is impossible (another process scribbled on it), 0 on
        success."""
        cdef Header* h = self._h
        cdef int64_t cap = self.capacity       # this handle's copy, checked at attach (not the header's)
        cdef int64_t m = n_rows if n_rows < cap else cap
        if not 0 <= h.next_id <= MAX_NEXT_ID:
            return 3
        cdef int64_t start = h.next_id + n_rows - m, r, s, new = 0
        cdef int64_t s0 = start % cap
        cdef int e = -1
        s = s0
        for r in range(m):
            if self._slot_ids[s] == SLOT_INFLIGHT:
                return 1
            s += 1
            if s == cap:
                s = 0
        if entry != NULL:
            for r in range(MAX_RESERVATIONS):
                if h.res[r].pid == 0:
                    e = r
                    break
            if e < 0:
                return 2
            h.res[e].pid = self._pid
            h.res[e].first = start
            h.res[e].count = m
            entry[0] = e
        s = s0
        for r in range(m):
            if self._slot_ids[s] == SLOT_EMPTY:
                new += 1
            self._slot_ids[s] = SLOT_INFLIGHT
            s += 1
            if s == cap:
                s = 0
        first_id[0] = h.next_id
        n_new[0] = new
        h.next_id += n_rows
        return 0

    cdef int _wait_for_writers(self, int64_t* spins) except -1 nogil:
        """(lock not held) Back off while another writer copies; now and then reap dead writers, and let
        Python's signal handlers run (a writer stopped mid-copy must not make Ctrl-C or SIGTERM wait): raises
        what a handler raised."""
        spins[0] += 1
        if spins[0] % SPIN_BEFORE_REAP == 0:
            self._lock()
            self._repair(False)
            self._unlock()
        if spins[0] % SPIN_BEFORE_SIGNALS == 0:
            with gil:
                PyErr_CheckSignals()
        sched_yield()
        return 0

    cdef inline double _stored_priority(self, double raw) noexcept nogil:
        return vpow1(raw + self._eps, self._alpha)

    cdef inline double _new_priority(self) noexcept nogil:
        """(lock held) The stored priority of a new transition, ``_stored_priority(max_priority)``, computed
        again only when the header's ``max_priority`` changed (any process may raise it)."""
        cdef double raw = self._h.max_priority
        if raw != self._max_raw:
            self._max_stored = self._stored_priority(raw)
            self._max_raw = raw
        return self._max_stored

    cdef inline void _stored_priorities(self, const double* raw, double* out, int64_t n) noexcept nogil:
        """``_stored_priority`` over an array (``out`` may be ``raw``): the same bits, through one vector pow."""
        cdef int64_t b
        for b in range(n):
            out[b] = raw[b] + self._eps
        vpow(out, out, n, self._alpha)

    cdef inline char* _row(self, int64_t slot, int f) noexcept nogil:
        return self._records + slot * self._rb_total + self._off[f]

    def add(self, **fields) -> int:
        """Insert one transition given as keyword fields; returns its transition id.

        Python scalars, numpy scalars and arrays are accepted; any cast numpy's ``same_kind``
        rule allows is applied, exactly as ``add_batch`` stores one row. New transitions get the
        maximum priority seen so far.
        """
        self._enter()
        try:
            return self._add_impl(fields)
        finally:
            self._leave()

    cdef object _add_impl(self, dict fields):
        cdef int f, n = self._n_fields
        cdef int64_t slot, tid, n_new, spins = 0
        cdef char scratch[MAX_FAST_FIELDS * SCALAR_SCRATCH]
        cdef const char* src[MAX_FAST_FIELDS]
        cdef cnp.ndarray arr
        cdef list keep
        cdef int busy
        if n > MAX_FAST_FIELDS:
            row = {k: np.asarray(v)[None] for k, v in fields.items()}
            return int(self.add_batch(**row)[0])
        if len(fields) != n:
            raise self._field_error(fields)
        keep = []
        for f in range(n):
            name = self._names[f]
            try:
                v = fields[name]
            except KeyError:
                raise self._field_error(fields) from None
            src[f] = NULL
            dtype = self._dtypes[f]
            if self._ndim[f] == 0:
                src[f] = self._scalar_fast(f, v, dtype, &scratch[f * SCALAR_SCRATCH])
            elif cnp.PyArray_Check(v):
                arr = <cnp.ndarray>v
                # identical dtype (kind, size, byte order, unit), C order, the field's shape: raw bytes
                if (cnp.PyArray_TYPE(arr) == self._typenum[f] and cnp.PyArray_IS_C_CONTIGUOUS(arr)
                        and self._same_shape(arr, f)
                        and (<object>cnp.PyArray_DESCR(arr) is dtype or arr.dtype == dtype)):
                    src[f] = <const char*>cnp.PyArray_DATA(arr)
                    keep.append(arr)
            if src[f] == NULL:
                arr = self._convert(name, v, False)
                keep.append(arr)
                src[f] = <const char*>cnp.PyArray_DATA(arr)
        # validated: everything from here on succeeds
        self._lock_gil()
        while True:
            busy = self._reserve(1, &tid, &n_new, NULL)
            if busy == 0:
                break
            self._unlock()
            if busy == 3:
                raise ValueError(_CORRUPT_NEXT_ID)
            with nogil:
                self._wait_for_writers(&spins)      # raises what a signal handler raised (Ctrl-C)
            self._lock_gil()
        slot = tid % self.capacity
        for f in range(n):
            _copy(self._row(slot, f), src[f], self._row_bytes[f])
        self._slot_ids[slot] = tid
        self._h.size += n_new
        if self._prioritized:
            tree_set(&self._tree, slot, self._new_priority())
        self._unlock()
        return tid

    cdef inline bint _batch_fast(self, v, int f):
        """``v`` is a C-contiguous array of exactly field ``f``'s dtype and shape ``[B, *shape]``:
        ``add_batch`` reads it as it is (no conversion)."""
        cdef int d, nd = self._ndim[f]
        cdef cnp.ndarray arr
        if not cnp.PyArray_Check(v):
            return False
        arr = <cnp.ndarray>v
        if (cnp.PyArray_TYPE(arr) != self._typenum[f] or not cnp.PyArray_IS_C_CONTIGUOUS(arr)
                or cnp.PyArray_NDIM(arr) != nd + 1):
            return False
        for d in range(nd):
            if cnp.PyArray_DIMS(arr)[d + 1] != self._dims[f * MAX_DIMS + d]:
                return False
        dtype = self._dtypes[f]
        return <object>cnp.PyArray_DESCR(arr) is dtype or arr.dtype == dtype

    cdef inline bint _same_shape(self, cnp.ndarray arr, int f):
        cdef int d, nd = self._ndim[f]
        if cnp.PyArray_NDIM(arr) != nd:
            return False
        for d in range(nd):
            if cnp.PyArray_DIMS(arr)[d] != self._dims[f * MAX_DIMS + d]:
                return False
        return True

    cdef const char* _scalar_fast(self, int f, v, dtype, char* out):
        """Write Python/numpy scalar ``v`` into ``out`` as field ``f``'s (native) dtype; NULL where
        only the general path (``_convert``) is known to store exactly what ``add_batch`` stores."""
        cdef int tn = self._typenum[f]
        cdef type t = type(v)
        if not self._native[f]:
            return NULL
        if t is float:
            if tn == cnp.NPY_FLOAT64:
                (<double*>out)[0] = v
            elif tn == cnp.NPY_FLOAT32:
                (<float*>out)[0] = <float>(<double>v)
            else:
                return NULL
            return out
        if t is bool:
            if tn == cnp.NPY_BOOL:
                (<cnp.npy_bool*>out)[0] = 1 if v else 0
                return out
            return NULL
        if t is int:
            if tn == cnp.NPY_INT64 and -9223372036854775808 <= v <= 9223372036854775807:
                (<int64_t*>out)[0] = v
            else:
                return NULL
            return out
        # a numpy scalar of exactly the field's dtype (kind, size, byte order, datetime unit), fixed size
        if t is self._scalar_types[f]:
            cnp.PyArray_ScalarAsCtype(v, out)
            return out
        if (self._scalar_types[f] is not None and isinstance(v, np.generic)
                and ((<object>v).dtype is dtype or (<object>v).dtype == dtype)):
            cnp.PyArray_ScalarAsCtype(v, out)
            return out
        return NULL

    def add_batch(self, priorities=None, **fields) -> np.ndarray:
        """Insert B transitions (every field with leading dimension B); returns their ids, int64[B].

        ``priorities`` (optional, float[B], raw, finite, >= 0) sets their initial priorities
        (Ape-X style); by default they get the maximum priority seen so far. If B exceeds the
        capacity only the last ``capacity`` rows are kept (the earlier ids are stale at once).
        Rows are copied with the lock and the GIL released.
        """
        self._enter()
        try:
            return self._add_batch_impl(priorities, fields)
        finally:
            self._leave()

    cdef object _add_batch_impl(self, priorities, dict fields):
        if len(fields) != self._n_fields:
            raise self._field_error(fields)
        arrays = []
        cdef int64_t B = -1
        cdef int fi = 0
        for name in self._names:
            if name not in fields:
                raise self._field_error(fields)
            arr = fields[name]
            if not self._batch_fast(arr, fi):
                arr = self._convert(name, arr, True)
            fi += 1
            if B >= 0 and arr.shape[0] != B:
                raise ValueError(f"field {name!r}: batch size {arr.shape[0]} differs from {B} "
                                 f"of field {self._names[0]!r}")
            B = arr.shape[0]
            arrays.append(arr)
        prio = None
        if priorities is not None:
            prio = np.ascontiguousarray(priorities, dtype=np.float64)
            if prio.shape != (B,):
                raise ValueError(f"priorities must have shape ({B},), got {prio.shape}")
            self._check_priorities(prio)
            if not self._prioritized:
                prio = None
        if B == 0:
            return np.empty(0, dtype=np.int64)
        cdef int64_t m = B if B < self.capacity else self.capacity
        cdef int64_t skip = B - m
        stored = None
        cdef double raw_max = 0
        if prio is not None:
            raw_max = float(prio[skip:].max())
            stored = np.empty(m)
            self._stored_priorities(<const double*>cnp.PyArray_DATA(<cnp.ndarray>prio) + skip,
                                    <double*>cnp.PyArray_DATA(<cnp.ndarray>stored), m)
        cdef const char** src = <const char**>malloc(self._n_fields * sizeof(char*))
        cdef int64_t* slots = <int64_t*>malloc(m * sizeof(int64_t))
        cdef int64_t* scratch = <int64_t*>malloc(m * sizeof(int64_t))
        cdef double* values = <double*>malloc(m * sizeof(double))
        if src == NULL or slots == NULL or scratch == NULL or values == NULL:
            free(src); free(slots); free(scratch); free(values)
            raise MemoryError()
        cdef int f, e = -1, busy
        cdef int64_t first, n_new, r, s, run, spins = 0, RB = self._rb_total
        cdef int64_t pause_us = <int64_t>(self._debug_copy_pause_s * 1e6)
        cdef double[::1] sv
        cdef Header* h = self._h
        for f in range(self._n_fields):
            src[f] = <const char*>cnp.PyArray_DATA(<cnp.ndarray>arrays[f])
        if stored is not None:
            sv = stored
            for r in range(m):
                values[r] = sv[r]
        try:
            with nogil:
                self._lock()
                while True:
                    busy = self._reserve(B, &first, &n_new, &e)
                    if busy == 0 or busy == 3:
                        break
                    self._unlock()
                    self._wait_for_writers(&spins)      # raises what a signal handler raised (Ctrl-C)
                    self._lock()
                if busy == 3:
                    self._unlock()
                else:
                    h.inflight += 1
                    self._unlock()
                    if pause_us > 0:
                        usleep(<unsigned int>pause_us)
                    # copy the kept rows into their records, field by field over at most two runs of slots
                    # (the ring may wrap once: m <= capacity)
                    s = (first + skip) % self.capacity
                    run = m if s + m <= self.capacity else self.capacity - s
                    for f in range(self._n_fields):
                        src[f] += skip * self._row_bytes[f]
                        _scatter(self._records, RB, self._off[f], self._row_bytes[f], src[f], s, run)
                        if run < m:
                            _scatter(self._records, RB, self._off[f], self._row_bytes[f],
                                     src[f] + run * self._row_bytes[f], 0, m - run)
                    for r in range(m):
                        slots[r] = s
                        s += 1
                        if s == self.capacity:
                            s = 0
                    self._lock()
                    for r in range(m):
                        self._slot_ids[slots[r]] = first + skip + r
                    h.size += n_new
                    if self._prioritized:
                        if stored is None:
                            values[0] = self._new_priority()
                            for r in range(1, m):
                                values[r] = values[0]
                        elif raw_max > h.max_priority:
                            h.max_priority = raw_max
                        self._tree_set_batch(slots, values, m, scratch)
                    h.res[e].pid = 0
                    h.inflight -= 1
                    self._unlock()
        finally:
            free(src); free(slots); free(scratch); free(values)
        if busy == 3:
            raise ValueError(_CORRUPT_NEXT_ID)
        ids = cnp.PyArray_EMPTY(1, <cnp.npy_intp*>&B, cnp.NPY_INT64, 0)
        cdef int64_t* iv = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ids)
        for r in range(B):
            iv[r] = first + r
        return ids

    cdef inline void _tree_set_batch(self, const int64_t* slots, const double* values, int64_t n,
                                     int64_t* scratch) noexcept nogil:
        """(lock held) ``tree_set_batch`` with the block's shared dedupe stamp."""
        self._tree.stamp = self._h.stamp
        tree_set_batch(&self._tree, slots, values, n, scratch)
        self._h.stamp = self._tree.stamp

    # ------------------------------------------------------------------ sampling

    cdef int _draw(self, int64_t n_pending, const int64_t* pending, int64_t* slots, int64_t* ids,
                   double* prio, int64_t* found, double* min_p) noexcept nogil:
        """Draw slots for the pending positions (lock held); ``found`` is scratch of the batch size.
        Returns 1 if all priorities are zero, 2 if the tree led to an empty slot or past the last one (corrupted),
        3 if nothing is stored. Each drawn record is prefetched for the gather."""
        cdef int64_t q, k, s, hi
        cdef double total
        if self._prioritized:
            total = tree_total(&self._tree)
            if not (total > 0):
                return 1
            min_p[0] = tree_min_nonzero(&self._tree)
            for q in range(n_pending):
                prio[q] = (q + rng_uniform(&self._rng)) * (total / n_pending)
            if tree_find_sorted(&self._tree, prio, found, n_pending) < 0:     # stratified: ascending
                return 1
            # second pass: these loads are independent, so their cache misses overlap
            for q in range(n_pending):
                k = pending[q]
                s = found[q]
                if s >= self.capacity:          # a padding leaf: only a corrupted tree leads there
                    return 2
                slots[k] = s
                _prefetch_record(self._records + s * self._rb_total, self._rb_total)
                ids[k] = self._slot_ids[s]
                if ids[k] == SLOT_EMPTY:        # an empty slot has priority 0: only a corrupted tree leads there
                    return 2
            for q in range(n_pending):
                k = pending[q]
                prio[k] = tree_get(&self._tree, slots[k])
        else:
            if self._h.size <= 0:               # every writer so far died before committing
                return 3
            hi = self._h.next_id if self._h.next_id < self.capacity else self.capacity
            if hi < 1:
                return 3
            for q in range(n_pending):
                k = pending[q]
                s = <int64_t>(rng_uniform(&self._rng) * hi)
                slots[k] = s
                _prefetch_record(self._records + s * self._rb_total, self._rb_total)
                ids[k] = self._slot_ids[s]
        return 0

    cdef object _new_rows(self, int f, int64_t B):
        """An uninitialised array [B, *shape] of field ``f``'s dtype (C-level: no argument parsing)."""
        cdef cnp.npy_intp dims[MAX_DIMS + 1]
        cdef int d
        dims[0] = B
        for d in range(self._ndim[f]):
            dims[d + 1] = self._dims[f * MAX_DIMS + d]
        return new_array(self._dtypes[f], self._ndim[f] + 1, dims)

    cdef object _out_array(self, arr, str name, object dtype, int ndim, const int64_t* dims, int64_t B):
        """``arr`` (``out[name]``) if it is a writable C-contiguous ndarray of ``dtype`` and shape [B, *dims], else
        ValueError naming what differs."""
        if not cnp.PyArray_Check(arr):
            raise ValueError(f"out[{name!r}] must be a numpy array (pass a dict an earlier sample() returned), "
                             f"got {type(arr).__name__}")
        cdef cnp.ndarray a = <cnp.ndarray>arr
        cdef int d
        bad = cnp.PyArray_NDIM(a) != ndim + 1 or cnp.PyArray_DIMS(a)[0] != B
        if not bad:
            for d in range(ndim):
                if cnp.PyArray_DIMS(a)[d + 1] != dims[d]:
                    bad = True
        if bad or a.dtype != dtype:
            shape = [B]
            for d in range(ndim):
                shape.append(dims[d])
            raise ValueError(f"out[{name!r}] must have shape {tuple(shape)} and dtype {dtype}, "
                             f"got {arr.shape} {arr.dtype}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISWRITEABLE(a):
            raise ValueError(f"out[{name!r}] must be C-contiguous and writable")
        return a

    cdef int _check_disjoint(self, list arrays) except -1:
        """The ``out`` arrays (each C-contiguous, checked before) occupy disjoint bytes, none of them the buffer's
        own: rows written through one array must not change another (``weights`` aliasing ``indices`` made the
        seqlock check fail for ever)."""
        cdef int n = self._n_fields + 2, i, j, bad_i = -1, bad_j = -1
        cdef size_t* span = <size_t*>malloc(2 * n * sizeof(size_t))
        cdef size_t lo_buf = <size_t>self._base, hi_buf = <size_t>self._base + <size_t>self._h.total_bytes
        cdef cnp.ndarray a
        if span == NULL:
            raise MemoryError()
        for i in range(n):
            a = <cnp.ndarray>arrays[i]
            span[2 * i] = <size_t>cnp.PyArray_DATA(a)
            span[2 * i + 1] = span[2 * i] + <size_t>cnp.PyArray_NBYTES(a)
            if bad_i < 0 and span[2 * i] < hi_buf and lo_buf < span[2 * i + 1]:
                bad_i = i
        if bad_i < 0:
            for i in range(n):
                for j in range(i + 1, n):
                    if bad_j < 0 and span[2 * i] < span[2 * j + 1] and span[2 * j] < span[2 * i + 1]:
                        bad_i, bad_j = i, j
        free(span)
        if bad_i < 0:
            return 0
        names = list(self._names) + ["indices", "weights"]
        if bad_j < 0:
            raise ValueError(f"out[{names[bad_i]!r}] overlaps the buffer's own memory; pass arrays of your own")
        raise ValueError(f"out[{names[bad_i]!r}] and out[{names[bad_j]!r}] share memory (overlap); each needs an "
                         f"array of its own")

    def sample(self, batch_size, beta=0.4, out=None) -> dict:
        """Draw ``batch_size`` transitions, proportionally to priority^alpha (uniformly for
        ``ReplayBuffer``), with replacement.

        Prioritized draws are stratified (Schaul et al. 2016, appendix B.2.1): the priority total is
        split into ``batch_size`` equal segments and one target is drawn uniformly in each, so each
        transition's expected count is exactly ``batch_size * P(i)`` with less variance than i.i.d.
        draws; the batch comes out ordered by slot, which lets the tree descent reuse cache lines.

        Returns ``{field: array[B, *shape], "indices": int64[B] transition ids, "weights":
        float64[B]}``. Weights are w(i) = (N P(i))^-beta / max_j w(j), where the max is taken at the
        smallest non-zero priority in the buffer (Schaul et al. 2016), i.e. ``(p_min / p_i)^beta``;
        all ones for ``ReplayBuffer``.

        ``out``: a dict an earlier ``sample`` of the same batch size returned; its arrays are filled in
        place and the same dict is returned (no allocation: a learner that samples in a loop can reuse
        one). Every array is checked first (ValueError, nothing written, when one does not fit).
        """
        self._enter()
        try:
            return self._sample_impl(batch_size, beta, out)
        finally:
            self._leave()

    cdef object _sample_impl(self, batch_size, beta, out):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {batch_size!r}")
        if batch_size < 1 or batch_size > 1 << 30:
            raise ValueError(f"batch_size must be in [1, 2**30], got {batch_size}")
        if type(beta) is not float and (isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating,
                                                                                        np.integer))):
            raise TypeError(f"beta must be a number in [0, 1], got {beta!r}")
        if not (0.0 <= beta <= 1.0):
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if out is not None and not isinstance(out, dict):
            raise TypeError(f"out must be a dict an earlier sample() returned, got {type(out).__name__}")
        if self._h.size == 0:
            raise ValueError("cannot sample from an empty buffer")
        cdef int64_t B = batch_size
        cdef int f, nf = self._n_fields
        cdef int64_t one = 1
        cdef list arrays              # the out arrays, each taken from ``out`` once and held here: a thread that
        if out is None:               # replaces an entry of ``out`` meanwhile cannot free what is being written
            arrays = [self._new_rows(f, B) for f in range(nf)]
            arrays.append(cnp.PyArray_EMPTY(1, <cnp.npy_intp*>&B, cnp.NPY_INT64, 0))
            arrays.append(cnp.PyArray_EMPTY(1, <cnp.npy_intp*>&B, cnp.NPY_FLOAT64, 0))
            out = dict(zip(self._names + ("indices", "weights"), arrays))
        else:
            arrays = [out.get(name) for name in self._names + ("indices", "weights")]
            for f in range(nf):
                self._out_array(arrays[f], self._names[f], self._dtypes[f], self._ndim[f], self._dims + f * MAX_DIMS, B)
            self._out_array(arrays[nf], "indices", _INT64, 0, &one, B)
            self._out_array(arrays[nf + 1], "weights", _FLOAT64, 0, &one, B)
            self._check_disjoint(arrays)
        cdef int64_t* ids = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>arrays[nf])
        cdef double* w = <double*>cnp.PyArray_DATA(<cnp.ndarray>arrays[nf + 1])
        # one block: the field destinations (nf pointers), then four scratch arrays of B entries each (slots,
        # pending, found: int64; prio: double)
        cdef char** dst = <char**>malloc(nf * sizeof(char*) + 4 * B * sizeof(int64_t))
        if dst == NULL:
            raise MemoryError()
        for f in range(nf):
            dst[f] = <char*>cnp.PyArray_DATA(<cnp.ndarray>arrays[f])
        cdef int64_t* slots = <int64_t*>(dst + nf)
        cdef int64_t* pending = slots + B
        cdef int64_t* found = slots + 2 * B
        cdef double* prio = <double*>(slots + 3 * B)
        cdef int64_t q, k, n_pending = B, n_next, spins = 0, RB = self._rb_total
        cdef double min_p = 1.0, beta_c = beta
        cdef int zero = 0
        for q in range(B):
            pending[q] = q
        try:
            with nogil:
                while n_pending > 0:
                    self._lock()
                    zero = self._draw(n_pending, pending, slots, ids, prio, found, &min_p)
                    self._unlock()
                    if zero:
                        break
                    if self._prioritized:       # (p_min / p)^beta, through one vector pow (``found`` is free now)
                        for q in range(n_pending):
                            (<double*>found)[q] = min_p / prio[pending[q]]
                        vpow(<double*>found, <double*>found, n_pending, beta_c)
                        for q in range(n_pending):
                            w[pending[q]] = (<double*>found)[q]
                    else:
                        for q in range(n_pending):
                            w[pending[q]] = 1.0
                    for f in range(nf):
                        _gather(dst[f], self._records, RB, self._off[f], self._row_bytes[f], pending, n_pending,
                                slots)
                    # seqlock check: keep rows whose slot still holds the id it had when drawn
                    self._lock()
                    n_next = 0
                    for q in range(n_pending):
                        k = pending[q]
                        if ids[k] < 0 or self._slot_ids[slots[k]] != ids[k]:
                            pending[n_next] = k
                            n_next += 1
                    self._unlock()
                    n_pending = n_next
                    if n_pending:
                        self._wait_for_writers(&spins)     # raises what a signal handler raised (Ctrl-C)
        finally:
            free(dst)
        if zero == 2:
            raise ValueError("cannot sample: the sum tree leads to an empty slot or past the last one (the shared "
                             "segment was corrupted?)")
        if zero == 3:
            raise ValueError("cannot sample from an empty buffer")
        if zero:
            raise ValueError("cannot sample: every stored priority is zero (eps=0 and all updates were 0)")
        return out

    def get(self, indices, fields=None) -> dict:
        """Rows of the stored transitions with ids ``indices`` (int[n], as ``add``/``sample`` return):
        ``{field: array[n, *shape]}`` for ``fields`` (default: all).

        Raises ``KeyError`` naming the first id that is not stored (not yet added, or overwritten
        since). Rows are copied without the lock and the GIL, then their ids are re-checked under
        the lock: an id that still holds its slot held it during the copy (ids only grow).
        """
        self._enter()
        try:
            return self._get_impl(indices, fields)
        finally:
            self._leave()

    cdef object _get_impl(self, indices, fields):
        idx = _as_index_array(indices)
        names = list(self._names) if fields is None else [fields] if isinstance(fields, str) else list(fields)
        unknown = [name for name in names if name not in self._specs]
        if unknown:
            raise KeyError(f"unknown field(s) {unknown}; this buffer stores {list(self._names)}")
        cdef int64_t n = idx.shape[0], q, f, rb, bad = -1, next_id = self._h.next_id
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        for q in range(n):
            if iv[q] < 0 or iv[q] >= next_id or iv[q] < next_id - self.capacity:
                raise KeyError(f"transition id {iv[q]} is not stored (stored ids: "
                               f"{max(0, next_id - self.capacity)}..{next_id - 1})")
        out = {}
        cdef int nf = len(names)
        cdef int64_t* which = <int64_t*>malloc(max(1, nf) * sizeof(int64_t))
        cdef char** dst = <char**>malloc(max(1, nf) * sizeof(char*))
        if which == NULL or dst == NULL:
            free(which); free(dst)
            raise MemoryError()
        for f, name in enumerate(names):
            shape, dtype = self._specs[name]
            arr = np.empty((n,) + shape, dtype=dtype)
            out[name] = arr
            which[f] = self._names.index(name)
            dst[f] = <char*>cnp.PyArray_DATA(<cnp.ndarray>arr)
        with nogil:
            for q in range(n):
                for f in range(nf):
                    rb = self._row_bytes[which[f]]
                    _copy(dst[f] + q * rb, self._row(iv[q] % self.capacity, which[f]), rb)
            self._lock()
            for q in range(n):
                if self._slot_ids[iv[q] % self.capacity] != iv[q]:
                    bad = iv[q]
                    break
            self._unlock()
        free(which); free(dst)
        if bad >= 0:
            raise KeyError(f"transition id {bad} is not stored (overwritten or still being written)")
        return out

    # ------------------------------------------------------------------ priorities

    def update_priorities(self, indices, priorities) -> int:
        """Set raw priorities (float[B], finite, >= 0) of transition ids ``indices`` (int[B]).

        Stored priority is ``(priority + eps) ** alpha``; it must stay below ``DBL_MAX / (2 capacity)``
        so that the total cannot overflow. Updates of stale ids (slot overwritten since) are dropped;
        duplicates: the last one wins. Returns the number applied. ``ReplayBuffer`` validates the same
        way and stores nothing.
        """
        self._enter()
        try:
            return self._update_priorities_impl(indices, priorities)
        finally:
            self._leave()

    cdef object _update_priorities_impl(self, indices, priorities):
        idx = _as_index_array(indices)
        if (type(priorities) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>priorities) == cnp.NPY_FLOAT64
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>priorities)):
            raw = priorities
        else:
            raw = np.ascontiguousarray(priorities, dtype=np.float64)
        cdef int64_t n = idx.shape[0]
        if raw.ndim != 1 or raw.shape[0] != n:
            raise ValueError(f"priorities must have shape ({n},), got {raw.shape}")
        if n == 0:
            return 0
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef const double* rv = <const double*>cnp.PyArray_DATA(<cnp.ndarray>raw)
        cdef int64_t b, limit = self._h.next_id
        cdef double top = 0
        for b in range(n):
            if iv[b] < 0 or iv[b] >= limit:
                raise IndexError(f"indices[{b}] = {iv[b]} out of range: valid transition ids are [0, {limit})")
            if not (rv[b] >= 0 and rv[b] < INFINITY):      # false for NaN, inf, negatives
                raise ValueError(f"priorities[{b}] = {rv[b]!r}: priorities must be finite and >= 0 "
                                 f"(no NaN, inf or negative values)")
            if rv[b] > top:
                top = rv[b]
        if self._prioritized and not self._stored_priority(top) <= self._prio_limit:
            self._check_priorities(raw)                     # raises, naming the limit
        # one block: slots and scratch (int64[n] each), stored values (double[n])
        cdef int64_t* slots = <int64_t*>malloc(3 * n * sizeof(int64_t))
        if slots == NULL:
            raise MemoryError()
        cdef int64_t* scratch = slots + n
        cdef double* sv = <double*>(slots + 2 * n)
        cdef double* values = sv
        cdef int64_t s, applied = 0
        cdef double raw_max = 0
        with nogil:
            if self._prioritized:       # stored values (p + eps)^alpha, outside the lock
                self._stored_priorities(rv, sv, n)
            self._lock()
            for b in range(n):
                s = iv[b] % self.capacity
                if self._slot_ids[s] == iv[b]:
                    slots[applied] = s
                    values[applied] = sv[b]          # applied <= b: compacts in place
                    if rv[b] > raw_max:
                        raw_max = rv[b]
                    applied += 1
            if self._prioritized and applied:
                self._tree_set_batch(slots, values, applied, scratch)
                if raw_max > self._h.max_priority:
                    self._h.max_priority = raw_max
            self._unlock()
        free(slots)
        return applied

    def get_priorities(self, indices) -> np.ndarray:
        """Stored priorities ``(p + eps) ** alpha`` of transition ids (float64[B]); NaN for stale ids,
        1.0 for a live id in ``ReplayBuffer``."""
        self._enter()
        try:
            return self._get_priorities_impl(indices)
        finally:
            self._leave()

    cdef object _get_priorities_impl(self, indices):
        idx = _as_index_array(indices)
        cdef int64_t n = idx.shape[0]
        if n and (idx.min() < 0 or idx.max() >= self._h.next_id):
            raise IndexError(f"indices out of range: valid transition ids are [0, {self._h.next_id})")
        out = np.empty(n, dtype=np.float64)
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef double* ov = <double*>cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef int64_t b, s
        with nogil:
            self._lock()
            for b in range(n):
                s = iv[b] % self.capacity
                if self._slot_ids[s] != iv[b]:
                    ov[b] = NAN
                elif self._prioritized:
                    ov[b] = tree_get(&self._tree, s)
                else:
                    ov[b] = 1.0
            self._unlock()
        return out

    # ------------------------------------------------------------------ persistence

    cdef _lock_quiescent(self):
        """Take the lock at a moment when no ``add_batch`` is between reserve and commit."""
        cdef int64_t spins = 0
        self._lock_gil()
        while self._h.inflight:
            self._unlock()
            with nogil:
                self._wait_for_writers(&spins)
            self._lock_gil()

    cdef dict _meta(self):
        return {
            "format": FILE_FORMAT, "version": FILE_VERSION,
            "kind": "prioritized" if self._prioritized else "uniform",
            "capacity": self.capacity,
            "fields": [[n, list(s), d.str] for n, (s, d) in self._specs.items()],
            "alpha": self._alpha, "eps": self._eps,
            "fanout": self._tree.fanout if self._prioritized else None,
            "next_id": self._h.next_id, "max_priority": self._h.max_priority,
        }

    def save(self, target) -> None:
        """Write contents, priorities, ring position, max priority and RNG state to ``target`` (a path
        or a writable binary file object): an uncompressed ``.npz``-format zip, streamed field by field
        (no full copy in memory). Saving to a path is atomic: the file is written beside it, flushed to
        disk and renamed over it, so a save that fails or is killed leaves the previous file intact.
        Other threads' calls wait while the file is written."""
        self._enter()
        try:
            return self._save_impl(target)
        finally:
            self._leave()

    cdef object _save_impl(self, target):
        if isinstance(target, (str, os.PathLike)):
            from pal_bench.atomic import atomic_open

            with atomic_open(target, "wb") as fh:
                self._save_to(fh)
        else:
            self._save_to(target)

    cdef _save_to(self, fh):
        cdef int64_t i
        self._lock_quiescent()
        try:
            meta = json.dumps(self._meta()).encode()
            arrays = {"__meta__": np.frombuffer(meta, dtype=np.uint8),
                      "slot_ids": self._slot_ids_arr,
                      "rng_state": np.array([self._rng.s[i] for i in range(4)], dtype=np.uint64)}
            if self._prioritized:
                leaves = np.empty(self.capacity, dtype=np.float64)
                for i in range(self.capacity):
                    leaves[i] = tree_get(&self._tree, i)
                arrays["priorities"] = leaves
            for name, arr in self._storage.items():
                arrays[f"field.{name}"] = arr
            np.savez(fh, **arrays)
        finally:
            self._unlock()

    @classmethod
    def load(cls, source, shared=False, name=None):
        """Rebuild a buffer written by ``save`` from ``source`` (a path or a readable binary file
        object), private or (``shared=True``) in a new shared segment. Every field of the file is
        checked against the others, and every member's size against the declared capacity and against
        the file, before anything is allocated: a file either restores a buffer whose invariants hold
        or raises ``ValueError``, using at most the memory a valid file of its capacity needs."""
        label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<file>"
        fh = open_source(source, label)
        try:
            return cls._load_from(fh, label, shared, name)
        finally:
            if fh is not source:
                fh.close()

    @classmethod
    def _load_from(cls, fh, str label, shared, name):
        try:
            with zipfile.ZipFile(fh) as zf:
                meta = validated_meta(zf, cls is PrioritizedReplayBuffer, file_size(fh, zf))
                fields = {n: (tuple(s), np.dtype(d)) for n, s, d in meta["fields"]}
                if meta["kind"] == "prioritized":
                    buf = PrioritizedReplayBuffer(meta["capacity"], fields, alpha=meta["alpha"],
                                                  fanout=meta["fanout"], eps=meta["eps"], seed=0,
                                                  shared=shared, name=name)
                else:
                    buf = ReplayBuffer(meta["capacity"], fields, seed=0, shared=shared, name=name)
                try:
                    (<_ReplayCore>buf)._restore(zf, meta)
                except BaseException:
                    buf.close()
                    raise
                return buf
        except (zipfile.BadZipFile, EOFError, KeyError, TypeError, OverflowError, json.JSONDecodeError,
                UnicodeDecodeError, NotImplementedError, RuntimeError) as e:
            raise ValueError(f"{label}: not a PAL-Bench replay buffer file, or truncated ({e!r})") from e
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from e

    cdef _restore(self, zf, dict meta):
        cdef int64_t i, cap = self.capacity, next_id = int(meta["next_id"])
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
        live = slot_ids >= 0
        if self._prioritized:
            leaves = read_member(zf, "priorities", np.empty(cap, dtype=np.float64))
            if not (np.isfinite(leaves).all() and (leaves >= 0).all() and (leaves[~live] == 0).all()):
                raise ValueError("invalid priorities")
            if (leaves > self._prio_limit).any():
                raise ValueError("priorities too large: their sum could overflow")
            if self._eps > 0 and (leaves[live] <= 0).any():
                raise ValueError("a stored transition has priority 0 although eps > 0")
            if not self._stored_priority(float(meta["max_priority"])) <= self._prio_limit:
                raise ValueError("max_priority too large: new transitions' priorities could overflow the sum")
        for name, arr in self._storage.items():
            read_member(zf, f"field.{name}", arr)
        if self._prioritized:
            for i in range(cap):
                self._tree.sums[leaf_pos(&self._tree, i)] = leaves[i]
            tree_rebuild(&self._tree)
        self._slot_ids_arr[:] = slot_ids
        self._h.next_id = next_id
        self._h.size = int(live.sum())
        self._h.max_priority = float(meta["max_priority"])
        for i in range(4):
            self._rng.s[i] = int(rng_state[i])

    # ------------------------------------------------------------------ pickling

    def __reduce__(self):
        """A shared buffer pickles as a reference (``attach`` by name in the receiving process); a
        private one as its full contents, in ``save``'s format."""
        self._check_open()
        if self._name:
            return (type(self).attach, (self._name,))
        fh = io.BytesIO()
        self.save(fh)
        return (_load_bytes, (type(self), fh.getvalue()))

    def __deepcopy__(self, memo):
        """An independent private copy with the same contents, priorities, counters and RNG state."""
        self._check_open()
        fh = io.BytesIO()
        self.save(fh)
        fh.seek(0)
        return type(self).load(fh)

    def _check_invariants(self) -> None:
        """Verify the tree and the slot table (for tests). Raises AssertionError. O(N)."""
        self._enter()
        try:
            return self._check_invariants_impl()
        finally:
            self._leave()

    cdef object _check_invariants_impl(self):
        cdef int64_t i
        cdef int bad
        self._lock_quiescent()
        try:
            ids = self._slot_ids_arr.copy()
            live = ids >= 0
            assert int(live.sum()) == self._h.size, f"size {self._h.size} != live slots {int(live.sum())}"
            assert (ids[live] % self.capacity == np.nonzero(live)[0]).all(), "slot table holds foreign ids"
            assert (ids[live] < self._h.next_id).all(), "slot table holds future ids"
            assert (ids >= SLOT_EMPTY).all(), "slot table holds in-flight slots while quiescent"
            if self._prioritized:
                bad = tree_check(&self._tree)
                assert bad == -1, f"tree level {bad} disagrees with its children"
                leaves = np.array([tree_get(&self._tree, i) for i in range(self.capacity)])
                assert (leaves[~live] == 0).all(), "an empty slot has a priority"
                assert (leaves[live] > 0).all() or self._eps == 0, "a live slot has zero priority"
                exact = math.fsum(leaves)
                assert math.isfinite(exact), "the total overflowed"
                assert abs(tree_total(&self._tree) - exact) <= 1e-9 * max(exact, 1e-300), "total drifted"
        finally:
            self._unlock()

    def _debug_hold_lock(self, double seconds) -> None:
        """Tests: hold the buffer's lock for ``seconds`` (to be killed while holding it)."""
        self._enter()
        try:
            return self._debug_hold_lock_impl(seconds)
        finally:
            self._leave()

    cdef object _debug_hold_lock_impl(self, double seconds):
        self._lock_gil()
        with nogil:
            usleep(<unsigned int>(seconds * 1e6))
        self._unlock()


def _load_bytes(cls, bytes data):
    return cls.load(io.BytesIO(data))


cdef object _as_index_array(indices):
    """``indices`` as a C-contiguous int64[B] array; TypeError/ValueError for anything else."""
    if type(indices) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>indices) == cnp.NPY_INT64:
        idx = indices if cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>indices) else np.ascontiguousarray(indices)
    else:
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = np.ascontiguousarray(idx, dtype=np.int64)
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
    return idx


cdef class ReplayBuffer(_ReplayCore):
    """Uniform replay buffer with the same API as ``PrioritizedReplayBuffer`` (weights all 1).

    Parameters
    ----------
    capacity : int
        Slots in the ring (>= 1).
    fields : dict
        ``{name: (shape, dtype)}``; ``shape`` is ``()`` for a scalar per transition.
    seed : int or None
        Seed of the sampling RNG (xoshiro256**); None draws one from the OS.
    shared : bool
        Place the buffer in a named shared-memory segment (``attach`` it from other processes).
    name : str or None
        The segment's name with ``shared=True`` (default: ``pal-<pid>-<random>``).
    """

    def __init__(self, capacity, fields, seed=None, shared=False, name=None):
        self._setup(capacity, fields, seed, False, 0.0, 0.0, 2, shared, name)

    def __repr__(self) -> str:
        where = f", shared_name={self._name!r}" if self._name else ""
        size = "closed" if self._closed else f"size={len(self)}"
        return f"ReplayBuffer(capacity={self.capacity}, {size}, fields={list(self._names)}{where})"


cdef class PrioritizedReplayBuffer(_ReplayCore):
    """Prioritized replay (Schaul et al. 2016, proportional variant) on a K-ary sum tree.

    Sampling is O(B K log_K N) and priority updates O(B K log_K N), with the tree walk under a
    short lock and row copies outside it without the GIL. See the module docstring for indices
    (transition ids), memory, sharing across processes and the concurrency scheme.

    Parameters
    ----------
    capacity : int
        Slots in the ring (>= 1).
    fields : dict
        ``{name: (shape, dtype)}``; ``shape`` is ``()`` for a scalar per transition.
    alpha : float
        Priority exponent in [0, 1]; 0 is uniform.
    fanout : int
        K of the sum tree (default 16, chosen by measurement: see ``pal_bench.SumTree``).
    eps : float
        Added to every raw priority before the exponent (>= 0), so a zero TD error stays sampleable.
    seed : int or None
        Seed of the sampling RNG (xoshiro256**); None draws one from the OS.
    shared : bool
        Place the buffer in a named shared-memory segment (``attach`` it from other processes).
    name : str or None
        The segment's name with ``shared=True`` (default: ``pal-<pid>-<random>``).
    """

    def __init__(self, capacity, fields, alpha=0.6, fanout=DEF_FANOUT, eps=1e-6, seed=None, shared=False,
                 name=None):
        if isinstance(alpha, bool) or not (isinstance(alpha, (int, float, np.floating, np.integer))
                                           and 0.0 <= alpha <= 1.0):
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        if isinstance(eps, bool) or not (isinstance(eps, (int, float, np.floating, np.integer)) and math.isfinite(eps)
                                         and eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or not 2 <= fanout <= 4096:
            raise ValueError(f"fanout must be an int in [2, 4096], got {fanout!r}")
        self._setup(capacity, fields, seed, True, float(alpha), float(eps), fanout, shared, name)

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def eps(self) -> float:
        return self._eps

    @property
    def fanout(self) -> int:
        return self._tree.fanout

    def total_priority(self) -> float:
        """Sum of stored priorities (the tree's root)."""
        self._check_open()
        return tree_total(&self._tree)

    def min_priority(self) -> float:
        """Smallest non-zero stored priority (inf when empty). O(1)."""
        self._check_open()
        return tree_min_nonzero(&self._tree)

    def __repr__(self) -> str:
        where = f", shared_name={self._name!r}" if self._name else ""
        size = "closed" if self._closed else f"size={len(self)}"
        return (f"PrioritizedReplayBuffer(capacity={self.capacity}, {size}, "
                f"alpha={self._alpha}, fanout={self._tree.fanout}, fields={list(self._names)}{where})")
