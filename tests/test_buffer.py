"""PrioritizedReplayBuffer and ReplayBuffer: API, sampling statistics, bad input, persistence."""

import numpy as np
import pytest
from conftest import LUNAR_FIELDS, assert_rows_consistent, lunar_batch
from scipy import stats

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer

BUFFERS = [PrioritizedReplayBuffer, ReplayBuffer]


def make(cls, capacity=100, **kw):
    return cls(capacity, LUNAR_FIELDS, seed=0, **kw)


def snapshot(buf) -> dict:
    """Everything observable about a buffer's state (contents via save/load-free means)."""
    n = buf.total_added
    ids = np.arange(max(0, n - buf.capacity), n)
    state = {"len": len(buf), "total_added": n, "max_priority": buf.max_priority,
             "prio": buf.get_priorities(ids) if n else None}
    if isinstance(buf, PrioritizedReplayBuffer):
        state["total"] = buf.total_priority()
    return state


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("cls", BUFFERS)
def test_add_and_sample_round_trip(cls):
    buf = make(cls, capacity=50)
    o = np.arange(8, dtype=np.float32)
    i = buf.add(obs=o, act=3, rew=0.5, next_obs=o + 1, done=True)
    assert i == 0 and len(buf) == 1
    b = buf.sample(4, beta=0.4)
    assert set(b) == {"obs", "act", "rew", "next_obs", "done", "indices", "weights"}
    assert b["obs"].shape == (4, 8) and b["obs"].dtype == np.float32
    assert b["act"].dtype == np.int64 and b["done"].dtype == np.bool_
    np.testing.assert_array_equal(b["indices"], [0, 0, 0, 0])
    np.testing.assert_array_equal(b["obs"][0], o)
    np.testing.assert_array_equal(b["next_obs"][0], o + 1)
    assert b["act"][0] == 3 and b["rew"][0] == np.float32(0.5) and b["done"][0]
    np.testing.assert_array_equal(b["weights"], 1.0)


@pytest.mark.parametrize("cls", BUFFERS)
def test_scalar_kinds_accepted_by_add(cls):
    buf = make(cls)
    o = np.zeros(8, np.float32)
    buf.add(obs=o.astype(np.float64), act=np.int64(2), rew=np.float32(1.5), next_obs=list(o), done=np.bool_(False))
    buf.add(obs=o, act=np.int32(2), rew=1, next_obs=o, done=False)
    b = buf.sample(64)
    assert set(b["act"]) == {2} and set(b["rew"]) <= {1.0, 1.5}


@pytest.mark.parametrize("cls", BUFFERS)
def test_ring_overwrites_oldest(cls):
    buf = make(cls, capacity=10)
    ids = buf.add_batch(**lunar_batch(25))
    np.testing.assert_array_equal(ids, np.arange(25))
    assert len(buf) == 10 and buf.total_added == 25
    b = buf.sample(500)
    assert set(b["indices"]) == set(range(15, 25))
    np.testing.assert_array_equal(b["act"], b["indices"])  # row r holds value r
    assert_rows_consistent(b)
    buf._check_invariants()


@pytest.mark.parametrize("cls", BUFFERS)
def test_add_batch_wraps_around_ring(cls):
    buf = make(cls, capacity=10)
    buf.add_batch(**lunar_batch(7))
    buf.add_batch(**lunar_batch(6, start=7))  # slots 7, 8, 9, 0, 1, 2
    b = buf.sample(400)
    assert set(b["indices"]) == set(range(3, 13))
    np.testing.assert_array_equal(b["act"], b["indices"])
    assert_rows_consistent(b)
    buf._check_invariants()


def test_new_transitions_get_max_priority():
    buf = make(PrioritizedReplayBuffer, alpha=0.5, eps=0.0)
    buf.add_batch(**lunar_batch(3))
    np.testing.assert_allclose(buf.get_priorities([0, 1, 2]), 1.0)
    buf.update_priorities([0, 1], [4.0, 9.0])
    assert buf.max_priority == 9.0
    (i,) = buf.add_batch(**lunar_batch(1, start=3))
    np.testing.assert_allclose(buf.get_priorities([0, 1, 2, i]), [2.0, 3.0, 1.0, 3.0])
    buf._check_invariants()


