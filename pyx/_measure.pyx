# cython: language_level=3
"""A marker for instruction counting: ``pal_bench.bench.regression`` runs the buffer under callgrind with
collection switched on only inside ``measured_region`` (``--toggle-collect``) and a profile dump after
each call (``--dump-after``), so each measured operation's instructions land in a part of their own."""


def measured_region(fn, Py_ssize_t n) -> None:
    """Call ``fn()`` ``n`` times (the region callgrind counts)."""
    cdef Py_ssize_t i
    for i in range(n):
        fn()
