# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""C-level core of the K-ary sum tree, shared by ``SumTree`` and ``PrioritizedReplayBuffer``.

Layout
------
Levels are numbered from the root (level 0) to the leaves (level ``n_levels - 1``). Level ``l``
holds ``level_size[l]`` nodes; node ``j`` of level ``l`` lives in child group ``j // K`` at
position ``j % K``. Every group occupies ``stride`` doubles, ``stride`` being ``K`` rounded up to
a multiple of 8 (64 bytes), and the array base is 64-byte aligned, so each group of K siblings is
contiguous and starts on a cache-line boundary. The children of node ``j`` of level ``l`` are
group ``j`` of level ``l + 1``. Padding entries hold 0 in ``sums`` and +inf in ``mins``.

``sums`` holds every level (leaves included); ``mins`` holds the internal levels only: the minimum
over the *non-zero* leaves below each node (+inf when there is none), so the minimum non-zero
priority is read in O(1) at the root and maintained in O(log_K N) per update.

A parent is always recomputed from its children (never updated by a delta), so the root never
drifts from the exact sum of the leaves by more than the rounding of one summation per level.

Nothing here takes a lock: callers serialise access.
"""

from libc.stdint cimport int64_t, uint64_t
from libc.math cimport INFINITY


cdef extern from *:
    void __builtin_prefetch(const void*) nogil

cdef enum:
    MAX_LEVELS = 64


cdef struct TreeLayout:
    int64_t capacity        # number of leaves
    int64_t fanout          # K
    int64_t stride          # doubles per child group (multiple of 8)
    int shift               # log2(K) when K is a power of two, else -1 (division by shift/mask)
    int n_levels            # levels including the leaf level (>= 2)
    int64_t level_size[MAX_LEVELS]
    int64_t level_offset[MAX_LEVELS]   # offset of each level in ``sums`` (doubles)
    int64_t min_offset[MAX_LEVELS]     # offset of each internal level in ``mins``
    int64_t stamp_offset[MAX_LEVELS]   # offset of each internal level in ``stamps``
    double* sums
    double* mins
    uint64_t* stamps        # dedupe marks for batch updates
    uint64_t stamp          # last stamp used


cdef inline int64_t _groups(int64_t n, int64_t k) noexcept nogil:
    return (n + k - 1) // k


cdef inline object _aligned_empty(int64_t n, double fill):
    """A float64 array of ``n`` items whose data starts on a 64-byte boundary, filled with ``fill``."""
    import numpy as np
    raw = np.empty(n + 8, dtype=np.float64)
    shift = (-raw.ctypes.data % 64) // 8
    arr = raw[shift:shift + n]
    arr.fill(fill)
    return arr


cdef inline object tree_layout(TreeLayout* t, int64_t capacity, int64_t fanout):
    """Compute the layout for ``capacity`` leaves (no memory yet): returns the sizes of the three
    arrays it needs, ``(n_sums, n_mins, n_stamps)`` doubles / doubles / uint64. ValueError for a bad
    capacity or fan-out."""
    cdef int64_t sizes[MAX_LEVELS]
    cdef int n = 0, level
    cdef int64_t size = capacity, total = 0, total_min = 0, total_stamp = 0
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if fanout < 2 or fanout > 4096:
        raise ValueError(f"fanout must be in [2, 4096], got {fanout}")
    sizes[n] = size
    n += 1
    while True:
        size = _groups(size, fanout)
        sizes[n] = size
        n += 1
        if size == 1:
            break
    t.capacity = capacity
    t.fanout = fanout
    t.stride = ((fanout + 7) // 8) * 8
    t.shift = -1
    if fanout & (fanout - 1) == 0:
        t.shift = 0
        while (1 << t.shift) < fanout:
            t.shift += 1
    t.n_levels = n
    t.stamp = 0
    for level in range(n):
        t.level_size[level] = sizes[n - 1 - level]
    for level in range(n):
        t.level_offset[level] = total
        total += _groups(t.level_size[level], fanout) * t.stride
        if level < n - 1:
            t.min_offset[level] = total_min
            total_min += _groups(t.level_size[level], fanout) * t.stride
            t.stamp_offset[level] = total_stamp
            total_stamp += t.level_size[level]
    t.sums = NULL
    t.mins = NULL
    t.stamps = NULL
    return total, total_min, total_stamp


cdef inline object tree_init(TreeLayout* t, int64_t capacity, int64_t fanout):
    """Compute the layout for ``capacity`` leaves and allocate its arrays (sums 0, mins +inf).

    Returns the tuple of numpy arrays that own the memory; the caller keeps it alive.
    """
    import numpy as np
    n_sums, n_mins, n_stamps = tree_layout(t, capacity, fanout)
    sums = _aligned_empty(n_sums, 0.0)
    mins = _aligned_empty(n_mins, INFINITY)
    stamps = np.zeros(n_stamps, dtype=np.uint64)
    cdef double[::1] sv = sums
    cdef double[::1] mv = mins
    cdef uint64_t[::1] st = stamps
    t.sums = &sv[0]
    t.mins = &mv[0]
    t.stamps = &st[0]
    return sums, mins, stamps


cdef inline int64_t parent_of(const TreeLayout* t, int64_t j) noexcept nogil:
    if t.shift >= 0:
        return j >> t.shift
    return j // t.fanout


cdef inline int64_t group_pos(const TreeLayout* t, int64_t j) noexcept nogil:
    """Offset of node ``j`` within its level: group ``j // K`` times the stride, plus ``j % K``."""
    cdef int64_t g = parent_of(t, j)
    return g * t.stride + (j - g * t.fanout)