def test_new_priority_follows_max_priority_raised_through_another_handle():
    """A handle reuses its last (max_priority + eps)^alpha only while the shared header's max_priority is
    unchanged: a raise through another handle (another process) reaches its next add and add_batch."""
    buf = make(PrioritizedReplayBuffer, alpha=0.5, eps=0.0, shared=True)
    other = PrioritizedReplayBuffer.attach(buf.shared_name)
    try:
        row = {k: v[0] for k, v in lunar_batch(1).items()}
        first = buf.add(**row)                       # computes and keeps 1.0 ** 0.5
        other.update_priorities([first], [16.0])     # the header's max_priority: 16
        second = buf.add(**row)
        (third,) = buf.add_batch(**lunar_batch(1, start=2))
        np.testing.assert_allclose(buf.get_priorities([first, second, third]), [4.0, 4.0, 4.0])
        buf._check_invariants()
    finally:
        other.close()
        buf.close()


def test_initial_priorities_in_add_batch():
    buf = make(PrioritizedReplayBuffer, alpha=1.0, eps=0.0)
    ids = buf.add_batch(priorities=[1.0, 2.0, 3.0], **lunar_batch(3))
    np.testing.assert_allclose(buf.get_priorities(ids), [1.0, 2.0, 3.0])
    assert buf.max_priority == 3.0


def test_every_path_stores_the_same_power_of_a_priority():
    """``add`` (max priority), ``add_batch(priorities=)`` and ``update_priorities`` store (p + eps)^alpha through one
    pow (libmvec's vector pow where the CPU has AVX2, else libm's): the same bits whichever call wrote them, and
    within 4 ulp of numpy's; weights likewise within 4 ulp of (p_min / p)^beta."""
    raw = np.geomspace(1e-6, 1e6, 37)                 # 37: whole vectors of 4 and a tail
    a = PrioritizedReplayBuffer(64, {"x": ((), np.float32)}, alpha=0.6, seed=0)
    a.add_batch(x=np.zeros(37, np.float32), priorities=raw)
    b = PrioritizedReplayBuffer(64, {"x": ((), np.float32)}, alpha=0.6, seed=0)
    b.add_batch(x=np.zeros(37, np.float32))
    b.update_priorities(np.arange(37), raw)
    c = PrioritizedReplayBuffer(128, {"x": ((), np.float32)}, alpha=0.6, seed=0)
    added = []
    for p in raw:          # raise the max priority to p, then add: the new row stores the max (add's own pow)
        c.update_priorities([c.add(x=0.0)], [p])
        added.append(c.add(x=0.0))
    ids = np.arange(37)
    assert np.array_equal(a.get_priorities(ids), b.get_priorities(ids))
    big = raw >= 1.0                                 # the max priority starts at 1: it only rises
    assert np.array_equal(a.get_priorities(ids)[big], c.get_priorities(added)[big])
    expected = (raw + 1e-6) ** 0.6
    assert np.all(np.abs(a.get_priorities(ids) - expected) <= 4 * np.spacing(expected))
    s = a.sample(256, beta=0.4)
    stored = a.get_priorities(s["indices"])
    w = (a.min_priority() / stored) ** 0.4
    assert np.all(np.abs(s["weights"] - w) <= 4 * np.spacing(w))


