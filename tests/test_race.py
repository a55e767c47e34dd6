"""The race's machinery: the matched-settings check, the clock (evaluation outside the training clock, the speed
span), the speed probe and its re-run rule, the order-statistic interval of a median, resumable storage, the
tables; and one real run of PAL's contestants on the smoke task."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from pal_bench.bench.stats import median_order_ci, pairing_range
from pal_bench.studies.race import orchestrate, results
from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.probe import probe_outliers, speed_probe
from pal_bench.studies.race.run import env_dims, run_one
from pal_bench.studies.race.task import MATCHED, TASKS, SettingsMismatch, check_matched

SMOKE = TASKS["smoke"]
LUNAR = (8, 4)


def matched_facts(**change) -> dict:
    m = MATCHED
    facts = {"n_params": m.n_params(*LUNAR), "torch_threads": 1, "n_envs": 1, "batch_size": 128, "n_step": 3,
             "target_update": 250, "double_q": True, "dueling": False, "gamma": 0.99, "lr": 5e-4, "grad_clip": 10.0,
             "buffer_capacity": 200_000, "alpha": 0.6, "beta": 0.4, "updates_per_step": 0.25}
    return facts | change


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------------------------------- matched settings

def test_the_matched_network_has_69124_parameters_on_lunarlander():
    assert MATCHED.n_params(*LUNAR) == 69_124
    assert env_dims("LunarLander-v3") == LUNAR


@pytest.mark.parametrize("change,what", [
    ({"updates_per_step": 1 / 3}, "updates_per_step"),          # RLlib's "auto" fragment with n-step 3
    ({"n_params": 3_332}, "n_params"),                          # RLlib's 8-256-4 network of the old race
    ({"torch_threads": 2}, "torch_threads"),
    ({"double_q": False}, "double_q"),
    ({"target_update": 334}, "target_update"),
    ({"updates_per_step": 0.2551}, "updates_per_step"),         # just over 2% off
])
def test_a_contestant_that_differs_from_the_matched_settings_is_refused(change, what):
    check_matched("fake", matched_facts(), *LUNAR)
    check_matched("fake", matched_facts(updates_per_step=0.2545), *LUNAR, measured=True)   # within 2%
    with pytest.raises(SettingsMismatch, match=what):
        check_matched("fake", matched_facts(**change), *LUNAR)


def test_the_race_refuses_a_mismatched_contestant_before_it_trains(monkeypatch):
    from pal_bench.studies.race import contestants

    trained = []

    class Fake(contestants.Contestant):
        @classmethod
        def settings(cls, name, track, task):
            return {}

        def build(self):
            pass

        def facts(self):
            return matched_facts(n_params=123, torch_threads=4) | {"n_params": MATCHED.n_params(4, 2) + 1}

        def attach(self, counters):
            pass

        def train(self, clock):
            trained.append(True)
            return {"env_steps": 0, "updates": 0}

    monkeypatch.setitem(contestants.REGISTRY, "pal", (__name__, "Fake"))
    monkeypatch.setattr(contestants, "contestant_class", lambda name: Fake)
    with pytest.raises(SettingsMismatch, match="n_params.*torch_threads"):
        run_one("pal", "matched", "smoke", 0)
    assert trained == []


def test_a_matched_run_whose_measured_updates_per_step_is_off_is_an_error_not_a_result(monkeypatch):
    from pal_bench.studies.race import contestants

    class Lazy(contestants.Contestant):
        @classmethod
        def settings(cls, name, track, task):
            return {}

        def build(self):
            pass

        def facts(self):
            return matched_facts(n_params=MATCHED.n_params(4, 2))

        def attach(self, counters):
            pass

        def train(self, clock):
            return {"env_steps": 1500, "updates": 200}        # 0.2 per step after the 500 of learning starts

    monkeypatch.setattr(contestants, "contestant_class", lambda name: Lazy)
    with pytest.raises(SettingsMismatch, match="measured from its logs"):
        run_one("pal", "matched", "smoke", 0)


# ---------------------------------------------------------------------------------------------- clock

def test_evaluation_is_outside_the_training_clock_and_the_run_stops_at_target_or_budget(monkeypatch):
    now = FakeClock()
    returns = iter([100.0, 600.0])

    def slow_eval(act, env, episodes, seed):
        now.t += 5.0                                         # each evaluation takes 5 s
        return next(returns)

    monkeypatch.setattr("pal_bench.studies.race.clock.greedy_return", slow_eval)
    clock = Clock(SMOKE, 0, now=now, quiet=True)
    now.t = 2.0
    clock.started()
    now.t = 4.0
    assert not clock.tick(999, None)                          # not due yet
    assert not clock.tick(1000, None)                         # evaluated: 100 < 500
    assert clock.curve[-1] == {"env_steps": 1000, "train_s": 2.0, "eval_s": 0.0, "setup_s": 2.0, "mean_return": 100.0}
    now.t = 10.0                                              # 1 s of training after the 5 s evaluation
    assert clock.train_s() == pytest.approx(3.0)
    assert clock.tick(2000, None)                             # 600 >= 500: reached
    assert clock.curve[-1]["train_s"] == pytest.approx(3.0) and clock.curve[-1]["eval_s"] == 5.0
    budget = Clock(dataclasses.replace(SMOKE, max_wall_s=10.0), 0, now=now, quiet=True)
    budget.started()
    now.t += 11.0
    assert budget.tick(10, None)                              # training budget spent


def test_speed_mode_times_the_span_after_learning_starts():
    now = FakeClock()
    clock = Clock(SMOKE, 0, mode="speed", now=now, quiet=True)
    clock.started()
    for steps in range(0, 1200, 100):
        now.t += 1.0
        if clock.tick(steps, None):
            break
    assert clock.span["start_steps"] == 500 and clock.span["end_steps"] == 1000
    assert clock.speed() == pytest.approx(100.0)
    assert clock.curve == []                                  # no evaluation in a speed round


# ---------------------------------------------------------------------------------------------- probe

def test_the_speed_probe_times_env_steps_and_updates():
    now = FakeClock()

    def tick():
        now.t += 0.5
        return now.t

    p = speed_probe(SMOKE, env_steps=10, updates=2, now=tick)
    assert p == {"probe_s": 1.0, "probe_env_s": 0.5, "probe_update_s": 0.5}


def test_the_probe_outliers_are_found_but_a_probe_alone_never_reruns_a_run(tmp_path, monkeypatch):
    assert probe_outliers({"a": 10.0, "b": 10.5, "c": 9.8, "d": 12.0}) == {"d": pytest.approx(12 / 10.25, abs=1e-3)}
    assert probe_outliers({"a": 10.0, "b": 10.9}) == {}
    stored = fake_runs(tmp_path, {("pal", s): 10.0 for s in range(4)} | {("pal", 4): 12.0})
    launched = []
    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)

    def launch(name, track, task_name, seed, log, mode="race", **kw):
        launched.append((name, seed))
        return stored[name, seed] | {"probe_s": 10.1}

    orchestrate.run_race("matched", "smoke", ["pal"], 5, tmp_path, launch_run=launch, cpus=1)
    assert launched == []                                     # all stored and current
    orchestrate.run_race("matched", "smoke", ["pal"], 5, tmp_path, rerun_slow=True, launch_run=launch, cpus=1)
    assert launched == []                                     # a slow probe is not a slow run


def curve(rate: float, reached: bool = True) -> list[dict]:
    """Evaluations at learning start (500) and at 1,000 and 2,000 env steps of a run making ``rate`` env steps/s."""
    return [{"env_steps": n, "train_s": 1.0 + (n - 500) / rate, "eval_s": 0.0, "setup_s": 1.0,
             "mean_return": 600.0 if reached and n == 2000 else 10.0} for n in (500, 1000, 2000)]


def test_a_run_slower_than_its_speed_rounds_is_run_again_once_and_both_draws_are_kept(tmp_path, monkeypatch):
    """The rerun rule reads the run's own env steps/s after learning start against its contestant's median speed
    round (not its outcome, not its probe): seed 2 at 60% of the speed rounds' median runs again; the first draw
    stays stored, marked superseded_by, and the rerun is not judged again."""
    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)
    d = orchestrate.runs_dir(tmp_path, "smoke", "matched", 1)
    (d / "speed").mkdir(parents=True)
    from pal_bench.conditions import cpu_model

    here = {"machine": {"cpu": cpu_model()}}
    for r in range(3):
        (d / "speed" / f"pal-r{r}.json").write_text(json.dumps({
            "contestant": "pal", "track": "matched", "round": r, "env_steps_per_s": 1000.0, "updates_per_s": 250.0,
            "updates_per_env_step": 0.25, "conditions": here}))
    rates = {0: 950.0, 1: 1020.0, 2: 600.0}
    launched = []

    def launch(name, track, task_name, seed, log, mode="race", **kw):
        launched.append((seed, kw.get("cpus")))
        slow = len(launched) <= 3 and seed == 2
        return fake_run(name, seed) | {"curve": curve(600.0 if slow else rates[seed] if seed != 2 else 990.0),
                                       "cpus": kw.get("cpus")}

    orchestrate.run_race("matched", "smoke", ["pal"], 3, tmp_path, launch_run=launch, cpus=1)
    assert launched == [(0, 1), (1, 1), (2, 1)]
    speed = orchestrate.load_runs(d / "speed", "*-r*.json")
    assert orchestrate.slow_runs(orchestrate.load_runs(d), speed) == {"pal-s2": pytest.approx(0.6)}
    elsewhere = [r | {"conditions": {"machine": {"cpu": "another CPU"}}} for r in speed]
    assert orchestrate.slow_runs(orchestrate.load_runs(d), elsewhere) == {}     # rounds of another machine: no verdict
    orchestrate.run_race("matched", "smoke", ["pal"], 3, tmp_path, rerun_slow=True, launch_run=launch, cpus=1)
    assert launched[3:] == [(2, 1)]
    runs = {r["run_id"]: r for r in orchestrate.load_runs(d)}
    assert set(runs) == {"pal-s0", "pal-s1", "pal-s2", "pal-s2-a1"}
    assert runs["pal-s2"]["superseded_by"] == "pal-s2-a1" and runs["pal-s2"]["curve"] == curve(600.0)
    assert runs["pal-s2-a1"]["rerun_of"] == "pal-s2" and "slower" in runs["pal-s2-a1"]["rerun_reason"]
    orchestrate.run_race("matched", "smoke", ["pal"], 3, tmp_path, rerun_slow=True, launch_run=launch, cpus=1)
    assert len(launched) == 4                                 # one pass: nothing judged again
    df = results.runs_frame(orchestrate.load_runs(d))
    assert len(results.track_runs(df, "matched", 1)) == 3 and len(results.track_runs(df, "matched", 1, True)) == 4
    assert results.track_runs(df, "matched", 2).empty and results.track_runs(df, "matched", None).empty


def test_a_run_that_used_more_cpu_than_its_budget_is_marked_and_left_out_of_the_tables(tmp_path, monkeypatch):
    from pal_bench.conditions import Conditions

    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)
    monkeypatch.setattr(Conditions, "finish", lambda self: {"own_cores": 1.4, "commit": "x"})
    monkeypatch.setattr(Conditions, "noisy", lambda self: False)
    orchestrate.run_race("matched", "smoke", ["pal"], 1, tmp_path, cpus=1,
                         launch_run=lambda *a, **kw: fake_run("pal", 0) | {"cpus": kw["cpus"]})
    (run,) = orchestrate.load_runs(orchestrate.runs_dir(tmp_path, "smoke", "matched", 1))
    assert run["over_budget"] and run["own_cores"] == 1.4
    df = results.runs_frame([run])
    assert results.track_runs(df, "matched", 1).empty and len(results.over_budget_runs(df, "matched", 1)) == 1


# ---------------------------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("n,lo_rank,cover", [(5, 1, 0.9375), (10, 2, 0.978515625), (20, 6, 0.958610534667969)])
def test_order_statistic_interval_of_a_median_by_hand(n, lo_rank, cover):
    """n=10: P(2 <= B <= 8), B ~ Bin(10, 1/2) = 1 - 2 (1 + 10) / 1024 = 0.9785; rank 3 would give 0.8906 < 0.95.
    n=20: P(6 <= B <= 14) = 0.9586 (rank 7: 0.8847). n=5: too few for 95%: the range, 1 - 2/32 = 0.9375."""
    x = np.arange(1, n + 1) * 10.0
    med, lo, hi, c = median_order_ci(np.random.default_rng(0).permutation(x))
    assert (lo, hi) == (x[lo_rank - 1], x[n - lo_rank]) and med == np.median(x)
    assert c == pytest.approx(cover)


def test_order_statistic_interval_covers_the_median_as_it_says():
    rng = np.random.default_rng(1)
    for n in (10, 20):
        hits = 0
        for _ in range(4000):
            _, lo, hi, cover = median_order_ci(rng.exponential(size=n))
            hits += lo <= np.log(2) <= hi
        assert abs(hits / 4000 - cover) < 0.015


def test_censored_runs_make_the_median_a_lower_bound():
    med, lo, hi, _ = median_order_ci([1, 2, 3, np.inf, np.inf, np.inf])
    assert hi == np.inf and med == np.inf
    assert pairing_range([2, 4], [1, 2]) == (1.0, 4.0)


def test_target_table_marks_lower_bounds_and_uses_the_bootstrap_only_with_ten_seeds():
    def runs(name, n, reached=True, scale=1.0):
        return [{"track": "matched", "contestant": name, "seed": s, "reached": reached,
                 "steps_to_target": int(1000 * (s + 1) * scale), "wall_to_target_s": 10.0 * (s + 1) * scale,
                 "wall_with_eval_to_target_s": 11.0 * (s + 1) * scale} for s in range(n)]

    df = pd.DataFrame(runs("pal", 10) + runs("tianshou", 10, scale=3.0) + runs("rllib", 5, reached=False, scale=9))
    t = results.target_table(df).set_index("contestant")
    assert t.loc["tianshou", "reached"] == "10/10" and t.loc["rllib", "reached"] == "0/5"
    assert t.loc["rllib", "env steps to target"].startswith(">= ")
    assert t.loc["tianshou", "wall / pal's"].startswith("3.00x (pairings 0.30-30.00) [")   # 10 seeds each: bootstrap
    assert t.loc["rllib", "wall / pal's"].startswith(">= 4.91x") and "[" not in t.loc["rllib", "wall / pal's"]
    assert "(94% range of 5)" in t.loc["rllib", "env steps to target"]
    # runs that stopped before the target above the median leave it exact: no ">="
    top = runs("dqn", 10)
    for r in top[-3:]:
        r["reached"] = False
    t = results.target_table(pd.DataFrame(runs("pal", 10) + top)).set_index("contestant")
    assert t.loc["dqn", "reached"] == "7/10" and t.loc["dqn", "wall to target, s (eval excluded)"].startswith("55.0 ")
    assert t.loc["dqn", "wall / pal's"].startswith("1.00x")


# ---------------------------------------------------------------------------------------------- storage

def fake_run(name, seed, probe=10.0, reached=True, track="matched", task="smoke", cpus=2):
    return {"contestant": name, "track": track, "task": task, "seed": seed, "mode": "race", "cpus": cpus,
            "setup_s": 1.0,
            "train_s": 5.0, "eval_s": 0.5, "wall_s": 6.5, "env_steps": 1000, "updates": 125,
            "updates_per_env_step": 0.25, "n_params": 1, "torch_threads": 1, "facts": {"n_params": 1},
            "env_steps_per_s": 200.0, "probe_s": probe,
            "curve": [{"env_steps": 1000, "train_s": 5.0, "eval_s": 0.0, "setup_s": 1.0,
                       "mean_return": 600.0 if reached else 10.0}]}


def fake_runs(tmp_path, probes: dict) -> dict:
    d = orchestrate.runs_dir(tmp_path, "smoke", "matched", 1)
    d.mkdir(parents=True)
    out = {}
    for (name, seed), p in probes.items():
        run = fake_run(name, seed, p, cpus=1) | {"settings_hash": orchestrate.run_hash(name, "matched", "smoke", 1),
                                         "noisy": False, "conditions": {}}
        (d / f"{name}-s{seed}.json").write_text(json.dumps(run))
        out[name, seed] = run
    return out


def test_runs_are_stored_resumed_rotated_and_run_again_when_their_settings_change(tmp_path, monkeypatch):
    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)
    launched = []

    def launch(name, track, task_name, seed, log, mode="race", **kw):
        launched.append((seed, name))
        return fake_run(name, seed)

    assert orchestrate.run_race("matched", "smoke", ["pal", "tianshou"], 2, tmp_path, launch_run=launch)
    assert launched == [(0, "pal"), (0, "tianshou"), (1, "tianshou"), (1, "pal")]     # rotated by seed
    launched.clear()
    orchestrate.run_race("matched", "smoke", ["pal", "tianshou"], 2, tmp_path, launch_run=launch)
    assert launched == []
    path = orchestrate.runs_dir(tmp_path, "smoke", "matched", 2) / "pal-s1.json"
    stale = json.loads(path.read_text()) | {"settings_hash": "old"}
    path.write_text(json.dumps(stale))
    orchestrate.run_race("matched", "smoke", ["pal", "tianshou"], 2, tmp_path, launch_run=launch)
    assert launched == [(1, "pal")]
    kept = json.loads(path.read_text())                       # the old run is kept, pointing at the new one
    assert kept["superseded_by"] == "pal-s1-a1" and kept["settings_hash"] == "old"
    assert json.loads(path.with_name("pal-s1-a1.json").read_text())["rerun_reason"] == "its settings changed"


def test_a_contestant_that_never_reaches_stops_after_five_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)
    launched = []

    def launch(name, track, task_name, seed, log, mode="race", **kw):
        launched.append(name)
        return fake_run(name, seed, reached=name == "pal")

    orchestrate.run_race("matched", "smoke", ["pal", "pal-processes"], 10, tmp_path, launch_run=launch)
    assert launched.count("pal") == 10 and launched.count("pal-processes") == orchestrate.MIN_UNREACHED_SEEDS


# ---------------------------------------------------------------------------------------------- real runs

@pytest.mark.parametrize("name", ["pal", "pal-processes"])
def test_pal_runs_the_matched_learner_and_its_counts_hold(name):
    run = run_one(name, "matched", "smoke", 0)
    assert run["n_params"] == MATCHED.n_params(4, 2) and run["torch_threads"] == 1
    assert run["facts"]["double_q"] and run["facts"]["n_envs"] == 1 and run["facts"]["beta"] == MATCHED.beta
    assert run["updates_per_env_step"] == pytest.approx(0.25, rel=0.02)
    assert run["curve"] and all(e["eval_s"] >= 0 for e in run["curve"])
    assert run["wall_s"] == pytest.approx(run["setup_s"] + run["train_s"] + run["eval_s"], abs=0.01)


def test_a_speed_round_of_pal_times_its_span(tmp_path):
    run = run_one("pal", "matched", "smoke", 0, mode="speed")
    assert run["span"]["start_steps"] >= SMOKE.learning_starts and run["env_steps_per_s"] > 0
    assert run["updates_per_s"] == pytest.approx(run["env_steps_per_s"] * run["updates_per_env_step"], rel=1e-4)


def test_a_terminated_race_takes_its_run_in_flight_with_it(tmp_path):
    """SIGTERM to the race (as `kill` or a batch system sends it) stops it like Ctrl-C: the worker process it
    waits on is killed too, not left running as an orphan."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "race.py"
    script.write_text("import subprocess, sys\nfrom pal_bench.studies.race import stop_on_termination\n"
                      "stop_on_termination()\n"
                      "subprocess.run([sys.executable, '-c', 'import time; time.sleep(120)'])\n")
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stderr=subprocess.DEVNULL)
    deadline, kids = time.monotonic() + 60, []
    while not kids and time.monotonic() < deadline:
        kids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _parent(d) == p.pid]
        time.sleep(0.1)
    assert kids, "the worker never started"
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(30) != 0
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{k}").exists() for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{k}").exists() for k in kids), "the worker outlived the race"


