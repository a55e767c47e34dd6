"""Prioritized sequence replay (R2D2): the prioritized buffer in sequence mode.

Each stored item is one sequence of ``seq_len`` steps, kept as one record of the Cython
``PrioritizedReplayBuffer`` whose fields are the step fields with a leading [seq_len] axis, plus the
step masks and the recurrent state at the sequence's first step. So every guarantee of the transition
buffer holds per sequence: a sampled sequence is never torn by a concurrent writer, priority updates of
overwritten sequences are dropped, bad input is rejected with nothing changed, ``save``/``load`` and
``shared=True``/``attach`` work as they do there. Sequences come from ``pal_bench.train.sequences``.
"""

from __future__ import annotations

import numpy as np

from pal_bench._replay import PrioritizedReplayBuffer
from pal_bench.replay_layout import normalise_fields

MASKS = ("mask", "obs_valid")
PRIORITY_ETA = 0.9


def record_fields(step_fields: dict, seq_len: int, lstm_size: int) -> dict:
    """The buffer record of one sequence: each step field with a leading [seq_len] axis, the bool step masks
    ``mask`` and ``obs_valid`` [seq_len], and ``h0``/``c0`` float32[lstm_size]."""
    fields = {k: ((seq_len,) + tuple(s), np.dtype(d)) for k, (s, d) in step_fields.items()}
    fields |= {m: ((seq_len,), np.dtype(np.bool_)) for m in MASKS}
    return fields | {"h0": ((lstm_size,), np.dtype(np.float32)), "c0": ((lstm_size,), np.dtype(np.float32))}


