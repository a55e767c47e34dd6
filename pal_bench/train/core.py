"""What every backend and every worker process shares, written once and free of threads, processes and Ray:
the run's algorithm module and spaces (rebuilt from the config), and the helpers of the algorithm step
(exploration schedule, beta annealing, action rescaling, tensor conversion, Ape-X initial priorities,
greedy evaluation episodes).

``Trainer`` (every backend's driver) is a ``RunCore``; a worker that runs elsewhere (an actor process, a
Ray actor, a long-haul node) builds its own ``RunCore(cfg)`` and calls the same methods.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from pal_bench.train import rate_policy
from pal_bench.train.algos import module_for
from pal_bench.train.config import Q_ALGOS, TrainConfig
from pal_bench.train.envs import make_env, make_vec
from pal_bench.train.errors import Diverged
from pal_bench.train.replay_spec import replay_fields, sequence_fields


class RunCore:
    """The algorithm, spaces and step helpers of one run's config (no workers, buffer or parameter server)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.algo = module_for(cfg.algo)
        probe = make_env(cfg.env, **cfg.env_kwargs)
        self.obs_shape = tuple(probe.observation_space.shape)
        self.obs_dtype = np.dtype(probe.observation_space.dtype)
        self.obs_dim = int(np.prod(self.obs_shape))
        # what the networks take: a flat size for vector observations, the shape for image stacks [C, H, W]
        self.net_input = self.obs_shape if len(self.obs_shape) == 3 else self.obs_dim
        self.action_space = probe.action_space
        probe.close()
        self.act_dim = 1 if not self.algo.CONTINUOUS else int(np.prod(self.action_space.shape))
        self.recurrent = getattr(self.algo, "RECURRENT", False)
        self.max_updates = rate_policy.max_updates(cfg.steps, cfg.learning_starts, cfg.updates_per_step)

    def networks(self):
        """A fresh set of the algorithm's networks for this run's spaces."""
        return self.algo.networks(self.net_input, self.action_space, self.cfg)

    def fields(self) -> dict:
        """Replay fields, the same for every backend: n-step transitions (``replay_spec.replay_fields``) or, for a
        recurrent algorithm, sequences (``replay_spec.sequence_fields``)."""
        if self.recurrent:
            return sequence_fields(self.obs_dim, self.cfg)
        return replay_fields(self.obs_shape, self.act_dim, self.algo.CONTINUOUS, self.obs_dtype)

    def make_vector_env(self, actor_id: int):
        """``envs_per_actor`` copies of the environment (gymnasium vector env, same-step autoreset)."""
        kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        mode = "async" if self.cfg.env_backend == "async" else "sync"
        return make_vec(self.cfg.env, self.cfg.envs_per_actor, mode, kwargs, **self.cfg.env_kwargs)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] (continuous) rescaled to the environment's bounds."""
        if not self.algo.CONTINUOUS:
            return actions
        low, high = self.action_space.low, self.action_space.high
        return low + (actions + 1.0) * 0.5 * (high - low)

    def explore(self, t: int, actor: int = 0):
        """The exploration setting of actor ``actor`` at env step ``t``: epsilon (DQN family: linear decay over
        ``eps_fraction * steps``, or Ape-X's fixed ``actor_epsilon``), True (SAC samples its policy) or the
        Gaussian noise scale (DDPG, TD3)."""
        cfg = self.cfg
        if cfg.algo in Q_ALGOS and cfg.exploration == "apex":
            return self.actor_epsilon(actor)
        if cfg.algo in Q_ALGOS:
            frac = min(1.0, t / max(1.0, cfg.eps_fraction * cfg.steps))
            return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)
        if cfg.algo == "sac":
            return True
        return cfg.exploration_noise

    def actor_epsilon(self, actor: int) -> float:
        """Ape-X (Horgan et al. 2018): actor i of N acts at epsilon_i = apex_eps^(1 + apex_alpha * i / (N - 1)),
        fixed for the run (N = 1: apex_eps)."""
        n = self.cfg.actors
        frac = actor / (n - 1) if n > 1 else 0.0
        return self.cfg.apex_eps ** (1.0 + self.cfg.apex_alpha * frac)

    def beta(self, update: int) -> float:
        """Importance-sampling exponent for update number ``update``: linear from beta to beta_final."""
        frac = min(1.0, update / max(1, self.max_updates))
        return self.cfg.beta + frac * (self.cfg.beta_final - self.cfg.beta)

    def to_tensors(self, sample: dict) -> dict:
        """A buffer sample as tensors for ``algo.losses`` (indices dropped, weights as float32)."""
        return {k: torch.as_tensor(v) for k, v in sample.items() if k != "indices"} | {
            "weights": torch.as_tensor(sample["weights"], dtype=torch.float32)}

    def make_stepper(self, envs, seeds: list[int], actor: int = 0):
        """The actor's environment stepper: n-step transitions, or sequences for a recurrent algorithm."""
        from pal_bench.train.workers import EnvStepper, SequenceStepper

        return (SequenceStepper if self.recurrent else EnvStepper)(envs, seeds, self.cfg, self.algo, self, actor)

    def actor_priorities(self, nets, targets, batch: dict) -> np.ndarray:
        """Ape-X: initial priorities |TD| computed by the actor with its own copy of the weights."""
        b = {k: torch.as_tensor(v) for k, v in batch.items()}
        b["done"] = b["done"].float()
        b["rew"] = b["rew"].float()
        b["disc"] = b["disc"].float()
        b["weights"] = torch.ones(len(batch["rew"]))
        with torch.no_grad():
            _, td = self.algo.losses(nets, targets, b, self.cfg, 1)
        if not bool(torch.isfinite(td).all()):
            raise Diverged("training diverged: non-finite actor-side priorities (|TD| of the q loss) at the actor's "
                           "insert (look for NaN/inf rewards or observations, or lower lr)")
        return td.numpy().astype(np.float64)

    def greedy_returns(self, online_state: dict) -> list[float]:
        """Returns of ``eval_episodes`` greedy episodes with the online weights ``online_state``; the
        episode seeds depend only on the run's seed, so every backend evaluates on the same episodes."""
        cfg = self.cfg
        nets = self.networks()
        nets.load_state_dict(online_state)
        env = make_env(cfg.env, **cfg.env_kwargs)
        rng = np.random.default_rng(0)
        explore = False if cfg.algo == "sac" else 0.0
        returns = []
        try:
            for k in range(cfg.eval_episodes):
                obs, _ = env.reset(seed=10_000 + cfg.seed * 1000 + k)
                done, total = False, 0.0
                state = self.algo.initial_state(nets, 1) if self.recurrent else None
                while not done:
                    if self.recurrent:
                        a, state = self.algo.act(nets, obs[None].astype(np.float32), explore, rng, state)
                        a = a[0]
                    else:
                        a = self.algo.act(nets, obs[None].astype(np.float32), explore, rng)[0]
                    obs, r, term, trunc, _ = env.step(self.env_actions(a))
                    total += float(r)
                    done = term or trunc
                returns.append(total)
        finally:
            env.close()
        return returns