def _parent(proc_dir) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


# ---------------------------------------------------------------------------------------------- tuning

def test_every_framework_gets_the_same_tuning_budget_from_its_own_example():
    from pal_bench.studies.race.contestants import DEFAULT_CONTESTANTS, contestant_class
    from pal_bench.studies.race.tuning import CONFIGS_PER_FRAMEWORK, SEARCH

    assert set(SEARCH) == set(DEFAULT_CONTESTANTS["tuned"])
    assert CONFIGS_PER_FRAMEWORK >= 6 and all(len(c) == CONFIGS_PER_FRAMEWORK for c in SEARCH.values())
    for name, configs in SEARCH.items():
        cls = contestant_class(name)
        example = cls.settings(name, "tuned", TASKS["full"], 2, 0)
        seen = {orchestrate.run_hash(name, "tuned", "full", 2, 0)}
        for k in range(1, len(configs)):
            s = cls.settings(name, "tuned", TASKS["full"], 2, k)
            assert s != example, f"{name} configuration {k} changes nothing"
            seen.add(orchestrate.run_hash(name, "tuned", "full", 2, k))
        assert len(seen) == len(configs)


def test_the_tuning_search_runs_every_configuration_and_the_tuned_track_its_best(tmp_path, monkeypatch):
    """Fake runs: configuration 3 of tianshou and 1 of PAL reach the target soonest. With one run of RLlib's missing
    (its configuration 2, whose other seed is the fastest) no best of RLlib's is marked and the tuned track refuses
    to run on a search stored in part; complete, RLlib's configuration 2 is its best."""
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.race.publish import race_tuning_block
    from pal_bench.studies.race.tuning import SEARCH, TUNING_SEEDS

    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)
    fastest = {"tianshou": 3, "pal-processes": 1}
    launched = []

    def launch(name, track, task_name, seed, log, mode="race", cpus=2, config=0):
        launched.append((name, config, seed))
        run = fake_run(name, seed, track=track) | {"config": config, "cpus": cpus}
        if fastest.get(name) == config:
            run["curve"] = [e | {"train_s": 1.0} for e in run["curve"]]
        return run

    names = ["pal-processes", "tianshou", "rllib"]
    assert orchestrate.run_tuning("smoke", names, tmp_path, cpus=2, launch_run=launch)
    assert sorted(launched) == sorted((n, c, s) for n in names for c in range(len(SEARCH[n]))
                                      for s in range(TUNING_SEEDS))
    d = orchestrate.runs_dir(tmp_path, "smoke", "tuned", 2) / "tuning"
    other_seed = (d / "rllib-c2-s1.json").read_text()
    (d / "rllib-c2-s1.json").unlink()
    fast = json.loads((d / "rllib-c2-s0.json").read_text())
    fast["curve"] = [e | {"train_s": 0.1} for e in fast["curve"]]
    (d / "rllib-c2-s0.json").write_text(json.dumps(fast))

    def best():
        frame = results.tuning_frame(orchestrate.load_runs(d, "*-c*-s*.json"))
        frame.to_csv(tmp_path / "race_smoke_tuning.csv", index=False)
        return frame[frame.best].groupby("contestant").config.first().to_dict()

    assert best() == {"pal-processes": 1, "tianshou": 3}
    assert "stored in part (35 of its 36 runs): no best" in race_tuning_block(tmp_path, "smoke")
    launched.clear()
    with pytest.raises(UsageError, match=r"stored in part \(1 of its runs are missing\).*--tune"):
        orchestrate.run_race("tuned", "smoke", names, 1, tmp_path, cpus=2, launch_run=launch)
    assert launched == []
    (d / "rllib-c2-s1.json").write_text(other_seed)
    assert best() == {"pal-processes": 1, "tianshou": 3, "rllib": 2}
    assert "stored in part" not in race_tuning_block(tmp_path, "smoke")
    orchestrate.run_race("tuned", "smoke", names, 1, tmp_path, cpus=2, launch_run=launch)
    assert sorted(launched) == [("pal-processes", 1, 0), ("rllib", 2, 0), ("tianshou", 3, 0)]
    # race.csv says which configuration each tuned run used, and the tuned track's table names it
    from pal_bench.studies.race import rebuild
    from pal_bench.studies.race.publish import race_target_block
    from pal_bench.studies.race.tuning import config_name

    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    rows = pd.read_csv(tmp_path / "race_smoke.csv")
    assert dict(zip(rows.contestant, rows.config)) == {"pal-processes": 1, "rllib": 2, "tianshou": 3}
    block = race_target_block(tmp_path, "tuned", "smoke", cpus=2)
    assert all(f"| {c}: {config_name(n, c)}" in block for n, c in [("pal-processes", 1), ("rllib", 2), ("tianshou", 3)])
    # a number the search does not have (from a stored file) is named so, never indexed from the end
    assert config_name("tianshou", 99) == config_name("tianshou", -1) == config_name("tianshou", 1.5) == \
        "not in the tuning search"


