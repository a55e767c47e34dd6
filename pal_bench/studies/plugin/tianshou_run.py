"""tianshou 2.0.1 DQN driven step by step, for the plug-in benchmark (the race's tianshou contestant is
pal_bench/studies/race/contestants/tianshou.py).

tianshou's own ``OffPolicyTrainer`` runs epochs of a fixed size; the plug-in benchmark needs timed
iterations, so this module builds the same objects (``DiscreteQLearningPolicy``, ``DQN``, ``Collector``) and
drives them with tianshou's own calls: ``Collector.collect(n_step=...)`` with the policy in
its training step (epsilon-greedy), then ``DQN.update(buffer, sample_size)`` per gradient step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DQNRun:
    algo: object
    policy: object
    buffer: object
    collector: object

    def act(self, obs: np.ndarray) -> int:
        """Greedy action for one observation."""
        import torch

        with torch.no_grad():
            q, _ = self.policy.model(torch.as_tensor(obs[None], dtype=torch.float32))
        return int(q.argmax(-1)[0])

    def collect(self, n_steps: int, eps: float) -> None:
        from tianshou.utils.torch_utils import policy_within_training_step, torch_train_mode

        self.policy.set_eps_training(eps)
        with policy_within_training_step(self.policy), torch_train_mode(self.policy, False):
            self.collector.collect(n_step=n_steps)

    def learn(self, updates: int, batch_size: int) -> None:
        from tianshou.utils.torch_utils import policy_within_training_step, torch_train_mode

        with policy_within_training_step(self.policy), torch_train_mode(self.policy):
            for _ in range(updates):
                self.algo.update(buffer=self.buffer, sample_size=batch_size)


def build(env_id: str, *, hidden, lr: float, gamma: float, n_step: int, target_update: int, capacity: int,
          alpha: float, beta: float, seed: int, buffer: str = "default") -> DQNRun:
    """DQN with a prioritized buffer: ``buffer`` "default" (tianshou's PrioritizedVectorReplayBuffer)
    or "pal" (``PALPrioritizedVectorReplayBuffer``); one environment."""
    import gymnasium as gym
    import torch
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, PrioritizedVectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net

    from pal_bench.integrations.tianshou import PALPrioritizedVectorReplayBuffer

    np.random.seed(seed)
    torch.manual_seed(seed)
    envs = DummyVectorEnv([lambda: gym.make(env_id)])
    envs.seed(seed)
    probe = gym.make(env_id)
    obs_dim, space = int(np.prod(probe.observation_space.shape)), probe.action_space
    probe.close()
    policy = DiscreteQLearningPolicy(model=Net(state_shape=obs_dim, action_shape=int(space.n),
                                               hidden_sizes=list(hidden)),
                                     action_space=space, eps_training=1.0, eps_inference=0.0)
    algo = DQN(policy=policy, optim=AdamOptimizerFactory(lr=lr), gamma=gamma, n_step_return_horizon=n_step,
               target_update_freq=target_update)
    cls = PALPrioritizedVectorReplayBuffer if buffer == "pal" else PrioritizedVectorReplayBuffer
    buf = cls(capacity, 1, alpha=alpha, beta=beta)
    collector = Collector(algo, envs, buf, exploration_noise=True)
    collector.reset()
    return DQNRun(algo, policy, buf, collector)


class TianshouRun:
    """The plug-in benchmark's tianshou DQN: one iteration = ``steps_per_iter`` env steps collected
    one at a time, each followed by one gradient step on a batch of ``case.batch_size`` (RLlib
    DQN's default rhythm); learning starts after 1000 steps, as in the RLlib cases."""

    methods = ("add", "sample", "update_weight")

    def __init__(self, case, seed: int, steps_per_iter: int):
        self.case, self.steps = case, steps_per_iter
        self.run = build(case.env, hidden=(256, 256), lr=5e-4, gamma=0.99, n_step=1, target_update=500,
                         capacity=100_000, alpha=0.6, beta=0.4, seed=seed, buffer=case.buffer)

    @property
    def buffer(self):
        return self.run.buffer

    def prepare(self, warmup: int) -> None:
        self.run.collect(1_000, eps=1.0)
        for _ in range(warmup):
            self.iterate()

    def iterate(self) -> None:
        for _ in range(self.steps):
            self.run.collect(1, eps=0.1)
            self.run.learn(1, self.case.batch_size)

    def close(self) -> None:
        self.run.collector.env.close()
