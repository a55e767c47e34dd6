"""The race's bookkeeping and stop rules, and the plug-in benchmark's tables and buffer clock."""

import dataclasses
import json
import time

import numpy as np
import pandas as pd
import pytest

from pal_bench.studies import plugin as plugin_bench
from pal_bench.studies import race

SMOKE = race.TASKS["smoke"]


def test_clock_stops_at_target_or_budget():
    task = dataclasses.replace(SMOKE, target=50.0, max_steps=5_000, eval_episodes=1)
    clock = race.Clock(task, seed=0, t0=time.perf_counter())
    assert clock.due(1_000) and not clock.due(999)
    assert not clock.record(1_000, lambda obs: 0)          # always-left CartPole: ~10, below target
    assert clock.next_eval == 2_000 and clock.curve[0]["mean_return"] < 50
    assert clock.record(5_000, lambda obs: 0)               # the step budget is spent
    assert clock.next_eval == 6_000
    reached = race.Clock(dataclasses.replace(task, target=-1.0), seed=0, t0=time.perf_counter())
    assert reached.record(1_000, lambda obs: 0)
    out_of_time = race.Clock(dataclasses.replace(task, max_wall_s=0.0), seed=0, t0=time.perf_counter())
    assert out_of_time.done(0)


def test_summary_and_table_report_unreached_runs_as_such():
    runs = [{"contestant": "pal", "seed": 0, "setup_s": 1.0, "wall_s": 30.0,
             "curve": [{"env_steps": 1000, "wall_s": 10.0, "mean_return": 50.0},
                       {"env_steps": 2000, "wall_s": 20.0, "mean_return": 210.0}]},
            {"contestant": "rllib", "seed": 0, "setup_s": 8.0, "wall_s": 90.0,
             "curve": [{"env_steps": 1000, "wall_s": 30.0, "mean_return": 20.0},
                       {"env_steps": 2000, "wall_s": 80.0, "mean_return": 205.0}]},
            {"contestant": "tianshou", "seed": 0, "setup_s": 2.0, "wall_s": 60.0,
             "curve": [{"env_steps": 1000, "wall_s": 60.0, "mean_return": 120.0}]}]
    task = dataclasses.replace(SMOKE, target=200.0)
    rows = pd.DataFrame([race.summarise(r, task) for r in runs])
    assert rows.reached.tolist() == [True, True, False]
    assert rows.wall_to_target_s.tolist()[:2] == [20.0, 80.0] and rows.steps_to_target.tolist()[:2] == [2000, 2000]
    t = race.race_table(rows).set_index("contestant")
    assert t.loc["rllib", "speedup"] == pytest.approx(4.0) and t.loc["rllib", "speedup_bound"] == ""
    # a run that never reached the target counts at the time it ran: its speedup is a lower bound
    assert t.loc["tianshou", "reached"] == 0 and t.loc["tianshou", "median_wall_to_target_s"] == 60.0
    assert t.loc["tianshou", "speedup"] == pytest.approx(3.0) and t.loc["tianshou", "speedup_bound"] == ">="
    assert np.isnan(t.loc["pal", "speedup"]) and np.isnan(t.loc["tianshou", "median_steps_to_target"])


def test_speedups_are_taken_against_pal_s_process_backend_where_it_raced():
    def run(name, seed, wall, reached=True):
        return {"contestant": name, "seed": seed, "reached": reached, "wall_to_target_s": wall if reached else None,
                "wall_s": wall + 1, "steps_to_target": 1000 if reached else None, "setup_s": 1.0, "best_return": 1.0}

    rows = pd.DataFrame([run("pal", s, 300.0 + s) for s in range(3)] + [run("pal-processes", s, 100.0 + s)
                                                                        for s in range(3)]
                        + [run("tianshou", s, 400.0 + 10 * s) for s in range(3)]
                        + [run("pal-processes", 3, 1800.0, reached=False)])
    t = race.race_table(rows).set_index("contestant")
    assert race.reference(rows.contestant) == "pal-processes"
    # pal-processes: 100, 101, 102 and one run at its budget (1801) -> median 101.5
    assert t.loc["pal-processes", "median_wall_to_target_s"] == pytest.approx(101.5)
    assert t.loc["tianshou", "speedup"] == pytest.approx(410.0 / 101.5)
    assert t.loc["tianshou", "speedup_bound"] == "<="        # the reference has a run counted at its budget
    low, high = t.loc["tianshou", ["speedup_low", "speedup_high"]]
    assert low <= t.loc["tianshou", "speedup"] <= high