def test_a_piece_stopped_by_max_minutes_leaves_the_tables_current(tmp_path, monkeypatch):
    """``pal-bench race --max-minutes 0`` starts one run and stops; the tables are rebuilt from what is stored (they
    were left stale before), and a tuning piece stored before any race run writes the tuning table alone."""
    import argparse
    import functools

    from pal_bench.studies import race

    monkeypatch.setattr(orchestrate, "settle", lambda *a, **k: None)

    def launch(name, track, task_name, seed, log, mode="race", cpus=2, config=0):
        return fake_run(name, seed, track=track) | {"config": config, "cpus": cpus}

    for f in ("run_race", "run_tuning"):
        monkeypatch.setattr(orchestrate, f, functools.partial(getattr(orchestrate, f), launch_run=launch))
    args = argparse.Namespace(tune=True, speed=False, track="tuned", seeds=None, max_minutes=0.0, out=tmp_path,
                              rerun_noisy=False, rerun_slow=False)
    names = ["pal-processes", "tianshou"]
    assert race._run(args, "smoke", names, 2) == 0
    tuning = pd.read_csv(tmp_path / "race_smoke_tuning.csv")
    assert len(tuning) == 1 and not (tmp_path / "race_smoke.csv").exists()
    args.tune, args.track = False, "matched"
    assert race._run(args, "smoke", names, 2) == 0
    assert len(pd.read_csv(tmp_path / "race_smoke.csv")) == 1                  # one run started, then stopped
    assert race._run(args, "smoke", names, 2) == 0
    assert len(pd.read_csv(tmp_path / "race_smoke.csv")) == 2


