"""SumTree against a plain numpy reference."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal_bench import DEFAULT_FANOUT, SumTree

FANOUTS = [2, 3, 4, 7, 8, 16, 32, 64]


def reference_find(leaves: np.ndarray, target: float) -> int:
    """First i with prefix(i) <= target < prefix(i + 1), exact on integer-valued leaves."""
    csum = np.cumsum(leaves)
    return int(np.searchsorted(csum, target, side="right"))


@st.composite
def tree_program(draw):
    capacity = draw(st.integers(1, 300))
    fanout = draw(st.sampled_from(FANOUTS))
    ops = []
    for _ in range(draw(st.integers(1, 12))):
        b = draw(st.integers(1, 40))
        idx = draw(st.lists(st.integers(0, capacity - 1), min_size=b, max_size=b))
        vals = draw(st.lists(st.integers(0, 50), min_size=b, max_size=b))
        ops.append((idx, vals))
    return capacity, fanout, ops


@settings(max_examples=150, deadline=None)
@given(tree_program(), st.randoms(use_true_random=False))
def test_tree_matches_numpy_reference(program, rnd):
    capacity, fanout, ops = program
    tree = SumTree(capacity, fanout=fanout)
    ref = np.zeros(capacity)
    for idx, vals in ops:
        tree.update(np.array(idx), np.array(vals, dtype=float))
        for i, v in zip(idx, vals):  # last write wins
            ref[i] = v
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
        assert tree.total() == ref.sum()
        nz = ref[ref > 0]
        assert tree.min_nonzero() == (nz.min() if nz.size else math.inf)
        if ref.sum() > 0:
            # half-integer targets never sit on a boundary: the answer is unique and exact
            targets = np.array([rnd.randrange(int(ref.sum())) + 0.5 for _ in range(20)])
            found = tree.find(targets)
            np.testing.assert_array_equal(found, [reference_find(ref, t) for t in targets])
            # boundaries: target == total and 0 give non-zero leaves in range
            edge = tree.find(np.array([0.0, ref.sum()]))
            assert ref[edge[0]] > 0 and edge[0] == np.flatnonzero(ref)[0]
            assert ref[edge[1]] > 0 and edge[1] == np.flatnonzero(ref)[-1]
    tree.check()


@pytest.mark.parametrize("fanout", [2, 16, 64])
def test_no_drift_after_a_million_updates(fanout):
    rng = np.random.default_rng(0)
    n = 10_000
    tree = SumTree(n, fanout=fanout)
    for _ in range(1000):  # 1000 batches of 1000 = 1e6 random updates
        idx = rng.integers(0, n, 1000)
        tree.update(idx, rng.random(1000) * 10 ** rng.uniform(-6, 6, 1000))
    leaves = tree.leaves()
    exact = math.fsum(leaves)
    assert abs(tree.total() - exact) <= 1e-9 * exact
    tree.check()


def test_float_rounding_never_returns_zero_or_out_of_range():
    rng = np.random.default_rng(1)
    for fanout in FANOUTS:
        cap = 1000
        tree = SumTree(cap, fanout=fanout)
        vals = rng.random(cap) ** 8  # widely spread magnitudes
        vals[rng.random(cap) < 0.5] = 0.0
        vals[-1] = 0.0
        tree.update(np.arange(cap), vals)
        targets = np.concatenate([rng.random(5000) * tree.total(), [tree.total(), np.nextafter(tree.total(), 0)]])
        found = tree.find(targets)
        assert found.min() >= 0 and found.max() < cap
        assert (vals[found] > 0).all()


def test_any_capacity_layout_and_alignment():
    for cap in [1, 2, 15, 16, 17, 255, 257, 1000]:
        for fanout in [2, 5, 16]:
            t = SumTree(cap, fanout=fanout)
            t.update(np.arange(cap), np.ones(cap))
            assert t.total() == cap
            assert t.find(np.array([cap - 0.5]))[0] == cap - 1
            t.check()


def test_default_fanout_is_documented():
    assert SumTree(10).fanout == DEFAULT_FANOUT
    assert str(DEFAULT_FANOUT) in SumTree.__doc__


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda t: t.update([0, 10], [1.0, 1.0]), IndexError),
        (lambda t: t.update([-1], [1.0]), IndexError),
        (lambda t: t.update([0], [np.nan]), ValueError),
        (lambda t: t.update([0], [np.inf]), ValueError),
        (lambda t: t.update([0], [-1.0]), ValueError),
        (lambda t: t.update([0, 1], [1.0]), ValueError),
        (lambda t: t.update([[0]], [[1.0]]), ValueError),
        (lambda t: t.update([0.5], [1.0]), TypeError),
        (lambda t: t.get([10]), IndexError),
        (lambda t: t.find([-1.0]), ValueError),
        (lambda t: t.find([1e9]), ValueError),
        (lambda t: t.find([np.nan]), ValueError),
    ],
)
def test_bad_input_raises_and_changes_nothing(call, exc):
    t = SumTree(10, fanout=4)
    t.update(np.arange(10), np.arange(10, dtype=float))
    before = t.leaves()
    with pytest.raises(exc):
        call(t)
    np.testing.assert_array_equal(t.leaves(), before)
    assert t.total() == 45.0
    t.check()


def test_constructor_validation_and_empty_find():
    with pytest.raises(ValueError):
        SumTree(0)
    with pytest.raises(ValueError):
        SumTree(10, fanout=1)
    with pytest.raises(ValueError, match="all zero"):
        SumTree(10).find([0.0])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(2, 20), st.integers(0, 2**31 - 1))
def test_sorted_targets_take_the_merged_walk_and_find_the_same_leaves(capacity, fanout, seed):
    """Ascending targets use one walk per node (the buffer's stratified draws); they must find exactly the
    leaves the per-target descent finds, zero leaves and rounding at the end included."""
    rng = np.random.default_rng(seed)
    tree = SumTree(capacity, fanout)
    values = rng.random(capacity) * (rng.random(capacity) < 0.7)
    if not values.any():
        values[rng.integers(capacity)] = 1.0
    tree.update(np.arange(capacity), values)
    targets = np.sort(rng.random(64)) * tree.total()
    targets[-1] = tree.total()                      # the very end: the last non-zero leaf
    merged = tree.find(targets)
    shuffled = rng.permutation(len(targets))
    while (np.diff(targets[shuffled]) >= 0).all():   # not ascending: the per-target descent
        shuffled = rng.permutation(len(targets))
    per_target = np.empty_like(merged)
    per_target[shuffled] = tree.find(targets[shuffled])
    np.testing.assert_array_equal(merged, per_target)
    assert (values[merged] > 0).all()


@pytest.mark.parametrize("capacity", [4096, 100_003])
@pytest.mark.parametrize("seed", range(5))
def test_fanout_16_step_finds_what_the_general_step_finds(capacity, seed):
    """K = 16 descends sorted single targets with its own unrolled step; on random real-valued leaves (some
    zero, targets at rounding-sensitive positions included) it must pick exactly the leaves the general
    step picks for the same targets in another order."""
    rng = np.random.default_rng(seed)
    tree = SumTree(capacity, 16)
    values = rng.random(capacity) * (rng.random(capacity) < 0.9)
    values[-1] = 0.0
    tree.update(np.arange(capacity), values)
    targets = np.sort(np.concatenate([rng.random(250) * tree.total(), [0.0, tree.total()],
                                      np.cumsum(values)[rng.integers(0, capacity, 4)]]))
    merged = tree.find(targets)
    per_target = np.empty_like(merged)
    order = rng.permutation(len(targets))
    per_target[order] = tree.find(targets[order])
    np.testing.assert_array_equal(merged, per_target)
    assert (values[merged] > 0).all()


@pytest.mark.parametrize("fanout", [2, 3, 16])
def test_minima_stay_exact_when_sorted_batches_skip_unchanged_ones(fanout):
    """A sorted batch update recomputes a node's minimum only when a child's minimum changed: after many
    sorted and unsorted batches (duplicates, zeros, new minima, raised minima) every node still equals
    its recomputation (``check``) and the root's minimum is the smallest non-zero leaf."""
    rng = np.random.default_rng(fanout)
    cap = 500
    t = SumTree(cap, fanout=fanout)
    leaves = np.zeros(cap)
    for step in range(300):
        n = int(rng.integers(2, 60))
        idx = rng.integers(0, cap, n)
        if step % 3:
            idx = np.sort(idx)
        vals = rng.choice([0.0, 1e-9, 1.0, 5.0], n) * rng.random(n)
        t.update(idx, vals)
        for i, v in zip(idx, vals):      # last write wins
            leaves[i] = v
        if step % 25 == 0 or step == 299:
            t.check()
            nz = leaves[leaves > 0]
            assert t.min_nonzero() == (nz.min() if nz.size else np.inf)
            np.testing.assert_array_equal(t.leaves(), leaves)


def test_read_only_index_and_value_arrays_are_accepted():
    t = SumTree(10, fanout=4)
    idx, val = np.arange(10), np.arange(10, dtype=float)
    idx.flags.writeable = val.flags.writeable = False
    t.update(idx, val)
    np.testing.assert_array_equal(t.get(idx), val)
    assert t.total() == 45.0
    t.check()