cdef inline int64_t node_pos(const TreeLayout* t, int level, int64_t j) noexcept nogil:
    """Offset in ``sums`` of node ``j`` of ``level``."""
    return t.level_offset[level] + group_pos(t, j)


cdef inline int64_t leaf_pos(const TreeLayout* t, int64_t i) noexcept nogil:
    return node_pos(t, t.n_levels - 1, i)


cdef inline double tree_total(const TreeLayout* t) noexcept nogil:
    return t.sums[t.level_offset[0]]


cdef inline double tree_min_nonzero(const TreeLayout* t) noexcept nogil:
    """Smallest non-zero leaf, +inf when every leaf is zero. O(1)."""
    return t.mins[t.min_offset[0]]


cdef inline double tree_get(const TreeLayout* t, int64_t i) noexcept nogil:
    return t.sums[leaf_pos(t, i)]


cdef inline double _group_sum(const double* c, int64_t stride) noexcept nogil:
    # Eight independent accumulators over the padded group (padding is 0): a fixed summation
    # order, so the result is deterministic, and one the compiler can vectorise.
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0
    cdef int64_t k
    for k in range(0, stride, 8):
        s0 += c[k]
        s1 += c[k + 1]
        s2 += c[k + 2]
        s3 += c[k + 3]
        s4 += c[k + 4]
        s5 += c[k + 5]
        s6 += c[k + 6]
        s7 += c[k + 7]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


cdef inline double _pos_or_inf(double v) noexcept nogil:
    return v if v > 0 else INFINITY


