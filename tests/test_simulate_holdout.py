"""Issue 50: the model judged on two sets kept apart, stated intervals, its outputs' provenance, and the check any
machine can run. The model runs on made-up inputs here, except ``--check-here``, which measures a tiny
configuration for real."""

import functools
import json
import re

import numpy as np
import pandas as pd
import pytest

from pal_bench.studies.simulate.calibrate import inputs_for
from pal_bench.studies.simulate.model import Workload, simulate, throughput
from pal_bench.studies.simulate.points import check_points, holdout_points
from pal_bench.studies.simulate.validate import interval, summary, validate
from tests.test_simulate import ROUND


def test_the_interval_combines_input_draws_with_the_model_error():
    # no residuals: the draws' own spread; with residuals: draw / (1 + e) over every pair
    assert interval([100.0, 100.0], []) == (100.0, 100.0)
    lo, hi = interval([100.0], [0.25, -0.2])
    assert 80.0 <= lo <= 83.0 and 122.0 <= hi <= 125.0        # between 100 / 1.25 and 100 / 0.8, interpolated
    rng = np.random.default_rng(0)
    residuals = rng.normal(0.1, 0.1, 200)           # the model over-predicts by about 10%
    lo, hi = interval([1_000.0], residuals)
    assert lo < 1_000 / 1.1 < hi and (lo + hi) / 2 < 1_000     # the interval sits mostly below the prediction


def test_the_holdout_set_covers_every_backend_at_two_and_three_workers():
    pts = holdout_points()
    assert {p.backend for p in pts} == {"threads", "processes", "learner-processes", "learner-allreduce",
                                       "ray-node", "ray"}
    assert {p.workers for p in pts} == {2, 3}
    e2e = [p for p in pts if p.curve == "end_to_end"]
    assert {p.aggregation for p in e2e if p.backend == "processes"} == {"sync", "async"}
    assert {p.aggregation for p in e2e if p.backend == "learner-allreduce"} == {"allreduce"}
    assert {(p.actors, p.learners) for p in e2e} == {(1, 1), (1, 2), (2, 1)}
    # --check-here at 1, 2, 4 workers: f_a, f_l at each, the whole trainer at 1 + 1, 2 + 2, 3 + 1
    chk = check_points(["processes"], [1, 2, 4])
    assert {(p.curve, p.actors, p.learners) for p in chk} >= {("f_a", 4, 0), ("f_l", 0, 4), ("end_to_end", 2, 2),
                                                              ("end_to_end", 3, 1), ("end_to_end", 1, 1)}


DEV = tuple((curve, n) for curve in ("f_a", "f_l") for n in (1, 2))     # the development points (curve, workers)
HELD = ((1, 1), (2, 1))                                                  # the held-out points (actors, learners)


@functools.cache
def _model_rates() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """What the model says on ROUND's inputs for ``_stored``'s points, simulated once for the module (the model is
    deterministic; a dozen tests write these files): the development points' rates and the held-out points'."""
    inp = inputs_for(ROUND, "processes")
    dev = tuple(throughput(inp, Workload("processes", 2, n, n, curve, steps=6_000, updates=600, learning_starts=1_000))
                for curve, n in DEV)
    # 3,000 steps (the validation simulates a point at its own steps, up to 9,000): the same answer, a third of the
    # simulated events
    held = tuple(simulate(inp, Workload("processes", 2, a, lr, "end_to_end", steps=3_000, learning_starts=1_000))
                 ["env_steps_per_s"] for a, lr in HELD)
    return dev, held


