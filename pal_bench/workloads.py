"""Workloads as data: the transition a replay buffer stores, how a stream of them is generated, and the memory modes
it can be stored in.

A ``Workload`` names its fields (``{name: (shape, dtype)}``, observation and next observation included), the
frame stack of its observation (1: a vector observation), its episode lengths, and makes transitions two ways:

- ``batch(n, seed)``: n rows for filling and timing a buffer (for ``lunarlander`` the random rows every stored
  LunarLander result was measured with);
- ``streams(n, seed, n_streams, chunk)``: n rows from ``n_streams`` environment streams with real episodes, the
  streams interleaved in chunks of ``chunk`` steps as actors insert them: next observations are the following
  steps' observations, stacks are built as a frame-stacking wrapper builds them (the reset frame repeated at an
  episode's start), and ``"stream"`` names each row's stream. Memory modes need this.

Memory modes (``MODES``): ``full`` stores every field of every row as given; ``next-ref`` stores each observation
once and finds the next one in the following step; ``stack`` (frame-stacked workloads) stores one frame per step and
rebuilds both stacks at sample time (``pal_bench.frame_replay``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("full", "next-ref", "stack")


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    obs_shape: tuple          # one observation, the stack axis first when ``stack > 1``
    obs_dtype: str
    action: tuple             # (shape, dtype) of the action
    stack: int = 1
    episode_len: tuple = (50, 400)     # episode lengths drawn uniformly from this range (steps)

    @property
    def fields(self) -> dict:
        """``{name: (shape, dtype)}`` of one transition, stored in full."""
        obs = (self.obs_shape, np.dtype(self.obs_dtype))
        return {"obs": obs, "act": (self.action[0], np.dtype(self.action[1])), "rew": ((), np.dtype(np.float32)),
                "next_obs": obs, "done": ((), np.dtype(np.bool_))}

    @property
    def row_bytes(self) -> int:
        """Bytes of one transition stored in full (fields' items, no padding)."""
        return sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in self.fields.values())

    @property
    def frame_shape(self) -> tuple:
        return self.obs_shape[1:] if self.stack > 1 else self.obs_shape

    @property
    def modes(self) -> tuple:
        return MODES if self.stack > 1 else MODES[:2]

    def buffer_kwargs(self, mode: str) -> dict:
        """``FrameReplayBuffer`` keyword arguments for ``mode`` (``next-ref`` or ``stack``)."""
        if mode not in self.modes or mode == "full":
            raise ValueError(f"{self.name} has frame-buffer modes {self.modes[1:]}, not {mode!r}")
        return {"fields": self.fields, "stack": self.stack if mode == "stack" else 1}

    # ------------------------------------------------------------------ rows

    def _frames(self, rng, n: int) -> np.ndarray:
        shape = (n, *self.frame_shape)
        if np.dtype(self.obs_dtype).kind == "u":
            return rng.integers(0, 256, shape, dtype=np.uint8)
        return rng.standard_normal(shape, dtype=np.float32)

    def _actions(self, rng, n: int) -> np.ndarray:
        shape, dtype = self.action
        if np.dtype(dtype).kind in "iu":
            return rng.integers(0, 4, (n, *shape), dtype=dtype)
        return rng.uniform(-1, 1, (n, *shape)).astype(dtype)

    def batch(self, n: int, seed: int = 0) -> dict:
        """``n`` transitions as a struct of arrays, for filling and timing (one stream, real episodes)."""
        if self.name == "lunarlander":
            return _lunar_batch(n, seed)
        rows = self.streams(n, seed, n_streams=1, chunk=n)
        rows.pop("stream")
        return rows

    def row(self, seed: int = 0) -> dict:
        """One transition as an environment loop hands it over: arrays for observations, Python scalars for
        scalar fields."""
        b = self.batch(1, seed)
        return {k: (v[0].item() if v[0].ndim == 0 else v[0]) for k, v in b.items()}

    def streams(self, n: int, seed: int = 0, n_streams: int = 4, chunk: int = 50) -> dict:
        """``n`` transitions from ``n_streams`` environment streams, each stream's steps in order, the streams
        interleaved in chunks of ``chunk`` steps; ``"stream"`` (int64[n]) names each row's stream."""
        if n_streams < 1 or chunk < 1:
            raise ValueError("n_streams and chunk must be >= 1")
        rng = np.random.default_rng(seed)
        per = [n // n_streams + (s < n % n_streams) for s in range(n_streams)]
        parts = [self._one_stream(rng, m) for m in per]
        order, sid = [], []
        pos = [0] * n_streams
        while any(pos[s] < per[s] for s in range(n_streams)):
            for s in range(n_streams):
                take = min(chunk, per[s] - pos[s])
                order += [(s, pos[s] + i) for i in range(take)]
                sid += [s] * take
                pos[s] += take
        starts = np.cumsum([0] + per)
        flat = np.array([starts[s] + i for s, i in order], dtype=np.int64)
        out = {k: np.concatenate([p[k] for p in parts])[flat] for k in self.fields}
        out["stream"] = np.array(sid, dtype=np.int64)
        return out

    def _one_stream(self, rng, m: int) -> dict:
        """``m`` consecutive steps of one stream: episodes of ``episode_len`` steps; an episode of L steps has
        L + 1 frames (reset, then one per step), stacks padded with the reset frame."""
        k = self.stack
        cols = {name: [] for name in self.fields}
        left = m
        while left > 0:
            E = int(rng.integers(self.episode_len[0], self.episode_len[1] + 1))
            L = min(left, E)
            frames = self._frames(rng, L + 1)
            t = np.arange(L + 1)
            if k > 1:
                idx = np.maximum(t[:, None] - (k - 1) + np.arange(k)[None, :], 0)      # [L + 1, k], padded
                stacks = frames[idx]
            else:
                stacks = frames
            cols["obs"].append(stacks[:L])
            cols["next_obs"].append(stacks[1:])
            cols["act"].append(self._actions(rng, L))
            cols["rew"].append(rng.standard_normal(L, dtype=np.float32))
            done = np.zeros(L, dtype=np.bool_)
            done[-1] = L == E                     # an episode cut off by the stream's end goes on
            cols["done"].append(done)
            left -= L
        return {k: np.concatenate(v) if v else np.empty((0, *self.fields[k][0]), self.fields[k][1])
                for k, v in cols.items()}


def _lunar_batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 8), dtype=np.float32),
        "act": rng.integers(0, 4, n, dtype=np.int64),
        "rew": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 8), dtype=np.float32),
        "done": rng.random(n) < 0.01,
    }


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("lunarlander", "LunarLander-v3: 8 float32 observation, discrete action (90 B a row)",
             (8,), "float32", ((), "int64"), episode_len=(100, 400)),
    Workload("humanoid", "MuJoCo Humanoid-v5 sized: 348 float32 observation, 17 float32 action",
             (348,), "float32", ((17,), "float32"), episode_len=(200, 1000)),
    Workload("atari", "Atari (Nature DQN): 84x84 uint8 frames, stack of 4, discrete action (56 KB a row in full)",
             (4, 84, 84), "uint8", ((), "int64"), stack=4, episode_len=(400, 2000)),
)}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
