"""Small MLPs shared by the algorithms."""

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
