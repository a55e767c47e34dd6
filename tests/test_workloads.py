"""Workloads as data (pal_bench.workloads), the adapters in each memory mode, and ``pal-bench memory``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pal_bench.bench.adapters import make_adapter
from pal_bench.frame_replay import FrameReplayBuffer
from pal_bench.workloads import WORKLOADS, get_workload


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_streams_are_real_episodes(name):
    """Within a stream, a step's next observation is the following step's observation unless the step ends an
    episode; stacks advance by one frame; an episode's first stack is its reset frame repeated."""
    w = get_workload(name)
    rows = w.streams(900, seed=3, n_streams=3, chunk=40)
    assert set(rows) == set(w.fields) | {"stream"}
    for k, (shape, dtype) in w.fields.items():
        assert rows[k].shape == (900, *shape) and rows[k].dtype == dtype
    assert np.bincount(rows["stream"]).tolist() == [300, 300, 300]
    assert (rows["stream"][:40] == 0).all() and (rows["stream"][40:80] == 1).all()
    for s in range(3):
        mine = np.flatnonzero(rows["stream"] == s)
        o, n, d = rows["obs"][mine], rows["next_obs"][mine], rows["done"][mine]
        cont = ~d[:-1]
        assert (n[:-1][cont] == o[1:][cont]).all()
        if (~cont).any():
            assert (n[:-1][~cont] != o[1:][~cont]).any()      # a new episode starts from a new frame
        if w.stack > 1:
            assert (o[:, 1:] == n[:, :-1]).all()
            first = np.r_[0, np.flatnonzero(d[:-1]) + 1]
            assert (o[first] == o[first][:, -1:]).all()       # reset frame repeated


def test_lunarlander_rows_are_the_stored_results_rows():
    """The LunarLander rows every stored latency result was measured with (random, seeded) stay the same."""
    b = get_workload("lunarlander").batch(5, seed=2)
    rng = np.random.default_rng(2)
    np.testing.assert_array_equal(b["obs"], rng.standard_normal((5, 8), dtype=np.float32))
    assert get_workload("lunarlander").row_bytes == 8 * 4 * 2 + 8 + 4 + 1


def test_unknown_workload_and_mode():
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("pong")
    with pytest.raises(ValueError, match="no memory mode 'stack'"):
        make_adapter("pal", 100, workload=get_workload("humanoid"), mode="stack")
    with pytest.raises(ValueError, match="no memory mode 'next-ref'"):
        make_adapter("naive-numpy", 100, workload=get_workload("humanoid"), mode="next-ref")


@pytest.mark.parametrize("mode", ["full", "next-ref", "stack"])
def test_pal_adapter_in_each_mode(mode):
    a = make_adapter("pal", 600, workload=get_workload("atari"), mode=mode)
    assert len(a.buf) == 600 and 0 < a.transitions() <= 600
    idx = a.sample(32)
    a.update(idx, np.full(32, 2.0))
    if mode != "full":
        assert isinstance(a.buf, FrameReplayBuffer) and a.buf.stack == (4 if mode == "stack" else 1)


def test_memory_command(tmp_path):
    """Each point in a fresh process; a frame mode needs less than half the bytes per transition of full rows,
    and full rows need about what their fields hold."""
    from pal_bench.studies.memory import main

    assert main(["--workload", "humanoid", "--impl", "pal,pal-uniform", "--capacity", "5000",
                 "--out", str(tmp_path), "--force"]) == 0
    df = pd.read_csv(tmp_path / "memory.csv")
    assert set(df.columns) >= {"impl", "workload", "mode", "capacity", "rss_bytes", "peak_rss_bytes",
                               "bytes_per_transition"}
    assert (df.status == "ok").all() and len(df) == 4
    row = get_workload("humanoid").row_bytes
    full = df[df["mode"] == "full"].bytes_per_transition
    ref = df[df["mode"] == "next-ref"].bytes_per_transition
    assert ((full > 0.8 * row) & (full < 1.5 * row)).all()
    assert (ref < 0.7 * row).all()
    assert (tmp_path / "memory.csv.meta.json").exists()


def test_memory_refuses_a_bad_stored_table_before_measuring(tmp_path, monkeypatch):
    from pal_bench.studies import memory

    monkeypatch.setattr(memory, "study", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    monkeypatch.setattr(memory, "interleaving_check", lambda *a, **k: (_ for _ in ()).throw(AssertionError("x")))
    for text in ("impl,workload\npal,atari\n", "impl,workload,mode,capacity,status,rss_bytes\npal,atari,full,1e5,"
                 "ok,lots\n", "\xff\xfe"):
        (tmp_path / "memory.csv").write_bytes(text.encode("latin-1"))
        with pytest.raises(SystemExit) as e:
            memory.main(["--workload", "humanoid", "--impl", "pal", "--out", str(tmp_path), "--force"])
        assert e.value.code == 2
    with pytest.raises(SystemExit):                        # nothing to check: refused, nothing written
        memory.main(["--workload", "humanoid", "--impl", "sb3", "--interleaved", "--out", str(tmp_path), "--force"])
    assert not (tmp_path / "interleaving.csv").exists()
