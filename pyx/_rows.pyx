# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The row store: ``RowStore``, a handle's typed view of a buffer's block (``pal_bench._segment``): where each
field sits in a record, the slot table, the sum tree's arrays and the handle's random stream. It makes a block
(``_setup``), attaches to a shared one and checks every word of it (``_open_shared``), repairs what dead writers
left (``_repair``), converts values to rows and checks ``out`` arrays; ``gather_rows`` / ``scatter_rows`` copy
field rows between records and packed arrays. The hot paths that use all this are ``pal_bench._replay``'s."""

import json
import math
import mmap
import os

import numpy as np

from pal_bench.replay_layout import HIDDEN_FIELD, normalise_fields, record_layout, segment_path, spec_json

cimport numpy as cnp
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.fcntl cimport O_RDWR
from posix.mman cimport shm_open
from posix.unistd cimport close as c_close

from _common cimport SCALAR_SCRATCH, SLOT_EMPTY, SLOT_INFLIGHT
from _lock cimport mutex_init, pthread_mutex_unlock
from _ndarray cimport new_array
from _rng cimport rng_seed
from _tree_core cimport leaf_pos, tree_check, tree_get, tree_layout, tree_rebuild
from _vmath cimport vpow1
from pal_bench._segment cimport (
    HEADER_BYTES,
    MAX_RESERVATIONS,
    Header,
    ReadOnlyBlock,
    SegmentHandle,
    block_layout,
    pid_dead,
    shm_create,
)

from pal_bench._segment import SEGMENT_MAGIC, SEGMENT_VERSION, SHM_DIR

cnp.import_array()

cdef extern from "<float.h>":
    double DBL_MAX

cdef enum:
    MAX_SPEC_BYTES = 1 << 20  # the fields' JSON description in a block


cdef void gather_rows(char* dst, const char* records, int64_t record_bytes, int64_t off, int64_t n,
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


cdef void scatter_rows(char* records, int64_t record_bytes, int64_t off, int64_t n, const char* src,
                       int64_t first, int64_t count) noexcept nogil:
    """Copy ``count`` consecutive field rows of ``n`` bytes from ``src`` into the records of slots
    ``first .. first + count - 1``, at offset ``off``: the inverse of ``gather_rows`` for a run of slots, one
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


cdef class RowStore(SegmentHandle):
    """A handle's typed view of a buffer's block; the buffers (``pal_bench._replay``) build on it."""

    def __cinit__(self, *args, **kwargs):
        self._off = NULL
        self._row_bytes = NULL
        self._typenum = NULL
        self._ndim = NULL
        self._dims = NULL
        self._native = NULL
        self._max_raw = NAN

    def __dealloc__(self):
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
        self._hidden_off = -1
        for name, shape, dstr, off in spec:
            if name == HIDDEN_FIELD:
                if tuple(shape) != () or np.dtype(dstr) not in (np.dtype(np.bool_), np.dtype(np.uint8)):
                    raise ValueError(f"field {HIDDEN_FIELD!r} is reserved for rows that are stored but never "
                                     f"drawn (bool or uint8, shape (); nonzero: hidden); got {np.dtype(dstr)} "
                                     f"{tuple(shape)}")
                self._hidden_off = off
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

    cdef _open_shared(self, name, seed, bint want_prioritized):
        """(``attach``) Map the shared segment ``name``, check its header and guarded words, bind this handle;
        nothing in the segment is trusted (ValueError naming the first header word that is wrong)."""
        segment_path(name)                  # validates it before anything else
        seed = self._check_seed(seed)
        size = self._open_named(name, "buffer")
        try:
            self._check_layout(size, want_prioritized)
            self._bind(seed, 0)
            self._seed_stream(self._join_segment())
        except BaseException:
            self._closed = True
            self._release()
            raise

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
        """(attach) Take the lock (``_join_lock``: waiting at most ``ATTACH_LOCK_TIMEOUT_S``), check the words it
        guards and the slot table, count this handle; returns its index (for its random stream)."""
        cdef Header* h = self._h
        self._join_lock()
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


    cdef void _release(self):
        self._storage = {}
        self._ro_storage = {}
        self._slot_ids_arr = None
        SegmentHandle._release(self)

    # ------------------------------------------------------------------ fork and repair

    cdef void _forked(self, int64_t pid) noexcept nogil:
        """A forked child's handle draws from its own random stream."""
        self._seed ^= <uint64_t>pid * <uint64_t>0x9E3779B97F4A7C15
        self._seed_stream(0)

    cdef void _repair(self, bint holder_died) noexcept nogil:
        """(lock held) Undo what dead writers left: reservations of dead processes are dropped and their
        in-flight slots emptied. When a holder died mid-section (``holder_died``), in-flight slots that no
        live writer owns are emptied too, live slots whose leaf is zero get the max priority, and the tree
        and size are rebuilt."""
        cdef Header* h = self._h
        cdef int64_t r, i, s, cap = self.capacity, size = 0, live_res = 0
        cdef bint any_dead = False
        cdef double stored_new = vpow1(h.max_priority + self._eps, self._alpha) if self._prioritized else 0.0
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
                    self._tree.sums[leaf_pos(&self._tree, s)] = stored_new
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

    # ------------------------------------------------------------------ output arrays

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

    cdef int _check_disjoint(self, list arrays, tuple names) except -1:
        """The ``out`` arrays (each C-contiguous, checked before) occupy disjoint bytes, none of them the buffer's
        own: rows written through one array must not change another (``weights`` aliasing ``indices`` made the
        seqlock check fail for ever)."""
        cdef int n = len(arrays), i, j, bad_i = -1, bad_j = -1
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
        if bad_j < 0:
            raise ValueError(f"out[{names[bad_i]!r}] overlaps the buffer's own memory; pass arrays of your own")
        raise ValueError(f"out[{names[bad_i]!r}] and out[{names[bad_j]!r}] share memory (overlap); each needs an "
                         f"array of its own")
