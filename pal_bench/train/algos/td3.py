"""TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor updates.

    a' = clip(mu_target(s') + clip(N(0, policy_noise^2), -noise_clip, noise_clip), -1, 1)
    y  = R^(n) + gamma^k * (1 - done) * min(Q1_target(s', a'), Q2_target(s', a'))
    critic loss = mean_i w_i * [(Q1(s_i, a_i) - y_i)^2 + (Q2(s_i, a_i) - y_i)^2],
    new priority_i = |Q1(s_i, a_i) - y_i|
    actor loss (every policy_delay-th update) = -mean_i Q1(s_i, mu(s_i))
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pal_bench.train.algos.ddpg import act  # noqa: F401  (same exploration: mu(s) + Gaussian noise)
from pal_bench.train.nets import QCritic, mlp, polyak

DEFAULT_ENV = "Pendulum-v1"
DEFAULTS = dict(lr=1e-3, critic_lr=1e-3, batch_size=256, n_step=1, updates_per_step=1.0, tau=0.005,
                exploration_noise=0.1, policy_noise=0.2, noise_clip=0.5, policy_delay=2, hidden=(256, 256),
                buffer_capacity=200_000)
ENV_DEFAULTS = {
    "Pendulum-v1": dict(steps=20_000, learning_starts=1_000, eval_interval=2_000),
    "LunarLander-v3": dict(env_kwargs={"continuous": True}, steps=300_000, learning_starts=10_000,
                           eval_interval=20_000, updates_per_step=0.5),
}
CONTINUOUS = True
GROUPS = {"critic": ["q1", "q2"], "actor": ["pi"]}
TARGETS = ["q1", "q2", "pi"]


def networks(obs_dim: int, action_space, cfg) -> nn.ModuleDict:
    act_dim = int(np.prod(action_space.shape))
    return nn.ModuleDict({"pi": mlp(obs_dim, act_dim, cfg.hidden, nn.Tanh()),
                          "q1": QCritic(obs_dim, act_dim, cfg.hidden), "q2": QCritic(obs_dim, act_dim, cfg.hidden)})


def critic_target(targets, batch, cfg) -> torch.Tensor:
    with torch.no_grad():
        a_next = targets["pi"](batch["next_obs"])
        noise = (torch.randn_like(a_next) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
        a_next = (a_next + noise).clamp(-1.0, 1.0)
        q_next = torch.min(targets["q1"](batch["next_obs"], a_next), targets["q2"](batch["next_obs"], a_next))
        return batch["rew"] + batch["disc"] * (1.0 - batch["done"]) * q_next


def losses(nets, targets, batch, cfg, update: int):
    y = critic_target(targets, batch, cfg)
    q1 = nets["q1"](batch["obs"], batch["act"])
    q2 = nets["q2"](batch["obs"], batch["act"])
    w = batch["weights"]
    out = {"critic": (w * ((q1 - y).pow(2) + (q2 - y).pow(2))).mean()}
    if update % cfg.policy_delay == 0:
        out["actor"] = -nets["q1"](batch["obs"], nets["pi"](batch["obs"])).mean()
    return out, (q1 - y).detach().abs()


def update_targets(nets, targets, cfg, step: int) -> bool:
    for name in TARGETS:
        polyak(nets[name], targets[name], cfg.tau)
    return True
