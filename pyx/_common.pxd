# cython: language_level=3
"""Constants shared by the Cython modules (one place, so that they cannot drift apart)."""

cdef enum:
    DEFAULT_FANOUT_C = 16    # the sum tree's default K (pal_bench.DEFAULT_FANOUT; chosen in _sumtree.pyx)
    SLOT_EMPTY = -1          # slot table: never written, or repaired after a dead writer
    SLOT_INFLIGHT = -2       # slot table: reserved by a writer that is copying its rows
    MAX_FAST_FIELDS = 32     # ``add``'s fast path handles at most this many fields
    SCALAR_SCRATCH = 32      # bytes of scratch per field in ``add`` (the largest numpy scalar: complex256)
