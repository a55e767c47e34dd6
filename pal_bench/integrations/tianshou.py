"""tianshou 2.0.1 prioritized replay on PAL's K-ary ``SumTree``.

``PALPrioritizedReplayBuffer`` and ``PALPrioritizedVectorReplayBuffer`` subclass tianshou's
``PrioritizedReplayBuffer`` and ``PrioritizedVectorReplayBuffer``: storage, sampling and priority
semantics are tianshou's; only ``self.weight``, tianshou's numpy/numba ``SegmentTree``, becomes a
``PALSegmentTree`` (the same interface on a ``SumTree``). As in tianshou, a leaf holds
``(|w| + eps) ** alpha`` for the last ``w`` given to ``update_weight`` (new slots get
``max_prio ** alpha``), ``_max_prio`` / ``_min_prio`` are running extremes of ``|w| + eps`` (both
start at 1.0), ``get_weight`` is ``(leaf / _min_prio) ** -beta``, and ``sample_indices`` draws its
uniforms from the global ``np.random`` (not ``self._random_state``), so equal seeds give equal
samples. The vector buffer keeps one tree over all its sub-buffers, the sub-buffers none.

Where tianshou 2.0.1 is wrong, these classes differ from it:

- ``update_weight`` validates before changing anything: a non-finite weight or a length mismatch
  raises ``ValueError``, a slot out of range ``IndexError`` (tianshou writes NaN/inf into its tree,
  or asserts). Negative weights are signed TD errors: tianshou, and so this, takes ``|w|``.
- ``reset`` zeroes the priorities (tianshou keeps them, so it keeps sampling the old slots).
- the vector buffer honours ``weight_norm`` and ``set_beta`` (tianshou's manager ignores both: its
  own ``weight_norm`` is always True, and ``set_beta`` only reaches the sub-buffers).
- bad ``alpha`` / ``beta`` raise ``ValueError`` (tianshou asserts).

Both classes read a batch (``buffer[indices]``, and so ``sample``) in one compiled gather without
tianshou's per-key parsing, the vector buffer's ``add`` writes a collector's batch in one compiled row
copy, ``update_weight`` computes ``|w| + eps`` with its extremes in one pass, ``sample_indices`` draws
``np.random.rand(B) * total`` in one call, ``get_weight`` divides the leaves by ``_min_prio`` in place,
and both powers (``** alpha``, ``** -beta``) call numpy's own power loop for the dtype directly (SIMD
code on some CPUs, which can differ from libm's ``pow`` by an ulp, so not a C ``pow``); all in
``pal_bench._dropin``, and only where the result is provably tianshou's (frame stack 1, plain numeric
arrays of the stored dtypes; anything else takes tianshou's own code): same storage, episode
bookkeeping, return values, batches and priorities, bit for bit (tested).

Neither class builds tianshou's ``SegmentTree``, so neither pays its numba compilation (seconds;
the vector buffer still compiles tianshou's numba index helpers, as ``VectorReplayBuffer`` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from tianshou.data import Batch, PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer, ReplayBuffer, to_numpy
from tianshou.data.buffer.manager import ReplayBufferManager

from pal_bench import DEFAULT_FANOUT, SumTree
from pal_bench._dropin import (
    abs_plus_eps,
    divide_by,
    divide_by_max,
    either,
    match_columns,
    power_of,
    put_rows,
    take_numeric_columns,
    uniforms_times,
)

if TYPE_CHECKING:
    import torch

__all__ = ["PALPrioritizedReplayBuffer", "PALPrioritizedVectorReplayBuffer", "PALSegmentTree"]

_EPS = np.finfo(np.float32).eps.item()  # tianshou's floor on |w|, so no slot gets priority 0
_RESERVED = frozenset(ReplayBuffer._reserved_keys)
_GATHERED = frozenset(("obs", "act", "rew", "terminated", "truncated", "done"))  # always stored
_GLOBAL_RANDOM = np.random.rand.__self__  # the RandomState behind np.random.rand, whose draws tianshou samples with
_WIDENED = (float, np.float64, np.float32)  # a float64 array divided by one of these stays float64


def _next_slot(buffer: ReplayBuffer, rew: Any, done: Any) -> tuple[int, Any, int, int]:
    """``buffer._update_state_pre_add(rew, done)`` (tianshou 2.0.1) without its ``__setattr__``
    checks: the slot the next row goes to, and the episode's return, length (0, 0 unless ``done``)
    and start slot; advances the slot and the episode."""
    state = buffer.__dict__
    slot, size = state["_insertion_idx"], min(state["_size"] + 1, buffer.maxsize)
    if state["_ep_start_idx"] > size:
        return buffer._update_state_pre_add(rew, done)  # raises tianshou's MalformedBufferError
    buffer.last_index[0] = slot
    state["_size"], state["_insertion_idx"] = size, (slot + 1) % buffer.maxsize
    state["_ep_return"] += rew
    state["_ep_len"] += 1
    start = state["_ep_start_idx"]
    if not done:  # np.zeros_like(ep_return): a numpy scalar's own zero goes into np.array() the same
        ep_return = state["_ep_return"]
        return slot, type(ep_return)(0) if isinstance(ep_return, np.number) else np.zeros_like(ep_return), 0, start
    ep_return, ep_len = state["_ep_return"], state["_ep_len"]
    state["_ep_return"], state["_ep_len"], state["_ep_start_idx"] = 0.0, 0, state["_insertion_idx"]
    return slot, ep_return, ep_len, start


class PALSegmentTree:
    """tianshou's ``SegmentTree`` interface (sum and prefix-sum search) on PAL's ``SumTree``.

    One float64 leaf per buffer slot. Unlike ``SumTree`` it pickles (as its leaves, rebuilt on
    load), so the buffers holding it pickle, deep-copy and ``save_hdf5``.
    """

    def __init__(self, size: int, fanout: int = DEFAULT_FANOUT) -> None:
        self.tree = SumTree(size, fanout)

    def __len__(self) -> int:
        return self.tree.capacity

    def __getitem__(self, index: int | np.ndarray) -> float | np.ndarray:
        """Leaves at ``index`` (an int, or ints of any shape; negative counts from the end)."""
        if type(index) is np.ndarray and index.ndim == 1:  # a batch of slots: SumTree checks the range in C
            try:
                return self.tree.get(index)
            except (IndexError, TypeError):
                pass  # negative slots count from the end; anything else raises below as it would
        idx = np.asarray(index)
        idx = np.where(idx < 0, idx + len(self), idx)
        out = self.tree.get(idx.reshape(-1)).reshape(idx.shape)
        return out[()] if out.ndim == 0 else out

    def __setitem__(self, index: int | np.ndarray, value: float | np.ndarray) -> None:
        """Set leaves ``index`` to ``value`` (finite, >= 0, broadcast to ``index``'s shape).

        Last write wins for repeated indices. Invalid input raises and changes nothing.
        """
        if type(index) is np.ndarray and index.ndim == 1:  # SumTree validates both
            if (type(value) is np.ndarray and value.shape == index.shape) or isinstance(value, float | np.floating):
                self.tree.update(index, value)  # one float: every slot of the batch (init_weight)
                return
        idx = np.asarray(index).reshape(-1)
        val = np.empty(np.shape(index), dtype=np.float64)
        val[...] = value  # broadcasts, or raises ValueError
        self.tree.update(idx, val.reshape(-1))

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """Sum of ``leaves[start:end]``; O(1) for all leaves, else O(end - start)."""
        if start == 0 and end is None:
            return self.tree.total()
        return float(self.tree.get(np.arange(len(self))[start:end]).sum())

    def get_prefix_sum_idx(self, value: float | np.ndarray) -> int | np.ndarray:
        """Leaf ``i`` with ``prefix(i) <= v < prefix(i) + leaf(i)`` for each ``v`` in ``value``
        (in ``[0, total]``; any shape) -> int or int64 array. Zero leaves are never returned."""
        if type(value) is np.ndarray and value.ndim == 1:  # a batch: SumTree converts it if needed
            return self.tree.find(value)
        v = np.asarray(value, dtype=np.float64)
        out = self.tree.find(v.reshape(-1)).reshape(v.shape)
        return int(out) if v.ndim == 0 else out

    def min_nonzero(self) -> float:
        """Smallest non-zero leaf (``inf`` if none), O(1)."""
        return self.tree.min_nonzero()

    def clear(self) -> None:
        """Set every leaf to 0."""
        self.tree = SumTree(len(self), self.tree.fanout)

    def __getstate__(self) -> dict[str, Any]:
        return {"fanout": self.tree.fanout, "leaves": self.tree.leaves()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        leaves = np.asarray(state["leaves"], dtype=np.float64)
        self.tree = SumTree(leaves.size, int(state["fanout"]))
        self.tree.update(np.arange(leaves.size), leaves)

    def __repr__(self) -> str:
        return f"PALSegmentTree({self.tree!r})"


class _PALPriorities:
    """What both PAL buffers change in tianshou's ``PrioritizedReplayBuffer``.

    ``init_weight``, ``get_weight``, ``add``, ``update`` and ``__getitem__`` (the batch's
    ``weight``) are tianshou's own: they reach the priorities only through ``self.weight[...]``.
    """

    weight: PALSegmentTree
    options: dict[str, Any]
    _alpha: float
    _beta: float
    _max_prio: float
    _min_prio: float
    _weight_norm: bool

    def _init_priorities(self, size: int, alpha: float, beta: float, weight_norm: bool, fanout: int) -> None:
        """The part of tianshou's ``PrioritizedReplayBuffer.__init__`` after ``ReplayBuffer.__init__``."""
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if not beta >= 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._alpha, self._beta = alpha, beta
        self._max_prio = self._min_prio = 1.0
        self.weight = PALSegmentTree(size, fanout)
        self.options.update(alpha=alpha, beta=beta)
        self._weight_norm = weight_norm

    def update_weight(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor) -> None:
        """Set the priority of slots ``index`` (int[B]) from ``new_weight`` (float[B], e.g. signed
        TD errors): leaf = ``(|w| + eps) ** alpha``.

        Raises ``ValueError`` (non-finite weight, length mismatch) or ``IndexError`` (slot out of
        range) and then changes nothing.
        """
        idx = index if type(index) is np.ndarray and index.ndim == 1 else np.asarray(index).reshape(-1)
        raw = to_numpy(new_weight)
        fast = abs_plus_eps(raw, _EPS)  # float32/64[B]: tianshou's np.abs(w) + eps, its min and max, in one pass
        if fast is not None:
            weight, low, high = fast
        else:
            weight = np.abs(raw)
            weight = (weight if weight.ndim == 1 else weight.reshape(-1)) + _EPS  # same dtype and rounding
            low, high = (weight.min(), weight.max()) if weight.size else (None, None)
        if weight.shape != idx.shape:
            raise ValueError(f"{idx.size} indices but {weight.size} weights")
        if idx.size == 0:
            return
        if not high < np.inf:  # NaN or inf
            raise ValueError("new_weight must be finite")
        leaf = power_of(weight, self._alpha)  # numpy's own power loop, called directly
        self.weight[idx] = weight**self._alpha if leaf is None else leaf  # validates first (indices; leaves finite)
        if high > self._max_prio:  # tianshou's max(_max_prio, high) and min(_min_prio, low), the same objects
            self._max_prio = high
        if low < self._min_prio:
            self._min_prio = low

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """``batch_size`` slots (int64[batch_size]), each drawn with probability leaf / total;
        ``0`` or ``None``: all valid slots, as tianshou."""
        if batch_size is not None and batch_size > 0 and len(self) > 0:  # np.random.rand(B) * total, in one call
            return self.weight.get_prefix_sum_idx(uniforms_times(_GLOBAL_RANDOM, batch_size, self.weight.reduce()))
        return super().sample_indices(batch_size)

    def get_weight(self, index: int | np.ndarray) -> float | np.ndarray:
        """tianshou's importance weights ``(leaf / _min_prio) ** -beta`` of slots ``index``; for a batch of
        slots the division runs in place in one compiled pass."""
        leaf = self.weight[index]
        if type(self._min_prio) in _WIDENED and divide_by(leaf, self._min_prio) is not None:
            weight = power_of(leaf, -self._beta)  # numpy's own power loop, called directly
            return leaf ** (-self._beta) if weight is None else weight
        return (leaf / self._min_prio) ** (-self._beta)

    def __getitem__(self, index: Any) -> Batch:
        """tianshou's batch of rows ``index`` with their importance weights (``weight``, float64[B]).

        For int64 indices in range, frame stack 1 and stored columns that are numeric arrays or batches, it
        gathers the arrays in one compiled call (what ``ReplayBuffer.__getitem__`` does, less its per-key
        ``get`` and ``Batch`` parsing); anything else goes through tianshou's code.
        """
        stored = self._meta.__dict__
        got = take_numeric_columns(stored, index, Batch) if self.stack_num == 1 else None
        if got is None or not _GATHERED <= got.keys():
            return super().__getitem__(index)  # rows of plain columns are plain: Batch() would not parse them
        if self._save_obs_next:
            obs_next = got["obs_next"] if "obs_next" in got else Batch()
        else:
            obs_next = stored["obs"][self.next(index)]
        rows = {"obs": got["obs"], "act": got["act"], "rew": got["rew"], "terminated": got["terminated"],
                "truncated": got["truncated"], "done": got["done"], "obs_next": obs_next,
                "info": got["info"] if "info" in got else Batch(),
                "policy": got["policy"] if "policy" in got else Batch()}
        for key in stored.keys() - self._input_keys:
            rows[key] = got[key]
        batch = Batch()
        batch.__dict__.update(rows)
        weight = self.get_weight(index)
        if self._weight_norm:
            normed = divide_by_max(weight)  # in place: weight is get_weight's own new array
            weight = weight / weight.max() if normed is None else normed
        batch.__dict__["weight"] = weight
        return batch

    def reset(self, keep_statistics: bool = False) -> None:
        """Clear the data, as tianshou, and the priorities, which tianshou keeps."""
        super().reset(keep_statistics=keep_statistics)
        if "weight" in vars(self):  # sub-buffers of a vector buffer have none: the manager's tree covers them
            self.weight.clear()


class PALPrioritizedReplayBuffer(_PALPriorities, PrioritizedReplayBuffer):
    """tianshou's ``PrioritizedReplayBuffer`` with its priorities in PAL's ``SumTree``.

    :param size: capacity, in transitions.
    :param alpha: prioritisation exponent (> 0).
    :param beta: importance-sampling exponent (>= 0).
    :param weight_norm: divide a batch's weights by their maximum.
    :param fanout: the sum tree's K (children per node).
    :param kwargs: ``ReplayBuffer``'s (stack_num, ignore_obs_next, save_only_last_obs, sample_avail, random_seed).
    """

    def __init__(
        self,
        size: int,
        alpha: float,
        beta: float,
        weight_norm: bool = True,
        *,
        fanout: int = DEFAULT_FANOUT,
        **kwargs: Any,
    ) -> None:
        # skips PrioritizedReplayBuffer.__init__, which builds (and numba-compiles) a SegmentTree
        ReplayBuffer.__init__(self, size, **kwargs)
        self._init_priorities(size, alpha, beta, weight_norm, fanout)


class PALPrioritizedVectorReplayBuffer(_PALPriorities, PrioritizedVectorReplayBuffer):
    """tianshou's ``PrioritizedVectorReplayBuffer`` with its priorities in PAL's ``SumTree``.

    ``buffer_num`` sub-buffers of ``ceil(total_size / buffer_num)`` transitions each; one tree over
    all of them, indexed by global slot (sub-buffer ``i`` starts at ``i * ceil(total_size / buffer_num)``).

    :param total_size: total capacity, in transitions.
    :param buffer_num: number of sub-buffers (one per environment).
    :param alpha, beta, weight_norm, fanout, kwargs: as ``PALPrioritizedReplayBuffer``.
    """

    def __init__(
        self,
        total_size: int,
        buffer_num: int,
        alpha: float,
        beta: float,
        weight_norm: bool = True,
        *,
        fanout: int = DEFAULT_FANOUT,
        **kwargs: Any,
    ) -> None:
        if buffer_num <= 0:
            raise ValueError(f"buffer_num must be > 0, got {buffer_num}")
        size = int(np.ceil(total_size / buffer_num))
        buffers = [PALPrioritizedReplayBuffer(size, alpha, beta, weight_norm, fanout=fanout, **kwargs)
                   for _ in range(buffer_num)]
        ReplayBufferManager.__init__(self, buffers)
        for buf in buffers:  # as tianshou's PrioritizedReplayBufferManager: only the manager has a tree
            del buf.weight
        self._init_priorities(self.maxsize, alpha, beta, weight_norm, fanout)

    def add(self, batch: Batch, buffer_ids: np.ndarray | list[int] | None = None,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """tianshou's ``add``: one row of ``batch`` per sub-buffer in ``buffer_ids`` (default: all),
        each new slot at priority ``max_prio ** alpha``; returns (slots, episode returns, episode
        lengths, episode start slots), returns and lengths 0 for unfinished episodes.

        When every stored key arrives as a numeric array of the stored dtype and row shape (a
        collector's batch after the first), the rows are copied in one compiled call; else, and for
        bad input, tianshou's ``ReplayBufferManager.add`` runs.
        """
        given = batch.__dict__ if type(batch) is Batch else {}
        new = {key: value for key, value in given.items() if key in _RESERVED}
        if (self._save_only_last_obs or type(new.get("terminated")) is not np.ndarray
                or type(new.get("truncated")) is not np.ndarray):
            return super().add(batch, buffer_ids)
        done = either(new["terminated"], new["truncated"])  # np.logical_or of two bool[B], in one call
        new["done"] = np.logical_or(new["terminated"], new["truncated"]) if done is None else done
        if not self._save_obs_next:
            new.pop("obs_next", None)
        ids = range(self.buffer_num) if buffer_ids is None else buffer_ids
        writes = match_columns(self._meta.__dict__, new, len(ids), Batch)  # checks, writes nothing
        if writes is None:
            return super().add(batch, buffer_ids)
        slots, returns, lengths, starts = [], [], [], []
        rew, done = new["rew"], new["done"]
        for row, buffer_id in enumerate(ids):
            slot, ep_return, ep_len, ep_start = _next_slot(self.buffers[buffer_id], rew[row], done[row])
            offset = self._offset[buffer_id]
            slots.append(slot + offset)
            returns.append(ep_return)
            lengths.append(ep_len)
            starts.append(ep_start + offset)
            self.last_index[buffer_id] = slot + offset
            self._lengths[buffer_id] = len(self.buffers[buffer_id])
        index = np.array(slots, dtype=np.int64)
        put_rows(writes, index)
        self.init_weight(index)
        return index, np.array(returns), np.array(lengths), np.array(starts)

    def __len__(self) -> int:
        """Transitions in all sub-buffers: tianshou's ``int(self._lengths.sum())`` without a numpy reduction."""
        return sum(self._lengths.tolist())

    def set_beta(self, beta: float) -> None:
        """Set beta here (which ``get_weight`` uses; tianshou 2.0.1 forgets it) and in the sub-buffers."""
        super().set_beta(beta)
        self._beta = beta
