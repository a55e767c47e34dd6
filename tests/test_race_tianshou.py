"""The race's tianshou contestant: its matched loss against PAL's on a fixed batch, its facts against the matched
settings, and short runs of both tracks that count their updates."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tianshou")
torch = pytest.importorskip("torch")
import gymnasium as gym  # noqa: E402
from fixed_batch import ACTIONS, OBS, episodes  # noqa: E402
from tianshou.algorithm import DQN  # noqa: E402
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy  # noqa: E402
from tianshou.algorithm.optim import AdamOptimizerFactory  # noqa: E402
from tianshou.data import Batch, PrioritizedVectorReplayBuffer  # noqa: E402
from tianshou.utils.net.common import Net  # noqa: E402
from tianshou.utils.torch_utils import policy_within_training_step  # noqa: E402

from pal_bench.studies.race.clock import Clock  # noqa: E402
from pal_bench.studies.race.contestants.tianshou import TUNED, TianshouContestant, weighted_huber_dqn  # noqa: E402
from pal_bench.studies.race.task import MATCHED, TASKS, Matched, SettingsMismatch, check_matched  # noqa: E402
from pal_bench.train.algos import dqn as pal_dqn  # noqa: E402
from pal_bench.train.config import TrainConfig  # noqa: E402
from pal_bench.train.workers import NStep  # noqa: E402


def tianshou_algo(cls, state: dict, target_state: dict, **kw):
    """tianshou's (matched-settings) DQN of class ``cls`` with online weights ``state``, target ``target_state``;
    its update counter past 0 so that the first update does not copy the online weights into the target."""
    net = Net(state_shape=OBS, action_shape=ACTIONS, hidden_sizes=list(MATCHED.hidden))
    net.load_state_dict(state)
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(ACTIONS))
    algo = cls(policy=policy, optim=AdamOptimizerFactory(lr=MATCHED.lr), gamma=MATCHED.gamma,
               n_step_return_horizon=MATCHED.n_step, target_update_freq=MATCHED.target_update, is_double=True, **kw)
    algo.model_old.module.load_state_dict(target_state)
    algo._iter = 1
    return algo


def tianshou_loss(algo, eps, priorities):
    """(loss, returns, weights, new priorities) of one tianshou update on all 16 transitions of ``eps`` in a
    PrioritizedVectorReplayBuffer with ``priorities``; the n-step targets by tianshou's own buffer code."""
    buf = PrioritizedVectorReplayBuffer(64, 1, alpha=MATCHED.alpha, beta=MATCHED.beta)
    for ep in eps:
        for o, a, r, o2, term, trunc in ep:
            buf.add(Batch(obs=o[None], act=[a], rew=[r], terminated=[term], truncated=[trunc], obs_next=o2[None],
                          info=[{}]), buffer_ids=[0])
    idx = np.arange(16)
    buf.update_weight(idx, priorities)
    batch = algo._preprocess_batch(buf[idx], buf, idx)      # n-step Double DQN returns, weights as tensors
    returns, weights = batch.returns.flatten().clone(), batch.weight.clone()
    with policy_within_training_step(algo.policy):
        stats = algo._update_with_batch(batch)              # the loss before the optimizer step
    return stats.loss, returns, weights, batch.weight.detach().abs()


