"""The end-to-end parts probe (issue 50): each placement puts the driver and the actor process where it says, the
run's counters are read over the trained part only, every process and thread it starts stops, and bad arguments or a
stored file with bad rows are refused."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import threading
import time

import pandas as pd
import pytest

from pal_bench.argtypes import UsageError
from pal_bench.studies.simulate import end_to_end_parts as parts
from pal_bench.studies.simulate.ray_learners import ray_processes

TWO = len(os.sched_getaffinity(0)) >= 2


def live():
    return set(threading.enumerate()), {p.pid for p in mp.active_children()}


def test_cpu_times_read_every_cpu_and_move_while_this_process_works():
    before = parts.cpu_times()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    after = parts.cpu_times()
    assert before and set(after) == set(before)
    assert sum(a[0] - b[0] for a, b in zip(after.values(), before.values())) >= 10      # 0.3 s at 100 ticks/s
    assert all(0 <= busy and 0 <= steal for busy, steal, _ in after.values())


def test_usage_counts_the_actor_from_the_reaped_children_less_what_it_had_used_at_the_clock():
    start = parts.Snapshot(wall=10.0, driver_cpu=1.0, driver_switches=5, children_cpu=3.0, children_switches=7,
                           cpus={0: (100, 0, 200), 1: (50, 10, 200)}, actors={42: (1.5, 2)})
    end = parts.Snapshot(wall=12.0, driver_cpu=2.6, driver_switches=25, children_cpu=7.5, children_switches=49,
                         cpus={0: (280, 0, 400), 1: (150, 30, 400)}, actors={})
    got = parts.usage(start, end, cpus=(0, 1))
    assert got["window_s"] == pytest.approx(2.0)
    assert got["driver_cores"] == pytest.approx(0.8) and got["driver_switches_per_s"] == pytest.approx(10)
    assert got["actor_cores"] == pytest.approx(1.5) and got["actor_switches_per_s"] == pytest.approx(20)
    assert got["cpu_a_busy"] == pytest.approx(0.9) and got["cpu_b_busy"] == pytest.approx(0.5)
    assert got["cpu_a_steal"] == 0 and got["cpu_b_steal"] == pytest.approx(0.1)


def test_usage_counts_actors_still_running_at_the_end_from_their_own_counters():
    """A Ray actor process is not this process's child: it is read from its own /proc at both ends (the children's
    totals, which it never reaches, do not count)."""
    start = parts.Snapshot(wall=10.0, driver_cpu=1.0, driver_switches=5, children_cpu=3.0, children_switches=7,
                           cpus={}, actors={42: (1.5, 2), 43: (0.5, 1)})
    end = parts.Snapshot(wall=14.0, driver_cpu=2.0, driver_switches=5, children_cpu=3.0, children_switches=7,
                         cpus={}, actors={42: (4.5, 42), 43: (1.5, 21)})
    got = parts.usage(start, end)
    assert got["actor_cores"] == pytest.approx(1.0) and got["actor_switches_per_s"] == pytest.approx(15)
    gone = dataclasses.replace(end, actors={42: (float("nan"), 0), 43: (1.5, 21)}, children_cpu=5.0)
    assert parts.usage(start, gone)["actor_cores"] == pytest.approx(0.0)   # one reaped: the children's totals
    got = parts.usage(start, gone, children=False)                          # not children (Ray's): not known
    assert math.isnan(got["actor_cores"]) and math.isnan(got["actor_switches_per_s"])


def tiny():
    from pal_bench.train import make_config

    return make_config("dqn", "CartPole-v1", backend="processes", learning_starts=200, batch_size=32)


def shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.skipif(not TWO, reason="placing the actor apart needs 2 CPUs")
@pytest.mark.parametrize("aggregation, placement", [("sync", "apart"), ("async", "together")])
def test_a_placement_puts_the_driver_and_the_actor_process_where_it_says_and_gives_every_thread_its_cpus_back(
        aggregation, placement):
    cpus = parts.two_cpus()
    before, threads_before, segments = live(), parts.masks(os.getpid()), shm()
    got = parts.trainer_run(aggregation, placement, 600, cpus, cfg=tiny())
    assert got["driver_cpus"] == str(cpus[0])
    assert got["actor_cpus"] == str(cpus[1] if placement == "apart" else cpus[0])
    assert got["transitions_per_s"] > 0 and got["updates_per_s"] > 0 and got["actor_cores"] > 0
    assert got["actor.env_step_us"] > 0 and got["learner.forward_backward_us"] > 0
    assert got["window_s"] >= got["wall_s"] * 0.5 and got["actor_restarts"] == 0
    assert 0 <= got["cpu_a_busy"] <= 1 and 0 <= got["cpu_b_steal"] <= 1
    assert parts.masks(os.getpid()) == threads_before and live() == before and shm() == segments


@pytest.mark.skipif(not TWO, reason="placing the actor apart needs 2 CPUs")
@pytest.mark.parametrize("placement", ["apart", "together"])
def test_ray_node_places_the_actor_process_ray_starts_and_reads_its_cpu_from_its_own_counters(placement):
    """Ray starts the actor process (not a child of this one, and without the driver's mask once the driver is
    placed), so ``together`` pins it to the driver's CPU explicitly; its CPU comes from its own /proc counters."""
    from pal_bench.train import make_config

    cfg = make_config("dqn", "CartPole-v1", backend="ray", ray_placement="node", learning_starts=200, batch_size=32)
    cpus = parts.two_cpus()
    before, threads_before, segments, rays = live(), parts.masks(os.getpid()), shm(), ray_processes()
    got = parts.trainer_run("async", placement, 600, cpus, cfg=cfg, backend="ray-node")
    assert got["driver_cpus"] == str(cpus[0])
    assert got["actor_cpus"] == str(cpus[1] if placement == "apart" else cpus[0])
    assert got["transitions_per_s"] > 0 and got["updates_per_s"] > 0
    assert 0 < got["actor_cores"] <= 1.2 and got["actor.env_step_us"] > 0
    # Ray's library keeps a few native threads in this process after its shutdown (gRPC, jemalloc): none of them,
    # nor any thread of ours, is left pinned
    after, default = parts.masks(os.getpid()), os.sched_getaffinity(0)
    assert all(after[t] == m for t, m in threads_before.items() if t in after)
    assert all(m == default for t, m in after.items() if t not in threads_before)
    assert live() == before and shm() == segments
    deadline = time.monotonic() + 30
    while ray_processes() - rays and time.monotonic() < deadline:       # Ray's processes stop after the run
        time.sleep(0.5)
    assert not ray_processes() - rays


