"""``pal-bench race-profile``: area attribution of a cProfile run, and both kinds of report on the smoke task."""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pytest

from pal_bench.studies import race_profile as rp


def test_area_of_sorts_code_paths_into_areas():
    assert rp.area_of("/v/lib/python3.11/site-packages/torch/nn/modules/linear.py").startswith("torch")
    assert rp.area_of("/v/site-packages/gymnasium/envs/box2d/lunar_lander.py").startswith("environment")
    assert rp.area_of("/v/site-packages/ray/rllib/utils/replay_buffers/prioritized_episode_buffer.py") \
        == "replay buffer"
    assert rp.area_of("/work/pal_bench/integrations/rllib.py") == "replay buffer"
    assert rp.area_of("/v/site-packages/ray/rllib/algorithms/dqn/dqn.py") == "RLlib and Ray"
    assert rp.area_of("/usr/lib/python3.11/threading.py") == rp.OTHER


def _numpy_heavy() -> float:
    x = np.random.default_rng(0).random(200_000)
    return float(sum(np.sort(x)[:10])) + sum(i * i for i in range(20_000))


def test_area_seconds_add_up_to_the_profile_and_charge_builtins_to_their_caller():
    prof = cProfile.Profile()
    prof.enable()
    _numpy_heavy()
    prof.disable()
    stats = pstats.Stats(prof)
    areas = rp.area_seconds(stats)
    total_own = sum(v[2] for v in stats.stats.values())
    assert sum(areas.values()) == pytest.approx(total_own, rel=1e-9)
    # np.sort's C loop is a built-in called from this file: charged to its area (OTHER), not dropped
    assert areas[rp.OTHER] > 0
    table = rp.area_table(stats)
    assert table["share_%"].sum() == pytest.approx(100, abs=0.5) and list(table.seconds) == sorted(table.seconds)[::-1]


def test_framework_contestant_gets_a_cprofile_area_table(capsys):
    assert rp.main(["tianshou", "--task", "smoke", "--seconds", "5", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "under cProfile" in out and "own time per area" in out and "race evaluation" in out
    assert "torch (forward, backward, optimizer)" in out and "environment (gymnasium, Box2D)" in out


def test_pal_contestant_reports_its_trainer_s_phase_times(capsys):
    assert rp.main(["pal", "--task", "smoke", "--seconds", "5"]) == 0
    out = capsys.readouterr().out
    assert "per-phase seconds per worker role" in out and "env_step" in out and "forward_backward" in out


def test_seconds_must_be_positive():
    with pytest.raises(SystemExit):
        rp.main(["pal", "--seconds", "0"])
