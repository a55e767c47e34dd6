"""One module per algorithm (CleanRL-like), all with the same small interface used by the trainer.

Each module defines ``DEFAULT_ENV``, ``DEFAULTS`` and ``ENV_DEFAULTS`` (config fields), and:

- ``networks(obs_dim, action_space, cfg) -> nn.ModuleDict``: the online networks;
- ``GROUPS``: optimizer group -> names of the modules it trains (one optimizer per group);
- ``TARGETS``: modules that have a target copy;
- ``act(nets, obs, explore, generator) -> np.ndarray``: actions for a batch of observations;
  ``explore`` is epsilon (DQN family), a noise scale (DDPG/TD3), or True/False (SAC);
- ``losses(nets, targets, batch, cfg, update) -> (dict[group, loss], |td| per sample)``;
- ``update_targets(nets, targets, cfg, step) -> bool``: after each parameter-server step; whether it
  changed the targets (False lets the server's next snapshot share the previous one's target tensors).

A recurrent module (``RECURRENT = True``: r2d2) also defines ``initial_state(nets, batch)`` and its ``act``
takes and returns the LSTM state: ``act(nets, obs, explore, generator, state) -> (actions, state)``; its
replay items and batches are sequences (``algos/r2d2.py``).

The batch is a dict of tensors: ``obs`` [B, obs_dim], ``act`` [B] (int64) or [B, act_dim] in
[-1, 1], ``rew`` [B] (n-step discounted return), ``next_obs``, ``done`` [B] (terminated within
the n steps), ``disc`` [B] (gamma^k, k the steps actually taken), ``weights`` [B] (importance).
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES = {"dqn": "dqn", "ddqn": "dqn", "ddpg": "ddpg", "td3": "td3", "sac": "sac", "r2d2": "r2d2"}


def module_for(algo: str) -> ModuleType:
    if algo not in MODULES:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {', '.join(MODULES)}")
    return importlib.import_module(f"pal_bench.train.algos.{MODULES[algo]}")
