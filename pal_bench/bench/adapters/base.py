"""The adapter interface and the LunarLander-sized transition every adapter stores."""

from __future__ import annotations

import numpy as np

# LunarLander-v3: 8-float observation, discrete action, reward, next observation, done flag.
LUNAR_FIELDS = {
    "obs": ((8,), np.float32),
    "act": ((), np.int64),
    "rew": ((), np.float32),
    "next_obs": ((8,), np.float32),
    "done": ((), np.bool_),
}
ALPHA = 0.6
BETA = 0.4


def lunar_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` random LunarLander-sized transitions as a struct of arrays."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 8), dtype=np.float32),
        "act": rng.integers(0, 4, n, dtype=np.int64),
        "rew": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 8), dtype=np.float32),
        "done": rng.random(n) < 0.01,
    }


def lunar_row(seed: int = 0) -> dict:
    """One transition as an environment loop hands it over: arrays for observations, Python
    scalars for action, reward and done."""
    b = lunar_batch(1, seed)
    return {"obs": b["obs"][0], "act": int(b["act"][0]), "rew": float(b["rew"][0]),
            "next_obs": b["next_obs"][0], "done": bool(b["done"][0])}


class BufferAdapter:
    """Base class: subclasses build ``self.buf`` in ``__init__`` and fill it to ``capacity``."""

    name = "abstract"
    #: False when the peer has no batch insert in its public API
    NATIVE_BATCH_INSERT = True
    #: largest capacity this adapter is run at, with the reason (None: no limit)
    MAX_CAPACITY: tuple[int, str] | None = None
    #: the same limit for the quick sweep
    QUICK_MAX_CAPACITY: tuple[int, str] | None = None

    def __init__(self, capacity: int, alpha: float = ALPHA, beta: float = BETA):
        self.capacity = capacity
        self.alpha = alpha
        self.beta = beta

    def insert_one(self, row: dict) -> None:
        raise NotImplementedError

    def insert_batch(self, batch: dict) -> None:
        raise NotImplementedError

    def sample(self, batch_size: int):
        raise NotImplementedError

    def update(self, indices, priorities: np.ndarray) -> None:
        raise NotImplementedError

    def fill(self, chunk: int = 50_000) -> None:
        """Fill to capacity through the fastest public path (batch insert when there is one)."""
        done = 0
        while done < self.capacity:
            n = min(chunk, self.capacity - done)
            self._fill_chunk(lunar_batch(n, seed=done))
            done += n

    def _fill_chunk(self, batch: dict) -> None:
        self.insert_batch(batch)
