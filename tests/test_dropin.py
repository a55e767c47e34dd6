"""The drop-ins' compiled kernels (``pal_bench._dropin``) against the numpy expressions they replace."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pal_bench import SumTree
from pal_bench._dropin import (
    abs_plus_eps,
    divide_by,
    divide_by_max,
    either,
    match_columns,
    power_of,
    put_rows,
    take_numeric_columns,
    uniforms_times,
)

NUMERIC = [np.dtype(c).newbyteorder(o) for c in "?bhilqBHILQefdgFDG" for o in "<>"]


class Nested:
    """A store in its ``__dict__``, as tianshou's ``Batch``."""

    def __init__(self, **columns):
        self.__dict__.update(columns)


def assert_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert type(got) is np.ndarray and got.flags.c_contiguous and got.flags.writeable
    assert (got.dtype, got.shape) == (want.dtype, want.shape) and got.dtype.byteorder == want.dtype.byteorder
    assert got.tobytes() == want.tobytes()


@st.composite
def columns_and_index(draw):
    rows = draw(st.integers(1, 40))
    columns = [draw(hnp.arrays(st.sampled_from(NUMERIC), (rows, *draw(hnp.array_shapes(min_dims=0, max_dims=2,
                                                                                        min_side=0, max_side=3)))))
               for _ in range(draw(st.integers(1, 5)))]
    index = np.array(draw(st.lists(st.integers(0, rows - 1), max_size=50)), dtype=np.int64)
    return columns, index


@settings(max_examples=200, deadline=None)
@given(columns_and_index())
def test_gathers_equal_numpy_fancy_indexing(case):
    """Any numeric dtype, byte order and row shape; repeated and empty indices."""
    columns, index = case
    store = {f"c{i}": c for i, c in enumerate(columns)} | {"nested": Nested(a=columns[0], empty=Nested())}
    got = take_numeric_columns(store, index, Nested)
    assert list(got) == list(store)
    for i, column in enumerate(columns):
        assert_identical(got[f"c{i}"], column[index])
    assert type(got["nested"]) is Nested and list(vars(got["nested"])) == ["a", "empty"]
    assert_identical(got["nested"].a, columns[0][index])
    assert type(got["nested"].empty) is Nested and vars(got["nested"].empty) == {}


def test_gathers_decline_what_is_not_plain_row_copying():
    """Negative or out-of-range indices, other index dtypes, object or string columns, views that are not
    C-contiguous, 0-d arrays and unknown values: None, so the caller runs numpy."""
    col = np.arange(20.0).reshape(10, 2)
    ok = np.array([0, 9])
    assert take_numeric_columns({"c": col}, ok, Nested) is not None
    for index in (np.array([-1]), np.array([10]), ok.astype(np.int32), ok.astype(float), [0, 1], np.arange(4)[::2]):
        assert take_numeric_columns({"c": col}, index, Nested) is None
    for column in (np.array([None] * 10), col[::2, 0], col.T, np.float64(1.0), np.array(["a"] * 10)):
        assert take_numeric_columns({"c": column}, np.array([0, 1]), Nested) is None
    assert take_numeric_columns({"c": col, "n": Nested(bad=[1, 2])}, ok, Nested) is None
    assert take_numeric_columns({"c": col, "x": "text"}, ok, Nested) is None


@settings(max_examples=200, deadline=None)
@given(columns_and_index(), st.data())
def test_row_writes_equal_numpy_assignment(case, data):
    """``match_columns`` + ``put_rows`` store what ``column[index] = values`` does (last repeated index wins)."""
    columns, index = case
    values = [data.draw(hnp.arrays(c.dtype, (len(index), *c.shape[1:]))) for c in columns]
    want = [c.copy() for c in columns]
    for w, v in zip(want, values, strict=True):
        w[index] = v
    stored = {f"c{i}": c for i, c in enumerate(columns)}
    pairs = match_columns(stored, {f"c{i}": v for i, v in enumerate(values)}, len(index), Nested)
    put_rows(pairs, index)
    for got, w in zip(columns, want, strict=True):
        assert got.tobytes() == w.tobytes()


