"""SAC (Haarnoja et al. 2018) with twin critics and a learned entropy coefficient.

    a ~ pi(.|s) = tanh(N(mu(s), sigma(s)^2)),  log pi(a|s) with the tanh correction
    y = R^(n) + gamma^k * (1 - done) * [min(Q1_t(s', a'), Q2_t(s', a')) - alpha * log pi(a'|s')],  a' ~ pi(.|s')
    critic loss = mean_i w_i * [(Q1 - y)^2 + (Q2 - y)^2],          new priority_i = |Q1(s_i, a_i) - y_i|
    actor loss  = mean_i [alpha * log pi(a_i|s_i) - min(Q1, Q2)(s_i, a_i)],  a_i ~ pi(.|s_i)
    alpha loss  = -mean_i log_alpha * (log pi(a_i|s_i) + target_entropy),  target_entropy = -act_dim
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from pal_bench.train.nets import QCritic, mlp, polyak

DEFAULT_ENV = "Pendulum-v1"
DEFAULTS = dict(lr=3e-4, critic_lr=1e-3, batch_size=256, n_step=1, updates_per_step=1.0, tau=0.005,
                sac_alpha=0.2, autotune=True, hidden=(256, 256), buffer_capacity=200_000)
ENV_DEFAULTS = {
    "Pendulum-v1": dict(steps=20_000, learning_starts=1_000, eval_interval=2_000),
    "LunarLander-v3": dict(env_kwargs={"continuous": True}, steps=300_000, learning_starts=10_000,
                           eval_interval=20_000, updates_per_step=0.5),
}
CONTINUOUS = True
GROUPS = {"critic": ["q1", "q2"], "actor": ["pi"], "alpha": ["alpha"]}
TARGETS = ["q1", "q2"]
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim, hidden)

    def forward(self, obs: torch.Tensor, deterministic: bool = False):
        """(action in [-1, 1] [B, act_dim], log pi(action|obs) [B])."""
        mu, log_std = self.net(obs).chunk(2, dim=-1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        u = mu if deterministic else mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        log_prob = (-0.5 * ((u - mu) / std).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - torch.log(1 - a.pow(2) + 1e-6).sum(-1)
        return a, log_prob


class LogAlpha(nn.Module):
    def __init__(self, init: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init)))


def networks(obs_dim: int, action_space, cfg) -> nn.ModuleDict:
    act_dim = int(np.prod(action_space.shape))
    return nn.ModuleDict({"pi": GaussianPolicy(obs_dim, act_dim, cfg.hidden),
                          "q1": QCritic(obs_dim, act_dim, cfg.hidden), "q2": QCritic(obs_dim, act_dim, cfg.hidden),
                          "alpha": LogAlpha(cfg.sac_alpha)})


def act(nets: nn.ModuleDict, obs: np.ndarray, explore: float, generator: np.random.Generator) -> np.ndarray:
    """A sample of the policy (``explore`` true) or its mean action: float32[B, act_dim]."""
    with torch.no_grad():
        a, _ = nets["pi"](torch.as_tensor(obs, dtype=torch.float32), deterministic=not explore)
    return a.numpy().astype(np.float32)


def losses(nets, targets, batch, cfg, update: int):
    alpha = nets["alpha"].log_alpha.exp().detach() if cfg.autotune else torch.tensor(cfg.sac_alpha)
    with torch.no_grad():
        a_next, logp_next = nets["pi"](batch["next_obs"])
        q_next = torch.min(targets["q1"](batch["next_obs"], a_next), targets["q2"](batch["next_obs"], a_next))
        y = batch["rew"] + batch["disc"] * (1.0 - batch["done"]) * (q_next - alpha * logp_next)
    q1 = nets["q1"](batch["obs"], batch["act"])
    q2 = nets["q2"](batch["obs"], batch["act"])
    w = batch["weights"]
    out = {"critic": (w * ((q1 - y).pow(2) + (q2 - y).pow(2))).mean()}
    a, logp = nets["pi"](batch["obs"])
    q_pi = torch.min(nets["q1"](batch["obs"], a), nets["q2"](batch["obs"], a))
    out["actor"] = (alpha * logp - q_pi).mean()
    if cfg.autotune:
        target_entropy = -float(batch["act"].shape[-1])
        out["alpha"] = -(nets["alpha"].log_alpha * (logp.detach() + target_entropy)).mean()
    return out, (q1 - y).detach().abs()


def update_targets(nets, targets, cfg, step: int) -> bool:
    for name in TARGETS:
        polyak(nets[name], targets[name], cfg.tau)
    return True