def test_return_bands_hold_each_seed_s_latest_evaluation():
    curves = pd.DataFrame([{"contestant": "a", "seed": 0, "wall_s": 1.0, "mean_return": 0.0},
                           {"contestant": "a", "seed": 0, "wall_s": 10.0, "mean_return": 100.0},
                           {"contestant": "a", "seed": 1, "wall_s": 2.0, "mean_return": 50.0},
                           {"contestant": "b", "seed": 0, "wall_s": 100.0, "mean_return": 7.0}])
    b = race.return_bands(curves, points=50)
    a = b[b.contestant == "a"]
    assert a.wall_s.max() <= 10.0 and b[b.contestant == "b"].wall_s.min() >= 100.0 - 1e-9
    first = a.iloc[0]
    assert first.seeds == 1 and first["median"] == 0.0
    late = a[a.wall_s >= 9.0].iloc[0]          # seed 0 still at 0 until t = 10; seed 1 holds 50
    assert late.seeds == 2 and late.low == 0.0 and late.high == 50.0 and late["median"] == 25.0


@pytest.mark.parametrize("name", ["pal", "pal-processes", "pal-apex"])
def test_pal_contestant_runs_to_its_budget_and_reports_its_evaluations(name):
    run = race.run_one(name, SMOKE, seed=0, split=(1, 1))
    steps = [e["env_steps"] for e in run["curve"]]
    assert steps and steps[-1] >= SMOKE.max_steps and steps == sorted(steps)
    assert 0 < run["setup_s"] < run["wall_s"] and all(e["wall_s"] > run["setup_s"] for e in run["curve"])
    # the trainer's per-phase times come with the run (``pal-bench race-profile`` prints them)
    assert {"actor0", "learner0"} <= set(run["phase_seconds"])
    assert all(s >= 0 for ph in run["phase_seconds"].values() for s in ph.values())


def test_unknown_contestant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown contestant"):
        race.run_one("nope", SMOKE, seed=0, split=(1, 1))


def test_buffer_clock_sums_time_inside_the_wrapped_methods():
    class Slow:
        def add(self, x):
            time.sleep(0.01)
            return x

    buf = Slow()
    clock = plugin_bench.BufferClock(buf, methods=("add", "sample"))
    assert buf.add(3) == 3 and buf.add(4) == 4
    assert 0.02 <= clock.seconds < 0.5


def test_speedup_table_and_amdahl_bound():
    rows = [dict(framework="rllib-dqn", env="E", batch_size=32, env_runners=0, buffer="default",
                 iteration_s=1.0, buffer_share=0.5),
            dict(framework="rllib-dqn", env="E", batch_size=32, env_runners=0, buffer="pal",
                 iteration_s=0.8, buffer_share=0.3)]
    t = plugin_bench.speedup_table(pd.DataFrame(rows))
    assert t.speedup.iloc[0] == pytest.approx(1.25) and t.bound.iloc[0] == pytest.approx(2.0)
    assert t.note.iloc[0] == ""
    # above the bound: expected for a drop-in that changes work outside the buffer, a problem otherwise
    fast = [r | {"iteration_s": 0.4} if r["buffer"] == "pal" else r for r in rows]
    for framework, problem in (("rllib-dqn", False), ("tianshou-dqn", True)):
        t = plugin_bench.speedup_table(pd.DataFrame([r | {"framework": framework} for r in fast]))
        assert t.speedup.iloc[0] == pytest.approx(2.5)
        assert ("measurement problem" in t.note.iloc[0] or "not a result" in t.note.iloc[0]) == problem
        assert "learner-connector" in t.note.iloc[0] or problem