cdef inline double _group_min_nonzero(const double* c, int64_t stride) noexcept nogil:
    """Smallest positive value of a padded group of leaves (padding is 0), +inf if none; branch-free,
    eight independent minima (the compiler turns the selects into min/blend instructions)."""
    cdef double m0 = INFINITY, m1 = INFINITY, m2 = INFINITY, m3 = INFINITY
    cdef double m4 = INFINITY, m5 = INFINITY, m6 = INFINITY, m7 = INFINITY, v
    cdef int64_t k
    for k in range(0, stride, 8):
        v = _pos_or_inf(c[k])
        m0 = v if v < m0 else m0
        v = _pos_or_inf(c[k + 1])
        m1 = v if v < m1 else m1
        v = _pos_or_inf(c[k + 2])
        m2 = v if v < m2 else m2
        v = _pos_or_inf(c[k + 3])
        m3 = v if v < m3 else m3
        v = _pos_or_inf(c[k + 4])
        m4 = v if v < m4 else m4
        v = _pos_or_inf(c[k + 5])
        m5 = v if v < m5 else m5
        v = _pos_or_inf(c[k + 6])
        m6 = v if v < m6 else m6
        v = _pos_or_inf(c[k + 7])
        m7 = v if v < m7 else m7
    m0 = m1 if m1 < m0 else m0
    m2 = m3 if m3 < m2 else m2
    m4 = m5 if m5 < m4 else m4
    m6 = m7 if m7 < m6 else m6
    m0 = m2 if m2 < m0 else m0
    m4 = m6 if m6 < m4 else m4
    return m4 if m4 < m0 else m0


cdef inline double _group_min(const double* c, int64_t stride) noexcept nogil:
    """Smallest value of a padded group of minima (padding is +inf); branch-free."""
    cdef double m0 = INFINITY, m1 = INFINITY, m2 = INFINITY, m3 = INFINITY
    cdef double m4 = INFINITY, m5 = INFINITY, m6 = INFINITY, m7 = INFINITY
    cdef int64_t k
    for k in range(0, stride, 8):
        m0 = c[k] if c[k] < m0 else m0
        m1 = c[k + 1] if c[k + 1] < m1 else m1
        m2 = c[k + 2] if c[k + 2] < m2 else m2
        m3 = c[k + 3] if c[k + 3] < m3 else m3
        m4 = c[k + 4] if c[k + 4] < m4 else m4
        m5 = c[k + 5] if c[k + 5] < m5 else m5
        m6 = c[k + 6] if c[k + 6] < m6 else m6
        m7 = c[k + 7] if c[k + 7] < m7 else m7
    m0 = m1 if m1 < m0 else m0
    m2 = m3 if m3 < m2 else m2
    m4 = m5 if m5 < m4 else m4
    m6 = m7 if m7 < m6 else m6
    m0 = m2 if m2 < m0 else m0
    m4 = m6 if m6 < m4 else m4
    return m4 if m4 < m0 else m0


cdef inline bint _recompute(TreeLayout* t, int level, int64_t j, bint with_min) noexcept nogil:
    """Recompute the sum of internal node ``j`` of ``level`` from its children and, when ``with_min``, its
    non-zero minimum too. Returns whether the minimum changed (False when it was not recomputed)."""
    cdef int64_t group = j * t.stride
    cdef const double* c = t.sums + t.level_offset[level + 1] + group
    cdef int64_t pos = group_pos(t, j)
    cdef double m
    cdef double* slot
    t.sums[t.level_offset[level] + pos] = _group_sum(c, t.stride)
    if not with_min:
        return False
    if level + 2 == t.n_levels:        # children are leaves: skip zeros
        m = _group_min_nonzero(c, t.stride)
    else:
        m = _group_min(t.mins + t.min_offset[level + 1] + group, t.stride)
    slot = t.mins + t.min_offset[level] + pos
    if slot[0] == m:
        return False
    slot[0] = m
    return True


cdef inline void tree_recompute(TreeLayout* t, int level, int64_t j) noexcept nogil:
    """Recompute the sum and the non-zero minimum of internal node ``j`` of ``level`` from its children."""
    _recompute(t, level, j, True)


cdef inline void tree_set(TreeLayout* t, int64_t i, double value) noexcept nogil:
    """Set leaf ``i`` and recompute its ancestors (single update). Sums go up to the root; a minimum is
    recomputed only while the one below it changed (a node's minimum depends on its children's only)."""
    cdef int level
    cdef bint changed = True
    t.sums[leaf_pos(t, i)] = value
    for level in range(t.n_levels - 2, -1, -1):
        i = parent_of(t, i)
        changed = _recompute(t, level, i, changed)