def _stored(tmp_path, holdout_error: float):
    """Scaling points made by the model on ROUND's inputs (development), and held-out points ``holdout_error``
    away from what the model says (a model that over-predicts the held-out points by that much)."""
    dev, held_rates = _model_rates()
    rows = []
    for (curve, n), model in zip(DEV, dev):
        # the development points a little off the model, both ways
        rows.append({"curve": curve, "threads": n, "throughput": model * (1.05 if n == 2 and curve == "f_a" else
                                                                          0.97 if n == 2 else 1.0),
                     "oversubscribed": False, "env_backend": "sync"})
    pd.DataFrame(rows).to_csv(tmp_path / "scaling_processes.csv", index=False)
    held = []
    for (a, lr), rate in zip(HELD, held_rates):
        held.append({"backend": "processes", "curve": "end_to_end", "actors": a, "learners": lr,
                     "aggregation": "sync", "env_backend": "sync", "measured": rate / (1 + holdout_error),
                     "steps": 3_000, "oversubscribed": a + lr > 2})
    pd.DataFrame(held).to_csv(tmp_path / "simulation_holdout.csv", index=False)


def test_validation_reports_the_sets_apart_with_bias_and_coverage(tmp_path):
    _stored(tmp_path, holdout_error=0.5)
    v = validate(tmp_path, pd.DataFrame([ROUND]), progress=lambda m: None, samples=1)
    assert {"backend", "curve", "actors", "learners", "measured", "predicted", "error", "lo90", "hi90",
            "set"} <= set(v.columns)
    assert list(v.set.unique()) == ["development", "holdout"]
    s = summary(v)
    dev, held = s["development"], s["holdout"]
    assert dev["points"] == 2 and held["points"] == 2          # multi-worker points only: the fit's are not counted
    assert held["bias"] == pytest.approx(0.5, abs=0.02)         # a holdout 50% over: its bias says so
    assert held["coverage"] == 0.0                              # ... and outside every stated interval
    assert abs(dev["bias"]) < 0.05
    assert set(held["per_backend"]) == {"processes"} and set(held["per_curve"]) == {"end_to_end"}
    # the holdout never enters the fit: the same development set gives the same development predictions
    _stored(tmp_path, holdout_error=-0.3)
    v2 = validate(tmp_path, pd.DataFrame([ROUND]), progress=lambda m: None, samples=1)
    dev1, dev2 = v[v.set == "development"], v2[v2.set == "development"]
    assert dev1.predicted.tolist() == dev2.predicted.tolist()
    assert summary(v2)["holdout"]["bias"] == pytest.approx(-0.3, abs=0.02)


