# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""One-pass kernels for the framework drop-ins (``pal_bench.integrations``).

Inside a training loop every buffer call runs with cold caches, and then each numpy call costs ~10 µs
whatever its size (docs/plugin.md, "tianshou"). These kernels do in one C call what the drop-ins did
in several numpy calls, with bit-identical results (each one's docstring says which numpy expression
it equals). Input they do not cover returns ``None``, and the caller runs the numpy expression.
"""

import math

import numpy as np

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.math cimport fabs, fabsf, isfinite, isnan
from libc.stdint cimport int64_t
from libc.string cimport memcpy

from numpy.random cimport bitgen_t

from _ndarray cimport new_array, plain_array, row_bytes

cnp.import_array()

cdef extern from *:
    void __builtin_prefetch(const void*) nogil

cdef enum:
    PREFETCH_AHEAD = 8  # rows ahead that a gather prefetches


cdef inline bint _int64_range(object index, const int64_t** data, cnp.npy_intp* n, int64_t* hi):
    """``index`` is a plain int64[B] whose values are all >= 0: its data, B and its largest value (-1 if B = 0)."""
    if not plain_array(index, cnp.NPY_INT64, 1):
        return False
    cdef const int64_t* ip = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>index)
    cdef cnp.npy_intp i, size = cnp.PyArray_DIMS(<cnp.ndarray>index)[0]
    cdef int64_t lo = 0, top = -1
    for i in range(size):
        if ip[i] < lo:
            lo = ip[i]
        if ip[i] > top:
            top = ip[i]
    data[0], n[0], hi[0] = ip, size, top
    return lo >= 0


cdef object _gather(cnp.ndarray col, const int64_t* ip, cnp.npy_intp n):
    """``col[index]`` for a plain column and in-range indices: a new C-contiguous array of ``col``'s dtype."""
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    cdef cnp.npy_intp i, d, row = row_bytes(col)
    dims[0] = n
    for d in range(1, cnp.PyArray_NDIM(col)):
        dims[d] = cnp.PyArray_DIMS(col)[d]
    rows = new_array(col.dtype, cnp.PyArray_NDIM(col), dims)
    cdef const char* src = <const char*>cnp.PyArray_DATA(col)
    cdef char* dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>rows)
    with nogil:  # rows a few places ahead are prefetched, so that their cache misses overlap
        for i in range(n):
            if i + PREFETCH_AHEAD < n:
                __builtin_prefetch(src + ip[i + PREFETCH_AHEAD] * row)
            if row == 8:  # a constant size: the compiler turns it into one move
                memcpy(dst + i * 8, src + ip[i] * 8, 8)
            elif row == 1:
                dst[i] = src[ip[i]]
            else:
                memcpy(dst + i * row, src + ip[i] * row, <size_t>row)
    return rows


cdef bint _gatherable(dict columns, int64_t hi, object nested) except -1:
    """Every value of ``columns`` is a plain numeric ndarray with more than ``hi`` rows, or a ``nested`` store
    whose values are (recursively)."""
    for value in columns.values():
        if type(value) is nested:
            if not _gatherable(value.__dict__, hi, nested):
                return False
        elif (not plain_array(value, -1, -1) or not cnp.PyTypeNum_ISNUMBER(cnp.PyArray_TYPE(<cnp.ndarray>value))
                or hi >= cnp.PyArray_DIMS(<cnp.ndarray>value)[0]):
            return False
    return True


cdef dict _gather_all(dict columns, const int64_t* ip, cnp.npy_intp n, object nested):
    out = {}
    for key, value in columns.items():
        if type(value) is nested:
            rows = nested.__new__(nested)
            rows.__dict__.update(_gather_all(value.__dict__, ip, n, nested))
            out[key] = rows
        else:
            out[key] = _gather(<cnp.ndarray>value, ip, n)
    return out