def test_sampling_frequencies_follow_priority_alpha():
    n, alpha, draws = 20, 0.6, 200_000
    buf = PrioritizedReplayBuffer(n, LUNAR_FIELDS, alpha=alpha, eps=0.0, seed=123)
    ids = buf.add_batch(**lunar_batch(n))
    raw = np.arange(1, n + 1, dtype=float)
    buf.update_priorities(ids, raw)
    counts = np.zeros(n)
    for _ in range(draws // 1000):
        np.add.at(counts, buf.sample(1000)["indices"], 1)
    expected = raw**alpha / (raw**alpha).sum() * draws
    chi2, p = stats.chisquare(counts, expected)
    assert p > 0.001, (chi2, p)
    # and a wrong exponent is rejected by the same test (the test can fail)
    wrong = raw / raw.sum() * draws
    assert stats.chisquare(counts, wrong)[1] < 1e-6


def test_importance_weights_match_formula():
    n, alpha, beta = 50, 0.7, 0.4
    buf = PrioritizedReplayBuffer(n, LUNAR_FIELDS, alpha=alpha, eps=0.0, seed=5)
    ids = buf.add_batch(**lunar_batch(n))
    raw = np.random.default_rng(0).uniform(0.1, 5.0, n)
    buf.update_priorities(ids, raw)
    b = buf.sample(256, beta=beta)
    p = raw**alpha
    prob = p / p.sum()
    w = (n * prob[b["indices"]]) ** -beta
    w_max = (n * prob.min()) ** -beta
    np.testing.assert_allclose(b["weights"], w / w_max, rtol=1e-12)
    assert b["weights"].max() <= 1.0


def test_alpha_zero_is_uniform_and_uniform_buffer_ignores_priorities():
    for buf in (PrioritizedReplayBuffer(10, LUNAR_FIELDS, alpha=0.0, seed=1), ReplayBuffer(10, LUNAR_FIELDS, seed=1)):
        ids = buf.add_batch(**lunar_batch(10))
        assert buf.update_priorities(ids, np.arange(10.0)) == 10
        counts = np.bincount(buf.sample(100_000)["indices"], minlength=10)
        assert stats.chisquare(counts)[1] > 0.001


def test_stale_priority_updates_are_dropped():
    buf = make(PrioritizedReplayBuffer, capacity=8, alpha=1.0, eps=0.0)
    buf.add_batch(**lunar_batch(8))
    old = buf.sample(8)["indices"]
    buf.add_batch(**lunar_batch(8, start=8))  # every slot overwritten
    before = buf.get_priorities(np.arange(8, 16))
    assert buf.update_priorities(old, np.full(8, 100.0)) == 0
    np.testing.assert_array_equal(buf.get_priorities(np.arange(8, 16)), before)
    assert np.isnan(buf.get_priorities(old)).all()
    assert buf.max_priority == 1.0
    buf._check_invariants()


def test_duplicate_updates_last_wins():
    buf = make(PrioritizedReplayBuffer, alpha=1.0, eps=0.0)
    buf.add_batch(**lunar_batch(4))
    buf.update_priorities([1, 2, 1, 1], [5.0, 6.0, 7.0, 2.0])
    np.testing.assert_allclose(buf.get_priorities([1, 2]), [2.0, 6.0])
    buf._check_invariants()


def test_zero_priority_with_eps_zero():
    buf = make(PrioritizedReplayBuffer, alpha=1.0, eps=0.0)
    ids = buf.add_batch(**lunar_batch(3))
    buf.update_priorities(ids, [0.0, 1.0, 0.0])
    assert set(buf.sample(200)["indices"]) == {1}
    buf.update_priorities([1], [0.0])
    with pytest.raises(ValueError, match="zero"):
        buf.sample(1)


BAD_ADDS = [
    (dict(obs=np.zeros(8), act=1, rew=0.0, next_obs=np.zeros(8)), ValueError, "missing"),
    (dict(obs=np.zeros(8), act=1, rew=0.0, next_obs=np.zeros(8), done=False, extra=1), ValueError, "unknown"),
    (dict(obs=np.zeros(7), act=1, rew=0.0, next_obs=np.zeros(8), done=False), ValueError, "obs"),
    (dict(obs=np.zeros(8), act=1.5, rew=0.0, next_obs=np.zeros(8), done=False), TypeError, "act"),
    (dict(obs=np.zeros(8), act=1, rew="x", next_obs=np.zeros(8), done=False), TypeError, "rew"),
    (dict(obs=np.zeros(8), act=1, rew=0.0, next_obs=np.zeros((2, 8)), done=False), ValueError, "next_obs"),
    (dict(obs=np.zeros(8), act=1, rew=0.0, next_obs=np.zeros(8), done=0.5), TypeError, "done"),
]


@pytest.mark.parametrize("cls", BUFFERS)
@pytest.mark.parametrize("kwargs, exc, match", BAD_ADDS)
def test_bad_add_raises_and_changes_nothing(cls, kwargs, exc, match):
    buf = make(cls)
    buf.add_batch(**lunar_batch(5))
    before = snapshot(buf)
    with pytest.raises(exc, match=match):
        buf.add(**kwargs)
    batch = {k: np.stack([v, v]) if isinstance(v, np.ndarray) else [v, v] for k, v in kwargs.items()}
    with pytest.raises(exc, match=match):
        buf.add_batch(**batch)
    assert_same_state(snapshot(buf), before)
    buf._check_invariants()


@pytest.mark.parametrize("cls", BUFFERS)
def test_bad_add_batch_inputs(cls):
    buf = make(cls)
    buf.add_batch(**lunar_batch(5))
    before = snapshot(buf)
    bad = lunar_batch(4)
    bad["act"] = bad["act"][:3]
    with pytest.raises(ValueError, match="act"):
        buf.add_batch(**bad)
    with pytest.raises(ValueError, match="priorities"):
        buf.add_batch(priorities=[1.0, np.nan, 1.0, 1.0], **lunar_batch(4))
    with pytest.raises(ValueError, match="priorities"):
        buf.add_batch(priorities=[1.0, -1.0, 1.0, 1.0], **lunar_batch(4))
    with pytest.raises(ValueError, match="priorities"):
        buf.add_batch(priorities=[1.0], **lunar_batch(4))
    assert_same_state(snapshot(buf), before)


@pytest.mark.parametrize("cls", BUFFERS)
@pytest.mark.parametrize(
    "indices, priorities, exc",
    [
        ([0, 1], [1.0, np.nan], ValueError),
        ([0, 1], [1.0, np.inf], ValueError),
        ([0, 1], [1.0, -0.5], ValueError),
        ([0, 99], [1.0, 1.0], IndexError),
        ([-1], [1.0], IndexError),
        ([0, 1], [1.0], ValueError),
        ([[0, 1]], [[1.0, 1.0]], ValueError),
        ([0.5], [1.0], TypeError),
    ],
)
def test_bad_priority_update_raises_and_changes_nothing(cls, indices, priorities, exc):
    buf = make(cls)
    buf.add_batch(**lunar_batch(10))
    before = snapshot(buf)
    with pytest.raises(exc):
        buf.update_priorities(indices, priorities)
    assert_same_state(snapshot(buf), before)
    buf._check_invariants()


@pytest.mark.parametrize("cls", BUFFERS)
def test_bad_sample_arguments(cls):
    buf = make(cls)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    buf.add_batch(**lunar_batch(3))
    for bad, exc in [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc):
            buf.sample(bad)
    for beta in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta"):
            buf.sample(1, beta=beta)


def test_constructor_validation():
    for kw, match in [(dict(alpha=-0.1), "alpha"), (dict(alpha=1.5), "alpha"), (dict(alpha=float("nan")), "alpha"),
                      (dict(eps=-1.0), "eps"), (dict(fanout=1), "fanout"), (dict(seed=-1), "seed")]:
        with pytest.raises(ValueError, match=match):
            PrioritizedReplayBuffer(10, LUNAR_FIELDS, **kw)
    for cls in BUFFERS:
        with pytest.raises(ValueError, match="capacity"):
            cls(0, LUNAR_FIELDS)
        with pytest.raises(TypeError, match="capacity"):
            cls(2.5, LUNAR_FIELDS)
        with pytest.raises(ValueError, match="fields"):
            cls(10, {})
        with pytest.raises(ValueError, match="reserved"):
            cls(10, {"weights": ((), np.float32)})
        with pytest.raises(ValueError, match="obs"):
            cls(10, {"obs": ((0,), np.float32)})


@pytest.mark.parametrize("cls", BUFFERS)
def test_save_load_round_trip(cls, tmp_path):
    buf = make(cls, capacity=64)
    buf.add_batch(**lunar_batch(100))
    if cls is PrioritizedReplayBuffer:
        b = buf.sample(32)
        buf.update_priorities(b["indices"], np.random.default_rng(0).random(32) * 3)
    buf.sample(5)  # advance the RNG
    path = tmp_path / "buf.pal"
    buf.save(path)
    loaded = cls.load(path)
    assert_same_state(snapshot(loaded), snapshot(buf))
    assert loaded.fields == buf.fields and loaded.capacity == buf.capacity
    a, b = buf.sample(50), loaded.sample(50)  # same RNG state -> same draws
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    ids_a = buf.add_batch(**lunar_batch(3, start=500))
    ids_b = loaded.add_batch(**lunar_batch(3, start=500))
    np.testing.assert_array_equal(ids_a, ids_b)
    loaded._check_invariants()


def test_load_rejects_truncated_foreign_and_wrong_kind(tmp_path):
    buf = make(PrioritizedReplayBuffer)
    buf.add_batch(**lunar_batch(50))
    path = tmp_path / "b.pal"
    buf.save(path)
    data = path.read_bytes()
    trunc = tmp_path / "trunc.pal"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="trunc"):
        PrioritizedReplayBuffer.load(trunc)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a PAL-Bench"):
        PrioritizedReplayBuffer.load(foreign)
    text = tmp_path / "text.pal"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a PAL-Bench"):
        PrioritizedReplayBuffer.load(text)
    with pytest.raises(ValueError, match="ReplayBuffer"):
        ReplayBuffer.load(path)


