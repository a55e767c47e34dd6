# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""``SumTree``: the K-ary sum tree on its own, with batch operations that release the GIL."""

import math

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from _common cimport DEFAULT_FANOUT_C
from _ndarray cimport plain_array
from _lock cimport mutex_init, mutex_lock_gil, pthread_mutex_lock, pthread_mutex_t, pthread_mutex_unlock
from _tree_core cimport (
    TreeLayout,
    leaf_pos,
    node_pos,
    tree_find_batch,
    tree_find_sorted,
    tree_get,
    tree_init,
    tree_min_nonzero,
    tree_rebuild,
    tree_set_batch,
    tree_total,
)

cnp.import_array()

# Chosen by measurement: `python -m pal_bench.studies.fanout` (one full buffer per K at capacity 1e6, batch 256,
# every K timed in each of 100 interleaved rounds; AMD EPYC, 2 cores, load < 1, 2026-12-01;
# results/fanout.csv, table in docs/latency.md). Against K = 16, sample + update took 0.97x
# [0.87, 1.10] at K = 8 (within noise), 1.06x [0.96, 1.19] at K = 32, 1.11x [0.97, 1.26] at K = 4,
# and 1.21x / 1.94x at K = 64 / 2 (intervals above 1); update alone: K = 32 1.30x, K = 4 1.19x.
# K = 8 and 16 are indistinguishable; 16 keeps the tree one level shallower.
DEFAULT_FANOUT = DEFAULT_FANOUT_C

cdef extern from "<float.h>":
    double DBL_MAX


