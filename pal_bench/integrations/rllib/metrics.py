"""RLlib's ``MetricsLogger`` with the same stats and results, at a fraction of the bookkeeping.

RLlib 2.60's DQN and SAC call the replay buffer's ``get_metrics()`` (``MetricsLogger.reduce()``) after every
sample, and the buffer's ``add``/``sample`` log about 50 values per training step through ``log_value``. Both
spend most of their time outside the statistics: ``log_value`` flattens and walks the key for every value
(``tree.flatten``, ``_key_in_stats``, ``_get_key``), and ``reduce`` walks the nested dict with dm-tree's
``map_structure_with_path`` (two thirds of its time). ``CheapMetricsLogger`` keeps RLlib's own ``Stats``
objects and calls: a key already logged pushes straight into its ``Stats`` (what ``log_value`` does for an
existing key: settings passed again are ignored there too), and ``reduce`` walks the plain nested dicts
itself, calling each ``Stats.reduce`` as RLlib's does. And a windowed mean holding one plain number (the
usual case: the buffer logs once between two reduces) reduces to ``np.float64(x)``, which is what
``np.nanmean([x])`` returns, without numpy's 20 µs of array checks (``_OneValueMean``). The results are
equal, key for key, class for class and value for value (tests/test_integration_rllib.py replays a
buffer's logging through both and aggregates them into a root logger each).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics.metrics_logger import DEFAULT_STATS_CLS_LOOKUP, MetricsLogger
from ray.rllib.utils.metrics.stats.base import StatsBase
from ray.rllib.utils.metrics.stats.mean import MeanStats

_DEPRECATED = frozenset({"clear_on_reduce", "throughput_ema_coeff", "reduce_per_index_on_aggregate"})


class _OneValueMean(MeanStats):
    """RLlib's ``MeanStats`` for a logger's own (leaf) stats: one plain ``float``/``int`` (exactly representable,
    not NaN) reduces to ``np.float64(x)`` directly; anything else goes through RLlib's ``window_reduce``. Its
    clones (what ``reduce`` returns, what a root logger aggregates into) are RLlib's own ``MeanStats``."""

    def window_reduce(self, values: Any = None) -> list:
        vals = self.values if values is None else values
        if len(vals) == 1:
            x = vals[0]
            if (type(x) is float and x == x) or (type(x) is int and -(2**53) <= x <= 2**53):
                return [np.float64(x)]
        return super().window_reduce(values)

    def clone(self, init_overrides: dict[str, Any] | None = None) -> MeanStats:
        args = self._get_init_args(stats_object=self)
        args.update(init_overrides or {})
        return MeanStats(**args)


class CheapMetricsLogger(MetricsLogger):
    """``MetricsLogger`` with a per-key cache of leaf ``Stats`` for ``log_value`` and a plain-dict ``reduce``.

    The cache is dropped whenever the stats structure changes (a new key, ``delete``, ``reset``,
    ``set_state``, an aggregation), so a cached ``Stats`` is always the one stored under its key.
    """

    def __init__(self, root: bool = False) -> None:
        super().__init__(root=root, stats_cls_lookup={**DEFAULT_STATS_CLS_LOOKUP, "mean": _OneValueMean})
        self._leaf_of: dict[Any, StatsBase] = {}

    def log_value(self, key: Any, value: Any, **kwargs: Any) -> None:
        try:
            stats = self._leaf_of.get(key)
        except TypeError:  # an unhashable key (a list): RLlib's path
            return super().log_value(key, value, **kwargs)
        if stats is not None and _DEPRECATED.isdisjoint(kwargs):
            stats.push(value)
            return
        super().log_value(key, value, **kwargs)
        stats = self._get_key(key, key_error=False)
        if isinstance(stats, StatsBase):
            self._leaf_of[key] = stats

    def reduce(self, compile: bool = False) -> dict:
        """``MetricsLogger.reduce``: every ``Stats`` reduced in place, the nested dict of their results."""

        def walk(node: dict, path: tuple) -> dict:
            out = {}
            for key, value in node.items():
                if isinstance(value, dict):
                    out[key] = walk(value, path + (key,))
                    continue
                try:
                    out[key] = value.reduce(compile=compile)
                except Exception as e:  # as RLlib words it
                    raise ValueError(f"Error reducing stats {value} with compile={compile} at path "
                                     f"{path + (key,)}.") from e
            return out

        with self._threading_lock:
            return walk(self.stats, ())

    def _set_key(self, flat_key: Any, stats: Any) -> None:
        self._leaf_of.clear()
        super()._set_key(flat_key, stats)

    def _del_key(self, flat_key: Any, key_error: bool = False) -> None:
        self._leaf_of.clear()
        super()._del_key(flat_key, key_error=key_error)

    def reset(self) -> None:
        self._leaf_of.clear()
        super().reset()

    def set_state(self, state: dict[str, Any]) -> None:
        self._leaf_of.clear()
        super().set_state(state)


def rows_per_episode(serials: list[int]) -> dict[int, int]:
    """Rows per episode serial, ignoring negative (empty-slot) ones: a few rows per call, where ``np.unique``
    costs ~15 µs and ``Counter``'s constructor ~15 µs cold inside a training loop."""
    out: dict[int, int] = {}
    for s in serials:
        if s >= 0:
            out[s] = out.get(s, 0) + 1
    return out


def metric_kwargs(**totals: float) -> dict[str, Any]:
    """RLlib's ``_update_*_metrics`` arguments: each total plus its ``agent_to_*``/``module_to_*`` dicts."""
    out: dict[str, Any] = dict(totals)
    for key, value in totals.items():
        key = key.replace("num_env_steps", "num_steps")
        out[f"agent_to_{key}"] = {DEFAULT_AGENT_ID: value}
        out[f"module_to_{key}"] = {DEFAULT_MODULE_ID: value}
    return out