cdef inline void tree_set_batch(TreeLayout* t, const int64_t* idx, const double* values,
                                int64_t n, int64_t* scratch) noexcept nogil:
    """Set ``n`` leaves (last write wins for duplicates), then recompute each touched ancestor once.

    ``scratch`` must hold ``n`` int64. Work: O(U * K) for U distinct touched nodes. For a batch sorted by
    leaf (a sampled batch is), each touched node's minimum is recomputed only when one of its children's
    minima changed (most updates leave the minima above the leaves' parents as they were); ``scratch``
    then holds ``2 * node + changed``.
    """
    cdef int64_t b, m = n, p, w, last, v
    cdef int level
    cdef uint64_t* marks
    cdef bint ascending = True, any_changed
    if n == 1:
        tree_set(t, idx[0], values[0])
        return
    for b in range(n):
        t.sums[leaf_pos(t, idx[b])] = values[b]
        scratch[b] = 2 * idx[b] + 1
        if b and idx[b] < idx[b - 1]:
            ascending = False
    if ascending:
        # sorted leaves: parents are sorted too, so a parent seen twice is seen in a row (no marks); the
        # children of one parent are one run, whose changed flags are OR-ed before the parent is recomputed
        for level in range(t.n_levels - 2, -1, -1):
            w = 0
            last = -1
            any_changed = False
            for b in range(m):
                v = scratch[b]
                p = parent_of(t, v >> 1)
                if p != last:
                    if last >= 0:        # w <= b: the run just finished is written at or before b
                        scratch[w] = 2 * last + _recompute(t, level, last, any_changed)
                        w += 1
                    last = p
                    any_changed = False
                any_changed = any_changed or (v & 1)
            scratch[w] = 2 * last + _recompute(t, level, last, any_changed)
            m = w + 1
        return
    for b in range(n):
        scratch[b] = idx[b]
    for level in range(t.n_levels - 2, -1, -1):
        t.stamp += 1
        marks = t.stamps + t.stamp_offset[level]
        w = 0
        for b in range(m):
            p = parent_of(t, scratch[b])
            if marks[p] != t.stamp:
                marks[p] = t.stamp
                tree_recompute(t, level, p)
                scratch[w] = p
                w += 1
        m = w


cdef inline void tree_rebuild(TreeLayout* t) noexcept nogil:
    """Recompute every internal node from the leaves, bottom-up. O(N)."""
    cdef int level
    cdef int64_t j
    for level in range(t.n_levels - 2, -1, -1):
        for j in range(t.level_size[level]):
            tree_recompute(t, level, j)


cdef inline int64_t _last_nonzero_child(const double* c, int64_t k, double* target) noexcept nogil:
    """Rounding fallback of ``_find_step``: the last non-zero child at or before ``k`` (-1 if none);
    ``target`` becomes that child's value (descend along its last non-zero leaf)."""
    cdef int64_t i = k
    while i >= 0 and c[i] <= 0:
        i -= 1
    if i < 0:
        return -1
    target[0] = c[i]
    return i


cdef inline int64_t _child_in_quad(const double* c, int64_t quad, double x, double* target) noexcept nogil:
    """The child of group ``c`` (0..K-1) within quad ``quad`` that holds ``x`` (relative to the quad's start):
    the count of the quad's running sums <= x, branch-free; ``target`` becomes relative to that child. When
    rounding left ``x`` on a zero child: the last non-zero child at or before it (-1 if none)."""
    cdef const double* cq = c + 4 * quad
    cdef double p1 = cq[0], p2, p3
    cdef double before[4]
    cdef int64_t k
    p2 = p1 + cq[1]
    p3 = p2 + cq[2]
    k = <int64_t>(x >= p1) + <int64_t>(x >= p2) + <int64_t>(x >= p3)
    before[0] = 0
    before[1] = p1
    before[2] = p2
    before[3] = p3
    target[0] = x - before[k]
    k += 4 * quad
    if c[k] <= 0:
        k = _last_nonzero_child(c, k, target)
    return k


