"""Issue 50: Ray's own idle CPU measured (``python -m pal_bench.studies.simulate.ray_idle``) and used by the model:
the Ray backends' background cores, and out of the per-call and per-update CPU the inputs measured as the whole
machine's. One tiny measurement runs for real."""

import pandas as pd
import pytest

from pal_bench.argtypes import UsageError
from pal_bench.studies.simulate.calibrate import BACKGROUND_CORES, inputs_for
from pal_bench.studies.simulate.costs import idle_cores, stored_costs
from pal_bench.studies.simulate.ray_idle import FILE
from tests.test_simulate import ROUND


def _rows(machine=(0.02, 0.03, 0.02), one=(0.32, 0.29, 0.40), two=(0.45, 0.41, 0.5)) -> pd.DataFrame:
    rows = []
    for r, (m, a, b) in enumerate(zip(machine, one, two)):
        rows += [{"round": r, "condition": "machine", "learners": 0, "seconds": 3.0, "busy_cores": m},
                 {"round": r, "condition": "session", "learners": 0, "seconds": 3.0, "busy_cores": a - 0.1},
                 {"round": r, "condition": "learners", "learners": 1, "seconds": 3.0, "busy_cores": a},
                 {"round": r, "condition": "learners", "learners": 2, "seconds": 3.0, "busy_cores": b}]
    return pd.DataFrame(rows)


def test_idle_cores_are_one_learners_less_the_machine_alone_median_over_rounds():
    assert idle_cores(_rows()) == pytest.approx(0.30)          # 0.30, 0.26, 0.38: the median
    assert idle_cores(_rows(), "session") == pytest.approx(0.20)   # the session alone: 0.1 less each round
    assert idle_cores(_rows(machine=(0.5, 0.5, 0.5))) == 0.0    # never below nothing
    with pytest.raises(ValueError, match="no round"):
        idle_cores(_rows().query("condition != 'machine'"))
    # a round without its machine-alone row is left out, not paired with another round's
    assert idle_cores(_rows().drop(index=4)) == pytest.approx((0.30 + 0.38) / 2)


def test_the_stored_idle_cores_become_the_ray_backends_background_and_leave_their_measured_cpu(tmp_path):
    assert "ray_idle_cores" not in stored_costs(tmp_path)       # not stored: the chosen assumption
    assert inputs_for(ROUND, "ray").background_cores == BACKGROUND_CORES["ray"]
    _rows().to_csv(tmp_path / FILE, index=False)
    idle = stored_costs(tmp_path)["ray_idle_cores"]
    assert idle == pytest.approx(0.30)
    costs = stored_costs(tmp_path)
    assert costs["ray_session_idle_cores"] == pytest.approx(0.20)
    row = dict(ROUND, **costs, ray_call_us=800.0, ray_call_cpu_us=900.0,
               **{"ray.learner_remote_us": 6_000.0, "ray.learner_remote_cpu_us": 10_000.0, "ray.f_l_1": 125.0})
    before = inputs_for(dict(row, ray_idle_cores=float("nan")), "ray")
    after = inputs_for(row, "ray")
    assert after.background_cores == pytest.approx(0.30) and inputs_for(row, "ray-node").background_cores == 0.30
    assert inputs_for(row, "processes").background_cores == 0.0       # no Ray there
    # the learner's processes' idle ran through every update's wall (1e6 / f_l(1) = 8,000 µs), the session's
    # through every bare call's round trip
    assert after.ray_learner_remote_cpu_us == pytest.approx(10_000 - 0.30 * 8_000)
    assert after.ray_call_cpu_us == pytest.approx(900 - 0.20 * 800)
    assert (before.ray_learner_remote_cpu_us, before.ray_call_cpu_us) == (10_000, 900)
    assert after.ray_learner_remote_us == before.ray_learner_remote_us   # the wait is the wait
    # no f_l(1) stored: the wall is the remote wait and the learner's own sample, gradients and priorities
    own = ROUND["sample_us"] + ROUND["grad_us"] + ROUND["prio_us"]
    older = inputs_for({k: v for k, v in row.items() if k != "ray.f_l_1"}, "ray")
    assert older.ray_learner_remote_cpu_us == pytest.approx(10_000 - 0.30 * (6_000 + own))


