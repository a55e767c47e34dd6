"""Adapters for the peers' prioritized buffers, each through its own documented public API."""

from __future__ import annotations

import numpy as np

from pal_bench.bench.adapters.base import ALPHA, BETA, BufferAdapter


class TianshouAdapter(BufferAdapter):
    """tianshou 2.0.1 ``tianshou.data.PrioritizedReplayBuffer`` (numpy segment tree).

    tianshou inserts one transition per ``add``; it has no batch insert for a single buffer. It is
    filled with ``ReplayBuffer.from_data`` followed by ``PrioritizedReplayBuffer.update`` (both
    public), its fastest path.
    """

    name = "tianshou"
    NATIVE_BATCH_INSERT = False

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        super().__init__(capacity, alpha, beta)
        from tianshou.data import Batch, PrioritizedReplayBuffer

        self._Batch = Batch
        self.buf = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=beta)
        self.fill()

    def fill(self, chunk: int = 0) -> None:
        from tianshou.data import ReplayBuffer

        from pal_bench.bench.adapters.base import lunar_batch

        b = lunar_batch(self.capacity)
        src = ReplayBuffer.from_data(
            obs=b["obs"], act=b["act"], rew=b["rew"], terminated=b["done"],
            truncated=np.zeros(self.capacity, bool), done=b["done"], obs_next=b["next_obs"],
        )
        self.buf.update(src)

    def insert_one(self, row: dict) -> None:
        self.buf.add(self._Batch(obs=row["obs"], act=row["act"], rew=row["rew"], terminated=row["done"],
                                 truncated=False, obs_next=row["next_obs"], info={}))

    def sample(self, batch_size: int) -> np.ndarray:
        _, indices = self.buf.sample(batch_size)
        return indices

    def update(self, indices, priorities: np.ndarray) -> None:
        self.buf.update_weight(indices, priorities)


class CpprbAdapter(BufferAdapter):
    """cpprb ``PrioritizedReplayBuffer`` (C++ segment tree behind a Cython binding)."""

    name = "cpprb"

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        super().__init__(capacity, alpha, beta)
        import cpprb

        env_dict = {"obs": {"shape": 8, "dtype": np.float32}, "act": {"dtype": np.int64},
                    "rew": {"dtype": np.float32}, "next_obs": {"shape": 8, "dtype": np.float32},
                    "done": {"dtype": np.bool_}}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=alpha)
        self.fill()

    def insert_one(self, row: dict) -> None:
        self.buf.add(**row)

    def insert_batch(self, batch: dict) -> None:
        self.buf.add(**batch)

    def sample(self, batch_size: int) -> np.ndarray:
        return self.buf.sample(batch_size, beta=self.beta)["indexes"]

    def update(self, indices, priorities: np.ndarray) -> None:
        self.buf.update_priorities(indices, priorities)


class RllibTimestepAdapter(BufferAdapter):
    """RLlib (ray 2.60) ``ray.rllib.utils.replay_buffers.PrioritizedReplayBuffer``, timestep storage.

    Every timestep is stored as its own ``SampleBatch`` (about 3.4 KB each), so filling takes over
    a minute and about 3 GB at 1e6: the quick sweep stops it at 1e5.
    """

    name = "rllib"
    MAX_CAPACITY = (10**6, "RLlib's timestep buffer needs ~3.4 KB and ~70 µs per step to fill: 1e7 would "
                           "take ~34 GB and over 10 minutes")
    QUICK_MAX_CAPACITY = (10**5, "quick sweep: filling RLlib's timestep buffer to 1e6 takes over a minute and "
                                 "~3 GB; the full sweep runs it")

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        super().__init__(capacity, alpha, beta)
        from ray.rllib.policy.sample_batch import SampleBatch
        from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer

        self._SampleBatch = SampleBatch
        self.buf = PrioritizedReplayBuffer(capacity=capacity, alpha=alpha)
        self.fill()

    def _sample_batch(self, batch: dict):
        return self._SampleBatch({"obs": batch["obs"], "actions": batch["act"], "rewards": batch["rew"],
                                  "new_obs": batch["next_obs"], "terminateds": batch["done"]})

    def insert_one(self, row: dict) -> None:
        self.buf.add(self._sample_batch({k: np.asarray(v)[None] for k, v in row.items()}))

    def insert_batch(self, batch: dict) -> None:
        self.buf.add(self._sample_batch(batch))

    def sample(self, batch_size: int) -> np.ndarray:
        return self.buf.sample(num_items=batch_size, beta=self.beta)["batch_indexes"]

    def update(self, indices, priorities: np.ndarray) -> None:
        self.buf.update_priorities(indices, priorities)