def matched_smoke_run(seed=0, **counters):
    """A stored matched run on the smoke task whose facts and run-time counters are the matched ones."""
    from pal_bench.studies.race.task import env_dims

    m = MATCHED
    facts = {k: getattr(m, k) for k in ("torch_threads", "n_envs", "batch_size", "n_step", "target_update", "double_q",
                                        "dueling", "gamma", "lr", "grad_clip", "buffer_capacity", "alpha", "beta")}
    facts |= {"n_params": m.n_params(*env_dims(TASKS["smoke"].env)), "learning_starts": TASKS["smoke"].learning_starts}
    counted = {"env_steps": 1000, "optimizer_steps": 125, "target_copies": 0, "first_update_env_step": 500,
               "batch_size": 128, "batch_sizes": {"128": 125}, "updates_per_env_step": 0.25,
               "eps_seen": [[0, 1.0], [499, m.epsilon(499, 1000)], [999, m.epsilon(999, 1000)]]} | counters
    return fake_run("pal", seed, cpus=2) | {"facts": facts, "counters": counted}


def test_the_stored_env_dims_are_the_environments_own():
    from pal_bench.studies.race.task import ENV_DIMS, env_dims

    assert {t.env for t in TASKS.values()} <= set(ENV_DIMS)
    assert all(env_dims(env) == dims for env, dims in ENV_DIMS.items())


