"""The learner-parts probe (issue 50): what each condition measures, that it stops every thread it starts, and that
bad arguments and a bad output folder are refused before anything is measured."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading

import pytest

from pal_bench.studies.simulate import learner_parts


def live():
    return set(threading.enumerate()), {p.pid for p in mp.active_children()}


def busy_update():                                      # a stand-in plain update: holds the GIL a little
    sum(range(200))


@pytest.mark.parametrize("learners, aggregation", [(1, "sync"), (1, "async"), (2, "sync"), (2, "async")])
def test_the_trainers_learners_are_timed_phase_by_phase(learners, aggregation):
    before = live()
    got = learner_parts.trainer_learners(learners, aggregation, updates=40, filled=600)
    assert got["updates"] >= 40 and got["updates_per_s"] > 0 and got["cores"] > 0
    assert got["forward_backward_us"] > 0 and got["sample_us"] > 0
    if aggregation == "sync":                           # a sync round is one server step of every learner's gradient
        assert got["server_steps"] == got["updates"] // learners
    else:
        assert got["server_steps"] + got["dropped_stale"] == got["updates"]
    if learners == 1 and aggregation == "sync":         # it applies its own gradient: no snapshot, no server wait
        assert got["apply_us"] > 0 and got["aggregation_wait_us"] == 0 and got["weights_pull_us"] < got["apply_us"]
    else:                                               # the server's thread steps; the learner loads its snapshots
        assert got["apply_us"] == 0 and got["server_aggregate_us"] > 0 and got["weights_pull_us"] > 0
    assert live() == before


def test_every_condition_in_every_round_with_the_order_rotated():
    before = live()
    seen = []
    df = learner_parts.measure(updates=20, seconds=0.2, rounds=2, progress=seen.append, filled=300,
                               plain=[busy_update, busy_update])
    names = [*learner_parts.TRAINER_CONDITIONS, *learner_parts.PLAIN_CONDITIONS]
    assert len(df) == 2 * len(names) and (df.updates_per_s > 0).all()
    assert list(df[df["round"] == 0].condition) == names
    assert list(df[df["round"] == 1].condition) == names[1:] + names[:1]
    plain = df[df.condition.isin(learner_parts.PLAIN_CONDITIONS)]
    assert plain.forward_backward_us.isna().all() and math.isnan(plain.cores.iloc[0])
    assert len(seen) == len(df) and live() == before


def test_an_error_in_a_plain_update_reaches_the_caller():
    def failing():
        raise RuntimeError("update failed")

    before = live()
    with pytest.raises(RuntimeError, match="update failed"):
        learner_parts.plain_update(2, 30.0, [busy_update, failing])
    assert live() == before


def test_bad_arguments_are_refused_before_measuring(monkeypatch, capsys):
    monkeypatch.setattr(learner_parts, "measure", lambda *a, **k: pytest.fail("measured"))
    for bad in (["--updates", "5"], ["--seconds", "nan"], ["--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            learner_parts.main(bad)
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err


@pytest.mark.parametrize("probe", ["learner_parts", "gil_wake"])
def test_a_bad_folder_is_refused_before_measuring(probe, tmp_path, monkeypatch, capsys):
    """Both probes check their output through ``gil_wake.output_target``."""
    import importlib

    module = importlib.import_module(f"pal_bench.studies.simulate.{probe}")
    monkeypatch.setattr(module, "measure", lambda *a, **k: pytest.fail("measured"))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("keep")
    with pytest.raises(SystemExit) as e:
        module.main(["--out", str(not_a_folder), "--force"])
    assert e.value.code == 2 and "not a folder" in capsys.readouterr().err and not_a_folder.read_text() == "keep"
    (tmp_path / "d" / module.FILE).mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        module.main(["--out", str(tmp_path / "d"), "--force"])
    assert e.value.code == 2 and "plain file" in capsys.readouterr().err


def test_it_writes_the_csv_and_its_conditions(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setattr(learner_parts, "measure", lambda *a, **k: pd.DataFrame(
        [{"round": 0, "condition": "one learner, sync", "learners": 1, "aggregation": "sync", "updates_per_s": 900.0}]))
    assert learner_parts.main(["--out", str(tmp_path), "--force"]) == 0
    assert pd.read_csv(tmp_path / learner_parts.FILE).updates_per_s.tolist() == [900.0]
    assert (tmp_path / (learner_parts.FILE + ".meta.json")).exists()


def test_a_folder_or_link_at_the_conditions_file_is_refused_and_nothing_is_created_before_measuring(tmp_path,
                                                                                                   monkeypatch, capsys):
    """(adversarial pass) a folder at the .meta.json let the probe replace the CSV and then fail; a link there was
    replaced; the output folder was made before the busy check; a link to nothing read "File exists"."""
    from pal_bench.conditions import meta_path

    monkeypatch.setattr(learner_parts, "measure", lambda *a, **k: pytest.fail("measured"))
    out = tmp_path / "out"
    out.mkdir()
    (out / learner_parts.FILE).write_text("good")
    meta = meta_path(out / learner_parts.FILE)
    meta.mkdir()
    with pytest.raises(SystemExit) as e:
        learner_parts.main(["--out", str(out), "--force"])
    assert e.value.code == 2 and "a folder or a link" in capsys.readouterr().err
    meta.rmdir()
    meta.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(SystemExit):
        learner_parts.main(["--out", str(out), "--force"])
    assert "a folder or a link" in capsys.readouterr().err and (out / learner_parts.FILE).read_text() == "good"
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    with pytest.raises(SystemExit):
        learner_parts.main(["--out", str(tmp_path / "dangling"), "--force"])
    assert "a link to nothing" in capsys.readouterr().err
    import pal_bench.conditions

    monkeypatch.setattr(pal_bench.conditions, "refuse_if_busy", lambda *a, **k: True)
    assert learner_parts.main(["--out", str(tmp_path / "new" / "dir")]) == 1
    assert not (tmp_path / "new").exists()


def test_the_stored_measurement_against_the_model_is_what_the_docs_quote():
    """docs/simulation.md quotes the model's errors on the stored measurement (``--model``)."""
    from pal_bench.paths import RESULTS, ROOT

    df = learner_parts.against_the_model(RESULTS)
    assert len(df) == 3 * df["round"].nunique() and df.error.notna().all()
    e = df.error
    quoted = f"median |error| {e.abs().median():.0%}, worst {e.abs().max():.0%}, mean {e.mean():+.0%}"
    assert quoted in " ".join((ROOT / "docs" / "simulation.md").read_text().split())


def test_model_with_no_stored_measurement_says_so_and_a_round_without_its_reference_is_skipped(tmp_path, capsys):
    import shutil

    import pandas as pd

    from pal_bench.paths import RESULTS

    assert learner_parts.main(["--model", "--out", str(tmp_path)]) == 2
    assert learner_parts.FILE in capsys.readouterr().err
    for name in ("simulation_inputs.csv", "simulation_inputs.csv.meta.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    pd.DataFrame([{"round": 0, "condition": "two learners, sync", "updates_per_s": 800.0},
                  {"round": 1, "condition": "one learner, sync", "updates_per_s": 900.0},
                  {"round": 1, "condition": "two learners, sync", "updates_per_s": 800.0}]).to_csv(
        tmp_path / learner_parts.FILE, index=False)
    df = learner_parts.against_the_model(tmp_path)
    assert df[["round", "condition"]].values.tolist() == [[1, "two learners, sync"]]
    assert df.measured_ratio.iloc[0] == pytest.approx(800 / 900)