def test_paired_alternates_the_two_buffers_and_closes_both():
    log = []

    class Buf:
        def __len__(self):
            return 7

        def add(self):
            time.sleep(0.002)

    class Run:
        methods = ("add",)

        def __init__(self, name):
            self.name, self.buffer, self.closed = name, Buf(), False

        def prepare(self, warmup):
            log.append(("prepare", self.name, warmup))

        def iterate(self):
            log.append(("iterate", self.name))
            self.buffer.add()

        def close(self):
            log.append(("close", self.name))

    out = plugin_bench.paired(Run, warmup=2, iters=4)
    order = [name for what, name, *_ in log if what == "iterate"]
    assert order == ["default", "pal", "pal", "default", "default", "pal", "pal", "default"]
    assert [e for e in log if e[0] == "close"] == [("close", "default"), ("close", "pal")]
    for r in out.values():
        assert r["iterations"] == 4 and r["buffer_len"] == 7 and 0 < r["buffer_share"] <= 1


def test_each_pal_backend_takes_the_split_from_its_own_curves(tmp_path, monkeypatch):
    """Actor-bound curves (learners 16x faster than 0.25 updates per step needs): threads lose with a second
    actor, processes gain, so on 3 cores the solver gives processes 2 actors and threads 1."""
    from pal_bench.studies import scaling

    monkeypatch.setattr(scaling, "usable_cores", lambda: 3)
    rows = [{"curve": c, "threads": x, "throughput": v, "backend": b}
            for b, fa in (("threads", (1000, 900)), ("processes", (1000, 1900)))
            for c, vals in (("f_a", fa), ("f_l", (1000, 1100))) for x, v in zip((1, 2), vals)]
    df = pd.DataFrame(rows)
    df[df.backend == "threads"].drop(columns="backend").to_csv(tmp_path / "scaling.csv", index=False)
    df[df.backend == "processes"].to_csv(tmp_path / "scaling_processes.csv", index=False)
    task = race.TASKS["full"]
    assert race.dse_split(task, "threads", tmp_path)[0] == 1
    assert race.dse_split(task, "processes", tmp_path) == (2, 1)
    assert race.dse_split(task, "processes", tmp_path / "none") == (1, 1)


def _fake_launch(calls: list, busy: bool = False):
    """A contestant run without training: reaches the target at its second evaluation."""
    def launch(name, task_name, seed, split, log):
        calls.append((name, seed, split))
        task = race.TASKS[task_name]
        return {"contestant": name, "seed": seed, "setup_s": 1.0, "wall_s": 30.0,
                "curve": [{"env_steps": 1000, "wall_s": 10.0, "mean_return": 10.0},
                          {"env_steps": 2000, "wall_s": 20.0, "mean_return": task.target}]}
    return launch


def test_race_stores_each_run_and_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(race, "launch", _fake_launch(calls))
    monkeypatch.setattr(race, "report", lambda out, task_name: 0)
    split = lambda name: (1, 1)                                          # noqa: E731
    # --max-minutes 0: the first run, then a clean stop with what is stored
    assert race.run_race("smoke", ["pal", "tianshou"], 2, split, tmp_path, max_minutes=0, settle_s=0) == 0
    assert calls == [("pal", 0, (1, 1))]
    assert sorted(p.name for p in (tmp_path / "race_smoke_runs").iterdir()) == ["pal-s0.json"]
    assert not (tmp_path / "race_smoke.csv").exists()
    assert "1 of 4 runs stored" in capsys.readouterr().err
    # the same command again: the stored run is skipped, the other three run, then the race's files
    assert race.run_race("smoke", ["pal", "tianshou"], 2, split, tmp_path, settle_s=0) == 0
    assert calls[1:] == [("tianshou", 0, (1, 1)), ("pal", 1, (1, 1)), ("tianshou", 1, (1, 1))]
    runs = pd.read_csv(tmp_path / "race_smoke.csv")
    assert len(runs) == 4 and runs.reached.all() and (runs.wall_to_target_s == 20.0).all()
    meta = json.loads((tmp_path / "race_smoke.csv.meta.json").read_text())
    assert meta["runs"] == 4 and "load_before" in meta
    # everything stored: nothing runs; a different split for PAL runs PAL again, not tianshou
    assert race.run_race("smoke", ["pal", "tianshou"], 2, split, tmp_path, settle_s=0) == 0 and len(calls) == 4
    assert race.run_race("smoke", ["pal", "tianshou"], 2, lambda n: (2, 1), tmp_path, settle_s=0) == 0
    assert calls[4:] == [("pal", 0, (2, 1)), ("pal", 1, (2, 1))]