def test_race_csv_has_each_run_s_counters_and_its_matched_check_and_keeps_unpinned_runs_apart(tmp_path):
    """Every row of race.csv (runs on a core budget) carries the run-time counters and ``check_matched`` /
    ``check_counted`` run again on its file: a run whose counters are off says why; counters of the wrong type in
    a hostile file are left out, never raise. The runs stored before the budgets go to race_unpinned.csv."""
    from pal_bench.studies.race import rebuild

    row = results.run_row(matched_smoke_run())
    assert row["matched_check"] == "passed", row["matched_check"]
    assert (row["optimizer_steps"], row["target_copies"], row["first_update_env_step"], row["batch_size_seen"],
            row["counted_updates_per_env_step"]) == (125, 0, 500, 128, 0.25)
    eps = [round(MATCHED.epsilon(t, 1000), 4) for t in (499, 499, 999)]      # smoke: starts at 500, decays over 1000
    assert [row["eps_learning_start"], row["eps_mid_decay"], row["eps_decay_end"]] == eps
    assert "target copies" in results.run_row(matched_smoke_run(target_copies=9))["matched_check"]
    assert "batches" in results.run_row(matched_smoke_run(batch_sizes={"64": 125}))["matched_check"]
    hostile = results.run_row(matched_smoke_run(optimizer_steps="125", batch_size=True, eps_seen=[["x", 1], 5],
                                                updates_per_env_step=float("nan")))
    assert hostile["optimizer_steps"] is None and hostile["batch_size_seen"] is None
    assert hostile["eps_learning_start"] is None and hostile["matched_check"] != "passed"
    assert results.run_row(fake_run("pal", 0, cpus=2))["matched_check"] == "no run-time counters stored"
    # a counter missing or not of its type is a failed check, never one skipped (found by an adversarial pass)
    big = 10**400                                                         # JSON has integers no float holds
    for bad in ({"optimizer_steps": None}, {"optimizer_steps": "125"}, {"optimizer_steps": big}, {"env_steps": None},
                {"updates_per_env_step": big}, {"eps_seen": [[0, 1.0], [499, float("inf")]]},
                {"eps_seen": [[0, True]]}, {"batch_sizes": ["128"]}, {"env_steps": 900},
                {"optimizer_steps": 0, "first_update_env_step": None}):
        assert results.run_row(matched_smoke_run(**bad))["matched_check"] != "passed", bad
    for facts in ({"learning_starts": 1500}, {"torch_threads": True}, {"batch_size": 128.0}, {"n_params": [0] * 10**5}):
        run = matched_smoke_run()
        run["facts"] |= facts
        text = results.run_row(run)["matched_check"]
        assert text != "passed" and len(text) <= results.MAX_CHECK_TEXT, facts
    assert results._when({"load_before": big})["load_before"] is None
    assert results.run_row(fake_run("pal", 0, track="tuned", cpus=2))["matched_check"] is None

    pinned = orchestrate.runs_dir(tmp_path, "smoke", "matched", 2)
    before = orchestrate.runs_dir(tmp_path, "smoke", "matched")
    pinned.mkdir(parents=True)
    for seed in range(2):
        (pinned / f"pal-s{seed}.json").write_text(json.dumps(matched_smoke_run(seed)))
        (before / f"pal-s{seed}.json").write_text(json.dumps(fake_run("pal", seed, cpus=2) | {"cpus": None}))
    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    rows = pd.read_csv(tmp_path / "race_smoke.csv")
    assert len(rows) == 2 and (rows.cpus == 2).all() and (rows.matched_check == "passed").all()
    assert rows.optimizer_steps.notna().all()
    apart = pd.read_csv(tmp_path / "race_smoke_unpinned.csv")
    assert len(apart) == 2 and apart.cpus.isna().all()
    # an evaluation's own keys never stand for its run's (a track there once named a figure outside results/)
    hostile = matched_smoke_run(0)
    hostile["curve"] = [e | {"track": "x/../../outside/pwn", "cpus": "abc", "seed": [1, 2]} for e in hostile["curve"]]
    (pinned / "pal-s0.json").write_text(json.dumps(hostile))
    (before / "pal-s1.json").write_text(json.dumps(fake_run("pal", 1) | {"cpus": None, "setup_s": 10**400}))
    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    curves = pd.read_csv(tmp_path / "race_smoke_curves.csv")
    assert set(curves.track) == {"matched"} and not (tmp_path.parent / "outside").exists()
    assert len(pd.read_csv(tmp_path / "race_smoke_unpinned.csv")) == 1          # the overflowing one skipped
    for f in before.glob("*.json"):
        f.unlink()
    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    assert not (tmp_path / "race_smoke_unpinned.csv").exists()                  # none left: its stale table goes


