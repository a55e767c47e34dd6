"""`pal-bench profile` reads a run's per-phase times, tabulates them per role and draws them."""

import json

import pytest

from pal_bench.cli import main
from pal_bench.train import profile


def test_profile_tables_and_figure(tmp_path, capsys):
    phases = {"actor0": {"env_step": 3.0, "inference": 1.0}, "actor1": {"env_step": 1.0, "inference": 1.0},
              "learner0": {"sample": 1.0, "forward_backward": 3.0}, "parameter-server": {"aggregate": 1.0, "idle": 3.0}}
    (tmp_path / "summary.json").write_text(json.dumps({"phase_seconds": phases}))
    t = profile.role_table(profile.phases(tmp_path)).set_index(["role", "phase"])
    assert t.loc[("actor", "env_step"), "seconds"] == 2.0
    assert t.loc[("actor", "env_step"), "share"] == pytest.approx((0.75 + 0.5) / 2)
    assert t.loc[("learner", "forward_backward"), "share"] == 0.75
    assert main(["profile", str(tmp_path)]) == 0
    assert "forward_backward" in capsys.readouterr().out
    assert (tmp_path / "profile.png").stat().st_size > 1000


def test_profile_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "nope")]) == 2
    assert "summary.json not found" in capsys.readouterr().err
