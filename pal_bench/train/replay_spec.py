"""The replay buffer every backend builds, written once: its fields and its construction from the config."""

from __future__ import annotations

import numpy as np

from pal_bench import PrioritizedReplayBuffer, ReplayBuffer
from pal_bench.sequence_replay import record_fields


def replay_fields(obs_shape, act_dim: int, continuous: bool, obs_dtype=np.float32) -> dict:
    """``{name: (shape, dtype)}`` of one n-step transition: obs (``obs_shape``: an int for a flat float32 vector, or
    the observation's shape with ``obs_dtype``, e.g. uint8[4, 84, 84] Atari stacks), act (int64, or
    float32[act_dim] when continuous), rew (the n-step return), next_obs, done, disc (gamma^steps)."""
    obs = ((obs_shape,) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape), np.dtype(obs_dtype))
    act = ((act_dim,), np.float32) if continuous else ((), np.int64)
    return {"obs": obs, "act": act, "rew": ((), np.float32), "next_obs": obs, "done": ((), np.float32),
            "disc": ((), np.float32)}


def sequence_fields(obs_dim: int, cfg) -> dict:
    """R2D2's replay record: one sequence of ``cfg.seq_len`` steps (obs float32[obs_dim], act int64, rew float32,
    done bool per step; the masks; the LSTM state at its start), ``sequence_replay.record_fields``."""
    steps = {"obs": ((obs_dim,), np.float32), "act": ((), np.int64), "rew": ((), np.float32), "done": ((), np.bool_)}
    return record_fields(steps, cfg.seq_len, cfg.lstm_size)


def buffer_class(cfg) -> type:
    return PrioritizedReplayBuffer if cfg.prioritized else ReplayBuffer


def make_buffer(cfg, fields: dict, **kwargs):
    """The buffer ``cfg`` asks for (prioritized with ``cfg.alpha``, or uniform), capacity
    ``cfg.buffer_capacity``, seeded with ``cfg.seed``; ``kwargs`` (e.g. ``shared=True, name=...``) pass through."""
    if cfg.prioritized:
        return PrioritizedReplayBuffer(cfg.buffer_capacity, fields, alpha=cfg.alpha, seed=cfg.seed, **kwargs)
    return ReplayBuffer(cfg.buffer_capacity, fields, seed=cfg.seed, **kwargs)