cdef inline int64_t _find_step(const TreeLayout* t, int level, int64_t j, double* target) noexcept nogil:
    """One level of ``tree_find_batch``: the child of node ``j`` of ``level`` that holds ``target[0]``
    (a node index on ``level + 1``); ``target`` becomes relative to that child. -1 if all zero.

    Branch-free: the children are summed in quads (the group is zero-padded to a multiple of 8), the
    quad is the count of running quad sums <= target, then the child within the quad the same way;
    the loads and adds of different targets overlap instead of waiting on mispredicted branches.
    """
    cdef const double* c = t.sums + t.level_offset[level + 1] + j * t.stride
    cdef const double* cq
    cdef double x = target[0], run = 0, below = 0, q
    cdef int64_t i, nq = (t.fanout + 3) >> 2, quad = 0, k
    cdef bint take
    for i in range(nq):
        cq = c + 4 * i
        q = (cq[0] + cq[1]) + (cq[2] + cq[3])
        run = run + q
        take = x >= run
        quad += take
        below = below + (q if take else 0.0)
    if quad == nq:                 # past this node's total by rounding: last non-zero child
        k = _last_nonzero_child(c, t.fanout - 1, target)
        return -1 if k < 0 else j * t.fanout + k
    k = _child_in_quad(c, quad, x - below, target)
    return -1 if k < 0 else j * t.fanout + k


cdef inline int64_t _find_step16(const double* c, int64_t j, double* target) noexcept nogil:
    """``_find_step`` for K = 16 (the default fan-out, stride 16): the same quads, unrolled, their running
    sums formed from four independent quad sums (short dependency chains, as in ``bench/floor.c``), the
    child group's address and the child index computed with constants. Identical results: the same sums
    in the same order (``((c0 + c1) + (c2 + c3))`` per quad, running sums left to right)."""
    cdef double x = target[0]
    cdef double q0 = (c[0] + c[1]) + (c[2] + c[3])
    cdef double q1 = (c[4] + c[5]) + (c[6] + c[7])
    cdef double q2 = (c[8] + c[9]) + (c[10] + c[11])
    cdef double q3 = (c[12] + c[13]) + (c[14] + c[15])
    cdef double r1 = q0, r2 = r1 + q1, r3 = r2 + q2, r4 = r3 + q3
    cdef double before_q[4]
    cdef int64_t quad, k
    quad = <int64_t>(x >= r1) + <int64_t>(x >= r2) + <int64_t>(x >= r3)
    if x >= r4:                    # past this node's total by rounding: last non-zero child
        k = _last_nonzero_child(c, 15, target)
        return -1 if k < 0 else j * 16 + k
    before_q[0] = 0
    before_q[1] = r1
    before_q[2] = r2
    before_q[3] = r3
    k = _child_in_quad(c, quad, x - before_q[quad], target)
    return -1 if k < 0 else j * 16 + k


cdef inline int tree_find_batch(const TreeLayout* t, double* targets, int64_t* out,
                                int64_t n) noexcept nogil:
    """For each target, the leaf i with prefix(i) <= target < prefix(i) + leaf(i) (a target at or
    past the total gives the last non-zero leaf; zero leaves are never returned), level by level: while descending for one
    target it prefetches the next group of a target a few places ahead, so the cache misses of
    the batch overlap. ``targets`` is overwritten. Returns -1 if the tree is all zeros, else 0."""
    cdef int64_t b, ahead, lines, line
    cdef int level
    cdef int64_t AHEAD = 8
    lines = (t.stride * 8 + 63) // 64
    for b in range(n):
        out[b] = 0
        if targets[b] < 0:
            targets[b] = 0
    for level in range(t.n_levels - 1):
        for b in range(n):
            ahead = b + AHEAD
            if ahead < n:
                for line in range(lines):
                    __builtin_prefetch(t.sums + t.level_offset[level + 1] + out[ahead] * t.stride + 8 * line)
            out[b] = _find_step(t, level, out[b], &targets[b])
            if out[b] < 0:
                return -1
    return 0


