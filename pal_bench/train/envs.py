"""Environments the package registers with gymnasium (on import of ``pal_bench.train``), and how the trainer makes
every environment (``make_env``, ``make_vec``).

``pal_bench/CartPoleNoVel-v0``: CartPole-v1 with the velocities hidden, a partially observable task where a
policy must remember (R2D2's LSTM) what a feed-forward one cannot see. Observation float32[2] = (cart
position, pole angle); actions, rewards, termination and the 500-step limit are CartPole-v1's.

Atari (``ALE/<Game>-v5``, ale-py with its bundled ROMs): made with ``frameskip=1`` and wrapped as the DQN papers
do, with gymnasium's own wrappers: ``AtariPreprocessing`` (frame skip 4 with max-pooling of the last two frames,
84x84 grayscale, up to 30 no-ops at reset) and ``FrameStackObservation`` (4 frames, the reset frame repeated at
an episode's start). Observations are uint8[4, 84, 84]; sticky actions stay v5's (0.25).
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


ATARI_PREFIX = "ALE/"
ATARI_STACK = 4


def is_atari(env_id: str) -> bool:
    return env_id.startswith(ATARI_PREFIX)


def _atari_wrappers() -> list:
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    return [lambda e: AtariPreprocessing(e, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30),
            lambda e: FrameStackObservation(e, ATARI_STACK)]


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError:
        raise gym.error.DependencyNotInstalled("Atari environments need ale-py and opencv: pip install -e "
                                               "'.[train]'") from None
    gym.register_envs(ale_py)


def make_env(env_id: str, **kwargs) -> gym.Env:
    """One environment as the trainer steps it (Atari: preprocessed and frame-stacked)."""
    if not is_atari(env_id):
        return gym.make(env_id, **kwargs)
    _register_ale()
    env = gym.make(env_id, **{"frameskip": 1, **kwargs})
    for wrap in _atari_wrappers():
        env = wrap(env)
    return env


def make_vec(env_id: str, num_envs: int, mode: str, vector_kwargs: dict, **kwargs):
    """``num_envs`` copies of ``make_env(env_id, **kwargs)`` as a gymnasium vector env (``mode`` sync or async)."""
    if not is_atari(env_id):
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                            **kwargs)
    _register_ale()
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                        wrappers=_atari_wrappers(), **{"frameskip": 1, **kwargs})


def register() -> None:
    """Register the package's environments (idempotent)."""
    if NO_VEL_ID not in gym.registry:
        gym.register(NO_VEL_ID, entry_point="pal_bench.train.envs:cartpole_no_vel", max_episode_steps=500,
                     reward_threshold=475.0)