def take_numeric_columns(dict columns, index, object nested):
    """``{key: value[index]}`` for a dict-of-columns store, in its order, in one C call: each ndarray value's rows,
    and for each value of type ``nested`` (e.g. tianshou's ``Batch``, a store in its ``__dict__``) a new
    ``nested`` instance holding its rows, built the same way (an empty one stays empty).

    ``None``, nothing allocated, unless every array (nested ones too) is numeric (bool, integer, floating,
    complex), C-contiguous, aligned and at least 1-D, every other value is ``nested``, and ``index`` is
    int64[B] (C-contiguous) with every value in range.
    """
    cdef const int64_t* ip
    cdef cnp.npy_intp n
    cdef int64_t hi
    if not _int64_range(index, &ip, &n, &hi) or not _gatherable(columns, hi, nested):
        return None
    return _gather_all(columns, ip, n, nested)


ctypedef fused real:
    float
    double


cdef bint _abs_plus_eps(const real* w, real* out, cnp.npy_intp n, real eps, cnp.npy_intp* i_lo,
                        cnp.npy_intp* i_hi) noexcept nogil:
    """``out = |w| + eps`` in ``real`` arithmetic (as numpy's in that dtype); the positions of its min and max.
    False if any ``out`` is not finite."""
    cdef cnp.npy_intp i
    cdef real a
    cdef bint finite = True
    for i in range(n):
        if real is float:
            a = fabsf(w[i])
        else:
            a = fabs(w[i])
        out[i] = a + eps
        if not isfinite(out[i]):
            finite = False
        elif out[i] < out[i_lo[0]]:
            i_lo[0] = i
        elif out[i] > out[i_hi[0]]:
            i_hi[0] = i
    return finite


def abs_plus_eps(weights, double eps):
    """``w = np.abs(weights) + eps`` in ``weights``' dtype, with ``w.min()`` and ``w.max()``: ``(w, min, max)``.

    ``weights``: float32[B] or float64[B], C-contiguous (``eps`` is rounded to float32 for float32 input, as
    numpy does with a Python float). ``min`` and ``max`` are numpy scalars of that dtype, both ``math.inf``
    when any ``w`` is not finite, both ``None`` for B = 0. Anything else: ``None``.
    """
    cdef int typenum
    if plain_array(weights, cnp.NPY_FLOAT32, 1):
        typenum = cnp.NPY_FLOAT32
    elif plain_array(weights, cnp.NPY_FLOAT64, 1):
        typenum = cnp.NPY_FLOAT64
    else:
        return None
    cdef cnp.ndarray src = <cnp.ndarray>weights
    cdef cnp.npy_intp n = cnp.PyArray_DIMS(src)[0], i, i_lo = 0, i_hi = 0
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    out = cnp.PyArray_EMPTY(1, dims, typenum, 0)
    cdef bint finite
    if typenum == cnp.NPY_FLOAT32:
        finite = _abs_plus_eps(<const float*>cnp.PyArray_DATA(src), <float*>cnp.PyArray_DATA(<cnp.ndarray>out),
                               n, <float>eps, &i_lo, &i_hi)
    else:
        finite = _abs_plus_eps(<const double*>cnp.PyArray_DATA(src), <double*>cnp.PyArray_DATA(<cnp.ndarray>out),
                               n, eps, &i_lo, &i_hi)
    if not finite:
        return out, math.inf, math.inf
    if n == 0:
        return out, None, None
    return out, out[i_lo], out[i_hi]


cdef inline bint _scalable(object values):
    """``values`` is float64[B], C-contiguous, aligned and writeable: it can be scaled in place."""
    return plain_array(values, cnp.NPY_FLOAT64, 1) and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>values)


cdef void _divide(double* v, cnp.npy_intp n, double divisor) noexcept nogil:
    cdef cnp.npy_intp i
    for i in range(n):
        v[i] = v[i] / divisor


def divide_by_max(weights):
    """``weights / weights.max()``, in place, for float64[B] (B >= 1), C-contiguous and writeable; returns it.

    NaN anywhere makes every value NaN, as numpy's max would. A maximum of zero (whose sign numpy's max leaves
    to its SIMD code) or anything else: ``None``, nothing changed.
    """
    if not _scalable(weights):
        return None
    cdef cnp.ndarray arr = <cnp.ndarray>weights
    cdef cnp.npy_intp n = cnp.PyArray_DIMS(arr)[0], i
    if n == 0:
        return None
    cdef double* w = <double*>cnp.PyArray_DATA(arr)
    cdef double top = w[0]
    with nogil:
        for i in range(n):
            if isnan(w[i]):
                top = w[i]
                break
            if w[i] > top:
                top = w[i]
    if top == 0:  # +0 or -0: which one numpy's max returns is its SIMD code's choice
        return None
    _divide(w, n, top)
    return weights