def test_matched_loss_equals_pal_on_a_fixed_batch():
    """The same 16 transitions, network weights and importance weights in tianshou (n-step targets from its
    buffer, the matched subclass's loss) and in PAL (n-step rows from its actors' ``NStep``, ``dqn.losses`` with
    algo="ddqn"): the same targets, loss (to 1e-6) and new priorities. tianshou's own Huber option, which drops
    the weights, gives another loss on this batch."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    eps = episodes(rng)
    online = Net(state_shape=OBS, action_shape=ACTIONS, hidden_sizes=list(MATCHED.hidden)).state_dict()
    target = {k: v + 0.05 * torch.randn_like(v) for k, v in online.items()}    # target != online: Double DQN shows
    priorities = rng.uniform(0.05, 5.0, 16)

    algo = tianshou_algo(weighted_huber_dqn(), online, target, max_grad_norm=MATCHED.grad_clip)
    loss, returns, weights, new_prio = tianshou_loss(algo, eps, priorities)
    assert weights.std() > 0.1                              # the importance weights matter on this batch

    cfg = TrainConfig(algo="ddqn", n_step=MATCHED.n_step, gamma=MATCHED.gamma, hidden=MATCHED.hidden)
    nets, targets = (pal_dqn.networks(OBS, gym.spaces.Discrete(ACTIONS), cfg) for _ in range(2))
    strip = len("model.model.")
    nets["q"].load_state_dict({k[strip:]: v for k, v in online.items()})
    targets["q"].load_state_dict({k[strip:]: v for k, v in target.items()})
    rows = []
    for ep in eps:
        builder = NStep(MATCHED.n_step, MATCHED.gamma)
        for o, a, r, o2, term, trunc in ep:
            rows += builder.push(o, a, r, o2, term, trunc)
    assert len(rows) == 16
    obs, act, rew, next_obs, done, disc = zip(*rows)
    batch = {"obs": torch.as_tensor(np.stack(obs)), "act": torch.as_tensor(act), "next_obs": torch.as_tensor(
             np.stack(next_obs)), "rew": torch.as_tensor(rew, dtype=torch.float32),
             "done": torch.as_tensor(done, dtype=torch.float32), "disc": torch.as_tensor(disc, dtype=torch.float32),
             "weights": weights.float()}

    y = pal_dqn.td_target(nets, targets, batch, double=True)
    torch.testing.assert_close(returns, y, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(pal_dqn.td_target(nets, targets, batch, double=False), y, atol=1e-3)
    pal_losses, pal_td = pal_dqn.losses(nets, targets, batch, cfg, update=1)
    assert abs(loss - pal_losses["q"].item()) < 1e-6
    torch.testing.assert_close(new_prio, pal_td, atol=1e-5, rtol=1e-5)

    plain = tianshou_algo(DQN, online, target, huber_loss_delta=1.0)   # tianshou's Huber: the weights dropped
    plain_loss, _, _, _ = tianshou_loss(plain, eps, priorities)
    assert abs(plain_loss - pal_losses["q"].item()) > 1e-3


def built(track: str, task=TASKS["full"]) -> TianshouContestant:
    c = TianshouContestant("tianshou", track, task, seed=0)
    c.build()
    return c


def test_matched_facts_on_lunarlander_pass_and_a_fake_fact_is_refused():
    c = built("matched")
    try:
        facts = c.facts()
    finally:
        c.close()
    assert facts["n_params"] == MATCHED.n_params(OBS, ACTIONS) == 69_124
    assert facts["hidden"] == [256, 256] and facts["grad_clip"] == 10.0 and facts["algorithm"] == "WeightedHuberDQN"
    check_matched("tianshou", facts, OBS, ACTIONS)
    small = Matched(hidden=(128, 128))
    with pytest.raises(SettingsMismatch, match="n_params"):
        check_matched("tianshou", facts | {"hidden": [128, 128], "n_params": small.n_params(OBS, ACTIONS)},
                      OBS, ACTIONS)
    with pytest.raises(SettingsMismatch, match="updates_per_step"):
        check_matched("tianshou", facts | {"updates_per_step": 0.0625}, OBS, ACTIONS)


def test_tuned_facts_are_the_examples():
    c = built("tuned")
    try:
        facts = c.facts()
    finally:
        c.close()
    assert facts["n_envs"] == TUNED["num_training_envs"] and facts["lr"] == TUNED["lr"]
    assert facts["n_step"] == 4 and facts["target_update"] == 500 and facts["dueling"] and facts["double_q"]
    assert facts["hidden"] == facts["dueling_q_hidden"] == facts["dueling_v_hidden"] == [128, 128]
    assert facts["buffer"] == "VectorReplayBuffer" and facts["buffer_capacity"] == 100_000
    assert facts["grad_clip"] == 0 and facts["updates_per_step"] == 0.0625
    with pytest.raises(SettingsMismatch):
        check_matched("tianshou", facts, OBS, ACTIONS)


def smoke(track: str, task) -> tuple[dict, TianshouContestant, Clock]:
    clock = Clock(task, seed=0, quiet=True)
    c = TianshouContestant("tianshou", track, task, seed=0)
    c.build()
    clock.started()
    try:
        out = c.train(clock)
    finally:
        c.close()
    return out, c, clock


def test_matched_smoke_does_a_quarter_update_per_step():
    task = TASKS["smoke"]
    out, c, clock = smoke("matched", task)
    assert out["env_steps"] >= task.max_steps and len(clock.curve) >= 1
    assert out["updates"] == c.algo._iter                  # tianshou's own update counter
    assert out["env_steps"] == c.collector.collect_step     # and its collector's
    ratio = out["updates"] / (out["env_steps"] - task.learning_starts)
    assert abs(ratio - MATCHED.updates_per_step) <= 0.02 * MATCHED.updates_per_step


def test_tuned_smoke_runs_and_counts():
    """The example collects 2048 steps before its first update: the smoke budget is raised past that."""
    task = dataclasses.replace(TASKS["smoke"], max_steps=3_000)
    out, c, clock = smoke("tuned", task)
    warmup = TUNED["batch_size"] * TUNED["num_training_envs"]
    assert out["env_steps"] >= task.max_steps and len(clock.curve) >= 1
    assert out["updates"] == c.algo._iter == (out["env_steps"] - warmup) // TUNED["collection_step_num_env_steps"]