@pytest.mark.skipif(not TWO, reason="placing the actor apart needs 2 CPUs")
def test_a_run_that_fails_once_its_actor_is_placed_stops_everything_and_unpins_the_driver():
    class Failing(parts.trainer_class()):
        def _wait_ready(self):
            super()._wait_ready()
            raise RuntimeError("failed after set-up")

    before, threads_before, segments = live(), parts.masks(os.getpid()), shm()
    with pytest.raises(RuntimeError, match="failed after set-up"):
        parts.trainer_run("sync", "apart", 600, parts.two_cpus(), cfg=tiny(), trainer=Failing)
    assert parts.masks(os.getpid()) == threads_before and live() == before and shm() == segments


def test_a_driver_thread_that_cannot_get_its_cpus_back_is_an_error(monkeypatch):
    mine = os.getpid()
    saved = parts.masks(mine)
    monkeypatch.setattr(parts, "masks", lambda pid: {tid: {999} for tid in saved})
    with pytest.raises(RuntimeError, match="could not restore the CPUs"):
        parts.restore(mine, saved, os.sched_getaffinity(0))


def test_the_backend_goes_to_every_run_and_row_and_its_own_file(tmp_path, monkeypatch, capsys):
    got = []

    def run(aggregation, placement, steps, cpus, backend):
        got.append(backend)
        return {"transitions_per_s": 1000.0}

    monkeypatch.setattr(parts, "trainer_run", run)
    monkeypatch.setattr(parts, "one_worker", lambda curve, steps, updates, backend: got.append(backend) or {})
    if not TWO:
        pytest.skip("the probe needs 2 CPUs")
    df = parts.measure(steps=50, updates=10, rounds=1, progress=lambda m: None, backend="ray-node")
    assert set(got) == {"ray-node"} and len(got) == len(df) and set(df.backend) == {"ray-node"}
    _stored(tmp_path, [{"round": 0, "condition": "f_a(1)", "transitions_per_s": 4500.0}])   # the process file only
    assert parts.main(["--model", "--backend", "ray-node", "--out", str(tmp_path)]) == 2
    assert parts.FILES["ray-node"] in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        parts.main(["--backend", "threads"])
    assert e.value.code == 2


def test_every_condition_in_every_round_with_the_order_rotated():
    seen, calls = [], []

    def run(aggregation, placement, steps, cpus):
        calls.append((aggregation, placement, steps))
        if (aggregation, placement) == ("async", "free"):
            raise OSError("no such CPU")
        return {"transitions_per_s": 1000.0, "updates_per_s": 250.0}

    def single(curve, steps, updates):
        return {"transitions_per_s": 4000.0} if curve == "f_a(1)" else {"updates_per_s": 900.0}

    if not TWO:
        pytest.skip("the probe needs 2 CPUs")
    df = parts.measure(steps=50, updates=10, rounds=2, progress=seen.append, run=run, single=single)
    names = [*parts.ONE_WORKER, *parts.TRAINER_CONDITIONS]
    assert len(df) == 2 * len(names) and len(seen) == len(df) + 2          # two lines say a condition failed
    assert list(df[df["round"] == 0].condition) == names
    assert list(df[df["round"] == 1].condition) == names[1:] + names[:1]
    assert sorted(calls) == sorted([(a, p, 50) for a in parts.AGGREGATIONS for p in parts.PLACEMENTS] * 2)
    failed = df[df.condition == "1 + 1 async, free"]         # recorded, and the other conditions went on
    assert failed.error.tolist() == ["OSError: no such CPU"] * 2 and failed.transitions_per_s.isna().all()
    assert any("failed: OSError" in m for m in seen)