cdef class SumTree:
    """K-ary sum tree over ``capacity`` non-negative float64 leaves.

    Children of a node are contiguous and every group of K siblings starts on a 64-byte boundary.
    ``update`` is O(B log_K N), ``find`` is O(B K log_K N), ``total`` and ``min_nonzero`` are O(1).
    Sums are float64 and every parent is recomputed from its children, so the root stays equal to
    the exact sum of the leaves up to one rounding per level (no drift over any number of updates).

    Thread-safe: every method takes the tree's own mutex (the same kind of lock the buffer takes:
    tried with the GIL held, waited for with it released), so ``update`` and ``find``, which run
    without the GIL, never interleave. Leaves must stay at most ``DBL_MAX / (2 capacity)``, so that
    the total of all leaves cannot overflow. Pickles and deep-copies by value (capacity, fan-out,
    leaves).

    Parameters
    ----------
    capacity : int
        Number of leaves (any value >= 1, not only powers of K).
    fanout : int
        K, children per node (default 16, see ``DEFAULT_FANOUT``).
    """

    cdef TreeLayout _t
    cdef object _owners
    cdef pthread_mutex_t _mutex
    cdef double _limit

    def __cinit__(self, int64_t capacity, int64_t fanout=DEFAULT_FANOUT):
        self._owners = tree_init(&self._t, capacity, fanout)
        if mutex_init(&self._mutex, False) != 0:
            raise OSError("cannot initialise the tree's mutex")
        self._limit = DBL_MAX / (2.0 * capacity)

    def __reduce__(self):
        return (_rebuild_tree, (self._t.capacity, self._t.fanout, self.leaves()))

    def __deepcopy__(self, memo):
        return _rebuild_tree(self._t.capacity, self._t.fanout, self.leaves())

    cdef inline void _lock(self):
        mutex_lock_gil(&self._mutex)

    cdef inline void _unlock(self) noexcept nogil:
        pthread_mutex_unlock(&self._mutex)

    @property
    def capacity(self) -> int:
        return self._t.capacity

    @property
    def fanout(self) -> int:
        return self._t.fanout

    @property
    def depth(self) -> int:
        """Number of levels, leaves included."""
        return self._t.n_levels

    def total(self) -> float:
        """Sum of all leaves."""
        self._lock()
        v = tree_total(&self._t)
        self._unlock()
        return v

    def min_nonzero(self) -> float:
        """Smallest non-zero leaf, ``inf`` when all leaves are zero. O(1)."""
        self._lock()
        v = tree_min_nonzero(&self._t)
        self._unlock()
        return v

    def leaves(self) -> np.ndarray:
        """A copy of the leaves, float64[capacity]."""
        return self.get(np.arange(self._t.capacity, dtype=np.int64))

    cdef object _check_indices(self, object indices):
        """``indices`` as a C-contiguous int64 array (read-only accepted, copied only to convert), every one in
        ``[0, capacity)``; the range check is one C pass (numpy's min and max cost more at batch sizes of 32)."""
        if plain_array(indices, cnp.NPY_INT64, 1):  # the usual case: no conversion call
            idx = indices
        else:
            idx = np.ascontiguousarray(indices)
            if idx.ndim != 1:
                raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
            if idx.size and idx.dtype.kind not in "iu":
                raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
            idx = np.require(idx, np.int64, ["C", "A"])  # read in place below: aligned too
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef int64_t b, n = cnp.PyArray_DIMS(<cnp.ndarray>idx)[0], cap = self._t.capacity
        cdef bint bad = False
        with nogil:
            for b in range(n):
                if iv[b] < 0 or iv[b] >= cap:
                    bad = True
                    break
        if bad:
            raise IndexError(f"indices out of range [0, {cap})")
        return idx

    def update(self, indices, values) -> None:
        """Set leaves ``indices`` (int[B]) to ``values`` (float[B], finite, >= 0; or one Python or numpy float
        for all B).

        Duplicate indices: the last one in the batch wins. Invalid input raises and changes nothing.
        """
        idx = self._check_indices(indices)
        cdef int64_t b, n = cnp.PyArray_DIMS(<cnp.ndarray>idx)[0]
        cdef double one = 0, x, limit = self._limit
        cdef const float* fv = NULL      # float32 values, widened exactly below (as numpy's cast)
        cdef const double* vv = NULL     # float64 values, read in place
        cdef bint single = isinstance(values, (float, np.floating)), bad = False
        if single:
            one = values  # exact for float16/32/64, rounded for longdouble (as numpy's cast to float64)
        else:
            if plain_array(values, cnp.NPY_FLOAT64, 1) or plain_array(values, cnp.NPY_FLOAT32, 1):
                val = values
            else:
                val = np.require(np.ascontiguousarray(values, dtype=np.float64), None, ["A"])
            if cnp.PyArray_NDIM(<cnp.ndarray>val) != 1 or cnp.PyArray_DIMS(<cnp.ndarray>val)[0] != n:
                raise ValueError(f"values must have shape ({n},), got {val.shape}")
            if cnp.PyArray_TYPE(<cnp.ndarray>val) == cnp.NPY_FLOAT32:
                fv = <const float*>cnp.PyArray_DATA(<cnp.ndarray>val)
            else:
                vv = <const double*>cnp.PyArray_DATA(<cnp.ndarray>val)
        with nogil:  # one pass: NaN fails both comparisons, inf the second
            if single:
                bad = not (one >= 0 and one <= limit)
            else:
                for b in range(n):
                    x = fv[b] if fv != NULL else vv[b]
                    if not (x >= 0 and x <= limit):
                        bad = True
                        break
        if bad:
            bad_values = np.asarray([one] if single else val, dtype=np.float64)
            if not (np.isfinite(bad_values).all() and (bad_values >= 0).all()):
                raise ValueError("values must be finite and >= 0")
            raise ValueError(f"values must be at most {self._limit:.3g} (DBL_MAX / (2 capacity)), so that the "
                             f"total cannot overflow; got {bad_values.max()!r}")
        if n == 0:
            return
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef int64_t* scratch = NULL
        cdef double* wide
        if n == 1 and vv == NULL:  # one value: a single tree_set, no scratch
            one = fv[0] if fv != NULL else one
            vv = &one
        elif n > 1:  # the batch update's scratch, then the values as float64 if they are not already
            scratch = <int64_t*>malloc(n * (sizeof(int64_t) + (sizeof(double) if vv == NULL else 0)))
            if scratch == NULL:
                raise MemoryError()
            if vv == NULL:
                wide = <double*>(scratch + n)
                for b in range(n):
                    wide[b] = fv[b] if fv != NULL else one
                vv = wide
        self._lock()
        with nogil:
            tree_set_batch(&self._t, iv, vv, n, scratch)  # n == 1: one tree_set, scratch unused
            self._unlock()
        free(scratch)

    def get(self, indices) -> np.ndarray:
        """Leaf values at ``indices`` (int[B]) -> float64[B]."""
        idx = self._check_indices(indices)
        cdef cnp.npy_intp n = cnp.PyArray_DIMS(<cnp.ndarray>idx)[0]
        out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT64, 0)
        cdef const int64_t* iv = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>idx)
        cdef double* ov = <double*>cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef cnp.npy_intp b
        self._lock()
        with nogil:
            for b in range(n):
                ov[b] = tree_get(&self._t, iv[b])
            self._unlock()
        return out

    def find(self, prefix_targets) -> np.ndarray:
        """Leaf index for each prefix-sum target (float[B] in [0, total]) -> int64[B].

        Leaf i is returned for prefix(i) <= target < prefix(i) + leaf(i); a target equal to the
        total (or past it by rounding) gives the last non-zero leaf. Zero leaves are never returned.
        """
        if plain_array(prefix_targets, cnp.NPY_FLOAT64, 1):  # the usual case: read in place, no conversion call
            src = prefix_targets
        else:
            src = np.ascontiguousarray(prefix_targets, dtype=np.float64)  # scalar -> [scalar]; copied below
            if src.ndim != 1:
                raise ValueError(f"prefix_targets must be 1-D, got shape {src.shape}")
        cdef cnp.npy_intp b, n = cnp.PyArray_DIMS(<cnp.ndarray>src)[0]
        out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
        cdef int64_t* ov = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef double* wv = <double*>malloc(n * sizeof(double) + 1)  # the descent's work copy (+1: never malloc(0))
        if wv == NULL:
            raise MemoryError()
        memcpy(wv, cnp.PyArray_DATA(<cnp.ndarray>src), n * sizeof(double))
        cdef bint bad = False, ascending = True
        self._lock()  # checked under the lock: the total is the one the descent sees
        cdef double total = tree_total(&self._t)
        with nogil:
            if total > 0:
                for b in range(n):  # one pass: range (NaN fails it) and order
                    if not (wv[b] >= 0 and wv[b] <= total):
                        bad = True
                        break
                    if b and wv[b] < wv[b - 1]:
                        ascending = False
                if not bad and n:
                    if ascending:
                        tree_find_sorted(&self._t, wv, ov, n)
                    else:
                        tree_find_batch(&self._t, wv, ov, n)
            self._unlock()
        free(wv)
        if not total > 0:
            raise ValueError("find on a tree whose leaves are all zero")
        if bad:
            raise ValueError(f"prefix_targets must be finite and within [0, total={total!r}]")
        return out

    def check(self) -> None:
        """Verify every internal node against its children; raise AssertionError on mismatch. O(N)."""
        cdef int level
        cdef int64_t j, k, child, K = self._t.fanout
        cdef double s
        leaves = self.leaves()
        self._lock()
        try:
            nz = leaves[leaves > 0]
            expected_min = nz.min() if nz.size else math.inf
            if tree_min_nonzero(&self._t) != expected_min:
                raise AssertionError(f"min_nonzero {tree_min_nonzero(&self._t)} != {expected_min}")
            exact = math.fsum(leaves)
            total = tree_total(&self._t)
            if not math.isfinite(total) or abs(total - exact) > 1e-9 * max(abs(exact), 1e-300):
                raise AssertionError(f"total {total!r} drifted from fsum {exact!r}")
            for level in range(self._t.n_levels - 1):
                for j in range(self._t.level_size[level]):
                    s = 0
                    for k in range(K):
                        child = j * K + k
                        if child < self._t.level_size[level + 1]:
                            s += self._t.sums[node_pos(&self._t, level + 1, child)]
                    if abs(self._t.sums[node_pos(&self._t, level, j)] - s) > 1e-9 * max(abs(s), 1e-300):
                        raise AssertionError(f"node {j} of level {level} != sum of its children")
        finally:
            self._unlock()

    def rebuild(self) -> None:
        """Recompute all internal nodes from the leaves. O(N)."""
        self._lock()
        with nogil:
            tree_rebuild(&self._t)
            self._unlock()

    def __repr__(self) -> str:
        return (f"SumTree(capacity={self._t.capacity}, fanout={self._t.fanout}, "
                f"depth={self._t.n_levels}, total={tree_total(&self._t)!r})")


def _rebuild_tree(capacity, fanout, leaves):
    tree = SumTree(capacity, fanout)
    nz = np.flatnonzero(leaves)
    if nz.size:
        tree.update(nz, leaves[nz])
    return tree
