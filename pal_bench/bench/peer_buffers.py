"""The peers' prioritized buffers behind the public buffer protocol (``pal_bench.bench.protocol``), each through
its own documented public API, so that ``pal-bench check-buffer`` checks them and ``pal-bench latency`` times them
exactly as it does a user's buffer.

They store transitions of the fields ``obs``, ``act``, ``rew``, ``next_obs`` and ``done`` (the workloads' fields;
the peers have named slots for them); any other field is refused at construction. What each wrapper adds to the
peer's own call is a renaming of its outputs (and, for RLlib's episode buffer, reading the sampled one-step
episodes into arrays, which RLlib's DQN learner does too).
"""

from __future__ import annotations

import uuid

import numpy as np

from pal_bench.bench.protocol import Fields

TRANSITION = ("obs", "act", "rew", "next_obs", "done")


def _transition_fields(fields: Fields, who: str) -> None:
    extra = sorted(set(fields) - set(TRANSITION))
    missing = sorted(set(TRANSITION) - set(fields))
    if extra or missing:
        raise ValueError(f"{who} stores transitions of the fields {', '.join(TRANSITION)}; "
                         + (f"unknown {extra}" if extra else f"missing {missing}"))


class TianshouPrioritized:
    """tianshou 2.0.1 ``tianshou.data.PrioritizedReplayBuffer``. ``add`` is its ``add`` of one ``Batch``;
    tianshou has no batch insert for one buffer, so ``add_batch`` is ``ReplayBuffer.from_data`` then
    ``PrioritizedReplayBuffer.update`` (both public, its fastest path; the suites mark it as not native).
    ``sample`` sets ``beta`` with ``set_beta`` and returns ``batch.weight``; ``done`` is stored as ``terminated``.
    tianshou draws from numpy's global generator: ``seed`` seeds it."""

    NATIVE_BATCH_INSERT = False

    def __init__(self, capacity: int, fields: Fields, alpha: float = 0.6, seed: int | None = None):
        _transition_fields(fields, "tianshou's buffer")
        from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer

        self._Batch, self._ReplayBuffer = Batch, ReplayBuffer
        if seed is not None:
            np.random.seed(seed)
        self.buf = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=0.4)

    def add(self, **row) -> None:
        self.buf.add(self._Batch(obs=row["obs"], act=row["act"], rew=row["rew"], terminated=row["done"],
                                 truncated=False, obs_next=row["next_obs"], info={}))

    def add_batch(self, **cols) -> None:
        n = len(cols["act"])
        self.buf.update(self._ReplayBuffer.from_data(
            obs=cols["obs"], act=cols["act"], rew=cols["rew"], terminated=cols["done"],
            truncated=np.zeros(n, bool), done=cols["done"], obs_next=cols["next_obs"]))

    def sample(self, batch_size: int, beta: float) -> dict:
        self.buf.set_beta(beta)
        b, indices = self.buf.sample(batch_size)
        return {"obs": b.obs, "act": b.act, "rew": b.rew, "next_obs": b.obs_next, "done": b.terminated,
                "indices": indices, "weights": b.weight}

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_weight(indices, priorities)

    def __len__(self) -> int:
        return len(self.buf)


class CpprbPrioritized:
    """cpprb ``PrioritizedReplayBuffer`` (C++ segment tree): ``add`` takes one row or many; ``sample`` returns
    scalar fields as [B, 1], reshaped (a view) to [B]; ``indexes`` is renamed ``indices``. cpprb's generator cannot
    be seeded from Python."""

    def __init__(self, capacity: int, fields: Fields, alpha: float = 0.6, seed: int | None = None):
        import cpprb

        self._shapes = {k: tuple(shape) for k, (shape, _) in fields.items()}
        env_dict = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in fields.items()}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=alpha)

    def add(self, **row) -> None:
        self.buf.add(**row)

    def add_batch(self, **cols) -> None:
        self.buf.add(**cols)

    def sample(self, batch_size: int, beta: float) -> dict:
        s = self.buf.sample(batch_size, beta=beta)
        out = {k: s[k].reshape(batch_size, *shape) for k, shape in self._shapes.items()}
        return out | {"indices": s["indexes"], "weights": s["weights"]}

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_priorities(indices, priorities)

    def __len__(self) -> int:
        return self.buf.get_stored_size()


# RLlib's SampleBatch column names
_RLLIB_COLUMNS = {"obs": "obs", "act": "actions", "rew": "rewards", "next_obs": "new_obs", "done": "terminateds"}


