"""The episode objects the RLlib drop-in's ``sample`` returns: 1-step ``SingleAgentEpisode``s built without
the constructor's per-episode work, and one column episode standing for a whole batch."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from ray.rllib.env import single_agent_episode as _sae
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space


class OneStepEpisodes:
    """Builds the 1-step ``SingleAgentEpisode`` objects ``sample`` returns, about 10x faster than the
    constructor: ``SingleAgentEpisode.__init__`` re-derives the space structure of every lookback
    buffer and validates (~35 µs an episode, most of a 256-batch sample), while these episodes
    all share two spaces whose structures are computed once here. The attributes set are exactly
    the constructor's (RLlib 2.60; tests/test_integration_rllib.py compares both field by field)."""

    def __init__(self, obs_space: Any, act_space: Any):
        self.obs_space, self.act_space = obs_space, act_space
        self._structs = {id(sp): get_base_struct_from_space(sp)
                         for sp in (obs_space, act_space, _sae._REWARDS_BOX_SPACE, None)}
        self._prefix, self._serial = os.urandom(8).hex(), 0

    def _buffer(self, data: list, space: Any) -> InfiniteLookbackBuffer:
        b = InfiniteLookbackBuffer.__new__(InfiniteLookbackBuffer)
        b.data, b.lookback, b.finalized = data, 0, False
        b._space, b._space_struct = space, self._structs[id(space)]
        return b

    def _new(self, cls: type, terminated: bool, truncated: bool):
        """An episode of ``cls`` with the constructor's attributes that do not depend on its data."""
        ep = cls.__new__(cls)
        self._serial += 1
        ep.id_ = f"{self._prefix}{self._serial:016x}"
        ep.agent_id = ep.module_id = ep.multi_agent_episode_id = None
        ep._observation_space, ep._action_space = self.obs_space, self.act_space
        ep.is_terminated, ep.is_truncated = terminated, truncated
        ep._custom_data = {}
        ep._start_time = ep._last_step_time = ep._last_added_observation = ep._last_added_infos = None
        return ep

    def make(self, obs: Any, next_obs: Any, action: Any, reward: float, terminated: bool, truncated: bool,
             weight: float, n_step: int, t_started: int) -> SingleAgentEpisode:
        ep = self._new(SingleAgentEpisode, terminated, truncated)
        ep.observations = self._buffer([obs, next_obs], self.obs_space)
        ep.infos = self._buffer([{}, {}], None)
        ep.actions = self._buffer([action], self.act_space)
        ep.rewards = self._buffer([reward], _sae._REWARDS_BOX_SPACE)
        ep.extra_model_outputs = {"weights": self._buffer([weight], None), "n_step": self._buffer([n_step], None)}
        ep.t_started = t_started
        ep.t = t_started + 1
        return ep

    def columns(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                weights: np.ndarray, n_step: np.ndarray, terminated: bool = False,
                truncated: bool = False) -> ColumnEpisode:
        """One ``ColumnEpisode`` for ``n = len(rewards)`` transitions; only a single transition (n = 1) may end
        its episode (``terminated``/``truncated``), since RLlib reads those flags per episode."""
        ep = self._new(ColumnEpisode, terminated, truncated)
        ep.observations = ep.infos = ep.actions = ep.rewards = None      # read through the getters only
        ep._columns = {"obs": obs, "next_obs": next_obs, "actions": actions, "rewards": rewards,
                       "weights": weights, "n_step": n_step}
        ep.extra_model_outputs = {"weights": None, "n_step": None}       # the keys the connector iterates
        ep.t_started, ep.t = 0, len(rewards)
        return ep


class ColumnEpisode(SingleAgentEpisode):
    """``n`` sampled one-step transitions, none of which ends its episode (or a single one that may), as ONE
    episode object whose getters
    return the batch's columns: what RLlib's learner connectors (``AddObservationsFromEpisodesToBatch``,
    ``AddNextObservationsFromEpisodesToTrainBatch``, ``AddColumnsFromEpisodesToTrainBatch``) read from an
    episode of length ``n`` (observations ``[0, n)`` and ``[1, n + 1)``, actions, rewards and extra model outputs
    ``[0, n)``, and the episode's terminated/truncated flags, which RLlib gives the last step), each as one array
    that RLlib's ``add_n_batch_items`` appends as an already batched item. So a whole batch costs one object
    instead of ``n`` (and the connectors one call per column instead of ``n``). Any other read raises
    ``NotImplementedError`` naming the ``columnar=False`` switch: this is not a trajectory (its "next
    observation" of step i is not the observation of step i + 1)."""

    __slots__ = ("_columns",)

    def _column(self, name: str, indices: Any, lo: int = 0, **unsupported: Any) -> np.ndarray:
        if any(v is not None and v is not False for v in unsupported.values()) or indices != slice(lo, lo + self.t):
            raise NotImplementedError(
                f"a columnar sample of PALPrioritizedEpisodeReplayBuffer answers RLlib's learner-connector reads "
                f"only (got {name} at {indices!r}, options {unsupported}); configure the buffer with "
                f"columnar=False to get one SingleAgentEpisode per sampled transition")
        return self._columns[name]

    def get_observations(self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None,
                         one_hot_discrete: bool = False) -> np.ndarray:
        opts = dict(neg_index_as_lookback=neg_index_as_lookback, fill=fill, one_hot_discrete=one_hot_discrete)
        if indices == slice(1, self.t + 1):
            return self._column("next_obs", indices, lo=1, **opts)
        return self._column("obs", indices, **opts)

    def get_actions(self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None,
                    one_hot_discrete: bool = False) -> np.ndarray:
        return self._column("actions", indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill,
                            one_hot_discrete=one_hot_discrete)

    def get_rewards(self, indices: Any = None, *, neg_index_as_lookback: bool = False,
                    fill: Any = None) -> np.ndarray:
        return self._column("rewards", indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_extra_model_outputs(self, key: str, indices: Any = None, *, neg_index_as_lookback: bool = False,
                                fill: Any = None) -> np.ndarray:
        return self._column(key, indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_infos(self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None) -> list:
        self._column("obs", indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)
        return [{} for _ in range(self.t)]

    @property
    def is_numpy(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"ColumnEpisode({self.t} transitions, terminated={self.is_terminated}, truncated={self.is_truncated})"

    def to_numpy(self) -> ColumnEpisode:
        return self
