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

Code
----
One module per concept, each building on the one before: ``_segment`` (the block as a mapping, its
life and its robust lock: ``SegmentHandle``), ``_rows`` (the fields' layout, the slot table, the tree's
arrays, making, attaching, checking and repairing a block, the row copy kernels: ``RowStore``), this
module (the hot paths: insert, sample, get, update), ``replay_files`` (save, load and the invariant
check, in Python) and the tree itself in ``_tree_core.pxd`` / ``_sumtree``.
"""

import io
import math

import numpy as np

from pal_bench.replay_files import check_invariants, load_buffer, save_buffer
from pal_bench.replay_layout import HIDDEN_FIELD

cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_REFCNT
from libc.math cimport INFINITY, NAN
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from _common cimport DEFAULT_FANOUT_C, MAX_FAST_FIELDS, SCALAR_SCRATCH, SLOT_EMPTY, SLOT_INFLIGHT
from _rng cimport rng_uniform
from _tree_core cimport (
    __builtin_prefetch,
    leaf_pos,
    tree_check,
    tree_find_sorted,
    tree_get,
    tree_min_nonzero,
    tree_rebuild,
    tree_set,
    tree_set_batch,
    tree_total,
)
from _vmath cimport vpow, vpow1
from pal_bench._rows cimport MAX_DIMS, RowStore, gather_rows, scatter_rows
from pal_bench._segment cimport MAX_RESERVATIONS, Header

cnp.import_array()

_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned int usec)

DEF_FANOUT = DEFAULT_FANOUT_C
# sample() without ``out=``: a batch of at least this many bytes reuses output arrays no one holds any more, so that
# big rows (an Atari batch is 14 MB) do not pay fresh pages from the kernel on every call
cdef int64_t POOL_MIN_BYTES = 256 * 1024
cdef Py_ssize_t POOL_PER_BATCH = 3       # kept per batch size: the caller's last batch, the one before, a spare
cdef Py_ssize_t POOL_BATCH_SIZES = 4     # batch sizes kept (a learner uses one or two)
cdef int64_t MAX_HIDDEN_REDRAWS = 1000   # uniform draws that may land on hidden rows before sample() gives up
cdef int64_t MAX_NEXT_ID = 1 << 62     # transition ids stay below this (no int64 overflow in id arithmetic)
_CORRUPT_NEXT_ID = "the shared segment's header word next_id was overwritten with an impossible value (corrupted)"

cdef enum:
    SPIN_BEFORE_REAP = 64     # waits on an in-flight slot before checking for dead writers
    SPIN_BEFORE_SIGNALS = 1024    # waits on an in-flight slot before letting Python's signal handlers run


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


cdef class _ReplayCore(RowStore):
    """The hot paths of both buffers (insert, sample, get, update) and their files; use ``ReplayBuffer`` or
    ``PrioritizedReplayBuffer``."""

    cdef dict _out_pool           # batch size -> list of tuples of output arrays no caller holds (big batches)

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
        cdef _ReplayCore buf = cls.__new__(cls)
        buf._open_shared(name, seed, cls is PrioritizedReplayBuffer)
        return buf

    # ------------------------------------------------------------------ validation helpers

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

    cdef inline bint _hidden(self, int64_t slot) noexcept nogil:
        """The row in ``slot`` is a hidden one (its ``_hidden`` field set): never drawn, never re-prioritised."""
        return self._hidden_off >= 0 and self._records[slot * self._rb_total + self._hidden_off] != 0

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
            tree_set(&self._tree, slot, 0.0 if self._hidden(slot) else self._new_priority())
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
                        scatter_rows(self._records, RB, self._off[f], self._row_bytes[f], src[f], s, run)
                        if run < m:
                            scatter_rows(self._records, RB, self._off[f], self._row_bytes[f],
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
                        if self._hidden_off >= 0:
                            for r in range(m):
                                if self._hidden(slots[r]):
                                    values[r] = 0.0
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
        3 if nothing is stored, 4 if uniform draws kept landing on hidden rows. Each drawn record is prefetched for the gather."""
        cdef int64_t q, k, s, hi, tries
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
                if self._hidden_off >= 0:           # hidden rows are drawn again (a bounded number of times)
                    tries = 0
                    while self._hidden(s):
                        tries += 1
                        if tries > MAX_HIDDEN_REDRAWS:
                            return 4
                        s = <int64_t>(rng_uniform(&self._rng) * hi)
                slots[k] = s
                _prefetch_record(self._records + s * self._rb_total, self._rb_total)
                ids[k] = self._slot_ids[s]
        return 0


    def sample(self, batch_size, beta=0.4, out=None, fields=None) -> dict:
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
        one). Every array is checked first (ValueError, nothing written, when one does not fit). Without ``out``, a
        batch of 256 KB or more reuses output arrays of an earlier call that no one references any more (no dict,
        view, tensor or variable of a caller), so big rows do not pay fresh pages on every call.

        ``fields``: the names of the fields to return (default all); the others are not copied.
        """
        self._enter()
        try:
            return self._sample_impl(batch_size, beta, out, fields)
        finally:
            self._leave()

    cdef object _sample_impl(self, batch_size, beta, out, fields):
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
        cdef tuple names = self._names
        cdef list sel = list(range(self._n_fields))
        if fields is not None:
            names = (fields,) if isinstance(fields, str) else tuple(fields)
            unknown = [n for n in names if n not in self._specs]
            if unknown or len(set(names)) != len(names) or not names:
                raise ValueError(f"fields must name distinct fields of {list(self._names)}, got {fields!r}")
            sel = [self._names.index(n) for n in names]
        cdef int64_t B = batch_size
        cdef int f, g, nf = len(names)
        cdef int64_t one = 1
        cdef bint poolable = fields is None and B * self._rb_total >= POOL_MIN_BYTES
        cdef list arrays              # the out arrays, each taken from ``out`` once and held here: a thread that
        cdef tuple pooled = None      # replaces an entry of ``out`` meanwhile cannot free what is being written
        if out is None:
            if poolable:
                pooled = self._take_pooled(B)
            if pooled is not None:
                arrays = list(pooled)
            else:
                arrays = [self._new_rows(<int>sel[f], B) for f in range(nf)]
                arrays.append(cnp.PyArray_EMPTY(1, <cnp.npy_intp*>&B, cnp.NPY_INT64, 0))
                arrays.append(cnp.PyArray_EMPTY(1, <cnp.npy_intp*>&B, cnp.NPY_FLOAT64, 0))
                if poolable:
                    pooled = tuple(arrays)
            out = dict(zip(names + ("indices", "weights"), arrays))
        else:
            arrays = [out.get(name) for name in names + ("indices", "weights")]
            for f in range(nf):
                g = sel[f]
                self._out_array(arrays[f], self._names[g], self._dtypes[g], self._ndim[g], self._dims + g * MAX_DIMS, B)
            self._out_array(arrays[nf], "indices", _INT64, 0, &one, B)
            self._out_array(arrays[nf + 1], "weights", _FLOAT64, 0, &one, B)
            self._check_disjoint(arrays, names + ("indices", "weights"))
        cdef int64_t* ids = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>arrays[nf])
        cdef double* w = <double*>cnp.PyArray_DATA(<cnp.ndarray>arrays[nf + 1])
        # one block: the field destinations (nf pointers), then four scratch arrays of B entries each (slots,
        # pending, found: int64; prio: double)
        cdef char** dst = <char**>malloc(nf * sizeof(char*) + (4 * B + nf) * sizeof(int64_t))
        if dst == NULL:
            raise MemoryError()
        for f in range(nf):
            dst[f] = <char*>cnp.PyArray_DATA(<cnp.ndarray>arrays[f])
        cdef int64_t* slots = <int64_t*>(dst + nf)
        cdef int64_t* which = slots + 4 * B         # the stored field behind each output field
        for f in range(nf):
            which[f] = <int64_t>sel[f]
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
                        gather_rows(dst[f], self._records, RB, self._off[which[f]], self._row_bytes[which[f]], pending,
                                    n_pending, slots)
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
        if zero == 4:
            raise ValueError(f"cannot sample: {MAX_HIDDEN_REDRAWS} uniform draws in a row hit hidden rows (every row "
                             f"hidden, or too few visible ones to draw among by rejection)")
        if zero:
            raise ValueError("cannot sample: every stored priority is zero (every row hidden, or eps=0 and all updates "
                             "were 0)")
        if pooled is not None:
            self._give_pooled(B, pooled)
        return out

    cdef tuple _take_pooled(self, int64_t B):
        """(GIL held) A tuple of output arrays for batch size ``B`` that no one outside the pool references any
        more (no dict, view, tensor or variable of a caller: each array's reference count is the tuple's and this
        loop's), taken out of the pool; None when there is none. The check and the removal run without a Python
        call between them, so two threads cannot take the same one."""
        if self._out_pool is None:
            return None
        cdef list kept = self._out_pool.get(B)
        if not kept:
            return None
        cdef Py_ssize_t i
        cdef tuple t
        cdef bint free
        for i in range(len(kept)):
            t = <tuple>kept[i]
            free = True
            for a in t:
                if Py_REFCNT(a) != 2:
                    free = False
                    break
            if free:
                del kept[i]
                if self._still_fits(t, B):
                    return t
                return None          # a caller changed it (shape, dtype, flags) before dropping it: not reused
        return None

    cdef bint _still_fits(self, tuple t, int64_t B):
        """The pooled arrays are still what ``sample`` made: each writable, C-contiguous, of its field's dtype and
        shape [B, *shape] (a caller may have set ``.shape``, ``.dtype`` or ``.flags.writeable`` on one)."""
        cdef int f, nf = self._n_fields
        cdef int64_t one = 1
        try:
            for f in range(nf):
                self._out_array(t[f], self._names[f], self._dtypes[f], self._ndim[f], self._dims + f * MAX_DIMS, B)
            self._out_array(t[nf], "indices", _INT64, 0, &one, B)
            self._out_array(t[nf + 1], "weights", _FLOAT64, 0, &one, B)
        except ValueError:
            return False
        return True

    cdef void _give_pooled(self, int64_t B, tuple arrays):
        """Keep ``arrays`` for a later ``sample`` of batch size ``B`` (at most ``POOL_PER_BATCH`` per size)."""
        if self._out_pool is None:
            self._out_pool = {}
        cdef list kept = self._out_pool.get(B)
        if kept is None:
            if len(self._out_pool) >= POOL_BATCH_SIZES:      # the oldest batch size's arrays go
                del self._out_pool[next(iter(self._out_pool))]
            kept = self._out_pool[B] = []
        if len(kept) < POOL_PER_BATCH:
            kept.append(arrays)

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

    def gather_window(self, indices, field, lo, hi, out=None):
        """Field ``field`` of the transitions with ids ``i + lo .. i + hi`` for each id ``i`` of ``indices`` (int[B];
        ``lo <= 0 <= hi``): returns ``(window, ok)``, ``window`` of shape [B, hi - lo + 1, *shape] and ``ok``
        bool[B]. ``ok[b]`` is False where one id of row b's window is not stored (never added, overwritten, or
        being written): that row of ``window`` means nothing. ``out``: an array of that shape and dtype to fill
        (C-contiguous). Rows are copied with the lock and the GIL released and their ids checked under the lock
        afterwards (``get``'s seqlock). ``pal_bench.frame_replay`` rebuilds frame stacks with it.
        """
        self._enter()
        try:
            return self._gather_window_impl(indices, field, lo, hi, out)
        finally:
            self._leave()

    cdef object _gather_window_impl(self, indices, field, lo_, hi_, out):
        idx = _as_index_array(indices)
        if field not in self._specs:
            raise KeyError(f"unknown field {field!r}; this buffer stores {list(self._names)}")
        if isinstance(lo_, bool) or isinstance(hi_, bool) or not isinstance(lo_, (int, np.integer)) \
                or not isinstance(hi_, (int, np.integer)):
            raise TypeError(f"lo and hi must be ints, got {lo_!r}, {hi_!r}")
        if not (-self.capacity < lo_ <= 0 <= hi_ < self.capacity):
            raise ValueError(f"need -capacity < lo <= 0 <= hi < capacity, got lo={lo_}, hi={hi_}")
        shape, dtype = self._specs[field]
        cdef int64_t lo = lo_, hi = hi_, W = hi_ - lo_ + 1
        cdef int64_t n = idx.shape[0], q, j, t, rb, next_id, cap = self.capacity
        want = (n, W) + shape
        if out is None:
            win = np.empty(want, dtype=dtype)
        else:
            if (not isinstance(out, np.ndarray) or out.shape != want or out.dtype != dtype
                    or not out.flags.c_contiguous or not out.flags.writeable):
                raise ValueError(f"out must be a writeable C-contiguous {dtype} array of shape {want}")
            win = out
        ok = np.ones(n, dtype=np.bool_)
        cdef int f = self._names.index(field)
        rb = self._row_bytes[f]
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef char* dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>win)
        cdef char* okv = <char*>cnp.PyArray_DATA(<cnp.ndarray>ok)
        with nogil:
            next_id = self._h.next_id
            for q in range(n):
                # (no sum can overflow: next_id <= 2**62 and |lo|, hi < capacity)
                if iv[q] < -lo or iv[q] >= next_id - hi or iv[q] + lo < next_id - cap:
                    okv[q] = 0
                    continue
                for j in range(W):
                    t = iv[q] + lo + j
                    _copy(dst + (q * W + j) * rb, self._row(t % cap, f), rb)
            self._lock()
            for q in range(n):
                if okv[q]:
                    for j in range(W):
                        t = iv[q] + lo + j
                        if self._slot_ids[t % cap] != t:
                            okv[q] = 0
                            break
            self._unlock()
        return win, ok

    def hide_rows(self, indices) -> int:
        """Hide the stored transitions with ids ``indices`` (int[B]): their ``_hidden`` field is set (to 3) and their
        priority to 0, so they are never drawn or re-prioritised again (``pal_bench.frame_replay`` hides steps whose
        frame window the ring has cut). Stale ids are skipped. Returns how many were hidden. ValueError for a buffer
        without a ``_hidden`` field."""
        self._enter()
        try:
            if self._hidden_off < 0:
                raise ValueError(f"this buffer has no {HIDDEN_FIELD!r} field: nothing can be hidden")
            idx = _as_index_array(indices)
            return self._hide_impl(idx)
        finally:
            self._leave()

    cdef int64_t _hide_impl(self, idx):
        cdef int64_t n = idx.shape[0], b, s, done = 0
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        for b in range(n):
            if iv[b] < 0 or iv[b] >= MAX_NEXT_ID:
                raise IndexError(f"indices[{b}] = {iv[b]} is not a transition id")
        with nogil:
            self._lock()
            for b in range(n):
                s = iv[b] % self.capacity
                if self._slot_ids[s] == iv[b]:
                    self._records[s * self._rb_total + self._hidden_off] = 3
                    if self._prioritized:
                        tree_set(&self._tree, s, 0.0)
                    done += 1
            self._unlock()
        return done

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
        raw = np.array(priorities, dtype=np.float64, order="C", copy=True)    # private: checked is what is stored
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
                if self._slot_ids[s] == iv[b] and not self._hidden(s):
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
        1.0 for a live id in ``ReplayBuffer`` (0.0 for a hidden row, which is never drawn)."""
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
                    ov[b] = 0.0 if self._hidden(s) else 1.0
            self._unlock()
        return out

    # ------------------------------------------------------------------ files (``pal_bench.replay_files``)

    cdef _lock_quiescent(self):
        """Take the lock at a moment when no ``add_batch`` is between reserve and commit."""
        cdef int64_t spins = 0
        self._lock_gil()
        while self._h.inflight:
            self._unlock()
            with nogil:
                self._wait_for_writers(&spins)
            self._lock_gil()

    def save(self, target) -> None:
        """Write contents, priorities, ring position, max priority and RNG state to ``target`` (a path
        or a writable binary file object): an uncompressed ``.npz``-format zip, streamed field by field
        (no full copy in memory). Saving to a path is atomic: the file is written beside it, flushed to
        disk and renamed over it, so a save that fails or is killed leaves the previous file intact.
        Other threads' calls wait while the file is written."""
        save_buffer(self, target)

    @classmethod
    def load(cls, source, shared=False, name=None):
        """Rebuild a buffer written by ``save`` from ``source`` (a path or a readable binary file
        object), private or (``shared=True``) in a new shared segment. Every field of the file is
        checked against the others, and every member's size against the declared capacity and against
        the file, before anything is allocated: a file either restores a buffer whose invariants hold
        or raises ``ValueError``, using at most the memory a valid file of its capacity needs."""
        return load_buffer(source, cls is PrioritizedReplayBuffer, _KINDS, shared, name)

    def _quiescent(self):
        """(``replay_files``) A context manager: the lock held at a moment when no ``add_batch`` is between reserve
        and commit, yielding ``_state()`` (views into the block: read them inside the block only)."""
        return _Quiescent(self)

    cdef dict _state(self):
        """(lock held) What a file holds and what the checks read: metadata, the slot table (a view), the RNG
        state, the leaves' priorities (a copy; None when uniform), the fields (views), the tree's checks."""
        cdef int64_t i
        leaves = None
        if self._prioritized:
            leaves = np.empty(self.capacity, dtype=np.float64)
            for i in range(self.capacity):
                leaves[i] = tree_get(&self._tree, i)
        meta = {"kind": "prioritized" if self._prioritized else "uniform", "capacity": self.capacity,
                "fields": [[n, list(s), d.str] for n, (s, d) in self._specs.items()],
                "alpha": self._alpha, "eps": self._eps, "fanout": self._tree.fanout if self._prioritized else None,
                "next_id": self._h.next_id, "max_priority": self._h.max_priority}
        return {"meta": meta, "size": self._h.size, "slot_ids": self._slot_ids_arr,
                "rng_state": np.array([self._rng.s[i] for i in range(4)], dtype=np.uint64),
                "priorities": leaves, "fields": dict(self._storage),
                "tree_bad_level": tree_check(&self._tree) if self._prioritized else -1,
                "total": tree_total(&self._tree) if self._prioritized else 0.0}

    def _fields_to_fill(self) -> dict:
        """(``load``, on the buffer it has just made) Writable views of every field."""
        self._check_open()
        return dict(self._storage)

    def _set_state(self, slot_ids, leaves, int64_t next_id, double max_priority, rng_state) -> None:
        """(``load``, on the buffer it has just made, checked by ``replay_files``) Put the slot table, the leaves'
        priorities (float64[capacity], rebuilding the tree; None when uniform), the ring position, the max
        priority and the RNG state in place. ValueError, changing nothing, when the max priority could overflow
        the tree's sum."""
        cdef int64_t i, cap = self.capacity
        self._check_open()
        if self._prioritized and not self._stored_priority(max_priority) <= self._prio_limit:
            raise ValueError("max_priority too large: new transitions' priorities could overflow the sum")
        if self._prioritized:
            for i in range(cap):
                self._tree.sums[leaf_pos(&self._tree, i)] = leaves[i]
            tree_rebuild(&self._tree)
        self._slot_ids_arr[:] = slot_ids
        self._h.next_id = next_id
        self._h.size = int((slot_ids >= 0).sum())
        self._h.max_priority = max_priority
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
        check_invariants(self)

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


cdef class _Quiescent:
    """``buf._quiescent()``: the buffer's lock held while no writer is between reserve and commit."""
    cdef _ReplayCore _buf

    def __cinit__(self, _ReplayCore buf):
        self._buf = buf

    def __enter__(self):
        self._buf._enter()
        try:
            self._buf._lock_quiescent()
        except BaseException:
            self._buf._leave()
            raise
        try:
            return self._buf._state()
        except BaseException:
            self._buf._unlock()
            self._buf._leave()
            raise

    def __exit__(self, *exc):
        self._buf._unlock()
        self._buf._leave()
        return False


cdef object _as_index_array(indices):
    """``indices`` as a private C-contiguous int64[B] copy (what is checked is what is used: another thread, or an
    ``out`` array sharing its memory, cannot change an id between the check and the copy that reads with it);
    TypeError/ValueError for anything else."""
    if type(indices) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>indices) == cnp.NPY_INT64:
        idx = np.array(indices, order="C", copy=True)
    else:
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = np.array(idx, dtype=np.int64, order="C", copy=True)
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

    #: the buffer protocol's declaration (pal_bench.bench.protocol): uniform draws, no priorities kept
    PRIORITIZED = False

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


_KINDS = {"prioritized": PrioritizedReplayBuffer, "uniform": ReplayBuffer}
