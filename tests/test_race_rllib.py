"""RLlib's race contestants (``pal_bench.studies.race.contestants.rllib``): what the matched and tuned configs
build, read back from RLlib's own objects, and the update rhythm RLlib's own counters log in a short run."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("gymnasium")

from pal_bench.studies.race.clock import Clock  # noqa: E402
from pal_bench.studies.race.contestants import make  # noqa: E402
from pal_bench.studies.race.contestants.rllib import RLlibContestant  # noqa: E402
from pal_bench.studies.race.task import MATCHED, TASKS, SettingsMismatch, check_matched  # noqa: E402

LUNAR, CARTPOLE = (8, 4), (4, 2)
OLD_RACE_PARAMS = 8 * 256 + 256 + 256 * 4 + 4          # the old race's 8-256-4 network (as RLlib built it): 3,332


def built_facts(name: str, track: str, task=TASKS["full"]) -> dict:
    c = make(name, track, task, 0)
    try:
        c.build()
        return c.facts()
    finally:
        c.close()


@pytest.mark.parametrize("name", ["rllib", "rllib-pal"])
def test_matched_config_builds_the_matched_network_and_rhythm(ray_session, name):
    pytest.importorskip("Box2D")
    facts = built_facts(name, "matched")
    assert facts["n_params"] == MATCHED.n_params(*LUNAR) == 69_124
    assert facts["n_params_target"] == 69_124                  # the target network exists and is left out
    assert facts["hidden"] == [256, 256] and facts["activation"] == "relu"
    assert facts["updates_per_step"] == 0.25 and facts["rr_weights"] == [1, 1]
    assert facts["target_update"] == 250 and facts["target_update_env_steps"] == 1_000 and facts["tau"] == 1.0
    assert facts["loss"] == MATCHED.loss and facts["optimizer"] == "Adam" and facts["grad_clip_by"] == "global_norm"
    assert facts["epsilon"] == [[0, 1.0], [TASKS["full"].eps_decay_steps, MATCHED.eps_end]]
    assert facts["buffer"] == ("PALPrioritizedEpisodeReplayBuffer" if name == "rllib-pal"
                               else "PrioritizedEpisodeReplayBuffer")
    check_matched(name, facts, *LUNAR)
    for wrong in (OLD_RACE_PARAMS, 35_076):
        with pytest.raises(SettingsMismatch, match=f"n_params = {wrong} "):
            check_matched(name, facts | {"n_params": wrong}, *LUNAR)
    with pytest.raises(SettingsMismatch, match="updates_per_step"):
        check_matched(name, facts | {"updates_per_step": 1 / 3}, *LUNAR)       # the old race's "auto" fragment


def test_tuned_config_is_rllibs_example(ray_session):
    pytest.importorskip("Box2D")
    facts = built_facts("rllib", "tuned")
    assert facts["double_q"] and facts["dueling"] and facts["n_step"] == [2, 5]
    # encoder 8-256 (tanh), Q/advantage head 256-256-4 and value head 256-256-1
    assert facts["n_params"] == (8 * 256 + 256) + (256 * 256 + 256 + 256 * 4 + 4) + (256 * 256 + 256 + 256 + 1)
    assert facts["batch_size"] == 32 and facts["lr"] == 5e-4 and facts["buffer_capacity"] == 50_000
    assert facts["updates_per_step"] == 0.2 and facts["rollout_fragment_length"] == 5
    assert facts["target_update_env_steps"] == 500 and facts["target_update"] == 100
    assert facts["epsilon"] == [[0, 1.0], [25_000, 0.02]]     # the example's 10,000 of 200,000 steps, scaled
    with pytest.raises(SettingsMismatch):
        check_matched("rllib", facts, *LUNAR)
    with pytest.raises(ValueError, match="does not race in the tuned track"):
        make("rllib-pal", "tuned", TASKS["full"], 0)


def test_settings_do_not_import_ray():
    code = ("import sys; from pal_bench.studies.race.contestants.rllib import RLlibContestant as C; "
            "from pal_bench.studies.race.task import TASKS; "
            "[C.settings(n, t, TASKS['full']) for n, t in (('rllib', 'matched'), ('rllib-pal', 'matched'), "
            "('rllib', 'tuned'))]; assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    s = RLlibContestant.settings("rllib", "tuned", TASKS["full"])
    assert "cartpole_dqn.py" in s["example"] and s["epsilon"][1] == [25_000, 0.02]


@pytest.mark.parametrize("name,track", [("rllib", "matched"), ("rllib-pal", "matched"), ("rllib", "tuned")])
def test_smoke_run_logs_the_configured_updates_per_env_step(ray_session, name, track):
    """CartPole, 2,000 env steps: RLlib's logged updates / env steps after learning starts is the configured rate
    (matched: 0.25, updates at env steps 500, 504, ..., 2000: 376 / 1500 = 0.2507), Adam's own step count agrees,
    and the race's evaluations fall on the scheduled steps."""
    task = TASKS["smoke"]
    c = make(name, track, task, 0)
    clock = Clock(task, 0, quiet=True)
    try:
        c.build()
        facts = c.facts()
        clock.started()
        out = c.train(clock)
        adam_steps = c.optimizer_steps()
        target_updates = c.last["target_updates"]
        # the race evaluates the env runner's module: it holds the learner's latest weights
        acting = c.algo.get_module().state_dict()
        learning = c._learner(lambda lr: {k: v.clone() for k, v in lr.module["default_policy"].state_dict().items()})
        assert acting.keys() <= learning.keys() and all((acting[k] == learning[k]).all() for k in acting)
    finally:
        c.close()
    assert out["env_steps"] == task.max_steps
    assert [p["env_steps"] for p in clock.curve] == [1_000, 2_000]
    ups = out["updates"] / (out["env_steps"] - facts["learning_starts"])
    print(f"{name} ({track}): {out['updates']} updates / {out['env_steps'] - facts['learning_starts']} env steps "
          f"after learning starts = {ups:.4f} (configured {facts['updates_per_step']})")
    assert abs(ups - facts["updates_per_step"]) <= 0.02 * facts["updates_per_step"]
    assert adam_steps == out["updates"]
    if track == "matched":
        check_matched(name, facts | {"updates_per_step": ups}, *CARTPOLE, measured=True)
        # target copies when 1000 sampled env steps have passed since the last: at env steps 1000 and 2000,
        # updates 126 and 376, 250 updates apart
        assert out["updates"] == (task.max_steps - task.learning_starts) // 4 + 1 == 376
        assert target_updates == 2