def test_row_writes_decline_anything_else_and_write_nothing():
    stored = {"a": np.zeros((4, 2), np.float32), "n": Nested(b=np.zeros(4, np.int64))}
    good = {"a": np.ones((1, 2), np.float32), "n": Nested(b=np.ones(1, np.int64))}
    assert len(match_columns(stored, good, 1, Nested)) == 2
    read_only = np.zeros((4, 2), np.float32)
    read_only.flags.writeable = False
    for new, rows in [({"a": good["a"]}, 1),                                                   # a key missing
                      ({**good, "x": np.ones(1)}, 1),                                          # an extra key
                      ({**good, "a": np.ones((1, 2), np.float64)}, 1),                         # another dtype
                      ({**good, "a": np.ones((1, 2), ">f4")}, 1),                              # another byte order
                      ({**good, "a": np.ones((1, 3), np.float32)}, 1),                         # another row shape
                      ({**good, "a": np.ones((2, 2), np.float32)}, 1),                         # other rows
                      ({**good, "a": np.ones((1, 4), np.float32)[:, ::2]}, 1),                 # not contiguous
                      ({**good, "n": Nested(b=np.ones(1, np.int64), c=np.ones(1))}, 1),        # nested key
                      ({**good, "n": np.ones(1)}, 1),                                           # array for a store
                      ({**good, "a": [[1.0, 2.0]]}, 1)]:                                       # not an array
        assert match_columns(stored, new, rows, Nested) is None
    assert match_columns({"a": read_only}, {"a": good["a"]}, 1, Nested) is None
    pairs = match_columns(stored, good, 1, Nested)
    for index in (np.array([4]), np.array([-1]), np.array([0, 1]), np.array([0], np.int32)):
        with pytest.raises(ValueError):
            put_rows(pairs, index)
    assert not stored["a"].any() and not stored["n"].b.any()


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), st.integers(0, 40)))
def test_abs_plus_eps_equals_numpy(w):
    eps = np.finfo(np.float32).eps.item()
    got, low, high = abs_plus_eps(w, eps)
    want = np.abs(w) + eps
    assert_identical(got, want)
    if not np.isfinite(want).all():
        assert low == high == np.inf
    elif w.size:
        assert type(low) is type(want.min()) and (low, high) == (want.min(), want.max())
    else:
        assert low is high is None


def test_abs_plus_eps_declines_other_input():
    for w in (np.ones(3, np.float16), np.ones((3, 1), np.float32), np.ones(6)[::2], [1.0, 2.0], np.ones(3, int)):
        assert abs_plus_eps(w, 1e-6) is None


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 40)))
def test_divide_by_max_equals_numpy(w):
    with np.errstate(all="ignore"):  # a zero, tiny or infinite max: numpy's inf and NaN
        want = w / w.max()
    got = divide_by_max(w)
    if w.max() == 0:  # declined: numpy's choice of +0 or -0
        assert got is None
        return
    assert got is w
    np.testing.assert_array_equal(got, want)  # NaN where numpy has NaN
    assert got.tobytes() == want.tobytes() or np.isnan(want).any()


def test_divide_by_max_declines_other_input():
    read_only = np.ones(3)
    read_only.flags.writeable = False
    for w in (np.ones(0), np.ones(3, np.float32), read_only, np.ones(6)[::2]):
        assert divide_by_max(w) is None
    np.testing.assert_array_equal(read_only, 1.0)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(0, 40)),
       st.one_of(st.floats(), st.floats(width=32).map(np.float32), st.floats().map(np.float64)))
def test_divide_by_equals_numpy(w, divisor):
    with np.errstate(all="ignore"):
        want = w / divisor
    got = divide_by(w, divisor)
    assert got is w and got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    assert got.tobytes() == want.tobytes() or np.isnan(want).any()


def test_divide_by_declines_other_input():
    read_only = np.ones(3)
    read_only.flags.writeable = False
    for w in (np.ones(3, np.float32), read_only, np.ones(6)[::2], np.ones((2, 2)), [1.0, 2.0]):
        assert divide_by(w, 2.0) is None
    np.testing.assert_array_equal(read_only, 1.0)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.uint8, st.integers(0, 40)), st.data())
def test_either_equals_logical_or_for_any_bool_bytes(raw, data):
    """Bools viewed from arbitrary bytes (numpy treats any non-zero byte as True)."""
    a = raw.view(bool)
    b = data.draw(hnp.arrays(np.uint8, raw.shape)).view(bool)
    want = np.logical_or(a, b)
    got = either(a, b)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_either_declines_other_input():
    yes = np.ones(3, bool)
    for a, b in ((yes, np.ones(2, bool)), (yes, np.ones(3, np.uint8)), (yes[::2], yes[:2]), (yes.reshape(1, 3), yes),
                 ([True], [False])):
        assert either(a, b) is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([np.float32, np.float64]).flatmap(
           lambda dt: hnp.arrays(dt, st.integers(0, 300), elements=st.floats(0, 1e6, width=np.dtype(dt).itemsize * 8))),
       st.floats(-4, 4))
