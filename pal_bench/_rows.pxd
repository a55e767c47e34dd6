# cython: language_level=3
"""Declarations of the row store (implemented in ``pyx/_rows.pyx``): ``RowStore``, a handle's typed view of a
buffer's block (the fields' layout in each record, the slot table, the sum tree, the random stream), how a block
is made, attached, checked and repaired, and the kernels that copy field rows in and out of the records."""

from libc.stdint cimport int64_t, uint64_t

from _rng cimport Rng
from _tree_core cimport TreeLayout
from pal_bench._segment cimport SegmentHandle

cdef enum:
    MAX_DIMS = 16             # dimensions of a field's shape


cdef void gather_rows(char* dst, const char* records, int64_t record_bytes, int64_t off, int64_t n,
                      const int64_t* pending, int64_t n_pending, const int64_t* slots) noexcept nogil
cdef void scatter_rows(char* records, int64_t record_bytes, int64_t off, int64_t n, const char* src,
                       int64_t first, int64_t count) noexcept nogil


cdef class RowStore(SegmentHandle):
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
    cdef int64_t _hidden_off      # record offset of the bool field ``_hidden`` (rows never drawn), -1 when none
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
    cdef public double _debug_copy_pause_s    # tests: sleep this long in add_batch between reserve and copy

    cdef _setup(self, capacity, fields, seed, bint prioritized, double alpha, double eps, fanout, bint shared, name)
    cdef _bind(self, seed, int64_t handle_index)
    cdef void _seed_stream(self, int64_t index) noexcept nogil
    cdef _open_shared(self, name, seed, bint want_prioritized)
    cdef _check_layout(self, int64_t size, bint want_prioritized)
    cdef int64_t _join_segment(self) except? -1
    cdef _check_guarded(self)
    cdef bint _reserved_by_live(self, int64_t s) noexcept nogil
    cdef _field_error(self, dict kw)
    cdef object _convert(self, str name, value, bint batch)
    cdef object _new_rows(self, int f, int64_t B)
    cdef object _out_array(self, arr, str name, object dtype, int ndim, const int64_t* dims, int64_t B)
    cdef int _check_disjoint(self, list arrays, tuple names) except -1