# ---------------------------------------------------------------------------------------------- hostile run files

def stored_run(d, stem, **change):
    run = fake_run(stem.split("-s")[0], int(stem.split("-s")[1].split("-")[0]), cpus=2) | {
        "settings_hash": "x", "noisy": False, "conditions": {}} | change
    (d / f"{stem}.json").write_text(json.dumps(run))
    return run


def test_run_files_that_are_not_runs_are_skipped_with_one_line_and_the_rest_rebuilt(tmp_path, capsys):
    """A FIFO, a link, a JSON list, a run without its curve, NaN steps and another contestant's run under a PAL
    name are each skipped with one line; the good runs make the CSV; nothing hangs."""
    import os

    from pal_bench.studies.race import rebuild

    d = orchestrate.runs_dir(tmp_path, "smoke", "matched", 2)
    d.mkdir(parents=True)
    stored_run(d, "pal-s0")
    stored_run(d, "pal-s1")
    os.mkfifo(d / "pal-s2.json")
    (d / "pal-s3.json").symlink_to("/dev/zero")
    (d / "pal-s4.json").write_text("[1, 2]")
    stored_run(d, "pal-s5", curve=None)
    (d / "pal-s6.json").write_text(json.dumps(fake_run("pal", 6) | {"env_steps": float("nan")}))
    stored_run(d, "pal-s7", contestant="tianshou")
    stored_run(d, "pal-s8", cpus=1)
    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    err = capsys.readouterr().err
    for k in range(2, 9):
        assert err.count(f"pal-s{k}.json") == 1, err
    df = pd.read_csv(tmp_path / "race_smoke.csv")
    assert sorted(df.run_id) == ["pal-s0", "pal-s1"]


