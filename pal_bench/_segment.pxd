# cython: language_level=3
"""Declarations of a buffer's block as a shared-memory segment (implemented in ``pyx/_segment.pyx``): the header
at the start of every block, making a segment with all its pages reserved, where each part of a block starts,
a read-only export of a mapping, and ``SegmentHandle``: one process's mapping of a block, its life (close while
calls are in flight, fork) and the block's robust lock."""

from libc.stdint cimport int64_t, uint64_t

from _lock cimport pthread_mutex_t

cdef enum:
    MAX_RESERVATIONS = 64     # concurrent add_batch copies (threads or processes) at one time
    HEADER_BYTES = 16384      # room for the header at the start of the block


cdef struct Reservation:
    int64_t pid               # the writer's process id; 0: free entry
    int64_t first             # first transition id it copies (the ones it keeps)
    int64_t count             # how many


cdef struct Header:
    uint64_t magic
    int64_t version
    int64_t ready             # 1 once the creator has initialised everything
    int64_t kind              # 1 prioritized, 0 uniform
    int64_t capacity
    int64_t fanout
    double alpha
    double eps
    int64_t record_bytes
    int64_t n_fields
    int64_t spec_offset
    int64_t spec_bytes
    int64_t slots_offset
    int64_t records_offset
    int64_t sums_offset
    int64_t mins_offset
    int64_t stamps_offset
    int64_t total_bytes
    int64_t creator_pid
    int64_t handles           # handles ever opened on the block (the creator is 0): seeds per-process streams
    # ---- below: guarded by the mutex
    int64_t next_id           # id of the next transition to be reserved
    int64_t size              # filled slots
    int64_t inflight          # add_batch calls between reserve and commit
    double max_priority       # largest raw priority applied so far (starts at 1.0)
    uint64_t stamp            # the tree's dedupe stamp (shared: every process marks with fresh stamps)
    int64_t lock_count, lock_contended, lock_wait_ns, lock_hold_ns, lock_hold_sampled
    int64_t lock_t0           # when the current hold started, if it is one of the timed ones (else 0)
    int64_t repairs           # dead holders / writers repaired
    Reservation res[MAX_RESERVATIONS]
    pthread_mutex_t mutex


cdef int shm_create(bytes path, int64_t nbytes) except -2
cdef dict block_layout(int64_t capacity, int64_t spec_bytes, int64_t record_bytes, bint prioritized,
                       int64_t fanout)
cdef bint pid_dead(int64_t pid) noexcept nogil


cdef class ReadOnlyBlock:
    cdef object _mm
    cdef char* _data
    cdef Py_ssize_t _size
    cdef Py_ssize_t _shape[1]


cdef int64_t fork_generation() noexcept nogil


cdef class SegmentHandle:
    """One mapping of a block (private, or a named shared segment) with its life and its lock; the buffer
    (``pal_bench._rows.RowStore`` and ``pal_bench._replay``) builds on it."""
    cdef object __weakref__
    cdef object _mm               # the mapping (mmap.mmap): owns the block; field views hold it too
    cdef unsigned char[::1] _mv   # exported view of the mapping, for the C pointer
    cdef char* _base
    cdef Header* _h
    cdef str _name                # shared segment name ('' for a private buffer)
    cdef bint _creator
    cdef int64_t _creator_pid     # the process that created the segment: only it unlinks (not a forked child)
    cdef int _lock_fd             # creator: the segment's fd, holding a shared flock while the segment lives
    cdef bint _closed
    cdef int _users               # calls in flight on this handle: close() unmaps only when the last one returns
    cdef int64_t _users_gen       # the fork generation ``_users`` counts in (a forked child starts from none)
    cdef int64_t _pid             # the process this handle last ran in
    cdef int64_t _gen             # fork generation it last ran in

    cdef object _create_segment(self, str name, int64_t total)
    cdef _map(self, mm)
    cdef int64_t _open_named(self, str name, str what) except -1
    cdef int _join_lock(self) except -1
    cdef bint _owns_segment(self) noexcept
    cdef void _release(self)
    cdef int _enter(self) except -1
    cdef void _leave(self)
    cdef int _check_open(self) except -1
    cdef int _lock(self) except -1 nogil
    cdef int _lock_gil(self) except -1
    cdef int _locked(self, int rc, int64_t t0) except -1 nogil
    cdef int _lock_failed(self, int rc) except -1 with gil
    cdef void _unlock(self) noexcept nogil
    cdef object _lock_stats_impl(self)
    cdef void _after_fork(self) noexcept nogil
    cdef void _forked(self, int64_t pid) noexcept nogil
    cdef void _repair(self, bint holder_died) noexcept nogil