def divide_by(values, double divisor):
    """``values / divisor``, in place, for float64[B], C-contiguous and writeable; returns it (else ``None``).

    One IEEE quotient per value, as numpy's (``divisor`` widened to float64 exactly).
    """
    if not _scalable(values):
        return None
    _divide(<double*>cnp.PyArray_DATA(<cnp.ndarray>values), cnp.PyArray_DIMS(<cnp.ndarray>values)[0], divisor)
    return values


def either(a, b):
    """``np.logical_or(a, b)`` (bool[B]) for two bool[B] arrays, C-contiguous; anything else: ``None``."""
    if not (plain_array(a, cnp.NPY_BOOL, 1) and plain_array(b, cnp.NPY_BOOL, 1)):
        return None
    cdef cnp.npy_intp i, n = cnp.PyArray_DIMS(<cnp.ndarray>a)[0]
    if cnp.PyArray_DIMS(<cnp.ndarray>b)[0] != n:
        return None
    out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_BOOL, 0)
    cdef const char* x = <const char*>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef const char* y = <const char*>cnp.PyArray_DATA(<cnp.ndarray>b)
    cdef char* o = <char*>cnp.PyArray_DATA(<cnp.ndarray>out)
    for i in range(n):
        o[i] = (x[i] != 0) | (y[i] != 0)  # numpy's bools may hold any non-zero byte (views of uint8)
    return out


cdef cnp.PyUFuncGenericFunction _power_loops[2]  # numpy's own power loops: float32, float64
cdef void* _power_data[2]


cdef void _find_power_loops():
    """The first ``ff->f`` and ``dd->d`` loops registered on ``np.power``: the ones numpy's type resolution
    picks for same-dtype operands (its dispatch to the CPU's SIMD code happened when numpy loaded them)."""
    cdef cnp.ufunc power = np.power
    cdef int i, slot
    cdef const char* t
    for i in range(power.ntypes):
        t = power.types + i * power.nargs
        if t[0] == t[1] == t[2] and (t[0] == cnp.NPY_FLOAT or t[0] == cnp.NPY_DOUBLE):
            slot = 0 if t[0] == cnp.NPY_FLOAT else 1
            if _power_loops[slot] == NULL:
                _power_loops[slot] = power.functions[i]
                _power_data[slot] = power.data[i]


_find_power_loops()
_FAST_EXPONENTS = frozenset((1.0, -1.0, 0.0, 0.5, 2.0))  # ndarray.__pow__ hands these to other ufuncs


def power_of(values, exponent):
    """``values ** exponent`` (a new array of ``values``' dtype) for float32[B] or float64[B], C-contiguous, and a
    Python float ``exponent``, through numpy's own inner loop for that dtype called as ``**`` calls it (the
    exponent cast to the dtype, stride 0): the same results on any CPU, without the ufunc's dispatch.

    ``None`` for other input, for the exponents numpy's ``**`` sends elsewhere (1, -1, 0, 0.5, 2), and whenever
    a result is not finite (numpy then computes it again, and warns as it does).
    """
    if type(exponent) is not float or exponent in _FAST_EXPONENTS:
        return None
    cdef int slot
    if plain_array(values, cnp.NPY_FLOAT32, 1):
        slot = 0
    elif plain_array(values, cnp.NPY_FLOAT64, 1):
        slot = 1
    else:
        return None
    if _power_loops[slot] == NULL:
        return None
    cdef cnp.ndarray src = <cnp.ndarray>values
    cdef cnp.npy_intp i, n = cnp.PyArray_DIMS(src)[0]
    out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT32 if slot == 0 else cnp.NPY_FLOAT64, 0)
    cdef float e32 = <float>(<double>exponent)
    cdef double e64 = exponent
    cdef char* args[3]
    cdef cnp.npy_intp steps[3]
    args[0] = <char*>cnp.PyArray_DATA(src)
    args[1] = <char*>&e32 if slot == 0 else <char*>&e64
    args[2] = <char*>cnp.PyArray_DATA(<cnp.ndarray>out)
    steps[0] = steps[2] = cnp.PyArray_ITEMSIZE(src)
    steps[1] = 0
    _power_loops[slot](args, &n, steps, _power_data[slot])
    cdef const float* o32 = <const float*>args[2]
    cdef const double* o64 = <const double*>args[2]
    for i in range(n):
        if not (isfinite(o32[i]) if slot == 0 else isfinite(o64[i])):
            return None
    return out


