"""RLlib's race contestants (``pal_bench.studies.race.contestants.rllib``): what the matched and tuned configs
build, read back from RLlib's own objects, and the update rhythm RLlib's own counters log in a short run."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("gymnasium")

from fixed_batch import ACTIONS, EPISODES, OBS, episodes  # noqa: E402

from pal_bench.studies.race.clock import Clock  # noqa: E402
from pal_bench.studies.race.contestants import make  # noqa: E402
from pal_bench.studies.race.contestants.rllib import RLlibContestant  # noqa: E402
from pal_bench.studies.race.counters import RunCounters  # noqa: E402
from pal_bench.studies.race.task import MATCHED, TASKS, SettingsMismatch, check_counted, check_matched  # noqa: E402

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


def assert_acting_holds_the_learners_weights(c) -> None:
    """The race evaluates the (local) env runner's module: it holds the learner's latest weights."""
    acting = c.algo.get_module().state_dict()
    learning = c._learner(lambda lr: {k: v.clone() for k, v in lr.module["default_policy"].state_dict().items()})
    assert acting.keys() <= learning.keys() and all((acting[k] == learning[k]).all() for k in acting)


@pytest.mark.parametrize("name,track", [("rllib-pal", "matched"), ("rllib", "tuned")])
def test_smoke_run_logs_the_configured_updates_per_env_step(ray_session, name, track):
    """CartPole, 2,000 env steps on one CPU's settings (the local env runner): RLlib's logged updates / env steps
    after learning starts is the configured rate (matched: 0.25, updates at env steps 500, 504, ..., 2000: 376 /
    1500 = 0.2507), Adam's own step count agrees, and the race's evaluations fall on the scheduled steps. (``rllib``
    on the matched track: the two-CPU test below, the same checks with a remote env runner.)"""
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
        assert_acting_holds_the_learners_weights(c)
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


# ---------------------------------------------------------------- the matched loss against PAL's, on a fixed batch

# PAL's mlp (Linear 0, ReLU, Linear 2, ReLU, Linear 4) -> RLlib's matched module: the encoder's one hidden layer
# (8-256, ReLU) and the Q head's ("af") hidden and output layers (256-256, ReLU, 256-4)
PAL_TO_RLLIB = {"0": "encoder.net.mlp.0", "2": "af.net.mlp.0", "4": "af.net.mlp.2"}



def rllib_episode(obs, act, rew, next_obs, terminated, truncated, weight, n_step, spaces):
    """One n-step transition in the form RLlib's episode buffers sample it (``PrioritizedEpisodeReplayBuffer.sample``):
    a 1-step ``SingleAgentEpisode`` with observations ``[o_t, o_(t+n)]``, the discounted reward sum, the flags of
    the window's last step and ``extra_model_outputs`` ``weights`` and ``n_step``."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    ep = SingleAgentEpisode(observations=[obs, next_obs], actions=[act], rewards=[rew], terminated=terminated,
                            truncated=truncated, extra_model_outputs={"weights": [weight], "n_step": [n_step]},
                            observation_space=spaces[0], action_space=spaces[1], len_lookback_buffer=0)
    ep.to_numpy()
    return ep


