"""Replay with memory modes: next observations by reference, and frame stacks rebuilt from single frames.

A buffer that stores each transition's observation and next observation in full holds every Atari frame eight
times (two stacks of four): 56 KB a transition, 56 GB at a million. ``FrameReplayBuffer`` stores one frame per
environment step and rebuilds both stacks when it samples; with ``stack=1`` it stores each observation once and
finds a transition's next observation in the following step ("next observation by reference").

Layout
------
``add_batch`` takes rows from any number of environment streams, interleaved as a parallel trainer's actors and
vector environments produce them: ``stream`` (int[B]) names each row's stream, and the rows of one stream are its
consecutive steps in order. Each stream's rows are split into *segments*, runs in which a step's next observation
is the following step's observation (a segment ends at an episode end or a truncation, or wherever the two
differ: the rule is tested on the bytes, not on ``done`` flags). A segment of T steps is stored as T + k
consecutive rows of the ring (k the stack size):

    k - 1 context frames | one row per step (its newest frame and its other fields) | one tail frame

Step t's observation is the k frames ending at its row, its next observation the k frames ending one row later.
The context frames are the older frames of the segment's first observation, so episode-start padding is exactly
what the environment's wrapper produced (repeated reset frames or zeros alike); the tail frame is the newest
frame of the last step's next observation. Context and tail rows are *hidden* (the core's ``_hidden`` field):
stored with priority 0, never drawn, never re-prioritised.

Why it is exact under concurrency: one segment is one ``add_batch`` reservation of the core buffer, so its rows
have consecutive transition ids and are overwritten oldest first. A step's window (ids ``i - k + 1 .. i + 1``)
is intact unless its context was overwritten (at most ``k - 1`` steps at the ring's oldest edge); ``sample``
copies each window with ``gather_window``, whose seqlock re-checks every id of the window after the copy, and
draws again for the rows whose window was not whole. Several actors (threads or processes on a ``shared=True``
buffer) may insert at once: their segments are separate reservations. cpprb's ``next_of``/``stack_compress``
and Stable-Baselines3's ``optimize_memory_usage`` assume that consecutive rows of the ring are consecutive steps
of one environment, which interleaved inserts break (docs/workloads.md).

Cost: each segment stores k extra rows, so a transition takes ``(frame + other fields) * (T + k) / T`` bytes for
segments of T steps: an actor should insert chunks of consecutive steps per stream (Ape-X actors send 50-step
chunks: 8% over one frame per step at k = 4). ``len()`` counts stored rows, hidden ones included;
``transitions()`` counts the steps that can be drawn.
"""

from __future__ import annotations

import sys

import numpy as np

from pal_bench._replay import PrioritizedReplayBuffer, ReplayBuffer
from pal_bench.replay_layout import HIDDEN_FIELD, normalise_fields

#: window arrays kept per batch size for ``sample`` to reuse (the caller's last batch, the one before, a spare),
#: and batch sizes kept
POOL_PER_BATCH = 3
POOL_BATCH_SIZES = 4
#: the ``_hidden`` field's values: a step (drawn), a context frame, a tail frame (3: hidden by ``hide_rows``)
STEP, CONTEXT, TAIL, HIDDEN_BY_CORE = 0, 1, 2, 3
#: how many times ``sample`` draws again for rows whose window was not whole before it gives up
MAX_REDRAWS = 100


def stored_fields(fields: dict, obs: str, next_obs: str, stack: int) -> dict:
    """The core buffer's fields for a transition layout ``fields``: the observation field holds one frame (its
    shape without the leading stack axis when ``stack > 1``), the next observation is not stored, the other fields
    are as given, plus the bool ``_hidden``."""
    spec = normalise_fields(fields)
    for name in (obs, next_obs):
        if name not in spec:
            raise ValueError(f"fields has no {name!r}; it has {list(spec)}")
    if HIDDEN_FIELD in spec:
        raise ValueError(f"field name {HIDDEN_FIELD!r} is reserved")
    if not isinstance(stack, (int, np.integer)) or isinstance(stack, bool) or stack < 1:
        raise ValueError(f"stack must be an int >= 1, got {stack!r}")
    if obs == next_obs:
        raise ValueError(f"obs and next_obs must be two fields, got {obs!r} for both")
    shape, dtype = spec[obs]
    if spec[next_obs] != (shape, dtype):
        raise ValueError(f"{next_obs!r} must have {obs!r}'s shape and dtype, got {spec[next_obs]} and {spec[obs]}")
    if stack > 1:
        if not shape or shape[0] != stack:
            raise ValueError(f"with stack={stack}, {obs!r} must have shape ({stack}, *frame), got {shape}")
        shape = shape[1:]
    out = {frame_field(obs, stack): (shape, dtype)}
    out |= {k: v for k, v in spec.items() if k not in (obs, next_obs)}
    return out | {HIDDEN_FIELD: ((), np.dtype(np.uint8))}


