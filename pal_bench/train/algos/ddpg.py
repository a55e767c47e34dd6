"""DDPG (Lillicrap et al. 2016): deterministic actor, Q critic, Gaussian exploration noise.

    y = R^(n) + gamma^k * (1 - done) * Q_target(s', mu_target(s'))
    critic loss = mean_i w_i * (Q(s_i, a_i) - y_i)^2,      new priority_i = |Q(s_i, a_i) - y_i|
    actor loss  = -mean_i Q(s_i, mu(s_i))
Actions live in [-1, 1] (tanh) in the buffer and the networks; the actor thread rescales them to
the environment's bounds.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pal_bench.train.nets import QCritic, mlp, polyak

DEFAULT_ENV = "Pendulum-v1"
DEFAULTS = dict(lr=1e-3, critic_lr=1e-3, batch_size=256, n_step=1, updates_per_step=1.0, tau=0.005,
                exploration_noise=0.1, hidden=(256, 256), buffer_capacity=200_000)
ENV_DEFAULTS = {
    "Pendulum-v1": dict(steps=20_000, learning_starts=1_000, eval_interval=2_000),
    "LunarLander-v3": dict(env_kwargs={"continuous": True}, steps=300_000, learning_starts=10_000,
                           eval_interval=20_000, updates_per_step=0.5),
}
CONTINUOUS = True
GROUPS = {"critic": ["q"], "actor": ["pi"]}
TARGETS = ["q", "pi"]


def networks(obs_dim: int, action_space, cfg) -> nn.ModuleDict:
    act_dim = int(np.prod(action_space.shape))
    return nn.ModuleDict({"pi": mlp(obs_dim, act_dim, cfg.hidden, nn.Tanh()),
                          "q": QCritic(obs_dim, act_dim, cfg.hidden)})


def act(nets: nn.ModuleDict, obs: np.ndarray, explore: float, generator: np.random.Generator) -> np.ndarray:
    """mu(s) + N(0, explore^2), clipped to [-1, 1]: float32[B, act_dim]."""
    with torch.no_grad():
        a = nets["pi"](torch.as_tensor(obs, dtype=torch.float32)).numpy()
    if explore > 0:
        a = a + generator.normal(0.0, explore, a.shape)
    return np.clip(a, -1.0, 1.0).astype(np.float32)


def critic_target(targets, batch) -> torch.Tensor:
    with torch.no_grad():
        q_next = targets["q"](batch["next_obs"], targets["pi"](batch["next_obs"]))
        return batch["rew"] + batch["disc"] * (1.0 - batch["done"]) * q_next


def losses(nets, targets, batch, cfg, update: int):
    y = critic_target(targets, batch)
    q = nets["q"](batch["obs"], batch["act"])
    td = q - y
    critic = (batch["weights"] * td.pow(2)).mean()
    actor = -nets["q"](batch["obs"], nets["pi"](batch["obs"])).mean()
    return {"critic": critic, "actor": actor}, td.detach().abs()


def update_targets(nets, targets, cfg, step: int) -> bool:
    polyak(nets["q"], targets["q"], cfg.tau)
    polyak(nets["pi"], targets["pi"], cfg.tau)
    return True