def test_an_idle_measurement_as_busy_as_the_machine_is_refused(tmp_path):
    from pal_bench.studies.simulate.stored import require_inputs

    pd.DataFrame([ROUND]).to_csv(tmp_path / "simulation_inputs.csv", index=False)
    _rows(one=(2.5, 2.5, 2.5)).to_csv(tmp_path / FILE, index=False)
    with pytest.raises(UsageError, match=f"{FILE}: Ray idle keeps 2.4.* cores busy, as many as"):
        require_inputs(tmp_path)
    _rows().to_csv(tmp_path / FILE, index=False)
    assert require_inputs(tmp_path).ray_idle_cores.iloc[0] == pytest.approx(0.30)


@pytest.mark.parametrize("change, why", [
    (lambda df: pd.concat([df, df.iloc[[4]]]), "round 1, machine measured twice"),
    (lambda df: df.assign(learners=df.learners.where(df.condition != "session", 3)), "condition 'session' with 3"),
    (lambda df: df.assign(learners=df.learners.where(df.condition != "learners", 0)), "condition 'learners' with 0"),
    (lambda df: pd.concat([df] * 900), "rows, at most 10000")])
def test_rows_that_contradict_each_other_are_one_line(tmp_path, change, why):
    change(_rows()).to_csv(tmp_path / FILE, index=False)
    with pytest.raises(UsageError, match=f"{FILE}.*{why}"):
        stored_costs(tmp_path)


@pytest.mark.parametrize("column, value, why", [("busy_cores", "-1", "busy_cores"), ("condition", "idle", "condition"),
                                                ("seconds", "0", "seconds"), ("busy_cores", "nan", "busy_cores"),
                                                ("busy_cores", "1e308", "busy_cores"), ("round", "x", "round")])
def test_a_bad_idle_file_is_one_line(tmp_path, column, value, why):
    df = _rows().astype(str)
    df.loc[2, column] = value
    df.to_csv(tmp_path / FILE, index=False)
    with pytest.raises(UsageError, match=f"{FILE}.*{why}"):
        stored_costs(tmp_path)


def test_a_file_with_no_complete_round_is_one_line(tmp_path):
    _rows().query("condition != 'learners'").to_csv(tmp_path / FILE, index=False)
    with pytest.raises(UsageError, match=f"{FILE}: no round with both"):
        stored_costs(tmp_path)


def test_the_probe_measures_for_real_and_writes_its_csv(tmp_path, capsys):
    """One round, one learner, 0.3 s a condition, a small buffer: a real Ray session (about 10 s)."""
    pytest.importorskip("ray")
    from pal_bench.studies.simulate.ray_idle import main

    assert main(["--rounds", "1", "--learners", "1", "--idle-s", "0.3", "--rows", "256", "--out", str(tmp_path),
                 "--force"]) == 0
    df = pd.read_csv(tmp_path / FILE)
    assert df.condition.tolist() == ["machine", "session", "learners"] and df.learners.tolist() == [0, 0, 1]
    assert (df.busy_cores >= 0).all() and (df.seconds >= 0.3).all()
    assert (tmp_path / f"{FILE}.meta.json").exists()
    assert stored_costs(tmp_path)["ray_idle_cores"] >= 0
    assert "Ray's idle cores (one learner's processes up" in capsys.readouterr().out
    import ray

    assert not ray.is_initialized()                  # the session it started is closed


def test_the_probe_refuses_a_learner_set_without_one(tmp_path, capsys):
    from pal_bench.studies.simulate.ray_idle import main

    with pytest.raises(SystemExit):
        main(["--learners", "2", "--out", str(tmp_path)])
    assert "--learners must include 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo"])
def test_a_stored_idle_file_that_is_not_a_plain_file_is_one_line(tmp_path, kind):
    import os

    path = tmp_path / FILE
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(UsageError, match=FILE):
        stored_costs(tmp_path)