def uniforms_times(random_state, cnp.npy_intp n, double scale):
    """``random_state.random_sample(n) * scale`` (float64[n]) in one call: the same draws from the same bit
    generator, under its lock, leaving it in the same state, each times ``scale`` (one IEEE product, as numpy's).

    ``random_state``: a ``numpy.random.RandomState`` (``np.random.rand.__self__`` for the global one).
    """
    bit_generator = random_state._bit_generator
    cdef bitgen_t* bitgen = <bitgen_t*>PyCapsule_GetPointer(bit_generator.capsule, "BitGenerator")
    out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_FLOAT64, 0)
    cdef double* o = <double*>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef cnp.npy_intp i
    with bit_generator.lock, nogil:
        for i in range(n):
            o[i] = bitgen.next_double(bitgen.state) * scale
    return out


cdef bint _match(dict stored, dict new, cnp.npy_intp rows, object nested, list pairs) except -1:
    """``match_columns``' recursion: appends to ``pairs``; False as soon as a column does not match."""
    if stored.keys() != new.keys():
        return False
    cdef cnp.ndarray col, val
    cdef int d
    for key, value in new.items():
        column = stored[key]
        if type(value) is nested:
            if type(column) is not nested or not _match(column.__dict__, value.__dict__, rows, nested, pairs):
                return False
            continue
        if not (plain_array(value, -1, -1) and plain_array(column, -1, -1)):
            return False
        col, val = <cnp.ndarray>column, <cnp.ndarray>value
        if (not cnp.PyTypeNum_ISNUMBER(cnp.PyArray_TYPE(val)) or not cnp.PyArray_ISWRITEABLE(col)
                or not cnp.PyArray_EquivTypes(val.dtype, col.dtype)
                or cnp.PyArray_NDIM(val) != cnp.PyArray_NDIM(col) or cnp.PyArray_DIMS(val)[0] != rows):
            return False
        for d in range(1, cnp.PyArray_NDIM(col)):
            if cnp.PyArray_DIMS(val)[d] != cnp.PyArray_DIMS(col)[d]:
                return False
        pairs.append((column, value))
    return True


def match_columns(dict stored, dict new, Py_ssize_t rows, object nested):
    """``[(column, values), ...]`` such that ``column[index] = values`` for each pair is ``stored[index] = new``
    for a dict-of-columns store (``nested``: the type whose ``__dict__`` holds a nested store, e.g. tianshou's
    ``Batch``); ``None`` when that is not plain row copying: other keys, a value not an ndarray of a numeric dtype
    equivalent to its column's with ``rows`` rows of the column's row shape, either side not C-contiguous and
    aligned, a read-only column. Nothing is written; ``put_rows`` writes the pairs.
    """
    pairs = []
    return pairs if _match(stored, new, rows, nested, pairs) else None


def put_rows(list pairs, index):
    """``column[index] = values`` for each ``(column, values)`` of ``match_columns`` (rows in order, so the last
    of repeated indices wins, as in numpy). ``index``: int64[rows], every value in range, else ``ValueError``
    with nothing written."""
    cdef const int64_t* ip
    cdef cnp.npy_intp n, i, row
    cdef int64_t hi
    if not _int64_range(index, &ip, &n, &hi):
        raise ValueError("index must be a C-contiguous int64[rows] array of slots >= 0")
    for column, values in pairs:
        if (cnp.PyArray_DIMS(<cnp.ndarray>values)[0] != n or hi >= cnp.PyArray_DIMS(<cnp.ndarray>column)[0]):
            raise ValueError("index does not match the rows or exceeds a column")
    cdef const char* src
    cdef char* dst
    for column, values in pairs:
        row = row_bytes(<cnp.ndarray>column)
        src = <const char*>cnp.PyArray_DATA(<cnp.ndarray>values)
        dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>column)
        with nogil:
            for i in range(n):
                memcpy(dst + ip[i] * row, src + i * row, <size_t>row)
