# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Thread-safe replay buffers: ``PrioritizedReplayBuffer`` (K-ary sum tree) and ``ReplayBuffer``.

Storage is one preallocated numpy array per field (struct of arrays), used as a ring.

Indices
-------
Every transition gets a *transition id*, a number that grows by one per inserted transition and
is never reused. Its slot is ``id % capacity``. ``add``/``add_batch`` return ids, ``sample``
returns ids under ``"indices"``, and ``update_priorities`` takes ids back: an id whose slot has
been overwritten since is *stale*, and its update is dropped (counted in the return value).

Concurrency
-----------
One mutex guards the tree and the slot bookkeeping (slot -> id, ring position, size). It is
never held around Python-level work. ``add_batch`` reserves its slots under the lock, copies
the rows with the lock and the GIL released, then commits under the lock. ``sample`` draws and
descends the tree under the lock, gathers rows with the lock and the GIL released, then
re-checks under the lock that each slot still holds the id it had when drawn (a seqlock); rows
that were overwritten meanwhile are drawn again, so a sampled transition is never torn.
"""

import json
import math
import zipfile

import numpy as np

cimport numpy as cnp
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.math cimport INFINITY, NAN, pow
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from _rng cimport Rng, rng_seed, rng_uniform
from _tree_core cimport (
    TreeLayout,
    leaf_pos,
    tree_check,
    tree_find_batch,
    tree_get,
    tree_init,
    tree_min_nonzero,
    tree_rebuild,
    tree_set,
    tree_set_batch,
    tree_total,
)

cnp.import_array()

cdef extern from "<sched.h>" nogil:
    int sched_yield()

DEF_FANOUT = 16  # keep equal to pal_bench._sumtree.DEFAULT_FANOUT (checked by a test)
FILE_FORMAT = "pal_bench.replay"
FILE_VERSION = 1
RESERVED_NAMES = ("indices", "weights", "priorities")

cdef enum:
    SLOT_EMPTY = -1       # never written
    SLOT_INFLIGHT = -2    # reserved by a writer that is copying its rows
    MAX_FAST_FIELDS = 32  # ``add`` fast path limit; more fields go through ``add_batch``


cdef inline void _copy(char* dst, const char* src, int64_t n) noexcept nogil:
    # Constant-size memcpy compiles to plain moves for the common row sizes.
    if n == 8:
        memcpy(dst, src, 8)
    elif n == 4:
        memcpy(dst, src, 4)
    elif n == 1:
        memcpy(dst, src, 1)
    elif n == 32:
        memcpy(dst, src, 32)
    else:
        memcpy(dst, src, n)


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


def _normalise_fields(fields) -> dict:
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
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if any(s < 1 for s in shape):
            raise ValueError(f"field {name!r}: shape {shape} must have positive dimensions")
        dtype = np.dtype(dtype)
        if dtype.hasobject or dtype.itemsize == 0:
            raise ValueError(f"field {name!r}: dtype {dtype} cannot be stored")
        out[name] = (shape, dtype)
    return out


cdef class _ReplayCore:
    """Shared machinery of both buffers; use ``ReplayBuffer`` or ``PrioritizedReplayBuffer``."""

    cdef readonly int64_t capacity
    cdef int64_t _next_id          # id of the next transition to be reserved
    cdef int64_t _size             # filled slots
    cdef int64_t _inflight         # add_batch calls between reserve and commit
    cdef int _n_fields
    cdef char** _data
    cdef int64_t* _row_bytes
    cdef int* _typenum
    cdef int* _ndim
    cdef int64_t* _slot_ids
    cdef PyThread_type_lock _mutex
    cdef Rng _rng
    cdef bint _prioritized
    cdef TreeLayout _tree
    cdef double _alpha
    cdef double _eps
    cdef double _max_priority      # largest raw priority applied so far (starts at 1.0)
    cdef object _owners
    cdef tuple _names
    cdef dict _specs
    cdef dict _storage
    cdef object _slot_ids_arr
    # lock statistics (updated under the lock): acquisitions, how many had to wait, ns waited/held
    cdef int64_t _lock_count, _lock_contended, _lock_wait_ns, _lock_hold_ns, _lock_hold_sampled, _lock_t0

    cdef void _acquire(self) noexcept nogil:
        """Take the mutex (GIL not held); time the wait only when it is contended."""
        cdef int64_t t0
        if not PyThread_acquire_lock(self._mutex, NOWAIT_LOCK):
            t0 = _now_ns()
            PyThread_acquire_lock(self._mutex, WAIT_LOCK)
            self._lock_wait_ns += _now_ns() - t0
            self._lock_contended += 1
        self._start_hold()

    cdef inline void _start_hold(self) noexcept nogil:
        # the hold time is timed on one section in 16 (a clock read costs ~50-100 ns here) and scaled
        self._lock_count += 1
        self._lock_t0 = _now_ns() if (self._lock_count & 15) == 0 else 0

    cdef void _acquire_gil(self):
        """Take the mutex while holding the GIL: try without blocking, else wait with the GIL released."""
        cdef int64_t t0
        if not PyThread_acquire_lock(self._mutex, NOWAIT_LOCK):
            with nogil:
                t0 = _now_ns()
                PyThread_acquire_lock(self._mutex, WAIT_LOCK)
                self._lock_wait_ns += _now_ns() - t0
            self._lock_contended += 1
        self._start_hold()

    cdef void _release(self) noexcept nogil:
        if self._lock_t0:
            self._lock_hold_ns += _now_ns() - self._lock_t0
            self._lock_hold_sampled += 1
        PyThread_release_lock(self._mutex)

    def lock_stats(self) -> dict:
        """Contention on the buffer's mutex since creation: ``acquisitions``, ``contended`` (had to
        wait), ``wait_s`` (total time spent waiting) and ``hold_s`` (total time held, estimated from
        one section in 16, timed, and scaled to all of them). Read without
        taking the lock (so reading does not count), hence a snapshot that may lag by one section."""
        cdef double hold = self._lock_hold_ns * (<double>self._lock_count / self._lock_hold_sampled) \
            if self._lock_hold_sampled else 0.0
        return {"acquisitions": self._lock_count, "contended": self._lock_contended,
                "wait_s": self._lock_wait_ns * 1e-9, "hold_s": hold * 1e-9}

    def __cinit__(self, *args, **kwargs):
        self._mutex = PyThread_allocate_lock()
        if self._mutex == NULL:
            raise MemoryError()
        self._data = NULL
        self._row_bytes = NULL
        self._typenum = NULL
        self._ndim = NULL

    def __dealloc__(self):
        if self._mutex != NULL:
            PyThread_free_lock(self._mutex)
        free(self._data)
        free(self._row_bytes)
        free(self._typenum)
        free(self._ndim)

    cdef _setup(self, capacity, fields, seed, bint prioritized, double alpha, double eps, fanout):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        specs = _normalise_fields(fields)
        if seed is None:
            seed = int(np.random.SeedSequence().entropy) & 0xFFFFFFFFFFFFFFFF
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self.capacity = capacity
        self._specs = specs
        self._names = tuple(specs)
        self._n_fields = len(specs)
        self._prioritized = prioritized
        self._alpha = alpha
        self._eps = eps
        self._max_priority = 1.0
        if prioritized:
            self._owners = tree_init(&self._tree, capacity, fanout)
        self._data = <char**>malloc(self._n_fields * sizeof(char*))
        self._row_bytes = <int64_t*>malloc(self._n_fields * sizeof(int64_t))
        self._typenum = <int*>malloc(self._n_fields * sizeof(int))
        self._ndim = <int*>malloc(self._n_fields * sizeof(int))
        if self._data == NULL or self._row_bytes == NULL or self._typenum == NULL or self._ndim == NULL:
            raise MemoryError()
        self._storage = {}
        cdef int f = 0
        cdef cnp.ndarray arr
        for name, (shape, dtype) in specs.items():
            arr = np.zeros((capacity,) + shape, dtype=dtype)
            self._storage[name] = arr
            self._data[f] = <char*>cnp.PyArray_DATA(arr)
            self._row_bytes[f] = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            self._typenum[f] = dtype.num
            self._ndim[f] = len(shape)
            f += 1
        self._slot_ids_arr = np.full(capacity, SLOT_EMPTY, dtype=np.int64)
        self._slot_ids = <int64_t*>cnp.PyArray_DATA(self._slot_ids_arr)
        rng_seed(&self._rng, <uint64_t>int(seed))

    # ------------------------------------------------------------------ properties

    def __len__(self) -> int:
        return self._size

    @property
    def fields(self) -> dict:
        """``{name: (shape, dtype)}`` as stored."""
        return dict(self._specs)

    @property
    def total_added(self) -> int:
        """Transitions inserted so far (the next transition id)."""
        return self._next_id

    @property
    def max_priority(self) -> float:
        """Largest raw priority applied so far (1.0 before any update); new transitions get it."""
        return self._max_priority

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

    # ------------------------------------------------------------------ insertion

    cdef int _reserve(self, int64_t n_rows, int64_t* first_id, int64_t* n_new) noexcept nogil:
        """Reserve ``n_rows`` ids (lock held). Returns 1 if a slot is still being written by
        another ``add_batch`` (caller retries), 0 on success."""
        cdef int64_t m = n_rows if n_rows < self.capacity else self.capacity
        cdef int64_t start = self._next_id + n_rows - m, r, s, new = 0
        for r in range(m):
            if self._slot_ids[(start + r) % self.capacity] == SLOT_INFLIGHT:
                return 1
        for r in range(m):
            s = (start + r) % self.capacity
            if self._slot_ids[s] == SLOT_EMPTY:
                new += 1
            self._slot_ids[s] = SLOT_INFLIGHT
        first_id[0] = self._next_id
        n_new[0] = new
        self._next_id += n_rows
        return 0

    cdef double _stored_priority(self, double raw) noexcept nogil:
        return pow(raw + self._eps, self._alpha)

    def add(self, **fields) -> int:
        """Insert one transition given as keyword fields; returns its transition id.

        Python scalars, numpy scalars and arrays are accepted; any cast numpy's ``same_kind``
        rule allows is applied. New transitions get the maximum priority seen so far.
        """
        cdef int f, n = self._n_fields
        cdef int64_t slot, tid, n_new
        cdef double scratch[MAX_FAST_FIELDS]
        cdef const char* src[MAX_FAST_FIELDS]
        cdef cnp.ndarray arr
        cdef list keep
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
            if self._ndim[f] == 0:
                src[f] = self._scalar_fast(f, v, <char*>&scratch[f])
            elif cnp.PyArray_Check(v):
                arr = <cnp.ndarray>v
                if (cnp.PyArray_TYPE(arr) == self._typenum[f] and cnp.PyArray_IS_C_CONTIGUOUS(arr)
                        and (<object>arr).shape == self._specs[name][0]):
                    src[f] = <const char*>cnp.PyArray_DATA(arr)
                    keep.append(arr)
            if src[f] == NULL:
                arr = self._convert(name, v, False)
                keep.append(arr)
                src[f] = <const char*>cnp.PyArray_DATA(arr)
        # validated: everything from here on succeeds
        self._acquire_gil()
        while self._reserve(1, &tid, &n_new):
            self._release()
            with nogil:
                sched_yield()
            self._acquire_gil()
        slot = tid % self.capacity
        for f in range(n):
            _copy(self._data[f] + slot * self._row_bytes[f], src[f], self._row_bytes[f])
        self._slot_ids[slot] = tid
        self._size += n_new
        if self._prioritized:
            tree_set(&self._tree, slot, self._stored_priority(self._max_priority))
        self._release()
        return tid

    cdef const char* _scalar_fast(self, int f, v, char* out):
        """Write Python/numpy scalar ``v`` into ``out`` as field ``f``'s dtype; NULL if not handled here."""
        cdef int tn = self._typenum[f]
        cdef type t = type(v)
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
            if tn == cnp.NPY_INT64:
                (<int64_t*>out)[0] = v
            elif tn == cnp.NPY_FLOAT64:
                (<double*>out)[0] = v
            elif tn == cnp.NPY_FLOAT32:
                (<float*>out)[0] = <float>(<double>v)
            else:
                return NULL
            return out
        if isinstance(v, np.generic) and cnp.PyArray_DescrFromScalar(v).type_num == tn:
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
        if len(fields) != self._n_fields:
            raise self._field_error(fields)
        arrays = []
        cdef int64_t B = -1
        for name in self._names:
            if name not in fields:
                raise self._field_error(fields)
            arr = self._convert(name, fields[name], True)
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
            if B and not (np.isfinite(prio).all() and (prio >= 0).all()):
                raise ValueError("priorities must be finite and >= 0")
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
            stored = (prio[skip:] + self._eps) ** self._alpha
        cdef const char** src = <const char**>malloc(self._n_fields * sizeof(char*))
        cdef int64_t* slots = <int64_t*>malloc(m * sizeof(int64_t))
        cdef int64_t* scratch = <int64_t*>malloc(m * sizeof(int64_t))
        cdef double* values = <double*>malloc(m * sizeof(double))
        if src == NULL or slots == NULL or scratch == NULL or values == NULL:
            free(src); free(slots); free(scratch); free(values)
            raise MemoryError()
        cdef int f
        cdef int64_t first, n_new, r, s0, chunk
        cdef double[::1] sv
        for f in range(self._n_fields):
            src[f] = <const char*>cnp.PyArray_DATA(<cnp.ndarray>arrays[f])
        if stored is not None:
            sv = stored
            for r in range(m):
                values[r] = sv[r]
        with nogil:
            self._acquire()
            while self._reserve(B, &first, &n_new):
                self._release()
                sched_yield()
                self._acquire()
            self._inflight += 1
            self._release()
            # copy the kept rows as at most two contiguous chunks per field (the ring may wrap)
            s0 = (first + skip) % self.capacity
            chunk = self.capacity - s0 if m > self.capacity - s0 else m
            for f in range(self._n_fields):
                memcpy(self._data[f] + s0 * self._row_bytes[f], src[f] + skip * self._row_bytes[f],
                       chunk * self._row_bytes[f])
                if chunk < m:
                    memcpy(self._data[f], src[f] + (skip + chunk) * self._row_bytes[f],
                           (m - chunk) * self._row_bytes[f])
            for r in range(m):
                slots[r] = (s0 + r) % self.capacity
            self._acquire()
            for r in range(m):
                self._slot_ids[slots[r]] = first + skip + r
            self._size += n_new
            if self._prioritized:
                if stored is None:
                    for r in range(m):
                        values[r] = self._stored_priority(self._max_priority)
                elif raw_max > self._max_priority:
                    self._max_priority = raw_max
                tree_set_batch(&self._tree, slots, values, m, scratch)
            self._inflight -= 1
            self._release()
        free(src); free(slots); free(scratch); free(values)
        return np.arange(first, first + B, dtype=np.int64)

    # ------------------------------------------------------------------ sampling

    cdef int _draw(self, int64_t n_pending, const int64_t* pending, int64_t* slots, int64_t* ids,
                   double* prio, int64_t* found, double* min_p) noexcept nogil:
        """Draw slots for the pending positions (lock held); ``found`` is scratch of the batch size.
        Returns 1 if all priorities are zero."""
        cdef int64_t q, k, s, hi
        cdef double total
        if self._prioritized:
            total = tree_total(&self._tree)
            if total <= 0:
                return 1
            min_p[0] = tree_min_nonzero(&self._tree)
            for q in range(n_pending):
                prio[q] = (q + rng_uniform(&self._rng)) * (total / n_pending)
            if tree_find_batch(&self._tree, prio, found, n_pending) < 0:
                return 1
            # second pass: these loads are independent, so their cache misses overlap
            for q in range(n_pending):
                k = pending[q]
                s = found[q]
                slots[k] = s
                ids[k] = self._slot_ids[s]
            for q in range(n_pending):
                k = pending[q]
                prio[k] = tree_get(&self._tree, slots[k])
        else:
            hi = self._next_id if self._next_id < self.capacity else self.capacity
            for q in range(n_pending):
                k = pending[q]
                s = <int64_t>(rng_uniform(&self._rng) * hi)
                slots[k] = s
                ids[k] = self._slot_ids[s]
        return 0

    def sample(self, batch_size, beta=0.4) -> dict:
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
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (0.0 <= beta <= 1.0):
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if self._size == 0:
            raise ValueError("cannot sample from an empty buffer")
        cdef int64_t B = batch_size
        out = {}
        cdef const char** dst = <const char**>malloc(self._n_fields * sizeof(char*))
        if dst == NULL:
            raise MemoryError()
        cdef int f = 0
        for name, (shape, dtype) in self._specs.items():
            arr = np.empty((B,) + shape, dtype=dtype)
            out[name] = arr
            dst[f] = <const char*>cnp.PyArray_DATA(<cnp.ndarray>arr)
            f += 1
        ids_arr = np.empty(B, dtype=np.int64)
        w_arr = np.ones(B, dtype=np.float64)
        cdef int64_t* ids = <int64_t*>cnp.PyArray_DATA(ids_arr)
        cdef double* w = <double*>cnp.PyArray_DATA(w_arr)
        cdef int64_t* slots = <int64_t*>malloc(B * sizeof(int64_t))
        cdef int64_t* pending = <int64_t*>malloc(B * sizeof(int64_t))
        cdef double* prio = <double*>malloc(B * sizeof(double))
        cdef int64_t* found = <int64_t*>malloc(B * sizeof(int64_t))
        if slots == NULL or pending == NULL or prio == NULL or found == NULL:
            free(dst); free(slots); free(pending); free(prio); free(found)
            raise MemoryError()
        cdef int64_t q, k, n_pending = B, n_next
        cdef double min_p = 1.0
        cdef int zero = 0
        cdef int64_t rb
        for q in range(B):
            pending[q] = q
        with nogil:
            while n_pending > 0:
                self._acquire()
                zero = self._draw(n_pending, pending, slots, ids, prio, found, &min_p)
                self._release()
                if zero:
                    break
                if self._prioritized:
                    for q in range(n_pending):
                        k = pending[q]
                        w[k] = min_p / prio[k]
                for f in range(self._n_fields):
                    rb = self._row_bytes[f]
                    for q in range(n_pending):
                        k = pending[q]
                        _copy(<char*>dst[f] + k * rb, self._data[f] + slots[k] * rb, rb)
                # seqlock check: keep rows whose slot still holds the id it had when drawn
                self._acquire()
                n_next = 0
                for q in range(n_pending):
                    k = pending[q]
                    if ids[k] < 0 or self._slot_ids[slots[k]] != ids[k]:
                        pending[n_next] = k
                        n_next += 1
                self._release()
                n_pending = n_next
                if n_pending:
                    sched_yield()
        free(dst); free(slots); free(pending); free(prio); free(found)
        if zero:
            raise ValueError("cannot sample: every stored priority is zero (eps=0 and all updates were 0)")
        if self._prioritized:
            np.power(w_arr, beta, out=w_arr)   # numpy's SIMD pow: 4x faster than a loop of libm pow
        out["indices"] = ids_arr
        out["weights"] = w_arr
        return out

    def get(self, indices, fields=None) -> dict:
        """Rows of the stored transitions with ids ``indices`` (int[n], as ``add``/``sample`` return):
        ``{field: array[n, *shape]}`` for ``fields`` (default: all).

        Raises ``KeyError`` naming the first id that is not stored (not yet added, or overwritten
        since). Rows are copied without the lock and the GIL, then their ids are re-checked under
        the lock: an id that still holds its slot held it during the copy (ids only grow).
        """
        idx = _as_index_array(indices)
        names = list(self._names) if fields is None else [fields] if isinstance(fields, str) else list(fields)
        unknown = [name for name in names if name not in self._specs]
        if unknown:
            raise KeyError(f"unknown field(s) {unknown}; this buffer stores {list(self._names)}")
        cdef int64_t n = idx.shape[0], q, f, rb, bad = -1
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        for q in range(n):
            if iv[q] < 0 or iv[q] >= self._next_id or iv[q] < self._next_id - self.capacity:
                raise KeyError(f"transition id {iv[q]} is not stored (stored ids: "
                               f"{max(0, self._next_id - self.capacity)}..{self._next_id - 1})")
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
            for f in range(nf):
                rb = self._row_bytes[which[f]]
                for q in range(n):
                    _copy(dst[f] + q * rb, self._data[which[f]] + (iv[q] % self.capacity) * rb, rb)
            self._acquire()
            for q in range(n):
                if self._slot_ids[iv[q] % self.capacity] != iv[q]:
                    bad = iv[q]
                    break
            self._release()
        free(which); free(dst)
        if bad >= 0:
            raise KeyError(f"transition id {bad} is not stored (overwritten or still being written)")
        return out

    # ------------------------------------------------------------------ priorities

    def update_priorities(self, indices, priorities) -> int:
        """Set raw priorities (float[B], finite, >= 0) of transition ids ``indices`` (int[B]).

        Stored priority is ``(priority + eps) ** alpha``. Updates of stale ids (slot overwritten
        since) are dropped; duplicates: the last one wins. Returns the number applied.
        ``ReplayBuffer`` validates the same way and stores nothing.
        """
        idx = _as_index_array(indices)
        raw = np.ascontiguousarray(priorities, dtype=np.float64)
        cdef int64_t n = idx.shape[0]
        if raw.ndim != 1 or raw.shape[0] != n:
            raise ValueError(f"priorities must have shape ({n},), got {raw.shape}")
        if n == 0:
            return 0
        # stored values (p + eps)^alpha with numpy's SIMD pow (NaN/negatives are rejected below)
        with np.errstate(all="ignore"):
            stored = np.power(raw + self._eps, self._alpha) if self._prioritized else raw
        cdef const double* sv = <const double*>cnp.PyArray_DATA(<cnp.ndarray>stored)
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef const double* rv = <const double*>cnp.PyArray_DATA(<cnp.ndarray>raw)
        cdef int64_t* slots = <int64_t*>malloc(n * sizeof(int64_t))
        cdef int64_t* scratch = <int64_t*>malloc(n * sizeof(int64_t))
        cdef double* values = <double*>malloc(n * sizeof(double))
        if slots == NULL or scratch == NULL or values == NULL:
            free(slots); free(scratch); free(values)
            raise MemoryError()
        cdef int64_t b, s, applied = 0, bad_index = -1, bad_value = -1, limit = self._next_id
        cdef double raw_max = 0, r
        with nogil:
            # validate everything before touching the buffer
            for b in range(n):
                if iv[b] < 0 or iv[b] >= limit:
                    bad_index = b
                    break
                r = rv[b]
                if not (r >= 0 and r < INFINITY):      # false for NaN, inf, negatives
                    bad_value = b
                    break
                values[b] = sv[b] if self._prioritized else 1.0
            if bad_index < 0 and bad_value < 0:
                self._acquire()
                for b in range(n):
                    s = iv[b] % self.capacity
                    if self._slot_ids[s] == iv[b]:
                        slots[applied] = s
                        values[applied] = values[b]
                        if rv[b] > raw_max:
                            raw_max = rv[b]
                        applied += 1
                if self._prioritized and applied:
                    tree_set_batch(&self._tree, slots, values, applied, scratch)
                    if raw_max > self._max_priority:
                        self._max_priority = raw_max
                self._release()
        free(slots); free(scratch); free(values)
        if bad_index >= 0:
            raise IndexError(f"indices[{bad_index}] = {iv[bad_index]} out of range: valid transition "
                             f"ids are [0, {limit})")
        if bad_value >= 0:
            raise ValueError(f"priorities[{bad_value}] = {rv[bad_value]!r}: priorities must be finite "
                             f"and >= 0 (no NaN, inf or negative values)")
        return applied

    def get_priorities(self, indices) -> np.ndarray:
        """Stored priorities ``(p + eps) ** alpha`` of transition ids (float64[B]); NaN for stale ids,
        1.0 for a live id in ``ReplayBuffer``."""
        idx = _as_index_array(indices)
        cdef int64_t n = idx.shape[0]
        if n and (idx.min() < 0 or idx.max() >= self._next_id):
            raise IndexError(f"indices out of range: valid transition ids are [0, {self._next_id})")
        out = np.empty(n, dtype=np.float64)
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef double* ov = <double*>cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef int64_t b, s
        with nogil:
            self._acquire()
            for b in range(n):
                s = iv[b] % self.capacity
                if self._slot_ids[s] != iv[b]:
                    ov[b] = NAN
                elif self._prioritized:
                    ov[b] = tree_get(&self._tree, s)
                else:
                    ov[b] = 1.0
            self._release()
        return out

    # ------------------------------------------------------------------ persistence

    cdef _lock_quiescent(self):
        """Take the lock at a moment when no ``add_batch`` is between reserve and commit."""
        self._acquire_gil()
        while self._inflight:
            self._release()
            with nogil:
                sched_yield()
            self._acquire_gil()

    cdef dict _meta(self):
        return {
            "format": FILE_FORMAT, "version": FILE_VERSION,
            "kind": "prioritized" if self._prioritized else "uniform",
            "capacity": self.capacity,
            "fields": [[n, list(s), d.str] for n, (s, d) in self._specs.items()],
            "alpha": self._alpha, "eps": self._eps,
            "fanout": self._tree.fanout if self._prioritized else None,
            "next_id": self._next_id, "max_priority": self._max_priority,
        }

    def save(self, path) -> None:
        """Write contents, priorities, ring position, max priority and RNG state to ``path``
        (an uncompressed ``.npz``-format zip, streamed field by field: no full copy in memory).
        Other threads' calls wait while the file is written."""
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
            with open(path, "wb") as fh:
                np.savez(fh, **arrays)
        finally:
            self._release()

    @classmethod
    def load(cls, path):
        """Rebuild a buffer written by ``save``. Raises ValueError for a file that is truncated,
        corrupt or not a PAL-Bench buffer of this kind."""
        try:
            with zipfile.ZipFile(path) as zf:
                meta = json.loads(_read_member(zf, "__meta__", None).tobytes())
                if not isinstance(meta, dict) or meta.get("format") != FILE_FORMAT:
                    raise ValueError("not a PAL-Bench replay buffer file")
                if meta.get("version") != FILE_VERSION:
                    raise ValueError(f"unsupported file version {meta.get('version')!r}")
                fields = {n: (tuple(s), np.dtype(d)) for n, s, d in meta["fields"]}
                if meta["kind"] == "prioritized":
                    if cls is ReplayBuffer:
                        raise ValueError("file holds a PrioritizedReplayBuffer; use PrioritizedReplayBuffer.load")
                    buf = PrioritizedReplayBuffer(meta["capacity"], fields, alpha=meta["alpha"],
                                                  fanout=meta["fanout"], eps=meta["eps"], seed=0)
                elif meta["kind"] == "uniform":
                    if cls is PrioritizedReplayBuffer:
                        raise ValueError("file holds a ReplayBuffer; use ReplayBuffer.load")
                    buf = ReplayBuffer(meta["capacity"], fields, seed=0)
                else:
                    raise ValueError(f"unknown buffer kind {meta['kind']!r}")
                (<_ReplayCore>buf)._restore(zf, meta)
                return buf
        except (zipfile.BadZipFile, EOFError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a PAL-Bench replay buffer file, or truncated ({e!r})") from e
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e

    cdef _restore(self, zf, dict meta):
        cdef int64_t i, s, sid, cap = self.capacity, next_id = int(meta["next_id"])
        for name, arr in self._storage.items():
            _read_member(zf, f"field.{name}", arr)
        slot_ids = _read_member(zf, "slot_ids", np.empty(cap, dtype=np.int64))
        rng_state = _read_member(zf, "rng_state", np.empty(4, dtype=np.uint64))
        live = slot_ids >= 0
        if ((slot_ids < SLOT_EMPTY).any() or (slot_ids[live] >= next_id).any()
                or (slot_ids[live] % cap != np.nonzero(live)[0]).any()):
            raise ValueError("inconsistent slot table")
        max_priority = float(meta["max_priority"])
        if not (math.isfinite(max_priority) and max_priority >= 0):
            raise ValueError("invalid max_priority")
        if self._prioritized:
            leaves = _read_member(zf, "priorities", np.empty(cap, dtype=np.float64))
            if not (np.isfinite(leaves).all() and (leaves >= 0).all() and (leaves[~live] == 0).all()):
                raise ValueError("invalid priorities")
            for i in range(cap):
                self._tree.sums[leaf_pos(&self._tree, i)] = leaves[i]
            tree_rebuild(&self._tree)
        self._slot_ids_arr[:] = slot_ids
        self._next_id = next_id
        self._size = int(live.sum())
        self._max_priority = max_priority
        for i in range(4):
            self._rng.s[i] = int(rng_state[i])

    def _check_invariants(self) -> None:
        """Verify the tree and the slot table (for tests). Raises AssertionError. O(N)."""
        cdef int64_t i
        cdef int bad
        self._lock_quiescent()
        try:
            ids = self._slot_ids_arr.copy()
            live = ids >= 0
            assert int(live.sum()) == self._size, f"size {self._size} != live slots {int(live.sum())}"
            assert (ids[live] % self.capacity == np.nonzero(live)[0]).all(), "slot table holds foreign ids"
            assert (ids[live] < self._next_id).all(), "slot table holds future ids"
            if self._prioritized:
                bad = tree_check(&self._tree)
                assert bad == -1, f"tree level {bad} disagrees with its children"
                leaves = np.array([tree_get(&self._tree, i) for i in range(self.capacity)])
                assert (leaves[~live] == 0).all(), "an empty slot has a priority"
                assert (leaves[live] > 0).all() or self._eps == 0, "a live slot has zero priority"
                exact = math.fsum(leaves)
                assert abs(tree_total(&self._tree) - exact) <= 1e-9 * max(exact, 1e-300), "total drifted"
        finally:
            self._release()


cdef object _as_index_array(indices):
    """``indices`` as a C-contiguous int64[B] array; TypeError/ValueError for anything else."""
    if type(indices) is np.ndarray and (<cnp.ndarray>indices).dtype.num == cnp.NPY_INT64:
        idx = np.ascontiguousarray(indices)
    else:
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = np.ascontiguousarray(idx, dtype=np.int64)
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
    return idx


def _read_member(zf, str name, target):
    """Read array ``name`` of an npz zip; into ``target`` (same shape and dtype) when given."""
    with zf.open(name + ".npy") as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        if fortran or dtype.hasobject:
            raise ValueError(f"member {name!r} has an unexpected layout")
        if target is None:
            target = np.empty(shape, dtype=dtype)
        elif tuple(shape) != target.shape or dtype != target.dtype:
            raise ValueError(f"member {name!r}: expected {target.shape} {target.dtype}, got {shape} {dtype}")
        view = memoryview(target.reshape(-1).view(np.uint8))
        pos, chunk = 0, 1 << 26
        while pos < len(view):
            got = fh.readinto(view[pos:pos + chunk])
            if not got:
                raise ValueError(f"member {name!r} is truncated")
            pos += got
    return target


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
    """

    def __init__(self, capacity, fields, seed=None):
        self._setup(capacity, fields, seed, False, 0.0, 0.0, 2)

    def __repr__(self) -> str:
        return f"ReplayBuffer(capacity={self.capacity}, size={self._size}, fields={list(self._names)})"


cdef class PrioritizedReplayBuffer(_ReplayCore):
    """Prioritized replay (Schaul et al. 2016, proportional variant) on a K-ary sum tree.

    Sampling is O(B K log_K N) and priority updates O(B K log_K N), with the tree walk under a
    short lock and row copies outside it without the GIL. See the module docstring for indices
    (transition ids) and the concurrency scheme.

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
    """

    def __init__(self, capacity, fields, alpha=0.6, fanout=DEF_FANOUT, eps=1e-6, seed=None):
        if not (isinstance(alpha, (int, float, np.floating)) and 0.0 <= alpha <= 1.0):
            raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
        if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or not 2 <= fanout <= 4096:
            raise ValueError(f"fanout must be an int in [2, 4096], got {fanout!r}")
        self._setup(capacity, fields, seed, True, float(alpha), float(eps), fanout)

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
        return tree_total(&self._tree)

    def min_priority(self) -> float:
        """Smallest non-zero stored priority (inf when empty). O(1)."""
        return tree_min_nonzero(&self._tree)

    def __repr__(self) -> str:
        return (f"PrioritizedReplayBuffer(capacity={self.capacity}, size={self._size}, "
                f"alpha={self._alpha}, fanout={self._tree.fanout}, fields={list(self._names)})")
