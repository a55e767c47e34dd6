"""The GIL wake-up probe (issue 50): what it measures, that it stops everything it starts, that errors reach
the caller."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading

import pytest

from pal_bench.studies.simulate import gil_wake


def test_each_condition_times_the_wakes_and_the_learners_rate():
    calls = []

    def update():                                   # a stand-in update: holds the GIL a little
        calls.append(sum(range(200)))

    timer = gil_wake.one_condition(update, 0.3, busy=True, spin_others=False, wake="timer")
    assert timer["wakes"] > 10 and timer["late_mean_us"] >= 0 and timer["learner_updates_per_s"] > 0
    assert timer["late_median_us"] <= timer["late_p90_us"] <= timer["late_p99_us"]
    event = gil_wake.one_condition(update, 0.3, busy=True, spin_others=True, wake="event")
    assert event["wakes"] > 10 and event["late_mean_us"] >= 0
    alone = gil_wake.one_condition(update, 0.2, busy=True, spin_others=False, wake=None)
    assert alone["wakes"] == 0 and math.isnan(alone["late_mean_us"]) and alone["learner_updates_per_s"] > 0
    two = gil_wake.one_condition(update, 0.2, busy=True, spin_others=False, wake="learner")
    assert two["wakes"] == 0 and two["learner_updates_per_s"] > 0 and two["second_learner_updates_per_s"] > 0
    assert math.isnan(timer["second_learner_updates_per_s"])
    assert threading.active_count() == 1 and not mp.active_children()


def test_an_error_in_the_learner_reaches_the_caller_and_stops_everything():
    def update():
        raise RuntimeError("learner failed")

    with pytest.raises(RuntimeError, match="learner failed"):
        gil_wake.one_condition(update, 5.0, busy=True, spin_others=True, wake="timer")
    assert threading.active_count() == 1 and not mp.active_children()


def test_the_command_refuses_a_bad_duration(capsys):
    with pytest.raises(SystemExit):
        gil_wake.main(["--seconds", "nan"])
    assert "--seconds" in capsys.readouterr().err
