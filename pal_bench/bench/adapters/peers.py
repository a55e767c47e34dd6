"""Adapters for the peers' buffers, each through its own documented public API, each in the memory modes it has."""

from __future__ import annotations

import numpy as np

from pal_bench.bench.adapters.base import ALPHA, BETA, LUNARLANDER, BufferAdapter
from pal_bench.bench.adapters.protocol import ProtocolAdapter
from pal_bench.bench.peer_buffers import CpprbPrioritized, RllibTimestepPrioritized, TianshouPrioritized
from pal_bench.workloads import Workload


class _PeerAdapter(ProtocolAdapter):
    """A peer measured through its protocol class (``IMPL``, from ``pal_bench.bench.peer_buffers``) in ``full``
    mode: the same calls as a user's buffer (``ProtocolAdapter``). Its memory modes, which are not part of the
    protocol, go through the peer's own options (``_mode_buffer``, ``_fill_mode_chunk``, ``_insert_mode_row``)."""

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        if mode == "full":
            super().__init__(capacity, alpha, beta, workload, mode)
            self.buf = self.proto.buf                   # the peer's own buffer object
            return
        BufferAdapter.__init__(self, capacity, alpha, beta, workload, mode)
        self.proto = None
        self.buf = self._mode_buffer()
        self.fill()

    def _mode_buffer(self):
        raise NotImplementedError

    def insert_one(self, row: dict) -> None:
        if self.proto is None:
            return self._insert_mode_row(row)
        self.proto.add(**row)

    def insert_batch(self, batch: dict) -> None:
        if self.proto is None:
            return self._insert_mode_batch(batch)
        self.proto.add_batch(**batch)

    def _fill_chunk(self, batch: dict) -> None:
        if self.proto is None:
            return self._fill_mode_chunk(batch)
        self.proto.add_batch(**batch)


class TianshouAdapter(_PeerAdapter):
    """tianshou 2.0.1 ``tianshou.data.PrioritizedReplayBuffer`` (numpy segment tree), in ``full`` mode through
    ``peer_buffers.TianshouPrioritized``.

    tianshou inserts one transition per ``add``; it has no batch insert for a single buffer. It is filled with
    ``ReplayBuffer.from_data`` followed by ``PrioritizedReplayBuffer.update`` (both public), its fastest path, a
    chunk at a time; the suites do not time that as a batch insert. Memory modes (its own options, filled through
    ``add``, one row at a time): ``next-ref`` is ``ignore_obs_next=True`` (the next observation is read from the
    following slot); ``stack`` is ``stack_num=k, save_only_last_obs=True, ignore_obs_next=True`` (one frame per
    slot, stacks rebuilt from the preceding slots). Both assume that consecutive slots are consecutive steps of one
    stream.
    """

    name = "tianshou"
    IMPL = TianshouPrioritized
    NATIVE_BATCH_INSERT = False
    MODES = ("full", "next-ref", "stack")

    def _mode_buffer(self):
        from tianshou.data import Batch, PrioritizedReplayBuffer

        self._Batch = Batch
        kw = {"ignore_obs_next": True}
        if self.mode == "stack":
            kw |= dict(stack_num=self.workload.stack, save_only_last_obs=True)
        return PrioritizedReplayBuffer(self.capacity, alpha=self.alpha, beta=self.beta, **kw)

    def _fill_mode_chunk(self, b: dict) -> None:
        for i in range(len(b["act"])):
            self.insert_one({k: v[i] for k, v in b.items()})

    def _insert_mode_row(self, row: dict) -> None:
        self.buf.add(self._Batch(obs=row["obs"], act=row["act"], rew=row["rew"], terminated=row["done"],
                                 truncated=False, obs_next=row["next_obs"], info={}))

    def sample(self, batch_size: int):
        if self.proto is None:
            return self.buf.sample(batch_size)[1]
        return super().sample(batch_size)

    def update(self, indices, priorities: np.ndarray) -> None:
        if self.proto is None:
            return self.buf.update_weight(indices, priorities)
        super().update(indices, priorities)