def sequence_priority(td_abs: np.ndarray, mask: np.ndarray, eta: float = PRIORITY_ETA) -> np.ndarray:
    """Per-sequence priority eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t| over the steps where
    ``mask`` is set: float64[B] from [B, T]; 0 for a sequence with no such step."""
    td_abs = np.asarray(td_abs, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    if td_abs.shape != m.shape or td_abs.ndim != 2:
        raise ValueError(f"td_abs and mask must both be [B, T], got {td_abs.shape} and {m.shape}")
    n = m.sum(axis=1)
    masked = np.where(m, td_abs, 0.0)
    mean = masked.sum(axis=1) / np.maximum(n, 1)
    return np.where(n > 0, eta * masked.max(axis=1, initial=0.0) + (1 - eta) * mean, 0.0)


class SequenceReplayBuffer:
    """``capacity`` sequences of ``seq_len`` steps with fields ``{name: (shape, dtype)}`` per step, and an LSTM
    state of ``lstm_size`` (h0 and c0, float32) per sequence. Priorities are per sequence:
    ``sequence_priority(|delta|, mask)`` = eta max + (1 - eta) mean over its learning steps."""

    def __init__(self, capacity: int, step_fields: dict, seq_len: int = 80, lstm_size: int = 64,
                 alpha: float = 0.6, eps: float = 1e-6, seed: int = 0, shared: bool = False, name=None,
                 _buffer: PrioritizedReplayBuffer | None = None):
        if seq_len < 1 or lstm_size < 1:
            raise ValueError(f"seq_len and lstm_size must be >= 1, got {seq_len}, {lstm_size}")
        clash = [k for k in step_fields if k in (*MASKS, "h0", "c0")]
        if clash:
            raise ValueError(f"step field names {clash} are reserved for the sequence's masks and state")
        self.seq_len, self.lstm_size = seq_len, lstm_size
        # as the buffer stores them (an int shape is a 1-tuple, a subarray dtype's shape joins the field's)
        self.step_fields = normalise_fields(step_fields)
        if _buffer is not None:
            self._buf = _buffer
            return
        fields = record_fields(self.step_fields, seq_len, lstm_size)
        self._buf = PrioritizedReplayBuffer(capacity, fields, alpha=alpha, eps=eps, seed=seed, shared=shared,
                                            name=name)

    # ------------------------------------------------------------------ writing

    def add_sequences(self, priorities=None, **batch) -> np.ndarray:
        """Store B sequences: every step field as [B, seq_len, *shape], ``mask`` and ``obs_valid`` [B, seq_len]
        (bool; the first step of a sequence must be real), ``h0``/``c0`` [B, lstm_size]. Returns their ids.
        New sequences get the buffer's max priority unless ``priorities`` (float[B]) are given."""
        mask = np.asarray(batch.get("mask"))
        if mask.dtype != np.bool_ or mask.ndim != 2 or mask.shape[1] != self.seq_len:
            raise ValueError(f"mask must be bool [B, {self.seq_len}], got {mask.dtype} {mask.shape}")
        if mask.shape[0] and not mask[:, 0].all():
            raise ValueError("every sequence must start with a real step (mask[:, 0] all True)")
        return self._buf.add_batch(priorities=priorities, **batch)

    # ------------------------------------------------------------------ reading

    def sample(self, batch_size: int, beta: float = 0.4) -> dict:
        """B sequences proportionally to priority^alpha: every field [B, seq_len, ...], ``mask``, ``obs_valid``,
        ``h0``/``c0`` [B, lstm_size], ``indices`` int64[B] sequence ids, ``weights`` float64[B]."""
        return self._buf.sample(batch_size, beta=beta)

    def update_priorities(self, indices, priorities) -> int:
        """Per-sequence priorities (float[B], finite, >= 0) for sequence ids; stale ids are dropped."""
        return self._buf.update_priorities(indices, priorities)

    def update_from_td(self, indices, td_abs, learn_mask, eta: float = PRIORITY_ETA) -> int:
        """``update_priorities`` with eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over ``learn_mask``."""
        return self._buf.update_priorities(indices, sequence_priority(td_abs, learn_mask, eta))

    # ------------------------------------------------------------------ the rest is the transition buffer's

    def __len__(self) -> int:
        return len(self._buf)

    @property
    def capacity(self) -> int:
        return self._buf.capacity

    @property
    def shared_name(self):
        return self._buf.shared_name

    def get_priorities(self, indices) -> np.ndarray:
        return self._buf.get_priorities(indices)

    def save(self, target) -> None:
        self._buf.save(target)

    @classmethod
    def load(cls, source, seq_len: int, lstm_size: int, step_fields: dict, **kw) -> SequenceReplayBuffer:
        """A buffer saved by ``save``; ``seq_len``, ``lstm_size`` and ``step_fields`` must match the file's."""
        buf = PrioritizedReplayBuffer.load(source, **kw)
        out = cls(buf.capacity, step_fields, seq_len, lstm_size, _buffer=buf)
        out._check_layout()
        return out

    @classmethod
    def attach(cls, name: str, seq_len: int, lstm_size: int, step_fields: dict, seed=None) -> SequenceReplayBuffer:
        """A handle on a shared sequence buffer created in another process (``shared=True``)."""
        buf = PrioritizedReplayBuffer.attach(name, seed=seed)
        out = cls(buf.capacity, step_fields, seq_len, lstm_size, _buffer=buf)
        out._check_layout()
        return out

    def _check_layout(self) -> None:
        want = {k: ((self.seq_len,) + s, d) for k, (s, d) in self.step_fields.items()}
        want |= {m: ((self.seq_len,), np.dtype(np.bool_)) for m in MASKS}
        want |= {"h0": ((self.lstm_size,), np.dtype(np.float32)), "c0": ((self.lstm_size,), np.dtype(np.float32))}
        got = {k: (tuple(s), np.dtype(d)) for k, (s, d) in self._buf.fields.items()}
        if got != want:
            self._buf.close()
            raise ValueError(f"not a sequence buffer of this layout: it stores {got}, expected {want}")

    def close(self) -> None:
        self._buf.close()

    def __enter__(self) -> SequenceReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