def test_validate_command_writes_its_provenance(tmp_path, capsys):
    from pal_bench.studies.simulate.cli import main

    _stored(tmp_path, holdout_error=0.1)
    pd.DataFrame([ROUND]).to_csv(tmp_path / "simulation_inputs.csv", index=False)
    assert main(["--validate", "--samples", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "holdout: 2 multi-worker points" in out and "bias +10" in out
    meta = json.loads((tmp_path / "simulation_validation.csv.meta.json").read_text())
    assert {s["file"] for s in meta["sources"]} == {"simulation_inputs.csv", "scaling_processes.csv",
                                                    "simulation_holdout.csv"}
    assert "measures nothing" in meta["what"] and "commit" in meta


def test_a_bad_holdout_file_is_one_line(tmp_path):
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.validate import measured_points

    _stored(tmp_path, holdout_error=0.0)
    df = pd.read_csv(tmp_path / "simulation_holdout.csv")
    df.loc[0, "measured"] = -5
    df.to_csv(tmp_path / "simulation_holdout.csv", index=False)
    with pytest.raises(UsageError, match="simulation_holdout.csv.*measured"):
        measured_points(tmp_path)


def test_a_prediction_is_judged_against_the_range_of_its_points_repeats():
    from pal_bench.studies.simulate.validate import beyond_repeats

    assert beyond_repeats(100.0, [90.0, 110.0, 95.0]) == 0.0          # inside: no error beyond the measurement
    assert beyond_repeats(132.0, [90.0, 110.0]) == pytest.approx(0.2)  # 20% above the highest repeat
    assert beyond_repeats(72.0, [90.0, 110.0]) == pytest.approx(-0.2)  # 20% below the lowest
    assert np.isnan(beyond_repeats(100.0, [90.0]))                     # one repeat: no range
    assert np.isnan(beyond_repeats(float("nan"), [90.0, 110.0]))       # not predicted


def test_validation_reports_each_prediction_against_its_repeats(tmp_path):
    from pal_bench.studies.simulate.publish import validation_block

    _stored(tmp_path, holdout_error=0.0)
    df = pd.read_csv(tmp_path / "scaling_processes.csv")
    # the 2-worker points measured three times: f_a's repeats span its prediction, f_l's lie 50%-60% above it
    inp = inputs_for(ROUND, "processes")
    for i, r in df.iterrows():
        w = Workload("processes", 2, r.threads, r.threads, r.curve, steps=6_000, updates=600, learning_starts=1_000)
        model = throughput(inp, w)
        reps = [0.8, 1.0, 1.3] if r.curve == "f_a" else [1.5, 1.6, 1.55]
        df.loc[i, "throughput_reps"] = " ".join(f"{model * k:.3f}" for k in reps) if r.threads == 2 else ""
        if r.threads == 2 and r.curve == "f_l":
            df.loc[i, "throughput"] = model * 1.55                  # the median of its repeats
    df.to_csv(tmp_path / "scaling_processes.csv", index=False)
    v = validate(tmp_path, pd.DataFrame([ROUND]), progress=lambda m: None, samples=1)
    two = v[(v.set == "development") & ((v.actors + v.learners) == 2)].set_index("curve")
    assert two.loc["f_a", "beyond_repeats"] == 0.0 and two.loc["f_a", "repeats"] == 3
    assert two.loc["f_l", "beyond_repeats"] == pytest.approx(1 / 1.5 - 1, abs=0.02)   # a third below the lowest
    assert v[v.set == "holdout"].beyond_repeats.isna().all()          # measured once: no range
    f = summary(v)["development"]
    assert f["with_repeats"] == 2 and f["inside_repeats"] == 0.5 and f["inside_repeats_if_right"] == 0.75
    assert f["median_repeat_spread"] == pytest.approx((1.3 / 0.8 + 1.6 / 1.5) / 2, rel=1e-3)
    v.to_csv(tmp_path / "simulation_validation.csv", index=False)
    block = validation_block(tmp_path)
    part = block.split("Against the measurements' own spread")[1]
    all_row = next(line for line in part.splitlines() if line.startswith("| development | all "))
    cells = [c.strip() for c in all_row.strip("|").split("|")]
    # points, the repeats' spread, inside, a right model's chance, median and worst beyond
    assert cells[2] == "2" and cells[4:8] == ["50%", "75%", "17%", "33%"], cells
    assert re.fullmatch(r"1\.3[45]x \(1\.6[23]x\)", cells[3]), cells


@pytest.mark.parametrize("reps, why", [("4000 nan 4100", "'nan' is not a rate"),
                                       ("4000 -1", "'-1' is not a rate"),
                                       ("4000 1e-300", "'1e-300' is not a rate"),
                                       ("4000 abc", "'abc' is not a rate"),
                                       (" ".join(["4000"] * 101), "more than 100 repeats"),
                                       ("1 2 3", r"measured value .* lies outside its repeats \(1-3\)")])
def test_bad_repeats_in_a_stored_point_are_one_line(tmp_path, reps, why):
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.validate import measured_points

    _stored(tmp_path, holdout_error=0.0)
    df = pd.read_csv(tmp_path / "scaling_processes.csv")
    df["throughput_reps"] = ""
    df.loc[2, "throughput_reps"] = reps.replace("4000", str(df.throughput[2]))
    df.to_csv(tmp_path / "scaling_processes.csv", index=False)
    with pytest.raises(UsageError, match=f"scaling_processes.csv: row 3: .*{why}"):
        measured_points(tmp_path)
    held = pd.read_csv(tmp_path / "simulation_holdout.csv").assign(measured_reps="")
    held.loc[1, "measured_reps"] = reps.replace("4000", str(held.measured[1]))
    held.to_csv(tmp_path / "simulation_holdout.csv", index=False)
    (tmp_path / "scaling_processes.csv").unlink()
    with pytest.raises(UsageError, match=f"simulation_holdout.csv: row 2: .*{why}"):
        measured_points(tmp_path)


def test_check_here_measures_predicts_and_writes_its_csv(tmp_path, capsys, monkeypatch):
    """A tiny --check-here for real (threads, 1 and 2 workers, a few hundred steps, the inputs' timed probes
    shortened): every point measured and predicted, the machine described, the conditions beside it."""
    from functools import partial

    from pal_bench.studies.simulate import inputs
    from pal_bench.studies.simulate.check import host_name
    from pal_bench.studies.simulate.cli import main

    monkeypatch.setattr(inputs, "PROBE_S", 0.2)
    monkeypatch.setattr(inputs, "corun_slowdown", partial(inputs.corun_slowdown, seconds=0.3))
    monkeypatch.setattr(inputs, "memory_bandwidth", partial(inputs.memory_bandwidth, seconds=0.3))

    assert main(["--check-here", "--backend", "threads", "--threads", "1,2", "--steps", "600", "--updates", "60",
                 "--out", str(tmp_path), "--force"]) == 0
    path = tmp_path / f"simulation_check_{host_name()}.csv"
    df = pd.read_csv(path)
    assert {(r.curve, r.actors, r.learners) for r in df.itertuples()} == {
        ("f_a", 1, 0), ("f_a", 2, 0), ("f_l", 0, 1), ("f_l", 0, 2), ("end_to_end", 1, 1)}
    assert (df.measured > 0).all() and (df.predicted > 0).all()
    assert np.allclose(df.error, (df.predicted - df.measured) / df.measured, rtol=1e-4, atol=1e-6)
    assert df.fit_point.tolist().count(True) == 2 and (df.cores >= 1).all() and df.cpu.notna().all()
    assert json.loads(path.with_name(path.name + ".meta.json").read_text())["machine"]["usable_cores"] >= 1
    assert "points beyond the fit" in capsys.readouterr().out


@pytest.mark.parametrize("actors, learners, curve", [(0, 0, "f_a"), (3, 0, "end_to_end"), (2, 1, "f_l"),
                                                     (2**40, 0, "f_a")])
def test_a_held_out_point_whose_workers_contradict_its_curve_is_one_line(tmp_path, actors, learners, curve):
    """(adversarial pass) an f_a point with no actor divided by zero; an end-to-end point with no learner, or 2^40
    actors, simulated for ever."""
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.validate import measured_points

    _stored(tmp_path, holdout_error=0.0)
    df = pd.read_csv(tmp_path / "simulation_holdout.csv")
    df.loc[1, ["actors", "learners", "curve"]] = actors, learners, curve
    df.to_csv(tmp_path / "simulation_holdout.csv", index=False)
    with pytest.raises(UsageError, match="simulation_holdout.csv.*(row 2|actors)"):
        measured_points(tmp_path)


def test_worker_costs_past_any_machine_are_refused(tmp_path):
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.costs import stored_costs

    pd.DataFrame({"actors": [1, 2048], "us_per_reservation": [1.0, 9_000.0]}).to_csv(
        tmp_path / "reservation_cost.csv", index=False)
    with pytest.raises(UsageError, match="reservation_cost.csv: a reservation reaches"):
        stored_costs(tmp_path)
    pd.DataFrame({"actors": [1, 16, 64], "us_per_reservation": [2.4, 1.2, 1.3]}).to_csv(
        tmp_path / "reservation_cost.csv", index=False)
    got = stored_costs(tmp_path)
    assert got["reserve_us_per_actor"] == 0 and 1.0 < got["reserve_us"] < 2.5     # falling: flat at the mean


def test_out_is_made_or_refused_before_anything_runs(tmp_path, capsys):
    from pal_bench.studies.simulate.cli import main

    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(SystemExit):
            main(["--validate", "--out", str(bad)])
        assert "--out" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "x"


def test_host_names_stay_apart_as_file_names():
    from pal_bench.studies.simulate.check import host_name

    assert host_name("node-7.cluster") == "node-7.cluster"
    a, b = host_name("a/b"), host_name("a_b")
    assert a != b and b == "a_b" and a.startswith("a_b-")
    assert "/" not in host_name("../../etc/passwd") and host_name("").startswith("host")