def test_batch_larger_than_capacity_keeps_the_last_rows():
    buf = make(PrioritizedReplayBuffer, capacity=5)
    ids = buf.add_batch(**lunar_batch(12))
    np.testing.assert_array_equal(ids, np.arange(12))
    b = buf.sample(300)
    assert set(b["indices"]) == set(range(7, 12))
    np.testing.assert_array_equal(b["act"], b["indices"])
    assert buf.update_priorities([0, 1], [5.0, 5.0]) == 0  # stale at once
    buf._check_invariants()


def test_buffer_default_fanout_matches_tree_default():
    from pal_bench import DEFAULT_FANOUT

    assert PrioritizedReplayBuffer(10, LUNAR_FIELDS).fanout == DEFAULT_FANOUT


@pytest.mark.parametrize("cls", BUFFERS)
def test_get_reads_stored_rows_by_id(cls):
    buf = make(cls, capacity=10)
    buf.add_batch(**lunar_batch(25))                        # ids 15..24 are stored
    rows = buf.get([24, 15, 20, 20])
    np.testing.assert_array_equal(rows["act"], [24, 15, 20, 20])  # row r holds value r
    assert set(rows) == set(LUNAR_FIELDS)
    assert_rows_consistent(rows | {"indices": np.array([24, 15, 20, 20])})
    only = buf.get(np.array([16]), "rew")
    assert list(only) == ["rew"] and only["rew"].shape == (1,)
    assert all(v.shape[0] == 0 for v in buf.get([]).values())
    before = snapshot(buf)
    for ids, exc in (([14], KeyError), ([25], KeyError), ([-1], KeyError), ([1.5], TypeError),
                     ([[15]], ValueError)):
        with pytest.raises(exc):
            buf.get(ids)
    with pytest.raises(KeyError, match="unknown field"):
        buf.get([15], ["nope"])
    assert_same_state(before, snapshot(buf))


