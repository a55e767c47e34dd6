"""``pal-bench race-profile``: area attribution of a cProfile run, and both kinds of report on the smoke task."""

from __future__ import annotations

import cProfile
import json
import pstats

import numpy as np
import pytest

from pal_bench.studies import race_profile as rp


def test_area_of_sorts_code_paths_into_areas():
    assert rp.area_of("/v/lib/python3.11/site-packages/torch/nn/modules/linear.py").startswith("torch")
    assert rp.area_of("/v/site-packages/gymnasium/envs/box2d/lunar_lander.py").startswith("environment")
    assert rp.area_of("/v/site-packages/ray/rllib/utils/replay_buffers/prioritized_episode_buffer.py") \
        == "replay buffer"
    assert rp.area_of("/work/pal_bench/integrations/rllib/buffer.py") == "replay buffer"
    assert rp.area_of("/v/site-packages/ray/rllib/algorithms/dqn/dqn.py") == "RLlib and Ray"
    assert rp.area_of("/usr/lib/python3.11/threading.py") == rp.OTHER


def _numpy_heavy() -> float:
    x = np.random.default_rng(0).random(200_000)
    return float(sum(np.sort(x)[:10])) + sum(i * i for i in range(20_000)) + sorted(x.tolist())[0]


def test_area_seconds_add_up_to_the_profile_and_charge_builtins_to_their_caller(monkeypatch):
    monkeypatch.setattr(rp, "AREAS", rp.AREAS + (("this test", ("test_race_profile",)),))
    prof = cProfile.Profile()
    prof.enable()
    _numpy_heavy()
    prof.disable()
    stats = pstats.Stats(prof)
    areas = rp.area_seconds(stats)
    total_own = sum(v[2] for v in stats.stats.values())
    assert sum(areas.values()) == pytest.approx(total_own, rel=1e-9)
    # the built-in ``sorted``, called from this file, is charged to this file's area
    builtin_sorted = sum(v[2] for (p, _l, n), v in stats.stats.items() if p == "~" and "sorted" in n)
    assert builtin_sorted > 0 and areas["this test"] >= builtin_sorted
    table = rp.area_table(stats)
    assert table["share_%"].sum() == pytest.approx(100, abs=0.5) and list(table.seconds) == sorted(table.seconds)[::-1]


def test_framework_contestant_gets_a_cprofile_area_table(capsys, tmp_path):
    assert rp.main(["tianshou", "--task", "smoke", "--seconds", "5", "--top", "5", "--out", str(tmp_path)]) == 0
    stored = json.loads((tmp_path / "race_profile_matched_tianshou_smoke.json").read_text())
    assert stored["profiled"] and stored["task"] == "smoke" and stored["conditions"]["load_before"] is not None
    out = capsys.readouterr().out
    assert "under cProfile" in out and "own time per area" in out and "race evaluation" in out
    assert "torch (forward, backward, optimizer)" in out and "environment (gymnasium, Box2D)" in out


def test_pal_contestant_reports_its_trainer_s_phase_times(capsys, tmp_path):
    assert rp.main(["pal", "--task", "smoke", "--seconds", "5", "--out", str(tmp_path)]) == 0
    stored = json.loads((tmp_path / "race_profile_matched_pal_smoke.json").read_text())
    assert not stored["profiled"] and "per-phase" in next(iter(stored["tables"]))
    out = capsys.readouterr().out
    assert "per-phase seconds per worker role" in out and "env_step" in out and "forward_backward" in out


def test_seconds_must_be_positive():
    with pytest.raises(SystemExit):
        rp.main(["pal", "--seconds", "0"])


class _Stats:
    """What ``component_table`` reads of a ``pstats.Stats``: ``stats`` (func -> (cc, nc, tt, ct, callers))."""

    def __init__(self, entries: dict):
        self.stats = {k: (1, 1, 0.0, ct, {}) for k, ct in entries.items()}


def test_component_table_sums_each_component_over_both_buffers_and_keeps_the_rest():
    stats = _Stats({("/x/ray/rllib/env/single_agent_env_runner.py", 1, "sample"): 30.0,
                    ("/x/ray/rllib/utils/replay_buffers/prioritized_episode_buffer.py", 2, "sample"): 20.0,
                    ("/w/pal_bench/integrations/rllib/buffer.py", 3, "sample"): 5.0,
                    ("/x/ray/rllib/env/single_agent_env_runner.py", 9, "_sample"): 29.0,   # inside "sample"
                    ("/x/ray/rllib/core/learner/learner_group.py", 4, "update"): 10.0})
    t = rp.component_table(stats, 100.0).set_index("component")
    assert t.loc["replay buffer sample", "seconds"] == 25.0
    assert t.loc["env runner: env steps, exploration forward passes, episode bookkeeping", "seconds"] == 30.0
    assert t.loc["the rest (framework loop, metrics, set-up)", "seconds"] == 35.0
    assert "replay buffer add" not in t.index and t["share_%"].sum() == pytest.approx(100)
