"""Cutting one environment's steps into R2D2's replay items: fixed-length, overlapping sequences that never
cross an episode boundary, each with the recurrent state the actor had at its first step.

A sequence of T = ``seq_len`` steps starts every ``seq_len - overlap`` steps of an episode. It is emitted as
soon as its last step is pushed; when the episode ends, the sequences still open are emitted with their tail
padded (``mask`` 0). After a time-limit end (truncation) the episode's final observation follows its last
step as one extra entry (``mask`` 0, ``obs_valid`` 1), so that the last steps can bootstrap from it; after a
termination there is nothing to bootstrap. A sequence that would hold no step the previous one does not
already hold is not emitted.

Per sequence (numpy): ``obs`` [T, *obs_shape], ``act`` [T], ``rew`` [T] float32 (one-step rewards: the
learner forms the n-step returns, ``algos/r2d2.py``), ``done`` [T] (terminated after this step), ``mask``
[T] (a real step), ``obs_valid`` [T] (an observation to bootstrap from), ``h0``/``c0`` [lstm] float32.
"""

from __future__ import annotations

import numpy as np

STEP_FIELDS = ("obs", "act", "rew", "done", "mask", "obs_valid")


class SequenceBuilder:
    """One environment's sequence cutter. ``push`` each step with the recurrent state used to act on it."""

    def __init__(self, seq_len: int = 80, overlap: int = 40):
        if seq_len < 1 or not 0 <= overlap < seq_len:
            raise ValueError(f"need seq_len >= 1 and 0 <= overlap < seq_len, got {seq_len}, {overlap}")
        self.T, self.overlap, self.stride = seq_len, overlap, seq_len - overlap
        self._reset()

    def _reset(self) -> None:
        self.steps: list[tuple] = []        # (obs, act, rew, done, mask, obs_valid, h, c) of this episode
        self.base = 0                       # episode index of steps[0] (older steps are dropped)

    def push(self, obs, act, rew: float, terminated: bool, truncated: bool, next_obs, state) -> list[dict]:
        """Add one step; ``state`` = (h, c), each float[lstm], the state the actor acted on ``obs`` with.
        Returns the sequences this step completes (none, one, or at an episode's end, the open ones)."""
        h, c = (np.array(s, dtype=np.float32).reshape(-1) for s in state)   # a copy: the caller reuses its state
        self.steps.append((np.asarray(obs), int(act), float(rew), bool(terminated), True, True, h, c))
        n = self.base + len(self.steps)                 # steps in the episode so far
        out = []
        first = n - self.T                              # the sequence whose last step this is
        if first >= 0 and first % self.stride == 0:
            out.append(self._sequence(first))
        if terminated or truncated:
            if truncated and not terminated:            # the final observation, to bootstrap from
                self.steps.append((np.asarray(next_obs), 0, 0.0, False, False, True, h, c))
            out += self._close(n)
        else:
            keep = (max(0, n - self.T) // self.stride + 1) * self.stride if n >= self.T else 0
            drop = keep - self.base                     # steps no open sequence starts at or before
            if drop > 0:
                del self.steps[:drop]
                self.base = keep
        return out

    def flush(self, next_obs) -> list[dict]:
        """Cut the episode here (the run's budget is spent): the open sequences, their last steps bootstrapping
        from ``next_obs`` as after a time limit. Nothing if no step is pending."""
        if not self.steps:
            return []
        n = self.base + len(self.steps)
        h, c = self.steps[-1][6], self.steps[-1][7]
        self.steps.append((np.asarray(next_obs), 0, 0.0, False, False, True, h, c))
        return self._close(n)

    def _close(self, n: int) -> list[dict]:
        """End the episode after its ``n`` real steps: the sequences still open, padded; then start afresh."""
        out = []
        length = self.base + len(self.steps)            # with an extra final-observation entry, if any
        start = self.base                               # a multiple of the stride: the oldest open sequence
        while start < n:
            if start + self.T > n and (start == 0 or length > start + self.overlap):
                out.append(self._sequence(start))
            start += self.stride
        self._reset()
        return out

    def _sequence(self, start: int) -> dict:
        """The sequence starting at episode step ``start``, padded to T."""
        rows = self.steps[start - self.base:start - self.base + self.T]
        obs0 = rows[0][0]
        T = self.T
        seq = {"obs": np.zeros((T,) + obs0.shape, dtype=np.float32), "act": np.zeros(T, np.int64),
               "rew": np.zeros(T, np.float32), "done": np.zeros(T, bool), "mask": np.zeros(T, bool),
               "obs_valid": np.zeros(T, bool)}
        for t, (o, a, r, d, m, v, _, _) in enumerate(rows):
            seq["obs"][t], seq["act"][t], seq["rew"][t], seq["done"][t] = o, a, r, d
            seq["mask"][t], seq["obs_valid"][t] = m, v
        seq["h0"], seq["c0"] = rows[0][6], rows[0][7]
        return seq


def stack(sequences: list[dict]) -> dict:
    """Sequences as a batch for ``SequenceReplayBuffer.add_sequences``: every field gets a leading [B]."""
    return {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}