def _twins(cls):
    """Two buffers with the same seed and contents: their samples match call for call."""
    bufs = [make(cls, capacity=64) for _ in range(2)]
    for b in bufs:
        b.add_batch(**lunar_batch(100, start=3))
        if isinstance(b, PrioritizedReplayBuffer):
            b.update_priorities(np.arange(36, 100), np.linspace(0.1, 3.0, 64))
    return bufs


@pytest.mark.parametrize("cls", BUFFERS)
def test_sample_into_out_reuses_the_arrays(cls):
    a, b = _twins(cls)
    out = a.sample(32, beta=0.5)
    b.sample(32, beta=0.5)
    arrays = dict(out)
    for _ in range(3):
        got = a.sample(32, beta=0.5, out=out)
        want = b.sample(32, beta=0.5)
        assert got is out and all(got[k] is arrays[k] for k in arrays)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("cls", BUFFERS)
@pytest.mark.parametrize("spoil", ["shape", "dtype", "strided", "readonly", "missing", "not-array"])
def test_sample_out_that_does_not_fit_is_rejected_before_any_draw(cls, spoil):
    a, b = _twins(cls)
    out = a.sample(16)
    b.sample(16)
    before = {k: v.copy() for k, v in out.items()}
    orig = dict(out)
    if spoil == "shape":
        out["obs"] = np.zeros((15, 8), np.float32)
    elif spoil == "dtype":
        out["rew"] = np.zeros(16, np.float64)
    elif spoil == "strided":
        out["obs"] = np.zeros((16, 16), np.float32)[:, ::2]
    elif spoil == "readonly":
        out["weights"].flags.writeable = False
    elif spoil == "missing":
        del out["indices"]
    else:
        out["done"] = [False] * 16
    with pytest.raises(ValueError, match="out\\["):
        a.sample(16, out=out)
    for k, v in before.items():                      # nothing written into the arrays that did fit
        if out.get(k) is orig[k]:
            np.testing.assert_array_equal(out[k], v)
    want = b.sample(16)                              # and no random draw spent
    np.testing.assert_array_equal(a.sample(16)["indices"], want["indices"])


def test_sample_out_must_be_a_dict():
    with pytest.raises(TypeError, match="out must be a dict"):
        _twins(ReplayBuffer)[0].sample(4, out=[np.zeros(4)])