cdef inline int tree_find_sorted(const TreeLayout* t, double* targets, int64_t* out, int64_t n) noexcept nogil:
    """``tree_find_batch`` for targets in ascending order (the buffer's stratified draws), level by level.

    At each level the distinct child groups about to be read are first touched, all of them, with
    independent loads, so their cache misses overlap instead of following one another (plain loads:
    measured at least as fast as ``prefetcht0`` here, and never dropped on a TLB miss). Targets under one node are then
    consecutive and ascending: a node holding one target takes the branch-free ``_find_step``; a node
    holding several is walked once for all of them (a running prefix sum that each target only moves
    forward), O(K + targets) instead of O(K) per target. Targets are overwritten; -1 if the tree is
    all zeros, else 0."""
    cdef int64_t b, e, j, k, K = t.fanout, line, lines, last
    cdef int level
    cdef const double* c
    cdef const double* base
    cdef double run, x, touch
    lines = (t.stride * 8 + 63) // 64
    for b in range(n):
        out[b] = 0
        if targets[b] < 0:
            targets[b] = 0
    for level in range(t.n_levels - 1):
        base = t.sums + t.level_offset[level + 1]
        last = -1
        touch = 0
        for b in range(n):
            if out[b] != last:
                last = out[b]
                for line in range(lines):
                    touch += base[last * t.stride + 8 * line]
        if touch < 0:              # never (sums are >= 0); keeps the loads
            return -1
        b = 0
        while b < n:
            j = out[b]
            e = b + 1
            while e < n and out[e] == j:
                e += 1
            if e == b + 1:
                if K == 16:
                    out[b] = _find_step16(base + j * 16, j, &targets[b])
                else:
                    out[b] = _find_step(t, level, j, &targets[b])
                if out[b] < 0:
                    return -1
                b = e
                continue
            c = base + j * t.stride
            k = 0
            run = 0
            while b < e:
                x = targets[b]
                while k < K - 1 and x >= run + c[k]:
                    run += c[k]
                    k += 1
                if c[k] > 0:
                    out[b] = j * K + k
                    targets[b] = x - run if x - run < c[k] else c[k]
                else:                      # rounding left it on a zero child: the last non-zero one
                    k = _last_nonzero_child(c, k, &targets[b])
                    if k < 0:
                        return -1
                    out[b] = j * K + k
                    # (k went back: later targets of this node start their walk from here, still correct)
                    run = 0
                    for line in range(k):
                        run += c[line]
                b += 1
    return 0


cdef inline int tree_check(const TreeLayout* t) noexcept nogil:
    """Recompute every internal node from its children and compare exactly (recomputation is
    deterministic). Returns -1 when all match, else the level of the first mismatch."""
    cdef int level
    cdef int64_t j, k, group, pos
    cdef const double* c
    cdef const double* cm
    cdef double m, v
    for level in range(t.n_levels - 2, -1, -1):
        for j in range(t.level_size[level]):
            group = j * t.stride
            pos = group_pos(t, j)
            c = t.sums + t.level_offset[level + 1] + group
            if t.sums[t.level_offset[level] + pos] != _group_sum(c, t.stride):
                return level
            m = INFINITY
            if level + 2 == t.n_levels:
                for k in range(t.fanout):
                    v = c[k]
                    if v > 0 and v < m:
                        m = v
            else:
                cm = t.mins + t.min_offset[level + 1] + group
                for k in range(t.fanout):
                    if cm[k] < m:
                        m = cm[k]
            if t.mins[t.min_offset[level] + pos] != m:
                return level
    return -1
