"""``PALPrioritizedEpisodeReplayBuffer``: RLlib's prioritized episode buffer with storage and priorities in
PAL's Cython buffer (usage and layout: ``pal_bench.integrations.rllib``)."""

from __future__ import annotations

import io
import os
import tempfile
from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
from ray.rllib.utils.serialization import gym_space_from_dict, gym_space_to_dict

from pal_bench import PrioritizedReplayBuffer
from pal_bench.integrations.rllib.episodes import OneStepEpisodes
from pal_bench.integrations.rllib.metrics import CheapMetricsLogger, metric_kwargs, rows_per_episode

STATE_VERSION = 1


def _field_spec(data: np.ndarray, space: Any) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of one step of ``data`` (array[T, *shape]); a numeric space's dtype wins."""
    if data.dtype.hasobject:
        raise NotImplementedError(f"only array observations/actions can be stored, got {data.dtype} data "
                                  f"(space {space}); Dict/Tuple spaces are not supported")
    dtype = getattr(space, "dtype", None)
    dtype = np.dtype(dtype) if dtype is not None and np.dtype(dtype).kind in "biuf" else data.dtype
    return data.shape[1:], dtype


class PALPrioritizedEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer):
    """``PrioritizedEpisodeReplayBuffer`` with storage and priorities in ``pal_bench.PrioritizedReplayBuffer``.

    Subclasses RLlib's class because DQN/SAC only call ``update_priorities`` on instances of it, but
    does not run its ``__init__`` (which allocates two Python segment trees of 2x capacity).

    Args:
        capacity: transitions (env steps) stored; the oldest are overwritten first.
        alpha: priority exponent in [0, 1]; stored priority is ``(|td_error| + eps) ** alpha``.
        beta: importance-sampling exponent in [0, 1], used when ``sample`` gets ``beta=None``.
        eps: added to every raw priority, so a zero TD error stays sampleable.
        fanout: K of PAL's sum tree.
        seed: seeds PAL's sampling RNG and the n-step draws (None: from the OS).
        columnar: ``sample`` returns the transitions that do not end an episode as one columnar episode
            (``ColumnEpisode``: one object per batch, read by RLlib's learner connectors as whole columns) and
            each one that does as its own 1-step episode; False: one 1-step episode per transition. The train
            batch RLlib builds is the same either way, rows in the order of the returned episodes.
        batch_size_B, batch_length_T, metrics_num_episodes_for_smoothing: as in RLlib.
        **kwargs: other ``replay_buffer_config`` keys, ignored (as RLlib's buffers do).
    """

    def __init__(self, capacity: int = 10000, *, alpha: float = 1.0, beta: float = 0.4, eps: float = 1e-6,
                 fanout: int = 16, seed: int | None = None, batch_size_B: int = 16, batch_length_T: int = 1,
                 metrics_num_episodes_for_smoothing: int = 100, columnar: bool = True, **kwargs: Any):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
        if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1:
            raise ValueError(f"capacity must be a whole number >= 1, got {capacity!r}")
        EpisodeReplayBuffer.__init__(self, capacity=int(capacity), batch_size_B=batch_size_B,
                                     batch_length_T=batch_length_T,
                                     metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing)
        self.metrics = CheapMetricsLogger(root=False)  # RLlib's stats and results, less bookkeeping per value
        self._alpha, self._beta, self._eps, self._fanout, self._seed = float(alpha), float(beta), eps, fanout, seed
        self._columnar = bool(columnar)
        self.rng = np.random.default_rng(seed)
        self._buf: PrioritizedReplayBuffer | None = None  # created by the first add (specs from its data)
        self._obs_space = self._act_space = None
        self._episodes: OneStepEpisodes | None = None
        self._succ = np.full(self.capacity, -1, dtype=np.int64)     # slot -> successor's transition id
        self._episode = np.full(self.capacity, -1, dtype=np.int64)  # slot -> episode serial (-1: empty)
        self._episode_rows: dict[int, int] = {}                     # serial -> live rows
        self._open: dict[str, tuple[int, int]] = {}                 # ongoing episode id -> (serial, last id)
        self._next_serial = 0
        self._last_sampled_ids = np.empty(0, dtype=np.int64)

    # ------------------------------------------------------------------ sizes

    def get_num_timesteps(self, module_id: str | None = None) -> int:
        """Transitions stored."""
        return 0 if self._buf is None else len(self._buf)

    def get_num_episodes(self, module_id: str | None = None) -> int:
        """Episodes with at least one stored transition."""
        return len(self._episode_rows)

    def get_num_episodes_evicted(self, module_id: str | None = None) -> int:
        return self._num_episodes_evicted

    @property
    def pal_buffer(self) -> PrioritizedReplayBuffer | None:
        """The underlying PAL buffer (None before the first ``add``)."""
        return self._buf

    def _oldest_live_id(self) -> int:
        return self._buf.total_added - self.capacity

    # ------------------------------------------------------------------ add

    def _create(self, eps: SingleAgentEpisode, rows: dict[str, np.ndarray]) -> None:
        self._obs_space, self._act_space = eps.observation_space, eps.action_space
        obs_spec = _field_spec(rows["obs"], self._obs_space)
        fields = {"obs": obs_spec, "next_obs": obs_spec, "action": _field_spec(rows["action"], self._act_space),
                  "reward": ((), np.float64), "terminated": ((), np.bool_), "truncated": ((), np.bool_),
                  "t": ((), np.int64)}
        self._buf = PrioritizedReplayBuffer(self.capacity, fields, alpha=self._alpha, fanout=self._fanout,
                                            eps=self._eps, seed=self._seed)

    def add(self, episodes: list[SingleAgentEpisode] | SingleAgentEpisode, weight: float | None = None) -> None:
        """Store every env step of ``episodes`` (chunks; a chunk of an episode seen before continues it).

        ``weight``: initial raw priority of the new transitions (default: the largest seen so far).
        Raises ValueError (nothing stored) if a chunk's data does not match the stored specs.
        """
        chunks = []
        for eps in force_list(episodes):
            n = len(eps)
            if n == 0:
                continue
            obs = np.asarray(eps.get_observations(slice(0, n + 1)))
            act = np.asarray(eps.get_actions(slice(0, n)))
            done = np.zeros(n, dtype=np.bool_)
            chunks.append((eps, {"obs": obs[:-1], "next_obs": obs[1:], "action": act,
                                 "reward": np.asarray(eps.get_rewards(slice(0, n)), dtype=np.float64),
                                 "terminated": done if not eps.is_terminated else np.arange(n) == n - 1,
                                 "truncated": done if not eps.is_truncated else np.arange(n) == n - 1,
                                 "t": eps.t_started + np.arange(n, dtype=np.int64)}))
        if not chunks:
            return
        try:
            rows = (chunks[0][1] if len(chunks) == 1
                    else {k: np.concatenate([c[k] for _, c in chunks]) for k in chunks[0][1]})
        except ValueError as e:
            raise ValueError(f"episode chunks have inconsistent shapes: {e}") from None
        created = self._buf is None
        if created:  # field specs from the first data
            self._create(chunks[0][0], rows)
        prio = None if weight is None else np.full(len(rows["reward"]), weight, dtype=np.float64)
        try:
            ids = self._buf.add_batch(priorities=prio, **rows)  # validates everything before storing
        except (TypeError, ValueError):
            if created:
                self._buf, self._obs_space, self._act_space = None, None, None
            raise
        self._link(chunks, ids)

    def _link(self, chunks: list, ids: np.ndarray) -> None:
        """Successor links, episode serials and metrics for the transitions ``ids`` just added."""
        n_total, oldest = len(ids), self._oldest_live_id()
        succ = ids + 1
        serial = np.empty(n_total, dtype=np.int64)
        links, pos, n_new = [], 0, 0
        for eps, c in chunks:
            n = len(c["reward"])
            known = self._open.pop(eps.id_, None)
            if known is not None and known[1] >= oldest:
                serial[pos:pos + n] = known[0]
                links.append((known[1], ids[pos]))
            else:
                serial[pos:pos + n] = self._next_serial
                self._next_serial += 1
                n_new += 1
            succ[pos + n - 1] = -1
            if not eps.is_done:
                self._open[eps.id_] = (int(serial[pos]), int(ids[pos + n - 1]))
            pos += n
        if ids[0] < oldest:  # more rows than the capacity: only the last ones stay
            live = ids >= oldest
            ids, serial, succ = ids[live], serial[live], succ[live]
        slots = ids % self.capacity
        evicted = rows_per_episode(self._episode[slots].tolist())  # the episodes whose rows these slots held
        evicted_rows, n_evicted = sum(evicted.values()), 0
        for s, k in evicted.items():
            left = self._episode_rows.pop(s) - k
            if left > 0:
                self._episode_rows[s] = left
            else:
                n_evicted += 1
        self._episode[slots] = serial
        self._succ[slots] = succ
        for s, k in rows_per_episode(serial.tolist()).items():
            self._episode_rows[s] = self._episode_rows.get(s, 0) + k
        for prev, nxt in links:
            if prev >= oldest:
                self._succ[prev % self.capacity] = nxt
        self._open = {k: v for k, v in self._open.items() if v[1] >= oldest}
        self._num_timesteps_added += n_total
        self._num_episodes_evicted += n_evicted
        self._update_add_metrics(**metric_kwargs(
            num_episodes_added=n_new, num_env_steps_added=n_total, num_episodes_evicted=n_evicted,
            num_env_steps_evicted=evicted_rows))

    # ------------------------------------------------------------------ sample

    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: int | tuple[int, int] | None = None,
               beta: float | None = None, gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, to_numpy: bool = False, lookback: int = 0,
               min_batch_length_T: int = 0, **kwargs: Any) -> list[SingleAgentEpisode]:
        """Draw ``num_items`` transitions by priority; return them as 1-step ``SingleAgentEpisode`` objects
        (``columnar``, the default: those that do not end an episode together as one columnar episode).

        Each holds observations ``[o_t, o_{t+k}]``, action ``a_t``, reward ``sum_{i<k} gamma^i r_{t+i}``
        and the terminated/truncated flags of step ``t+k-1``, with ``extra_model_outputs`` ``weights``
        (importance weight ``(p_min / p_t) ** beta``, in (0, 1]) and ``n_step`` (= k). ``k`` is
        ``n_step`` (an int; a tuple ``(lo, hi)`` draws it per item from ``rng.integers(lo, hi)``, high
        exclusive, as RLlib does), or fewer where the episode ends or its stored data does (RLlib's
        buffer redraws such items instead). Sequences, infos and extra model outputs are not stored:
        asking for them raises NotImplementedError.
        """
        if (batch_length_T or 0) > 1 or lookback or min_batch_length_T or include_infos or include_extra_model_outputs:
            raise NotImplementedError("PALPrioritizedEpisodeReplayBuffer samples single transitions only: "
                                      "no sequences (batch_length_T/lookback/min_batch_length_T), infos or "
                                      "extra model outputs")
        if num_items is not None and batch_size_B is not None:
            raise ValueError("pass either num_items or batch_size_B, not both")
        B = num_items or batch_size_B or self.batch_size_B
        beta = self._beta if beta is None else beta
        if self._buf is None or len(self._buf) == 0:
            raise ValueError("cannot sample from an empty buffer")
        if isinstance(n_step, (tuple, list)):
            if not 1 <= n_step[0] < n_step[1]:
                raise ValueError(f"n_step range must satisfy 1 <= low < high, got {n_step!r}")
            n = self.rng.integers(n_step[0], n_step[1], size=B)
        elif (n_step or 1) < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step!r}")
        else:
            n = None if (n_step or 1) == 1 else np.full(B, n_step, dtype=np.int64)  # None: 1-step
        out = self._buf.sample(B, beta)
        ids = out["indices"]
        ret, next_obs, k, term, trunc = self._n_step(out, n, gamma)

        self._last_sampled_ids = ids
        if self._episodes is None or self._episodes.obs_space is not self._obs_space:
            self._episodes = OneStepEpisodes(self._obs_space, self._act_space)
        make, obs, act, w, t = self._episodes.make, out["obs"], out["action"], out["weights"], out["t"]
        if self._columnar:
            # the transitions that do not end an episode as one columnar episode, each that does as its own
            # (RLlib takes terminated/truncated per episode); batch rows come in this order, so the ids too
            cols = self._episodes.columns
            done = term | trunc
            columns = (obs, next_obs, act, ret, w, k)
            n_live = B - int(np.count_nonzero(done))
            if n_live < B:  # one gather per column puts the live rows first (in order), then the ends
                order = np.argsort(done, kind="stable")
                columns = tuple(a[order] for a in columns)
                term, trunc, self._last_sampled_ids = term[order], trunc[order], ids[order]
            episodes = [cols(*(a[:n_live] for a in columns))] if n_live else []
            # each end its own 1-step episode: rows of shape (1, ...), views into the gathered columns
            episodes += [cols(*r, te, tr) for *r, te, tr in zip(*(a[n_live:, None] for a in columns),
                                                                   term[n_live:].tolist(), trunc[n_live:].tolist())]
        else:
            episodes = [make(obs[i], next_obs[i], act[i], ret[i], bool(term[i]), bool(trunc[i]), w[i], int(k[i]),
                             int(t[i])) for i in range(B)]
        if to_numpy:
            episodes = [e.to_numpy() for e in episodes]

        self.sampled_timesteps += B
        self._update_sample_metrics(**metric_kwargs(
            num_env_steps_sampled=B, num_episodes_per_sample=len(set(self._episode[ids % self.capacity].tolist())),
            num_env_steps_per_sample=len(set(ids.tolist())), sampled_n_step=1.0 if n is None else float(k.mean()),
            num_resamples=0))
        return episodes

    def _n_step(self, out: dict, n: np.ndarray | None, gamma: float) -> tuple:
        """Walk successor links from the sampled rows for up to ``n - 1`` steps (all B rows at once; ``n`` None:
        1 step for all).

        Returns ``(discounted return float64[B], o_{t+k} array[B, *obs], k int64[B], terminated bool[B],
        truncated bool[B])``.
        """
        if n is None or n.max() <= 1:  # 1-step: the sampled rows as they are (fresh arrays from PAL's sample)
            ones = np.ones(len(out["indices"]), dtype=np.int64)
            return out["reward"], out["next_obs"], ones, out["terminated"], out["truncated"]
        B = len(n)
        ret = out["reward"].astype(np.float64)
        k = np.ones(B, dtype=np.int64)
        cur = out["indices"].copy()
        term, trunc = out["terminated"].copy(), out["truncated"].copy()
        end_id = np.full(B, -1, dtype=np.int64)  # id of the row that ends the walk, if not the sampled one
        oldest = max(self._oldest_live_id(), 0)
        active = np.flatnonzero((k < n) & ~term & ~trunc)
        while active.size:
            nxt = self._succ[cur[active] % self.capacity]
            active, nxt = active[nxt >= oldest], nxt[nxt >= oldest]  # -1 (not added yet) or overwritten: stop
            rows = self._buf.get(nxt, ("reward", "terminated", "truncated"))
            ret[active] += gamma ** k[active] * rows["reward"]
            k[active] += 1
            cur[active], end_id[active] = nxt, nxt
            term[active], trunc[active] = rows["terminated"], rows["truncated"]
            active = active[(k[active] < n[active]) & ~term[active] & ~trunc[active]]
        next_obs = out["next_obs"]
        walked = end_id >= 0
        if walked.any():
            next_obs = next_obs.copy()
            next_obs[walked] = self._buf.get(end_id[walked], "next_obs")["next_obs"]
        return ret, next_obs, k, term, trunc

    # ------------------------------------------------------------------ priorities

    def update_priorities(self, priorities: Any, module_id: str | None = None) -> None:
        """Set the priorities of the last sampled batch to ``priorities`` (float[B] |TD errors|, finite, >= 0).

        Raises ValueError, changing nothing, for a wrong length, NaN, inf or negative values. Updates of
        transitions overwritten since the sample are dropped.
        """
        p = np.asarray(priorities, dtype=np.float64)
        if p.ndim != 1 or len(p) != len(self._last_sampled_ids):
            raise ValueError(f"priorities must have shape ({len(self._last_sampled_ids)},) (the last sampled "
                             f"batch), got {p.shape}")
        self._buf.update_priorities(self._last_sampled_ids, p)  # raises on NaN, inf or < 0, changing nothing
        self._last_sampled_ids = np.empty(0, dtype=np.int64)

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """Picklable state: PAL's arrays (transitions, priorities, slot table, RNG), links and counters."""
        state: dict[str, Any] = {
            "version": STATE_VERSION, "pal": None,
            "succ": self._succ.copy(), "episode": self._episode.copy(),
            "episode_rows": np.array(sorted(self._episode_rows.items()), dtype=np.int64).reshape(-1, 2),
            "open_ids": np.array(list(self._open), dtype=str),
            "open": np.array(list(self._open.values()), dtype=np.int64).reshape(-1, 2),
            "last_sampled_ids": self._last_sampled_ids.copy(),
            "counters": np.array([self._next_serial, self._num_timesteps_added, self.sampled_timesteps,
                                  self._num_episodes_evicted], dtype=np.int64),
            "rng": self.rng.bit_generator.state,
            "spaces": [None if s is None else gym_space_to_dict(s) for s in (self._obs_space, self._act_space)],
            "columnar": self._columnar,
        }
        if self._buf is not None:
            with tempfile.TemporaryDirectory() as d:  # PAL's save writes to a path only
                path = os.path.join(d, "buffer.npz")
                self._buf.save(path)
                with np.load(path) as npz:
                    state["pal"] = {k: npz[k] for k in npz.files}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a ``get_state`` result (capacity, alpha and ``columnar`` come from the state)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported PALPrioritizedEpisodeReplayBuffer state version {state.get('version')!r}")
        buf = None
        if state["pal"] is not None:
            raw = io.BytesIO()
            np.savez(raw, **state["pal"])
            raw.seek(0)
            buf = PrioritizedReplayBuffer.load(raw)
            if buf.capacity != len(state["succ"]):
                raise ValueError("inconsistent state: PAL buffer and link arrays differ in capacity")
            self._alpha, self._eps, self._fanout = buf.alpha, buf.eps, buf.fanout
        self._buf = buf
        self.capacity = len(state["succ"])
        self._succ, self._episode = state["succ"].copy(), state["episode"].copy()
        self._episode_rows = {int(s): int(c) for s, c in state["episode_rows"]}
        self._open = {str(e): (int(s), int(i)) for e, (s, i) in zip(state["open_ids"], state["open"])}
        self._last_sampled_ids = state["last_sampled_ids"].copy()
        (self._next_serial, self._num_timesteps_added, self.sampled_timesteps,
         self._num_episodes_evicted) = (int(c) for c in state["counters"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self._obs_space, self._act_space = (None if s is None else gym_space_from_dict(s) for s in state["spaces"])
        self._columnar = bool(state.get("columnar", self._columnar))
