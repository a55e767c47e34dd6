"""The GIL wake-up probe (issue 50): what it measures, that it stops everything it starts, that errors in either
thread reach the caller, and that a bad output folder is refused before anything is measured."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading

import pytest

from pal_bench.studies.simulate import gil_wake


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """One spinning process at most, whatever the machine."""
    import pal_bench.conditions

    monkeypatch.setattr(pal_bench.conditions, "usable_cores", lambda: 2)


def live():
    return set(threading.enumerate()), {p.pid for p in mp.active_children()}


def busy_update():                                      # a stand-in update: holds the GIL a little
    sum(range(200))


def test_each_condition_times_the_wakes_and_the_learners_rate():
    before = live()
    timer = gil_wake.one_condition(busy_update, 1.0, busy=True, spin_others=False, wake="timer")
    assert timer["wakes"] >= 3 and timer["late_mean_us"] >= 0 and timer["learner_updates_per_s"] > 0
    assert timer["late_median_us"] <= timer["late_p90_us"] <= timer["late_p99_us"]
    assert math.isnan(timer["second_learner_updates_per_s"])
    event = gil_wake.one_condition(busy_update, 1.0, busy=True, spin_others=True, wake="event")
    assert event["wakes"] >= 3 and event["late_mean_us"] >= 0
    alone = gil_wake.one_condition(busy_update, 0.2, busy=True, spin_others=False, wake=None)
    assert alone["wakes"] == 0 and math.isnan(alone["late_mean_us"]) and alone["learner_updates_per_s"] > 0
    two = gil_wake.one_condition(busy_update, 0.2, busy=True, spin_others=False, wake="learner",
                                 second_update=busy_update)
    assert two["wakes"] == 0 and two["learner_updates_per_s"] > 0 and two["second_learner_updates_per_s"] > 0
    assert live() == before


def test_a_second_learner_without_its_own_update_is_refused():
    with pytest.raises(ValueError, match="its own update"):
        gil_wake.one_condition(busy_update, 0.1, busy=True, spin_others=False, wake="learner")


@pytest.mark.parametrize("side", ["learner", "second learner"])
def test_an_error_in_either_thread_reaches_the_caller_and_stops_everything(side):
    def failing():
        raise RuntimeError(f"{side} failed")

    before = live()
    first, other = (failing, busy_update) if side == "learner" else (busy_update, failing)
    with pytest.raises(RuntimeError, match=f"{side} failed"):
        gil_wake.one_condition(first, 30.0, busy=True, spin_others=True, wake="learner", second_update=other)
    assert live() == before


def test_ctrl_c_in_the_learner_stops_every_thread_and_process():
    def interrupted():
        raise KeyboardInterrupt

    before = live()
    with pytest.raises(KeyboardInterrupt):
        gil_wake.one_condition(interrupted, 30.0, busy=True, spin_others=True, wake="timer")
    assert live() == before


def test_bad_arguments_and_a_bad_folder_are_refused_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gil_wake, "measure", lambda *a, **k: pytest.fail("measured"))
    with pytest.raises(SystemExit) as e:
        gil_wake.main(["--seconds", "nan"])
    assert e.value.code == 2 and "--seconds" in capsys.readouterr().err
    # a bad output folder: tests/test_simulate_learner_parts.py, for both probes (``gil_wake.output_target``)
