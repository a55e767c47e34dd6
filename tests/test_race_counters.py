"""The race's equal means: runs pinned to their core budget, settings counted at run time from hooks on the
frameworks' objects (and refused when they differ), and the headline's wording from the numbers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pal_bench.argtypes import UsageError
from pal_bench.studies.race import results
from pal_bench.studies.race.counters import RunCounters
from pal_bench.studies.race.pin import cpu_set, over_budget, tree_cpus
from pal_bench.studies.race.task import MATCHED, TASKS, SettingsMismatch, check_counted

SMOKE = TASKS["smoke"]


def test_counters_count_optimizer_steps_target_copies_loss_rows_and_the_first_update():
    """A toy learner: 7 optimizer steps on batches of 5 rows, a hard target copy after steps 3 and 6; the forward
    on the next observations runs without gradients and is not a loss row."""
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    target.load_state_dict(online.state_dict())
    opt = torch.optim.SGD(online.parameters(), lr=0.1)
    env = {"steps": 100}
    c = RunCounters(env_steps=lambda: env["steps"])
    c.watch_optimizer(opt)
    c.watch_target(target.parameters())
    c.watch_loss_rows(online)
    for step in range(1, 8):
        env["steps"] += 4
        with torch.no_grad():
            online(torch.randn(5, 3))                         # the next observations: no gradients
        opt.zero_grad()
        online(torch.randn(5, 3)).sum().backward()
        opt.step()
        if step % 3 == 0:
            target.load_state_dict(online.state_dict())
    c.detach()
    opt.step()                                                # hooks removed: not counted
    d = c.as_dict(env_steps=env["steps"], learning_starts=100)
    assert d["optimizer_steps"] == 7 and d["target_copies"] == 2 and d["first_update_env_step"] == 104
    assert d["batch_size"] == 5 and d["batch_sizes"] == {"5": 7}
    assert d["updates_per_env_step"] == pytest.approx(7 / 28, abs=1e-5)


def test_epsilon_is_kept_once_per_thousand_env_steps():
    c = RunCounters()
    for t in range(0, 3_001, 250):
        c.epsilon(t, 1 - t / 10_000)
    assert [t for t, _ in c.eps_seen] == [0, 1_000, 2_000, 3_000]


def counted(**change) -> dict:
    """The counts of a run that did the matched work on the smoke task (2,000 env steps, learning from 500)."""
    base = {"env_steps": 2_000, "optimizer_steps": 375, "target_copies": 1, "first_update_env_step": 504,
            "batch_size": 128, "batch_sizes": {"128": 375}, "updates_per_env_step": 0.25,
            "eps_seen": [[t, MATCHED.epsilon(t, SMOKE.eps_decay_steps)] for t in (0, 1_000, 2_000)]}
    return base | change


@pytest.mark.parametrize("change,what", [
    ({"updates_per_env_step": 0.2}, "updates per env step"),
    ({"batch_size": 64, "batch_sizes": {"64": 375}}, "batches of"),
    ({"target_copies": 6}, "target copies"),
    ({"first_update_env_step": 1_000}, "first update"),
    ({"eps_seen": [[0, 1.0], [1_000, 0.5]]}, "epsilon 0.5 at env step 1000"),
    ({"eps_seen": []}, "seen only up to env step None"),
    ({"batch_sizes": {"128": 200, "32": 175}}, "every one"),
    ({"updates_per_env_step": float("nan")}, "updates per env step nan"),
    ({"eps_seen": [[0, 1.0], [1_000, float("nan")]]}, "epsilon nan"),
])
def test_a_run_whose_counted_settings_differ_is_refused(change, what):
    check_counted("fake", counted(), SMOKE, 500)
    with pytest.raises(SettingsMismatch, match=what):
        check_counted("fake", counted(**change), SMOKE, 500)


def test_epsilon_seen_only_at_the_start_of_a_long_decay_is_refused():
    full = TASKS["full"]
    long_run = counted(env_steps=100_000, eps_seen=[[0, 1.0]], optimizer_steps=22_500, target_copies=90,
                       batch_sizes={"128": 22_500}, first_update_env_step=full.learning_starts)
    with pytest.raises(SettingsMismatch, match="seen only up to env step 0"):
        check_counted("fake", long_run, full, full.learning_starts)


def test_a_budget_larger_than_the_machine_is_a_usage_error_and_over_budget_is_own_cores_above_it():
    have = len(os.sched_getaffinity(0))
    assert cpu_set(1) == sorted(os.sched_getaffinity(0))[:1]
    with pytest.raises(UsageError, match="may use"):
        cpu_set(have + 1)
    assert over_budget(1.11, 1) and not over_budget(1.09, 1) and not over_budget(None, 1)


def test_a_pinned_run_stays_on_its_cpu_and_its_counts_are_stored():
    """A real PAL run through ``launch`` on one CPU: the worker and everything it started could use only the first
    CPU, the run records its budget and the counters its hooks saw, and they pass the matched check."""
    from pal_bench.studies.race.run import launch

    with tempfile.TemporaryDirectory() as d:
        run = launch("pal-processes", "matched", "smoke", 0, Path(d) / "race.log", cpus=1)
    first = sorted(os.sched_getaffinity(0))[:1]
    assert run["cpus"] == 1 and run["cpu_set"] == first and run["tree_cpus"] == first
    c = run["counters"]
    assert c["optimizer_steps"] == run["updates"] and c["batch_size"] == MATCHED.batch_size
    check_counted("pal-processes", c, SMOKE, SMOKE.learning_starts)
    assert tree_cpus() == sorted(os.sched_getaffinity(0))      # the caller itself is not pinned


def test_at_least_only_where_a_censored_run_can_move_the_median():
    v = pd.Series(np.arange(1.0, 11.0))
    assert not results.censoring_moves_median(v, pd.Series([True] * 9 + [False]))   # the largest: median exact
    assert results.censoring_moves_median(v, pd.Series([True] * 4 + [False] + [True] * 5))
    r = results.ratio_intervals(v * 3, v)
    assert r["ratio"] == pytest.approx(3.0) and r["boot_low"] < 3 < r["boot_high"]
    assert r["order_low"] == pytest.approx(6 / 9) and r["order_high"] == pytest.approx(27 / 2)
    assert r["order_coverage"] >= 0.95
    few = results.ratio_intervals(v[:3] * 3, v[:3])                # no bootstrap on fewer than 10 seeds a side
    assert np.isnan(few["boot_low"]) and "bootstrap n/a (fewer than 10 seeds a side)" in results.interval_text(few)