def frame_field(obs: str, stack: int) -> str:
    """The stored field of one frame per row: its name carries the stack size, so that a handle made with another
    ``stack`` does not attach to or load the buffer (the fields would not match)."""
    return f"{obs}__frames_of_{int(stack)}"


class FrameReplayBuffer:
    """Prioritized (or uniform) replay of ``capacity`` stored rows (steps, with the context and tail frames of each
    segment) for transitions with ``fields`` ``{name: (shape, dtype)}``, storing ``obs`` once per step and never
    ``next_obs``. ``stack=k > 1``: ``obs`` has shape (k, *frame) and holds a frame stack (oldest first), and one
    frame per step is stored. The interface is the core buffer's: ``add_batch``, ``sample``,
    ``update_priorities``, ``save``/``load``, ``shared=True``/``attach``; see the module docstring for the layout.
    """

    def __init__(self, capacity: int, fields: dict, obs: str = "obs", next_obs: str = "next_obs", stack: int = 1,
                 prioritized: bool = True, alpha: float = 0.6, eps: float = 1e-6, fanout: int | None = None,
                 seed: int = 0, shared: bool = False, name: str | None = None, _buffer=None):
        self.fields = normalise_fields(fields)
        self._stored = stored_fields(fields, obs, next_obs, stack)
        self.obs, self.next_obs, self.stack = obs, next_obs, int(stack)
        self._frame = frame_field(obs, self.stack)
        self._frame_shape, self._frame_dtype = self._stored[self._frame]
        self._others = [k for k in self._stored if k not in (self._frame, HIDDEN_FIELD)]
        self._pool: dict[int, list[np.ndarray]] = {}     # sample's window arrays no caller holds (see _window)
        if _buffer is not None:
            self._buf = _buffer
            self._check_layout()
            return
        if not isinstance(capacity, (int, np.integer)) or capacity < self.stack + 1:
            raise ValueError(f"capacity must be an int >= stack + 1 = {self.stack + 1}, got {capacity!r}")
        if prioritized:
            kw = {} if fanout is None else {"fanout": fanout}
            self._buf = PrioritizedReplayBuffer(capacity, self._stored, alpha=alpha, eps=eps, seed=seed,
                                                shared=shared, name=name, **kw)
        else:
            self._buf = ReplayBuffer(capacity, self._stored, seed=seed, shared=shared, name=name)

    # ------------------------------------------------------------------ writing

    def _column(self, name: str, value, B: int | None) -> np.ndarray:
        shape, dtype = self.fields[name]
        arr = np.asarray(value)
        if arr.ndim != len(shape) + 1 or arr.shape[1:] != shape or (B is not None and arr.shape[0] != B):
            want = ("B" if B is None else B,) + shape
            raise ValueError(f"field {name!r} must have shape {want}, got {arr.shape}")
        if arr.dtype != dtype:
            if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise ValueError(f"field {name!r}: cannot store {arr.dtype} as {dtype}")
            arr = arr.astype(dtype)
        return arr

    def add_batch(self, priorities=None, stream=None, **columns) -> np.ndarray:
        """Store B steps: every field with leading dimension B; ``stream`` (int[B], default all 0) names each row's
        environment stream, and the rows of one stream must be its consecutive steps in order. Returns the
        steps' transition ids (int64[B], in the rows' order). ``priorities`` (float[B], raw, >= 0) as in the core
        buffer; by default new steps get the largest priority seen. Everything is checked before anything is
        stored: a ``next_obs`` that is not ``obs`` advanced by one frame (stack > 1) is a ValueError naming the row.
        """
        unknown = sorted(set(columns) - set(self.fields))
        missing = sorted(set(self.fields) - set(columns))
        if unknown or missing:
            raise ValueError(f"add_batch needs exactly the fields {list(self.fields)}; missing {missing}, "
                             f"unknown {unknown}")
        o = self._column(self.obs, columns[self.obs], None)
        B = o.shape[0]
        cols = {k: self._column(k, v, B) for k, v in columns.items()}
        o, n = cols[self.obs], cols[self.next_obs]
        k = self.stack
        if k == 1:
            o, n = o[:, None], n[:, None]
        if B == 0:
            return np.empty(0, dtype=np.int64)
        if stream is None:
            stream = np.zeros(B, dtype=np.int64)
        stream = np.asarray(stream)
        if stream.shape != (B,) or (B and stream.dtype.kind not in "iu"):
            raise ValueError(f"stream must be int[{B}], got {stream.dtype} {stream.shape}")
        prio = None
        if priorities is not None:
            prio = np.asarray(priorities, dtype=np.float64)
            if prio.shape != (B,):
                raise ValueError(f"priorities must have shape ({B},), got {prio.shape}")
            if not (np.isfinite(prio).all() and (prio >= 0).all()):
                raise ValueError("priorities must be finite and >= 0 (no NaN, inf or negative values)")
        if k > 1:
            shifted = _rows_equal(o[:, 1:], n[:, :-1])
            if not shifted.all():
                bad = int(np.flatnonzero(~shifted)[0])
                raise ValueError(f"row {bad}: {self.next_obs!r} is not {self.obs!r} advanced by one frame "
                                 f"(next[:-1] must equal obs[1:] for a stack of {k})")
        order = np.argsort(stream, kind="stable")
        s_sorted = stream[order]
        cont = (s_sorted[1:] == s_sorted[:-1]) & _rows_equal(n[order[:-1]], o[order[1:]])
        starts = np.flatnonzero(np.concatenate([[True], ~cont]))          # first sorted row of each segment
        ends = np.concatenate([starts[1:], [B]])                             # one past its last row
        seg = np.cumsum(np.concatenate([[True], ~cont])) - 1                 # segment of each sorted row
        S = starts.size
        R = B + S * k
        if R > self._buf.capacity:
            raise ValueError(f"{B} steps in {S} segments take {R} rows, more than the capacity "
                             f"{self._buf.capacity}: insert fewer at a time")
        step_pos = np.arange(B) + seg * k + (k - 1)                          # row of each sorted step
        frames = np.empty((R,) + self._frame_shape, dtype=self._frame_dtype)
        frames[step_pos] = o[order, -1]
        first = order[starts]
        for j in range(k - 1):                                               # context frames
            frames[starts + np.arange(S) * k + j] = o[first, j]
        tail_pos = ends + np.arange(S) * k + (k - 1)
        frames[tail_pos] = n[order[ends - 1], -1]
        hidden = np.full(R, CONTEXT, dtype=np.uint8)
        hidden[step_pos] = STEP
        hidden[tail_pos] = TAIL
        rows = {self._frame: frames, HIDDEN_FIELD: hidden}
        for name in self._others:
            full = np.zeros((R,) + self.fields[name][0], dtype=self.fields[name][1])
            full[step_pos] = cols[name][order]
            rows[name] = full
        stored_prio = None
        if prio is not None:
            stored_prio = np.zeros(R)
            stored_prio[step_pos] = prio[order]
        ids = self._buf.add_batch(priorities=stored_prio, **rows)
        out = np.empty(B, dtype=np.int64)
        out[order] = ids[step_pos]
        return out

    def add(self, stream: int = 0, **row) -> int:
        """One step (a segment of its own: k + 1 rows; insert chunks with ``add_batch`` where you can)."""
        batch = {key: np.asarray(v)[None] for key, v in row.items()}
        return int(self.add_batch(stream=np.array([stream]), **batch)[0])

    # ------------------------------------------------------------------ reading

    def sample(self, batch_size: int, beta: float = 0.4) -> dict:
        """Draw ``batch_size`` steps as the core buffer does (proportionally to priority^alpha, stratified;
        uniformly without priorities) among those whose frames are all stored. Returns ``{field: array[B, ...],
        "indices", "weights"}``; ``obs`` and ``next_obs`` are views of one [B, k + 1, *frame] window array, so they
        share memory (copy one before writing into it)."""
        k = self.stack
        take = self._others or [HIDDEN_FIELD]          # the core returns at least one field
        got = self._buf.sample(batch_size, beta, fields=take)
        win, ok = self._buf.gather_window(got["indices"], self._frame, -(k - 1), 1, out=self._window(batch_size))
        self._keep_window(batch_size, win)
        tries = 0
        while not ok.all():
            tries += 1
            bad = np.flatnonzero(~ok)
            self._hide_cut(got["indices"][bad])
            if tries > MAX_REDRAWS:
                raise RuntimeError(f"sample: {MAX_REDRAWS} redraws still hit steps whose frames were being written")
            more = self._buf.sample(bad.size, beta, fields=take)
            w2, ok2 = self._buf.gather_window(more["indices"], self._frame, -(k - 1), 1)
            for key in (*take, "indices", "weights"):
                got[key][bad] = more[key]
            win[bad] = w2
            ok[bad] = ok2
        out = {key: got[key] for key in self._others}
        if k == 1:
            out[self.obs], out[self.next_obs] = win[:, 0], win[:, 1]
        else:
            out[self.obs], out[self.next_obs] = win[:, :k], win[:, 1:]
        out["indices"], out["weights"] = got["indices"], got["weights"]
        return out

    def _hide_cut(self, ids: np.ndarray) -> None:
        """Hide the steps among ``ids`` whose window the ring has cut for good (their oldest frame's id is older than
        the oldest stored one: ids are never reused, so the window never heals), so that they are not drawn again;
        windows that failed because a writer was copying are left alone."""
        oldest = self._buf.total_added - self._buf.capacity
        cut = ids[ids - (self.stack - 1) < oldest]
        if cut.size:
            self._buf.hide_rows(cut)

    def _window(self, n: int) -> np.ndarray | None:
        """A [n, k + 1, *frame] array of an earlier ``sample`` that no one references any more (no batch, view or
        tensor of a caller) and that is still as it was made, taken out of the pool; None when there is none
        (``gather_window`` allocates). ``list.pop`` is atomic, so two threads never take the same array, and no
        lock is held (a fork cannot leave one locked)."""
        kept = self._pool.get(n)
        for _ in range(len(kept) if kept else 0):
            try:
                arr = kept.pop(0)
            except IndexError:
                return None
            if sys.getrefcount(arr) == 2 and self._still_fits(arr, n):   # ``arr`` and getrefcount's argument
                return arr
            if sys.getrefcount(arr) > 2:
                kept.append(arr)                       # still held by a caller: back in the pool
        return None

    def _still_fits(self, arr: np.ndarray, n: int) -> bool:
        return (arr.shape == (n, self.stack + 1, *self._frame_shape) and arr.dtype == self._frame_dtype
                and arr.flags.c_contiguous and arr.flags.writeable)

    def _keep_window(self, n: int, win: np.ndarray) -> None:
        kept = self._pool.get(n)
        if kept is None:
            if len(self._pool) >= POOL_BATCH_SIZES:
                self._pool.pop(next(iter(self._pool)), None)
            kept = self._pool.setdefault(n, [])
        if len(kept) < POOL_PER_BATCH and not any(a is win for a in kept):
            kept.append(win)

    def __reduce__(self):
        """Pickled as its core buffer (a shared one travels as an attach reference) and its layout."""
        return (_rebuild, (self._buf, self.fields, self.obs, self.next_obs, self.stack))

    def update_priorities(self, indices, priorities) -> int:
        """As the core buffer's (ids of hidden rows are dropped like stale ones); returns the number applied."""
        return self._buf.update_priorities(indices, priorities)

    def get_priorities(self, indices) -> np.ndarray:
        return self._buf.get_priorities(indices)

    def __len__(self) -> int:
        """Stored rows, the hidden context and tail frames included."""
        return len(self._buf)

    def transitions(self) -> int:
        """Stored steps that can be drawn (reads the ``_hidden`` flag of every row: O(capacity))."""
        n = len(self._buf)
        if n == 0:
            return 0
        kinds = self._buf.storage[HIDDEN_FIELD]
        return int(np.count_nonzero(kinds[: min(n, self._buf.capacity)] == STEP))

    @property
    def capacity(self) -> int:
        return self._buf.capacity

    @property
    def shared_name(self):
        return self._buf.shared_name

    # ------------------------------------------------------------------ files and sharing

    def save(self, target) -> None:
        self._buf.save(target)

    @classmethod
    def load(cls, source, fields: dict, obs: str = "obs", next_obs: str = "next_obs", stack: int = 1,
             prioritized: bool = True, **kw) -> FrameReplayBuffer:
        """A buffer saved by ``save``; ``fields``, ``obs``, ``next_obs`` and ``stack`` as it was made with
        (ValueError if the file's fields are not the ones they imply)."""
        core = (PrioritizedReplayBuffer if prioritized else ReplayBuffer).load(source, **kw)
        buf = cls(core.capacity, fields, obs, next_obs, stack, _buffer=core)
        try:
            buf._check_kinds()
        except ValueError:
            core.close()
            raise
        return buf

    @classmethod
    def attach(cls, name: str, fields: dict, obs: str = "obs", next_obs: str = "next_obs", stack: int = 1,
               prioritized: bool = True, seed=None) -> FrameReplayBuffer:
        """A handle on the shared buffer ``name`` made with ``shared=True`` in another process."""
        core = (PrioritizedReplayBuffer if prioritized else ReplayBuffer).attach(name, seed=seed)
        return cls(core.capacity, fields, obs, next_obs, stack, _buffer=core)

    def _check_layout(self) -> None:
        have = {k: (tuple(s), np.dtype(d)) for k, (s, d) in self._buf.fields.items()}
        if have != self._stored:
            self._buf.close()
            raise ValueError(f"not a frame buffer of this layout: it stores {have}, expected {self._stored}")

    def _check_kinds(self) -> None:
        """(load) The rows' kinds, in id order, follow the layout: each segment is ``k - 1`` context rows, one or
        more steps, one tail (a run cut by the ring's oldest edge may be shorter). A file whose ``_hidden`` values
        were edited (a tail made a step, a step a context frame) would otherwise hand back frames that were never
        a step's. ValueError naming the first row that breaks it."""
        core, k = self._buf, self.stack
        lo, hi = max(0, core.total_added - core.capacity), core.total_added
        kinds = np.asarray(core.storage[HIDDEN_FIELD])[np.arange(lo, hi) % core.capacity].astype(np.int64)
        n = len(kinds)
        if n == 0:
            return
        step = (kinds == STEP) | (kinds == HIDDEN_BY_CORE)       # a hidden step was a step
        nxt = np.r_[kinds[1:], -1]
        prev = np.r_[-1, kinds[:-1]]
        bad = ~np.isin(kinds, (STEP, CONTEXT, TAIL, HIDDEN_BY_CORE))
        bad |= step & ~np.isin(nxt, (STEP, TAIL, HIDDEN_BY_CORE))              # a step is followed by a step or tail
        bad |= (kinds == TAIL) & (np.arange(n) > 0) & ~np.isin(prev, (STEP, HIDDEN_BY_CORE))
        after_tail = (CONTEXT,) if k > 1 else (STEP, HIDDEN_BY_CORE)
        bad |= (kinds == TAIL) & (np.arange(n) < n - 1) & ~np.isin(nxt, after_tail)
        if k == 1:
            bad |= kinds == CONTEXT
        else:
            ctx = (kinds == CONTEXT).astype(np.int8)
            edges = np.diff(np.r_[0, ctx, 0])
            starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
            for a, b in zip(starts, ends):
                if (a > 0 and (b - a != k - 1 or kinds[a - 1] != TAIL)) or b >= n or not step[b]:
                    bad[a] = True
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise ValueError(f"the stored rows do not follow the frame layout of stack={k} (transition id "
                             f"{lo + first}, kind {int(kinds[first])}): not a file this buffer wrote, or edited")

    def close(self) -> None:
        self._buf.close()

    def __enter__(self) -> FrameReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rebuild(core, fields, obs, next_obs, stack) -> FrameReplayBuffer:
    return FrameReplayBuffer(core.capacity, fields, obs, next_obs, stack, _buffer=core)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool[n]: row i of ``a`` and of ``b`` hold the same bytes (NaN equal to itself, -0.0 not equal to 0.0)."""
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.bool_)
    a = np.ascontiguousarray(a).reshape(n, -1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(n, -1).view(np.uint8)
    return (a == b).all(axis=1)