class CpprbAdapter(_PeerAdapter):
    """cpprb ``PrioritizedReplayBuffer`` (C++ segment tree behind a Cython binding), in ``full`` mode through
    ``peer_buffers.CpprbPrioritized``.

    Memory modes (its own options): ``next-ref`` is ``next_of="obs"`` (``next_obs`` shares the following slot's
    memory; the last one is cached); ``stack`` adds ``stack_compress="obs"``, which needs the stack on the last axis,
    so observations are handed over as [84, 84, 4] (a transposed view; cpprb copies it). At an episode end the
    adapter calls ``on_episode_end()``, as cpprb's documentation asks. Both assume one stream per buffer."""

    name = "cpprb"
    IMPL = CpprbPrioritized
    MODES = ("full", "next-ref", "stack")

    def _mode_buffer(self):
        import cpprb

        env_dict = {}
        for name, (shape, dtype) in self.workload.fields.items():
            if name == "next_obs":
                continue
            if self.mode == "stack" and name == "obs":
                shape = (*shape[1:], shape[0])
            env_dict[name] = {"shape": shape or 1, "dtype": dtype}
        kw = {"next_of": "obs"} | ({"stack_compress": "obs"} if self.mode == "stack" else {})
        return cpprb.PrioritizedReplayBuffer(self.capacity, env_dict, alpha=self.alpha, **kw)

    def _rows(self, batch: dict) -> dict:
        if self.mode != "stack":
            return batch
        return dict(batch, obs=np.moveaxis(batch["obs"], -3, -1), next_obs=np.moveaxis(batch["next_obs"], -3, -1))

    def _fill_mode_chunk(self, batch: dict) -> None:
        done = np.flatnonzero(batch["done"])
        start = 0
        for end in list(done + 1) + [len(batch["act"])]:
            if end > start:
                self.insert_batch({k: v[start:end] for k, v in batch.items()})
                if end - 1 in done:
                    self.buf.on_episode_end()
            start = end

    def _insert_mode_row(self, row: dict) -> None:
        self.buf.add(**self._rows({k: np.asarray(v) for k, v in row.items()}) if self.mode == "stack" else row)

    def _insert_mode_batch(self, batch: dict) -> None:
        self.buf.add(**self._rows(batch))

    def sample(self, batch_size: int):
        if self.proto is None:
            return self.buf.sample(batch_size, beta=self.beta)["indexes"]
        return super().sample(batch_size)

    def update(self, indices, priorities: np.ndarray) -> None:
        if self.proto is None:
            return self.buf.update_priorities(indices, priorities)
        super().update(indices, priorities)


class Sb3Adapter(BufferAdapter):
    """Stable-Baselines3 2.9 ``stable_baselines3.common.buffers.ReplayBuffer`` (uniform; the most used buffer in
    practice), one environment. ``add`` takes one step of ``n_envs`` environments, so rows go in one at a time;
    ``sample`` returns torch tensors (its API), and there are no priorities: ``update`` does nothing. Memory mode
    ``next-ref`` is ``optimize_memory_usage=True`` (the next observation is the following slot's; it needs
    ``handle_timeout_termination=False``), which assumes one stream per buffer."""

    name = "sb3"
    NATIVE_BATCH_INSERT = False
    PRIORITIZED = False
    MODES = ("full", "next-ref")

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA, workload: Workload = LUNARLANDER,
                 mode: str = "full"):
        super().__init__(capacity, alpha, beta, workload, mode)
        import warnings

        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        shape, dtype = workload.fields["obs"]
        low, high = (0, 255) if dtype == np.uint8 else (-np.inf, np.inf)
        obs_space = spaces.Box(low, high, shape, dtype)
        a_shape, a_dtype = workload.fields["act"]
        act_space = spaces.Discrete(4) if a_dtype.kind in "iu" else spaces.Box(-1, 1, a_shape, a_dtype)
        with warnings.catch_warnings():             # SB3 warns when the buffer may not fit in free memory
            warnings.simplefilter("ignore")
            self.buf = ReplayBuffer(capacity, obs_space, act_space, device="cpu", n_envs=1,
                                    optimize_memory_usage=mode == "next-ref",
                                    handle_timeout_termination=mode != "next-ref")
        self.fill()

    def _fill_chunk(self, b: dict) -> None:
        for i in range(len(b["act"])):
            self.insert_one({k: v[i] for k, v in b.items()})

    def insert_one(self, row: dict) -> None:
        self.buf.add(np.asarray(row["obs"])[None], np.asarray(row["next_obs"])[None], np.asarray(row["act"])[None],
                     np.asarray([row["rew"]], np.float32), np.asarray([row["done"]]), [{}])

    def sample(self, batch_size: int):
        """The sampled rewards (SB3's ``sample`` returns tensors, not indices; a uniform buffer has nothing to
        update)."""
        return self.buf.sample(batch_size).rewards

    def update(self, indices, priorities: np.ndarray) -> None:
        pass


class RllibTimestepAdapter(ProtocolAdapter):
    """RLlib (ray 2.60) ``ray.rllib.utils.replay_buffers.PrioritizedReplayBuffer``, timestep storage, through
    ``peer_buffers.RllibTimestepPrioritized``.

    Every timestep is stored as its own ``SampleBatch`` (about 3.4 KB each), so filling takes over
    a minute and about 3 GB at 1e6: the quick sweep stops it at 1e5.
    """

    name = "rllib"
    IMPL = RllibTimestepPrioritized
    MAX_CAPACITY = (10**6, "RLlib's timestep buffer needs ~3.4 KB and ~70 µs per step to fill: 1e7 would "
                           "take ~34 GB and over 10 minutes")
    QUICK_MAX_CAPACITY = (10**5, "quick sweep: filling RLlib's timestep buffer to 1e6 takes over a minute and "
                                 "~3 GB; the full sweep runs it")
