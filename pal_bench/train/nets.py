"""The networks the algorithms share: small MLPs, and the Nature-DQN convolutional Q-network for Atari stacks."""

from __future__ import annotations

import torch
from torch import nn


def mlp(n_in: int, n_out: int, hidden: tuple = (256, 256), out_act: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), nn.ReLU()]
        n_in = h
    layers.append(nn.Linear(n_in, n_out))
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


class DuelingQ(nn.Module):
    """Dueling Q-network (Wang et al. 2016): a shared trunk, then a value stream V(s) and an advantage stream
    A(s, a), combined with the advantages' mean subtracted so that V and A are identifiable:

        Q(s, a) = V(s) + A(s, a) - (1 / |A|) * sum_a' A(s, a')

    [B, obs] -> [B, n_actions]. The trunk is ``hidden[:-1]``; each stream has one hidden layer of ``hidden[-1]``.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple):
        super().__init__()
        *trunk, width = hidden
        self.trunk = mlp(obs_dim, trunk[-1], tuple(trunk[:-1])) if trunk else nn.Identity()
        feat = trunk[-1] if trunk else obs_dim
        self.trunk_act = nn.ReLU() if trunk else nn.Identity()
        self.value = mlp(feat, 1, (width,))
        self.advantage = mlp(feat, n_actions, (width,))
        self.out_features = n_actions

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk_act(self.trunk(obs))
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=-1, keepdim=True)


class NatureQ(nn.Module):
    """The Nature-DQN network (Mnih et al. 2015) for uint8 frame stacks [B, C, 84, 84]: scaled to [0, 1], three
    convolutions (32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, ReLU), a 512-unit layer, then Q-values
    [B, n_actions]; ``dueling`` splits the last layer into value and advantage streams of 512 units each, combined
    as in ``DuelingQ``."""

    def __init__(self, obs_shape: tuple, n_actions: int, dueling: bool = False):
        super().__init__()
        c, h, w = obs_shape
        self.conv = nn.Sequential(nn.Conv2d(c, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.dueling = dueling
        if dueling:
            self.value = mlp(flat, 1, (512,))
            self.advantage = mlp(flat, n_actions, (512,))
        else:
            self.head = mlp(flat, n_actions, (512,))
        self.out_features = n_actions

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.conv(obs.float() / 255.0)
        if not self.dueling:
            return self.head(h)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=-1, keepdim=True)


class QCritic(nn.Module):
    """Q(s, a) for continuous actions: [B, obs] x [B, act] -> [B]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple):
        super().__init__()
        self.net = mlp(obs_dim + act_dim, 1, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, act], dim=-1)).squeeze(-1)


def polyak(online: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online."""
    with torch.no_grad():
        for p, tp in zip(online.parameters(), target.parameters()):
            tp.mul_(1 - tau).add_(p, alpha=tau)
