"""Loss and target computations of each algorithm against hand-worked small cases."""

import pytest
import torch
from torch import nn

from pal_bench.train.algos import ddpg, dqn, sac, td3
from pal_bench.train.config import TrainConfig
from pal_bench.train.workers import NStep


class Fixed(nn.Module):
    """Returns a fixed tensor whatever the input (one row per batch element)."""

    def __init__(self, value):
        super().__init__()
        self.value = torch.as_tensor(value, dtype=torch.float32)

    def forward(self, *args, **kwargs):
        return self.value


def batch(**kw):
    base = {"rew": torch.tensor([1.0, 1.0]), "disc": torch.tensor([0.9, 0.9]), "done": torch.tensor([0.0, 1.0]),
            "obs": torch.zeros(2, 3), "next_obs": torch.zeros(2, 3), "weights": torch.ones(2)}
    return base | kw


def test_nstep_returns_and_flush_on_termination():
    b = NStep(n=3, gamma=0.5)
    assert b.push("s0", 0, 1.0, "s1", False, False) == []
    assert b.push("s1", 1, 2.0, "s2", False, False) == []
    (obs, act, ret, nxt, done, disc), = b.push("s2", 2, 3.0, "s3", False, False)
    assert (obs, act, nxt, done) == ("s0", 0, "s3", False)
    assert ret == 1 + 0.5 * 2 + 0.25 * 3 and disc == 0.125
    out = b.push("s3", 3, 4.0, "s4", True, False)       # terminal: flush the window (s1, s2, s3)
    assert [(o, r, d, g) for o, _, r, _, d, g in out] == [
        ("s1", 2 + 0.5 * 3 + 0.25 * 4, True, 0.125), ("s2", 3 + 0.5 * 4, True, 0.25), ("s3", 4.0, True, 0.5)]
    assert b.push("t0", 0, 1.0, "t1", False, True)[0][4] is False   # truncation: bootstrap, not done


def test_dqn_and_double_dqn_targets():
    nets = {"q": Fixed([[4.0, 0.0], [0.0, 9.0]])}       # online Q(s', .)
    targets = {"q": Fixed([[1.0, 5.0], [3.0, 2.0]])}    # target Q(s', .)
    # DQN: max_a Q_target = [5, 3]; second row is terminal
    assert dqn.td_target(nets, targets, batch(), double=False).tolist() == pytest.approx([1 + 0.9 * 5, 1.0])
    # Double DQN: a* = argmax online = [0, 1], evaluated by the target net = [1, 2]
    assert dqn.td_target(nets, targets, batch(), double=True).tolist() == pytest.approx([1 + 0.9 * 1, 1.0])


def test_dqn_loss_weights_and_priorities():
    cfg = TrainConfig(algo="dqn")
    q = nn.Linear(3, 2)
    with torch.no_grad():
        q.weight.zero_()
        q.bias.copy_(torch.tensor([2.0, 0.5]))
    nets, targets = {"q": q}, {"q": Fixed([[1.0, 5.0], [3.0, 2.0]])}
    b = batch(act=torch.tensor([0, 1]), weights=torch.tensor([1.0, 0.0]))
    losses, td = dqn.losses(nets, targets, b, cfg, 1)
    # Q(s,a) = [2, 0.5], y = [5.5, 1] -> td = [-3.5, -0.5]; huber(3.5) = 3.0, weighted mean = 3.0 / 2
    assert td.tolist() == pytest.approx([3.5, 0.5])
    assert losses["q"].item() == pytest.approx(1.5)


def test_ddpg_critic_target_and_losses():
    targets = {"pi": Fixed([[0.5], [0.5]]), "q": Fixed([2.0, 7.0])}
    assert ddpg.critic_target(targets, batch()).tolist() == pytest.approx([1 + 0.9 * 2, 1.0])
    nets = {"pi": Fixed([[0.1], [0.2]]), "q": Fixed([4.0, 1.0])}
    losses, td = ddpg.losses(nets, targets, batch(act=torch.zeros(2, 1)), TrainConfig(algo="ddpg"), 1)
    assert td.tolist() == pytest.approx([4 - 2.8, 0.0])
    assert losses["critic"].item() == pytest.approx((1.2 ** 2) / 2)
    assert losses["actor"].item() == pytest.approx(-2.5)


def test_td3_twin_min_and_delayed_actor():
    cfg = TrainConfig(algo="td3", policy_noise=0.0, policy_delay=2)
    targets = {"pi": Fixed([[0.0], [0.0]]), "q1": Fixed([2.0, 2.0]), "q2": Fixed([1.0, 5.0])}
    assert td3.critic_target(targets, batch(), cfg).tolist() == pytest.approx([1 + 0.9 * 1, 1.0])
    nets = {"pi": Fixed([[0.0], [0.0]]), "q1": Fixed([3.0, 3.0]), "q2": Fixed([2.0, 2.0])}
    b = batch(act=torch.zeros(2, 1))
    assert set(td3.losses(nets, targets, b, cfg, 2)[0]) == {"critic", "actor"}
    assert set(td3.losses(nets, targets, b, cfg, 3)[0]) == {"critic"}


def test_sac_soft_target_with_entropy_term():
    class Policy(nn.Module):
        def forward(self, obs, deterministic=False):
            return torch.zeros(2, 1), torch.tensor([-1.0, -1.0])

    cfg = TrainConfig(algo="sac", autotune=False, sac_alpha=0.5)
    nets = {"pi": Policy(), "q1": Fixed([4.0, 4.0]), "q2": Fixed([3.0, 6.0]), "alpha": sac.LogAlpha(0.5)}
    targets = {"q1": Fixed([2.0, 2.0]), "q2": Fixed([3.0, 1.0])}
    losses, td = sac.losses(nets, targets, batch(act=torch.zeros(2, 1)), cfg, 1)
    # y = r + disc * (min(2, 3) - 0.5 * (-1)) = 1 + 0.9 * 2.5 = 3.25; second row terminal: y = 1
    assert td.tolist() == pytest.approx([4 - 3.25, 3.0])
    # actor: alpha * logp - min(Q1, Q2) = -0.5 - [3, 4] -> mean -4.0
    assert losses["actor"].item() == pytest.approx(-4.0)


def test_sac_policy_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    pi = sac.GaussianPolicy(3, 2, (8,))
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    a, logp = pi(obs)
    mu, log_std = pi.net(obs).chunk(2, dim=-1)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mu, log_std.clamp(sac.LOG_STD_MIN, sac.LOG_STD_MAX).exp()),
        [torch.distributions.TanhTransform()])
    assert torch.allclose(logp, dist.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1), atol=1e-2)