class RllibTimestepPrioritized:
    """RLlib (ray 2.60) ``ray.rllib.utils.replay_buffers.PrioritizedReplayBuffer``, timestep storage: every row
    is a ``SampleBatch`` of one timestep; ``add`` and ``add_batch`` hand it a ``SampleBatch``, ``sample`` is
    ``sample(num_items=B, beta=beta)`` (``batch_indexes`` and ``weights`` renamed). RLlib draws from Python's
    ``random`` module: ``seed`` seeds it."""

    def __init__(self, capacity: int, fields: Fields, alpha: float = 0.6, seed: int | None = None):
        _transition_fields(fields, "RLlib's buffer")
        import random

        from ray.rllib.policy.sample_batch import SampleBatch
        from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer

        if seed is not None:
            random.seed(seed)
        self._SampleBatch = SampleBatch
        self.buf = PrioritizedReplayBuffer(capacity=capacity, alpha=alpha)

    def add(self, **row) -> None:
        self.add_batch(**{k: np.asarray(v)[None] for k, v in row.items()})

    def add_batch(self, **cols) -> None:
        self.buf.add(self._SampleBatch({_RLLIB_COLUMNS[k]: v for k, v in cols.items()}))

    def sample(self, batch_size: int, beta: float) -> dict:
        s = self.buf.sample(num_items=batch_size, beta=beta)
        return {k: s[c] for k, c in _RLLIB_COLUMNS.items()} | {"indices": s["batch_indexes"], "weights": s["weights"]}

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_priorities(np.asarray(indices), np.asarray(priorities))

    def __len__(self) -> int:
        return len(self.buf)


class RllibEpisodePrioritized:
    """RLlib (ray 2.60) ``PrioritizedEpisodeReplayBuffer``, the buffer its DQN uses on the new API stack.

    ``add_batch`` hands it numpy-backed ``SingleAgentEpisode`` objects, one per run between ``done`` flags (also
    cut every ``min(1000, capacity // 10)`` steps, so one episode never holds the whole buffer); ``add`` adds a
    one-step chunk continuing the ongoing episode. ``sample`` is ``sample(num_items=B, n_step=1, beta=beta,
    sample_episodes=True)`` as DQN calls it; the B one-step episodes are read into arrays (observations 0 and 1,
    action, reward, terminated, and ``extra_model_outputs["weights"]``); ``indices`` are the tree indices the
    buffer records. ``update_priorities`` applies to the last sample in RLlib (it takes no indices): the
    ``indices`` given are put back as the last sampled ones first. ``seed`` seeds the buffer's own generator."""

    def __init__(self, capacity: int, fields: Fields, alpha: float = 0.6, seed: int | None = None):
        _transition_fields(fields, "RLlib's episode buffer")
        import scipy.signal  # noqa: F401  (sample's n-step reward filter, else imported in the first sample)
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
        from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

        self._Episode = SingleAgentEpisode
        self._module_id = DEFAULT_MODULE_ID
        self._max_len = max(1, min(1000, capacity // 10))
        self._eps_id: str | None = None           # the episode ``add`` continues: id, next timestep, last obs
        self._t = 0
        self._last_obs: np.ndarray | None = None
        self.buf = PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=alpha)
        self.buf.rng = np.random.default_rng(seed)

    def add(self, **row) -> None:
        if self._eps_id is None:
            self._eps_id, self._t, self._last_obs = uuid.uuid4().hex, 0, np.asarray(row["obs"])
        next_obs = np.asarray(row["next_obs"])
        truncated = not row["done"] and self._t + 1 >= self._max_len
        self.buf.add(self._Episode(
            self._eps_id, observations=np.stack([self._last_obs, next_obs]), infos=[{}, {}],
            actions=np.asarray(row["act"])[None], rewards=np.asarray(row["rew"])[None],
            terminated=bool(row["done"]), truncated=truncated, t_started=self._t, len_lookback_buffer=0))
        self._t += 1
        self._last_obs = next_obs
        if row["done"] or truncated:
            self._eps_id = None

    def add_batch(self, **cols) -> None:
        obs, act, rew, next_obs = cols["obs"], cols["act"], cols["rew"], cols["next_obs"]
        done = np.asarray(cols["done"])
        n = len(done)
        ends = np.union1d(np.flatnonzero(done) + 1, np.arange(self._max_len, n, self._max_len))
        ends = ends if len(ends) and ends[-1] == n else np.append(ends, n)
        episodes, start = [], 0
        for end in ends.tolist():
            episodes.append(self._Episode(
                observations=np.concatenate([obs[start:end], next_obs[end - 1:end]]),
                infos=[{}] * (end - start + 1), actions=act[start:end], rewards=rew[start:end],
                terminated=bool(done[end - 1]), len_lookback_buffer=0))
            start = end
        self.buf.add(episodes)

    def sample(self, batch_size: int, beta: float) -> dict:
        eps = self.buf.sample(num_items=batch_size, n_step=1, batch_length_T=0, lookback=0, min_batch_length_T=0,
                              gamma=0.99, beta=beta, sample_episodes=True)
        return {"obs": np.stack([e.get_observations(0) for e in eps]),
                "act": np.stack([e.get_actions(0) for e in eps]),
                "rew": np.stack([e.get_rewards(0) for e in eps]),
                "next_obs": np.stack([e.get_observations(1) for e in eps]),
                "done": np.array([e.is_terminated for e in eps]),
                "indices": np.array(self.buf._last_sampled_indices),
                "weights": np.array([e.get_extra_model_outputs("weights")[0] for e in eps])}

    def update_priorities(self, indices, priorities) -> None:
        self.buf._last_sampled_indices = list(np.asarray(indices).tolist())
        self.buf.update_priorities(np.asarray(priorities), module_id=self._module_id)

    def __len__(self) -> int:
        return len(self.buf)