def test_a_rerun_on_one_cpu_budget_supersedes_nothing_on_another(tmp_path):
    """Run ids are unique in their own directory only: ``cpus2/pal-s0-a1`` replacing ``cpus2/pal-s0`` leaves
    ``cpus1/pal-s0`` (and a run stored before the budgets, ``pal-s0``) current, in the CSV, the curves and the
    tables."""
    from pal_bench.studies.race import rebuild

    two, one = (orchestrate.runs_dir(tmp_path, "smoke", "matched", c) for c in (2, 1))
    two.mkdir(parents=True)
    one.mkdir(parents=True)
    stored_run(two, "pal-s0")
    stored_run(two, "pal-s0-a1", rerun_of="pal-s0", rerun_reason="slower than its speed rounds")
    stored_run(one, "pal-s0", cpus=1, own_cores=1.0)
    runs = orchestrate.load_runs(two, cpus=2) + orchestrate.load_runs(one, cpus=1)
    assert sorted((r["cpus"], r["run_id"]) for r in orchestrate.current_runs(runs)) == [(1, "pal-s0"),
                                                                                         (2, "pal-s0-a1")]
    df = results.runs_frame(runs)
    gone = df[df.superseded_by.notna()]
    assert gone[["cpus", "run_id", "superseded_by"]].values.tolist() == [[2, "pal-s0", "pal-s0-a1"]]
    assert set(results.curves_frame(runs).cpus) == {1, 2}
    assert rebuild(tmp_path, "smoke", quiet=True) == 0
    csv = pd.read_csv(tmp_path / "race_smoke.csv")
    one_cpu = csv[csv.cpus == 1]
    assert one_cpu.run_id.tolist() == ["pal-s0"] and one_cpu.superseded_by.isna().all()


def test_a_rerun_interrupted_before_it_marked_the_old_run_still_replaces_it(tmp_path):
    """The new run names the old in ``rerun_of``: that is what supersedes (the old file's ``superseded_by`` is only
    written after); a ``superseded_by`` naming no run supersedes nothing."""
    d = orchestrate.runs_dir(tmp_path, "smoke", "matched", 2)
    d.mkdir(parents=True)
    stored_run(d, "pal-s0")
    stored_run(d, "pal-s0-a1", rerun_of="pal-s0", rerun_reason="the machine was busy")
    stored_run(d, "pal-s1", superseded_by="pal-s1-a9")
    runs = orchestrate.load_runs(d, cpus=2)
    assert sorted(r["run_id"] for r in orchestrate.current_runs(runs)) == ["pal-s0-a1", "pal-s1"]
    df = results.runs_frame(runs).set_index("run_id")
    assert df.loc["pal-s0", "superseded_by"] == "pal-s0-a1" and pd.isna(df.loc["pal-s1", "superseded_by"])


def test_a_second_race_on_the_same_runs_is_refused_at_once(tmp_path):
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.race.runfiles import race_lock

    d = orchestrate.runs_dir(tmp_path, "smoke", "matched", 2)
    with race_lock(d):
        with pytest.raises(UsageError, match="another pal-bench race"):
            orchestrate.run_race("matched", "smoke", ["pal"], 1, tmp_path, launch_run=lambda *a, **k: 1 / 0)
    with race_lock(d):                                        # released with its holder
        pass


def test_only_plain_budget_directories_are_read(tmp_path, capsys):
    from pal_bench.studies.race.runfiles import budget_dirs

    track = tmp_path / "matched"
    for name in ("cpus1", "cpus2", "cpus0", "cpus007", "cpusx", "cpus\u00b2", "other"):
        (track / name).mkdir(parents=True)
    (track / "cpus3").symlink_to(track / "cpus1")
    got = budget_dirs(track)
    assert [(p.name, n) for p, n in got] == [("matched", None), ("cpus1", 1), ("cpus2", 2)]
    err = capsys.readouterr().err
    assert all(n in err for n in ("cpus0", "cpus007", "cpusx", "cpus3", "cpus\u00b2")) and "other" not in err