def test_matched_loss_equals_pal_on_a_fixed_batch(ray_session):
    """The same 16 transitions, network weights and importance weights in RLlib (the matched contestant's learner:
    its learner connector builds the train batch from n-step episodes, its module's ``forward_train``, its
    ``DQNTorchLearner.compute_loss_for_module``) and in PAL (n-step rows from its actors' ``NStep``,
    ``dqn.losses`` with algo="ddqn"): the same rewards, discounts, loss (to 1e-6) and TD errors (the priorities
    RLlib writes back, to 1e-5). RLlib's own buffer, given the two episodes, samples the same n-step rows (reward
    sum, o_(t+3), flags, n_step 3) but never the last n - 1 = 2 transitions of an episode (it redraws them): PAL's
    shorter end-of-episode windows (4 of the 16 rows) are built by hand with their own n_step, which RLlib's loss
    takes per row (gamma ** n_step). An MSE loss or plain DQN target in RLlib's config gives another loss."""
    pytest.importorskip("Box2D")
    import gymnasium as gym
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.metrics import TD_ERROR_KEY

    from pal_bench.train.algos import dqn as pal_dqn
    from pal_bench.train.config import TrainConfig
    from pal_bench.train.workers import NStep

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    eps = episodes(rng)
    weights = rng.uniform(0.1, 1.0, 16).astype(np.float32)   # importance weights in (0, 1], as RLlib's
    cfg = TrainConfig(algo="ddqn", n_step=MATCHED.n_step, gamma=MATCHED.gamma, hidden=MATCHED.hidden)
    nets, targets = (pal_dqn.networks(OBS, gym.spaces.Discrete(ACTIONS), cfg) for _ in range(2))
    with torch.no_grad():                                    # target != online: Double DQN shows
        for p in targets.parameters():
            p.add_(0.05 * torch.randn_like(p))
    online, target = nets["q"].state_dict(), targets["q"].state_dict()

    # PAL's rows: n-step windows from NStep, in episode order (t = 0 .. len - 1), window k = min(3, len - t)
    rows, where = [], []
    for (length, _), ep in zip(EPISODES, eps):
        builder = NStep(MATCHED.n_step, MATCHED.gamma)
        for t, (o, a, r, o2, term, trunc) in enumerate(ep):
            rows += builder.push(o, a, r, o2, term, trunc)
            where.append((length, t, min(MATCHED.n_step, length - t), ep[-1][5]))
    assert len(rows) == 16
    obs, act, rew, next_obs, done, disc = zip(*rows)
    pal_batch = {"obs": torch.as_tensor(np.stack(obs)), "act": torch.as_tensor(act),
                 "next_obs": torch.as_tensor(np.stack(next_obs)), "rew": torch.as_tensor(rew, dtype=torch.float32),
                 "done": torch.as_tensor(done, dtype=torch.float32), "disc": torch.as_tensor(disc, dtype=torch.float32),
                 "weights": torch.as_tensor(weights)}

    c = make("rllib", "matched", TASKS["full"], 0)
    try:
        c.build()
        learner = c.algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        spaces = (gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32), gym.spaces.Discrete(ACTIONS))
        assert module.observation_space.shape == spaces[0].shape and module.action_space.n == ACTIONS

        # RLlib's buffer on the two episodes: the n-step rows it samples are PAL's, the last two of each episode
        # it never samples
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
        stored = []
        for ep in eps:
            e = SingleAgentEpisode(observations=[ep[0][0]] + [x[3] for x in ep], actions=[x[1] for x in ep],
                                   rewards=[x[2] for x in ep], terminated=ep[-1][4], truncated=ep[-1][5],
                                   observation_space=spaces[0], action_space=spaces[1], len_lookback_buffer=0)
            e.to_numpy()
            stored.append(e)
        buf = c.algo.local_replay_buffer
        buf.add(stored)
        drawn = buf.sample(num_items=400, n_step=MATCHED.n_step, gamma=MATCHED.gamma, beta=MATCHED.beta)
        by_obs = {np.asarray(o).tobytes(): i for i, o in enumerate(obs)}
        seen = {}
        for e in drawn:
            i = by_obs[np.asarray(e.get_observations(0)).tobytes()]
            seen[i] = (np.asarray(e.get_observations(1)), int(np.asarray(e.get_actions(0))),
                       float(np.asarray(e.get_rewards(0))), e.is_terminated, e.is_truncated,
                       int(np.asarray(e.get_extra_model_outputs("n_step", 0))))
        full = {i for i, (length, t, k, _) in enumerate(where) if k == MATCHED.n_step}
        assert set(seen) == full and len(full) == 12         # 400 draws: all 12 full windows, no end window
        for i, (o2, a, r, te, tr, n) in seen.items():
            np.testing.assert_array_equal(o2, next_obs[i])
            assert a == act[i] and abs(r - rew[i]) < 1e-9 and te == done[i] and n == MATCHED.n_step
            assert tr == (where[i][3] and where[i][1] + n == where[i][0])

        # the fixed batch: the 16 rows, through RLlib's learner connector
        rl_eps = [rllib_episode(obs[i], act[i], rew[i], next_obs[i], done[i], bool(trunc and t + k == length),
                                float(weights[i]), k, spaces)
                  for i, (length, t, k, trunc) in enumerate(where)]
        batch = learner._learner_connector(rl_module=learner.module, batch={}, episodes=rl_eps, shared_data={},
                                           metrics=learner.metrics)[DEFAULT_MODULE_ID]
        assert {Columns.OBS, Columns.NEXT_OBS, Columns.ACTIONS, Columns.REWARDS, Columns.TERMINATEDS, "weights",
                "n_step"} <= set(batch)
        torch.testing.assert_close(batch[Columns.OBS], pal_batch["obs"], atol=0, rtol=0)
        torch.testing.assert_close(batch[Columns.NEXT_OBS], pal_batch["next_obs"], atol=0, rtol=0)
        torch.testing.assert_close(batch[Columns.REWARDS], pal_batch["rew"], atol=0, rtol=0)
        torch.testing.assert_close(batch[Columns.TERMINATEDS].float(), pal_batch["done"], atol=0, rtol=0)
        torch.testing.assert_close(batch["weights"], pal_batch["weights"], atol=0, rtol=0)
        mcfg = learner.config.get_config_for_module(DEFAULT_MODULE_ID)
        assert mcfg.gamma == MATCHED.gamma and mcfg.double_q and mcfg.td_error_loss_fn == "huber"
        torch.testing.assert_close((mcfg.gamma ** batch["n_step"]).float(), pal_batch["disc"], atol=1e-7, rtol=0)

        # the same online and target weights in RLlib's module
        state = {f"{PAL_TO_RLLIB[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in online.items()}
        state |= {f"_target_{PAL_TO_RLLIB[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in target.items()}
        assert state.keys() == dict(module.named_parameters()).keys()
        module.load_state_dict(state, strict=False)
        for name, p in module.named_parameters():
            assert torch.equal(p, state[name])

        def rllib_loss(config):
            fwd = module.forward_train(batch)
            loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                                   fwd_out=fwd)
            td = learner.metrics.peek((DEFAULT_MODULE_ID, TD_ERROR_KEY))[-1]   # this call's TD errors
            return fwd, loss, torch.as_tensor(np.asarray(td, dtype=np.float32))

        fwd, loss, td = rllib_loss(mcfg)
        changed = {}
        for key, value in (("td_error_loss_fn", "mse"), ("double_q", False)):
            other = mcfg.copy(copy_frozen=False)
            setattr(other, key, value)
            changed[f"{key}={value!r}"] = rllib_loss(other)[1].item()
    finally:
        c.close()

    with torch.no_grad():
        torch.testing.assert_close(fwd["qf_preds"], nets["q"](pal_batch["obs"]), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fwd["qf_target_next_preds"], targets["q"](pal_batch["next_obs"]),
                                   atol=1e-6, rtol=1e-6)
    y = pal_dqn.td_target(nets, targets, pal_batch, double=True)
    assert not torch.allclose(pal_dqn.td_target(nets, targets, pal_batch, double=False), y, atol=1e-3)
    pal_losses, pal_td = pal_dqn.losses(nets, targets, pal_batch, cfg, update=1)
    print(f"RLlib loss {loss.item():.8f}, PAL loss {pal_losses['q'].item():.8f}, "
          f"max |TD| difference {(td - pal_td).abs().max().item():.2e}")
    assert abs(loss.item() - pal_losses["q"].item()) < 1e-6
    torch.testing.assert_close(td, pal_td, atol=1e-5, rtol=1e-5)
    unweighted = torch.nn.functional.smooth_l1_loss(
        nets["q"](pal_batch["obs"]).gather(-1, pal_batch["act"].unsqueeze(-1)).squeeze(-1), y).item()
    assert abs(unweighted - loss.item()) > 1e-3               # the importance weights matter on this batch

    for change, other_loss in changed.items():
        print(f"RLlib loss with {change}: {other_loss:.8f}")
        assert abs(other_loss - pal_losses["q"].item()) > 1e-3, change


def test_two_cpu_matched_run_uses_a_remote_env_runner_and_counts_hold(ray_session):
    """With two CPUs the matched contestant samples in one remote env runner (RLlib's own parallel sampling, the
    local runner holds no environment) at half the training intensity (RLlib's native ratio counts the local runner
    too): still one update of 128 per 4 env steps. CartPole, 2,000 env steps: the counters on RLlib's objects (Adam's
    step hook, the target network, the learner's env-step count, the buffer's priority updates, the remote runner's
    epsilon) agree with RLlib's own logs and pass ``check_counted``."""
    task = TASKS["smoke"]
    c = make("rllib", "matched", task, 0, cpus=2)
    clock = Clock(task, 0, quiet=True)
    counters = RunCounters()
    try:
        c.build()
        facts = c.facts()
        assert c.algo.config.num_env_runners == 1 and c.algo.env_runner_group.num_remote_env_runners() == 1
        assert c.settings("rllib", "matched", task, cpus=2)["num_env_runners"] == 1
        assert facts["n_envs"] == 1 and facts["updates_per_step"] == 0.25 and facts["rr_weights"] == [1, 1]
        assert facts["training_intensity"] == MATCHED.batch_size * MATCHED.updates_per_step / 2 == 16
        check_matched("rllib", facts, *CARTPOLE)
        c.attach(counters)
        clock.started()
        out = c.train(clock)
        counters.detach()
        adam_steps = c.optimizer_steps()
        # the env steps were sampled in another process: the remote runner holds the environment, the local one
        # none (it cannot sample), and the remote one's lifetime count (synced from the algorithm after each
        # train() call, its epsilon schedule's clock) is the run's
        (remote,) = c.algo.env_runner_group.foreach_env_runner(
            lambda r: (os.getpid(), r.env is not None, r.num_env_steps_sampled_lifetime), local_env_runner=False)
        assert c.algo.env_runner_group.local_env_runner.env is None
        target_updates = c.last["target_updates"]
        assert_acting_holds_the_learners_weights(c)
    finally:
        c.close()
    counted = counters.as_dict(out["env_steps"], facts["learning_starts"])
    print(f"rllib (matched, 2 CPUs): {out}, Adam steps {adam_steps}, target updates {target_updates}, "
          f"remote runner env steps {remote}, counted {counted}")
    assert out["env_steps"] == task.max_steps and [p["env_steps"] for p in clock.curve] == [1_000, 2_000]
    assert remote[0] != os.getpid() and remote[1] and remote[2] == out["env_steps"]
    assert counted["optimizer_steps"] == out["updates"] == adam_steps
    assert out["updates"] == (task.max_steps - task.learning_starts) // 4 + 1 == 376
    assert counted["batch_sizes"] == {str(MATCHED.batch_size): out["updates"]}
    assert counted["target_copies"] == target_updates == 2
    assert counted["first_update_env_step"] == task.learning_starts
    check_counted("rllib", counted, task, facts["learning_starts"])
