"""DQN (Mnih et al. 2015) and Double DQN (van Hasselt et al. 2016) with n-step returns (Ape-X), optionally
with a dueling head (Wang et al. 2016, ``dueling = true``): Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a').

    y = R^(n) + gamma^k * (1 - done) * Q_target(s', a*)
        a* = argmax_a Q_target(s', a)   (DQN)
        a* = argmax_a Q_online(s', a)   (Double DQN: select online, evaluate target)
    loss = mean_i w_i * huber(Q(s_i, a_i) - y_i),   new priority_i = |Q(s_i, a_i) - y_i|
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pal_bench.train.nets import DuelingQ, NatureQ, mlp

DEFAULT_ENV = "CartPole-v1"
DEFAULTS = dict(lr=1e-3, batch_size=128, n_step=3, target_update=250, updates_per_step=0.25, hidden=(256, 256))
ENV_DEFAULTS = {
    "CartPole-v1": dict(steps=50_000, learning_starts=1_000, eps_fraction=0.2, hidden=(128, 128), lr=1e-3,
                        target_update=200, eval_interval=5_000),
    # the partially observable CartPole (velocities hidden; pal_bench.train.envs): CartPole-v1's settings, R2D2's
    # budget, for the R2D2-vs-DDQN reference runs
    "pal_bench/CartPoleNoVel-v0": dict(steps=30_000, learning_starts=1_000, eps_fraction=0.2, hidden=(128, 128),
                                       lr=1e-3, target_update=200, eval_interval=5_000),
    "LunarLander-v3": dict(steps=300_000, learning_starts=10_000, buffer_capacity=200_000, eps_fraction=0.15,
                           lr=5e-4, target_update=250, eval_interval=20_000),
}
CONTINUOUS = False
GROUPS = {"q": ["q"]}
TARGETS = ["q"]


def networks(obs_dim, action_space, cfg) -> nn.ModuleDict:
    """``obs_dim``: the flat observation size (MLP), or an image stack's shape (C, H, W): the Nature-DQN network."""
    n = int(action_space.n)
    if isinstance(obs_dim, tuple):
        return nn.ModuleDict({"q": NatureQ(obs_dim, n, cfg.dueling)})
    return nn.ModuleDict({"q": DuelingQ(obs_dim, n, cfg.hidden) if cfg.dueling else mlp(obs_dim, n, cfg.hidden)})


def act(nets: nn.ModuleDict, obs: np.ndarray, explore: float, generator: np.random.Generator) -> np.ndarray:
    """Epsilon-greedy actions (int64[B]) for observations [B, obs_dim]."""
    with torch.no_grad():
        q = nets["q"](torch.as_tensor(obs, dtype=torch.float32))
    return epsilon_greedy(q, explore, generator)


def epsilon_greedy(q: torch.Tensor, explore: float, generator: np.random.Generator) -> np.ndarray:
    """int64[B] actions from Q-values [B, n_actions]: argmax, or with probability ``explore`` a uniform one."""
    greedy = q.argmax(-1).numpy()
    if explore > 0:
        rand = generator.random(len(q)) < explore
        greedy = np.where(rand, generator.integers(0, q.shape[-1], len(q)), greedy)
    return greedy.astype(np.int64)


def td_target(nets, targets, batch, double: bool) -> torch.Tensor:
    with torch.no_grad():
        q_next = targets["q"](batch["next_obs"])
        if double:
            a_star = nets["q"](batch["next_obs"]).argmax(-1, keepdim=True)
        else:
            a_star = q_next.argmax(-1, keepdim=True)
        bootstrap = q_next.gather(-1, a_star).squeeze(-1)
        return batch["rew"] + batch["disc"] * (1.0 - batch["done"]) * bootstrap


def losses(nets, targets, batch, cfg, update: int):
    y = td_target(nets, targets, batch, double=cfg.algo == "ddqn")
    q = nets["q"](batch["obs"]).gather(-1, batch["act"].long().unsqueeze(-1)).squeeze(-1)
    td = q - y
    loss = (batch["weights"] * F.smooth_l1_loss(q, y, reduction="none")).mean()
    return {"q": loss}, td.detach().abs()


def update_targets(nets, targets, cfg, step: int) -> bool:
    """Hard copy every ``target_update`` steps; True when it copied."""
    if step % cfg.target_update == 0:
        targets.load_state_dict(nets.state_dict())
        return True
    return False