def test_goals_are_not_met_on_a_ratio_that_pal_s_censored_runs_make_an_upper_bound(tmp_path):
    from pal_bench.studies.race.publish import race_goals_block, race_headline_block

    rows = []
    for s in range(10):
        rows.append(results.run_row(fake_run("pal-processes", s, reached=False) | {"cpus": 2}))
        rows.append(results.run_row(fake_run("tianshou", s) | {"cpus": 2, "setup_s": 30.0}))
    pd.DataFrame(rows, columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv", index=False)
    goals = race_goals_block(tmp_path)
    line = next(x for x in goals.splitlines() if "tianshou" in x and "2 CPUs" in x)
    assert "at most" in line and "unknown (censored)" in line and "| yes" not in line and "so far" not in line
    head = race_headline_block(tmp_path)
    assert "0 of 10 seeds" in head and "counted at their stop" in head and "at most" in head
    # a track with fewer seeds says that its verdict is so far
    pd.DataFrame(rows[:6], columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv", index=False)
    line = next(x for x in race_goals_block(tmp_path).splitlines() if "tianshou" in x and "2 CPUs" in x)
    assert "so far (3 of 10 seeds)" in line


def test_a_terminated_race_closes_its_pinned_run_and_leaves_no_shared_memory(tmp_path):
    """SIGTERM to the race while a pinned ``pal-processes`` run holds its shared buffer: the run's process group
    gets SIGTERM, the worker closes its trainer (the segments unlinked), nothing of it stays running and the run's
    result file is removed."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    def segments() -> set[str]:
        return {n for n in os.listdir("/dev/shm") if n.startswith("pal_")}

    before = segments()
    script = tmp_path / "race.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom pal_bench.studies.race import stop_on_termination\n"
        "from pal_bench.studies.race.run import launch\nstop_on_termination()\n"
        f"launch('pal-processes', 'matched', 'smoke', 0, Path({str(tmp_path / 'race.log')!r}), cpus=1)\n")
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (segments() - before) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert segments() - before, "the run never made its shared buffer"
    workers = [pid for pid in _descendants(p.pid)]
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(60) != 0
    deadline = time.monotonic() + 20
    while (segments() - before or any(Path(f"/proc/{k}").exists() for k in workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not segments() - before, f"left in /dev/shm: {segments() - before}"
    assert not [k for k in workers if Path(f"/proc/{k}").exists()], "a process of the run outlived the race"
    assert not list(Path(tempfile_dir()).glob("pal-race-run-*.json"))


def _descendants(root: int) -> list[int]:
    from pal_bench.conditions import descendants

    return list(descendants(root))


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


def test_the_headline_moves_to_the_pinned_track_once_every_contestant_has_ten_seeds(tmp_path):
    from pal_bench.studies.race.contestants import DEFAULT_CONTESTANTS
    from pal_bench.studies.race.publish import HEADLINE_SEEDS, race_headline_block

    def rows(cpus, seeds, scale=1.0, names=DEFAULT_CONTESTANTS["matched"]):
        return [results.run_row(fake_run(name, s) | {"cpus": cpus, "setup_s": (1.0 if name == "pal-processes"
                                                                              else 4.0) * scale})
                for name in names for s in range(seeds)]

    legacy = rows(None, 10)
    pd.DataFrame(legacy, columns=results.RUN_COLUMNS).to_csv(tmp_path / "race_unpinned.csv")
    pd.DataFrame(rows(2, 3, scale=2.0), columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv")
    head = race_headline_block(tmp_path)
    assert "stored before the core budgets" in head and "being run: 12 runs so far" in head
    # a default contestant with no pinned run at all holds the headline back
    pd.DataFrame(rows(2, HEADLINE_SEEDS, scale=2.0, names=("pal-processes", "tianshou")),
                 columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv")
    assert "being run: 20 runs so far" in race_headline_block(tmp_path)
    pd.DataFrame(rows(2, HEADLINE_SEEDS, scale=2.0), columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv")
    head = race_headline_block(tmp_path)
    assert "pinned to the same 2 CPUs" in head and "being run" not in head
    # rows with a budget in the file of the runs from before the budgets never join the pinned track's ...
    pd.DataFrame(rows(2, 30, scale=0.01, names=("tianshou",)), columns=results.RUN_COLUMNS).to_csv(
        tmp_path / "race_unpinned.csv")
    assert race_headline_block(tmp_path) == head
    (tmp_path / "race_unpinned.csv").write_bytes(b"\xff\xfe not a table")      # ... nor can a broken one stop it
    assert race_headline_block(tmp_path) == head


def test_the_tuned_track_s_sentence_names_each_best_configuration_and_waits_for_ten_seeds(tmp_path):
    from pal_bench.studies.race.publish import HEADLINE_SEEDS, race_tuned_headline_block
    from pal_bench.studies.race.tuning import config_name

    def rows(seeds, names=("pal-processes", "tianshou", "rllib")):
        best = {"pal-processes": 0, "tianshou": 3, "rllib": 2}
        return [results.run_row(fake_run(n, s, track="tuned") | {"cpus": 2, "config": best[n],
                                                                  "setup_s": 1.0 if n == "pal-processes" else 3.0})
                for n in names for s in range(seeds)]

    assert race_tuned_headline_block(tmp_path).startswith("_Not measured yet")
    pd.DataFrame(rows(4), columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv", index=False)
    text = race_tuned_headline_block(tmp_path)
    assert "Under way" in text and "tianshou 4" in text
    pd.DataFrame(rows(HEADLINE_SEEDS), columns=results.RUN_COLUMNS).to_csv(tmp_path / "race.csv", index=False)
    text = race_tuned_headline_block(tmp_path)
    assert "Under way" not in text and "pinned to the same 2 CPUs" in text
    assert f"tianshou (its configuration 3: {config_name('tianshou', 3)}) took 1.3x" in text      # 8 s / 6 s
    assert f"`pal-processes` (its configuration 0: {config_name('pal-processes', 0)}) reached" in text


def test_a_block_says_when_its_own_runs_ran_from_their_conditions():
    runs = [{"conditions": {"started": "2026-12-06T16:45:18+00:00", "finished": "2026-12-06T16:47:17+00:00",
                            "load_before": 0.9}, "commit": "aaa"},
            {"conditions": {"started": "2026-12-06T21:01:00+00:00", "finished": "2026-12-06T21:20:30+00:00",
                            "load_before": 1.0}, "commit": "bbb"},
            {"conditions": {"started": 5, "load_before": True}, "commit": "bbb"}]     # a malformed one says nothing
    df = pd.DataFrame([{"commit": r["commit"], **results._when(r["conditions"])} for r in runs])
    assert results._when(runs[2]["conditions"]) == {"started": None, "finished": None, "load_before": None}
    assert results.sitting(df) == ("Runs: 3, 2026-12-06 16:45 to 2026-12-06 21:20 UTC; commit aaa, bbb; "
                                   "load before each run 0.90-1.00.")
    assert results.sitting(df.drop(columns=["started"])) == ""
