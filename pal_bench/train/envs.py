"""Environments the package registers with gymnasium (on import of ``pal_bench.train``).

``pal_bench/CartPoleNoVel-v0``: CartPole-v1 with the velocities hidden, a partially observable task where a
policy must remember (R2D2's LSTM) what a feed-forward one cannot see. Observation float32[2] = (cart
position, pole angle); actions, rewards, termination and the 500-step limit are CartPole-v1's.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

NO_VEL_ID = "pal_bench/CartPoleNoVel-v0"
KEEP = [0, 2]           # of CartPole's (x, x_dot, theta, theta_dot)


class HideVelocities(gym.ObservationWrapper):
    """Keeps CartPole's position and angle, drops both velocities: [4] -> float32[2]."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[KEEP], space.high[KEEP], dtype=np.float32)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs, dtype=np.float32)[KEEP]


def cartpole_no_vel(**kwargs) -> gym.Env:
    return HideVelocities(CartPoleEnv(**kwargs))


def register() -> None:
    """Register the package's environments (idempotent)."""
    if NO_VEL_ID not in gym.registry:
        gym.register(NO_VEL_ID, entry_point="pal_bench.train.envs:cartpole_no_vel", max_episode_steps=500,
                     reward_threshold=475.0)
