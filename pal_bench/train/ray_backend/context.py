"""What every Ray worker process rebuilds from the config: the algorithm module, the spaces, the
replay fields, and the thread trainer's helpers (exploration schedule, beta annealing, action
rescaling, tensor conversion, Ape-X priorities), borrowed from ``Trainer`` so that no algorithm
math is duplicated."""

from __future__ import annotations

import math
from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from pal_bench.train import rate_policy
from pal_bench.train.algos import module_for
from pal_bench.train.config import TrainConfig
from pal_bench.train.replay_spec import replay_fields
from pal_bench.train.trainer import Trainer


class WorkerContext:
    """The parts of ``Trainer`` a worker needs, without its threads, buffer or parameter server."""

    make_vector_env = Trainer.make_vector_env
    env_actions = Trainer.env_actions
    explore = Trainer.explore
    beta = Trainer.beta
    to_tensors = Trainer.to_tensors
    actor_priorities = Trainer.actor_priorities

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.algo = module_for(cfg.algo)
        probe = gym.make(cfg.env, **cfg.env_kwargs)
        self.obs_dim = int(np.prod(probe.observation_space.shape))
        self.action_space = probe.action_space
        probe.close()
        self.act_dim = 1 if not self.algo.CONTINUOUS else int(np.prod(self.action_space.shape))
        # `Trainer.beta` reads rate.max_updates
        self.rate = SimpleNamespace(max_updates=max_updates(cfg))

    def networks(self):
        return self.algo.networks(self.obs_dim, self.action_space, self.cfg)

    def fields(self) -> dict:
        """Replay fields, the same as every backend's (``replay_spec.replay_fields``)."""
        return replay_fields(self.obs_dim, self.act_dim, self.algo.CONTINUOUS)


def max_updates(cfg: TrainConfig) -> int:
    """Learner updates in the whole budget (``rate_policy.max_updates``)."""
    return rate_policy.max_updates(cfg.steps, cfg.learning_starts, cfg.updates_per_step)


def chunk_size(cfg: TrainConfig) -> int:
    """Transitions per actor chunk: ``ray_chunk`` rounded up to whole vector steps."""
    e = cfg.envs_per_actor
    return max(e, math.ceil(cfg.ray_chunk / e) * e)


def rate_slack(cfg: TrainConfig) -> int:
    """Transitions actors may run ahead of the learners: the thread trainer's slack, and at least
    two chunks per actor so that collection and insertion overlap."""
    return rate_policy.default_slack(cfg, chunk_size(cfg))


def to_numpy(tensors):
    """A state dict (or a list of tensors) as numpy arrays: Ray ships those without pickling them."""
    if isinstance(tensors, dict):
        return {k: v.detach().numpy() for k, v in tensors.items()}
    return [t.detach().numpy() for t in tensors]


def from_numpy(arrays):
    """Back to tensors, sharing the arrays' memory (read-only when they come from the object store:
    the tensors are only read, ``load_state_dict`` and the optimizers copy)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if isinstance(arrays, dict):
            return {k: torch.from_numpy(v) for k, v in arrays.items()}
        return [torch.from_numpy(v) for v in arrays]


def merge_seconds(into: dict, add: dict) -> dict:
    """Add per-phase seconds (``PhaseTimer.seconds``) of one incarnation to the total."""
    for k, v in add.items():
        into[k] = into.get(k, 0.0) + v
    return into