def test_a_changed_preset_runs_its_contestant_again(tmp_path, monkeypatch):
    from pal_bench.train.config import PRESETS

    calls: list = []
    monkeypatch.setattr(race, "launch", _fake_launch(calls))
    monkeypatch.setattr(race, "report", lambda out, task_name: 0)
    split = lambda name: (1, 1)                                          # noqa: E731
    assert race.run_race("smoke", ["pal", "pal-apex"], 1, split, tmp_path, settle_s=0) == 0
    assert race.run_key("smoke", "pal-apex", (1, 1))["preset"]["local_buffer"] == PRESETS["apex"]["local_buffer"]
    monkeypatch.setitem(PRESETS, "apex", PRESETS["apex"] | {"local_buffer": 7})
    assert race.run_race("smoke", ["pal", "pal-apex"], 1, split, tmp_path, settle_s=0) == 0
    assert calls == [("pal", 0, (1, 1)), ("pal-apex", 0, (1, 1)), ("pal-apex", 0, (1, 1))]


def test_noisy_runs_are_marked_and_run_again_on_request(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(race, "launch", _fake_launch(calls))
    monkeypatch.setattr(race, "report", lambda out, task_name: 0)
    split = lambda name: (1, 1)                                          # noqa: E731
    assert race.run_race("smoke", ["pal"], 1, split, tmp_path, settle_s=0) == 0
    path = tmp_path / "race_smoke_runs" / "pal-s0.json"
    run = json.loads(path.read_text())
    assert "noisy" in run and run["conditions"]["what"].startswith("race (smoke): pal seed 0")
    run["noisy"] = True
    path.write_text(json.dumps(run))
    assert race.run_race("smoke", ["pal"], 1, split, tmp_path, settle_s=0) == 0 and len(calls) == 1
    assert race.run_race("smoke", ["pal"], 1, split, tmp_path, rerun_noisy=True, settle_s=0) == 0 and len(calls) == 2


def test_each_run_waits_for_the_previous_runs_load_to_fade(tmp_path, monkeypatch):
    """The load average still holds the previous run's own load when the next starts: the race waits (bounded)
    for it to fall to half the cores before it measures, so only other work marks a run noisy."""
    from pal_bench.bench import conditions

    loads = iter([1.9, 1.6, 1.2, 0.8] + [0.5] * 100)
    monkeypatch.setattr(conditions, "load1", lambda: next(loads))
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    slept: list[float] = []
    now = [0.0]

    def sleep(s):
        slept.append(s)
        now[0] += s

    said: list[str] = []
    assert conditions.settle(60, poll_s=5, progress=said.append, sleep=sleep, clock=lambda: now[0])
    assert slept == [5, 5, 5] and len(said) == 1 and "1.90" in said[0]
    # a machine that stays busy: give up at the bound, and the run is measured (and marked) anyway
    monkeypatch.setattr(conditions, "load1", lambda: 1.9)
    now[0], slept[:] = 0.0, []
    assert not conditions.settle(12, poll_s=5, sleep=sleep, clock=lambda: now[0])
    assert sum(slept) == 12
    # the race settles before every run it launches
    settled: list[float] = []
    monkeypatch.setattr(race, "settle", lambda s, progress=None: settled.append(s) or True)
    monkeypatch.setattr(race, "launch", _fake_launch([]))
    monkeypatch.setattr(race, "report", lambda out, task_name: 0)
    assert race.run_race("smoke", ["pal", "tianshou"], 1, lambda n: (1, 1), tmp_path, settle_s=7) == 0
    assert settled == [7, 7]