def test_power_of_equals_numpy_power(w, exponent):
    """Bit for bit what ``w ** exponent`` gives on this CPU (numpy's SIMD power, where it has one, included);
    declined where numpy's result is not finite or ``**`` takes another ufunc."""
    with np.errstate(all="ignore"):
        want = w**exponent
    got = power_of(w, exponent)
    if exponent in (1.0, -1.0, 0.0, 0.5, 2.0) or not np.isfinite(want).all():
        assert got is None
        return
    assert type(got) is np.ndarray and got is not w and got.dtype == want.dtype == w.dtype
    assert got.tobytes() == want.tobytes()


def test_power_of_matches_over_many_values_and_declines_other_input():
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        w = (rng.random(100_003) * 50 + 1e-6).astype(dt)
        for exponent in (0.6, -0.4, 0.123, 3.3):
            assert power_of(w, exponent).tobytes() == (w**exponent).tobytes()
    w = np.ones(4)
    for values, exponent in ((w, np.float64(0.6)), (w, 1), (w.astype(np.float16), 0.6), (w[::2], 0.6),
                             (w.reshape(2, 2), 0.6), ([1.0], 0.6)):
        assert power_of(values, exponent) is None


@pytest.mark.parametrize("make", [lambda: np.random.RandomState(7), lambda: np.random.RandomState(np.random.PCG64(7))])
@pytest.mark.parametrize("n", [0, 1, 33])
def test_uniforms_times_is_random_sample_times_scale(make, n):
    """Same draws and products as ``random_sample(n) * scale``, and the generator left where numpy leaves it."""
    for scale in (1.0, 0.1, 123.456, np.float32(3.3)):
        ours, theirs = make(), make()
        got, want = uniforms_times(ours, n, scale), theirs.random_sample(n) * scale
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert ours.random_sample(5).tobytes() == theirs.random_sample(5).tobytes()


def test_uniforms_times_of_the_global_generator_is_np_random_rand():
    np.random.seed(11)
    want, after = np.random.rand(64) * 2.5, np.random.rand(3)
    np.random.seed(11)
    got = uniforms_times(np.random.rand.__self__, 64, 2.5)
    assert got.tobytes() == want.tobytes() and np.random.rand(3).tobytes() == after.tobytes()


def test_sum_tree_takes_float32_values_and_one_value_for_all():
    """Float32 values widen exactly; one float (Python or numpy) fills every index; bad ones change nothing."""
    a, b = SumTree(10), SumTree(10)
    v = np.array([0.1, 0.2, 0.3], np.float32)
    a.update(np.arange(3), v)
    b.update(np.arange(3), v.astype(np.float64))
    np.testing.assert_array_equal(a.leaves(), b.leaves())
    a.update(np.array([5, 6]), np.float32(0.7))
    b.update(np.array([5, 6]), np.full(2, np.float32(0.7), np.float64))
    a.update(np.array([8]), 2.5)
    b.update(np.array([8]), np.array([2.5]))
    np.testing.assert_array_equal(a.leaves(), b.leaves())
    for index in (np.array([0, 1]), np.array([4]), np.array([], np.int64)):
        for bad in (np.nan, -1.0, np.float32(np.inf), np.longdouble("inf")):
            with pytest.raises(ValueError, match="finite and >= 0"):
                a.update(index, bad)
        with pytest.raises(ValueError, match="at most"):  # DBL_MAX / 20: ten of them could overflow the total
            a.update(index, 1e308)
    with pytest.raises(ValueError, match="shape"):
        a.update(np.array([0, 1]), np.ones(3))
    np.testing.assert_array_equal(a.leaves(), b.leaves())
    a.check()


def test_sum_tree_find_and_get_accept_any_array_like():
    """Lists, other dtypes, views and read-only arrays take the general path and agree with the fast one."""
    t = SumTree(16, fanout=4)
    t.update(np.arange(16), np.arange(16.0))
    targets = np.linspace(0, t.total(), 9)
    want = t.find(targets)
    for variant in (targets.tolist(), targets.astype(np.float32).astype(np.float64), np.repeat(targets, 2)[::2]):
        np.testing.assert_array_equal(t.find(variant), want)
    np.testing.assert_array_equal(t.find(float(targets[3])), want[3:4])  # a scalar is one target
    targets.flags.writeable = False
    np.testing.assert_array_equal(t.find(targets), want)
    np.testing.assert_array_equal(targets, np.linspace(0, t.total(), 9))  # the descent works on its own copy
    idx = np.arange(16)
    for variant in (idx.tolist(), idx.astype(np.int32), np.repeat(idx, 2)[::2]):
        np.testing.assert_array_equal(t.get(variant), np.arange(16.0))