def test_one_cpu_is_refused_before_measuring(monkeypatch, capsys):
    monkeypatch.setattr(parts.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("measured"))
    with pytest.raises(UsageError, match="needs 2 CPUs"):
        parts.two_cpus()
    assert parts.main(["--force"]) == 2 and "needs 2 CPUs" in capsys.readouterr().err


def test_bad_arguments_and_a_bad_folder_are_refused_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("measured"))
    for bad in (["--steps", "5"], ["--updates", "nan"], ["--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            parts.main(bad)
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("keep")
    if TWO:
        with pytest.raises(SystemExit) as e:
            parts.main(["--out", str(not_a_folder), "--force"])
        assert e.value.code == 2 and "not a folder" in capsys.readouterr().err
    assert not_a_folder.read_text() == "keep"


def _stored(tmp_path, rows):
    import shutil

    from pal_bench.paths import RESULTS

    shutil.copy(RESULTS / "simulation_inputs.csv", tmp_path / "simulation_inputs.csv")
    pd.DataFrame(rows).to_csv(tmp_path / parts.FILE, index=False)


def test_the_model_sets_each_round_against_its_own_one_worker_rates(tmp_path):
    rows = [{"round": 0, "condition": "f_a(1)", "transitions_per_s": 4500.0},
            {"round": 0, "condition": "f_l(1)", "updates_per_s": 900.0},
            {"round": 0, "condition": "1 + 1 sync, free", "transitions_per_s": 2000.0},
            {"round": 0, "condition": "1 + 1 sync, together", "transitions_per_s": 2000.0},
            {"round": 0, "condition": "1 + 1 async, free", "error": "OSError: failed"},
            {"round": 1, "condition": "f_a(1)", "transitions_per_s": 4500.0},
            {"round": 1, "condition": "f_l(1)", "updates_per_s": 1800.0},               # a faster learner
            {"round": 1, "condition": "1 + 1 sync, free", "transitions_per_s": 2000.0},
            {"round": 2, "condition": "1 + 1 sync, free", "transitions_per_s": 2000.0}]     # no fit: left out
    _stored(tmp_path, rows)
    df, left_out = parts.against_the_model(tmp_path)
    assert [(r.round, r.condition) for r in df.itertuples()] == [(0, "1 + 1 sync, free"), (0, "1 + 1 sync, together"),
                                                                 (1, "1 + 1 sync, free")]
    free, together, faster = df.predicted
    assert together < free < faster                     # one core's worth against two; a faster learner, more
    assert df.error.tolist() == pytest.approx(((df.predicted - 2000.0) / 2000.0).tolist())
    assert [(r.round, r.condition) for r in left_out.itertuples()] == [(0, "1 + 1 async, free"),
                                                                      (2, "1 + 1 sync, free")]


def test_a_stored_file_with_a_bad_row_or_none_is_refused_naming_it(tmp_path, capsys):
    assert parts.main(["--model", "--out", str(tmp_path)]) == 2
    assert parts.FILE in capsys.readouterr().err
    _stored(tmp_path, [{"round": 0, "condition": "f_a(1)", "transitions_per_s": -5.0}])
    assert parts.main(["--model", "--out", str(tmp_path)]) == 2
    assert "transitions_per_s" in capsys.readouterr().err
    twice = {"round": 0, "condition": "1 + 1 sync, free", "transitions_per_s": 2000.0}
    _stored(tmp_path, [twice, twice])
    assert parts.main(["--model", "--out", str(tmp_path)]) == 2
    assert "more than once" in capsys.readouterr().err
    _stored(tmp_path, [{"round": 0, "condition": "1 + 1 sync, free", "transitions_per_s": 2000.0}])   # no fit
    assert parts.main(["--model", "--out", str(tmp_path)]) == 2
    got = capsys.readouterr()
    assert "no trainer run" in got.err and "left out: round 0, 1 + 1 sync, free: no f_a(1)" in got.out


def test_the_docs_quote_the_stored_measurement():
    """docs/simulation.md quotes, for each backend's stored file, each condition's transitions/s (f_l(1): updates/s)
    and the actor's involuntary switches over the stored rounds; the model's errors it quotes come from ``--model``
    (about 2 minutes)."""
    from pal_bench.paths import RESULTS, ROOT

    docs = " ".join((ROOT / "docs" / "simulation.md").read_text().split())

    def span(v):
        return f"{v.min():,.0f}-{v.max():,.0f}"

    for backend, name in parts.FILES.items():
        df = pd.read_csv(RESULTS / name)
        assert name in docs, name
        for condition, g in df.groupby("condition"):
            column = "updates_per_s" if condition == "f_l(1)" else "transitions_per_s"
            cells = [span(g[column])] + ([span(g.actor_switches_per_s)] if condition in parts.TRAINER_CONDITIONS
                                         else [])
            assert all(c in docs for c in cells), (backend, condition, cells)
        assert f"{df['round'].nunique()} rounds" in docs
