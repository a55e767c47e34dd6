"""What does replaying sequences cost? R2D2's batch: 64 sequences of 80 steps sampled, then their priorities
updated, at 1e5 and 1e6 stored steps (LunarLander fields per step, an LSTM state of 64 per sequence).

- ``pal-seq``: ``SequenceReplayBuffer`` (sequences overlapping by 40 steps, so N stored steps are N / 40
  sequences);
- ``pal-transitions``: PAL's transition buffer sampling and updating the same number of steps (64 x 80 = 5120)
  as single transitions, what a sequence costs against its steps drawn one by one;
- ``rllib-episode``: RLlib 2.60's ``PrioritizedEpisodeReplayBuffer.sample(batch_size_B=64, batch_length_T=80)``
  (filled with 1000-step episodes), then ``update_priorities``; skipped with RLlib's reason where it cannot
  sample sequences;
- ``rllib-episode-uniform``: RLlib 2.60's uniform ``EpisodeReplayBuffer.sample(batch_size_B=64,
  batch_length_T=80)``, the RLlib buffer that does cut sequences (a dict of [64, 80, ...] arrays; a sequence
  that reaches an episode's end goes on into the next episode, marked by ``is_first``); sampling only (it
  has no priorities to update), so a lower bound for what a prioritized sequence buffer built on it would
  cost.

Ids read ``test_sequence_sample_update[N=<steps>-<impl>]``.
"""

import conftest
import numpy as np
import pytest
from conftest import SWEEP, fmt_n

from pal_bench import PrioritizedReplayBuffer
from pal_bench.bench.adapters.base import LUNAR_FIELDS, lunar_batch
from pal_bench.sequence_replay import SequenceReplayBuffer

B, T, OVERLAP, LSTM = 64, 80, 40, 64
IMPLS = ["pal-seq", "pal-transitions", "rllib-episode", "rllib-episode-uniform"]
CASES = [pytest.param(n, impl, id=f"N={fmt_n(n)}-{impl}") for n in (10**5, 10**6) for impl in IMPLS]
STEP_FIELDS = {k: v for k, v in LUNAR_FIELDS.items() if k != "next_obs"}   # a sequence holds each obs once


def _pal_seq(n_steps: int):
    buf = SequenceReplayBuffer(n_steps // (T - OVERLAP), STEP_FIELDS, seq_len=T, lstm_size=LSTM, seed=0)
    rows = lunar_batch(T * 256, seed=1)
    chunk = {k: rows[k].reshape((256, T) + rows[k].shape[1:]) for k in STEP_FIELDS}
    chunk |= {"mask": np.ones((256, T), bool), "obs_valid": np.ones((256, T), bool),
              "h0": np.zeros((256, LSTM), np.float32), "c0": np.zeros((256, LSTM), np.float32)}
    while len(buf) < buf.capacity:
        buf.add_sequences(**chunk)
    prio = np.random.default_rng(0).random(B) + 0.1

    def step():
        s = buf.sample(B, beta=0.4)
        buf.update_priorities(s["indices"], prio)
    return step


def _pal_transitions(n_steps: int):
    buf = PrioritizedReplayBuffer(n_steps, LUNAR_FIELDS, seed=0)
    rows = lunar_batch(8192, seed=1)
    for _ in range(-(-n_steps // 8192)):
        buf.add_batch(**rows)
    prio = np.random.default_rng(0).random(B * T) + 0.1

    def step():
        s = buf.sample(B * T, beta=0.4)
        buf.update_priorities(s["indices"], prio)
    return step


def _rllib_filled(cls, n_steps: int, **kwargs):
    """An RLlib episode buffer of ``cls`` holding ``n_steps`` steps as 1000-step LunarLander episodes."""
    if SWEEP == "quick" and n_steps > 10**5:
        pytest.skip("quick sweep: filling RLlib's episode buffer to 1e6 takes 11-14 s; the full sweep runs it")
    pytest.importorskip("ray.rllib")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    buf = cls(capacity=n_steps, **kwargs)
    rows = lunar_batch(1000, seed=1)
    for _ in range(n_steps // 1000):
        buf.add([SingleAgentEpisode(observations=np.concatenate([rows["obs"], rows["next_obs"][-1:]]),
                                    infos=[{}] * 1001, actions=rows["act"], rewards=rows["rew"], terminated=True,
                                    len_lookback_buffer=0)])
    return buf


def _rllib(n_steps: int):
    pytest.importorskip("ray.rllib")
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

    buf = _rllib_filled(PrioritizedEpisodeReplayBuffer, n_steps, alpha=0.6)
    got = buf.sample(batch_size_B=B, batch_length_T=T, beta=0.4, sample_episodes=True)
    lengths = {len(e) for e in got}
    if lengths != {T}:
        pytest.skip(f"RLlib's PrioritizedEpisodeReplayBuffer returned episodes of lengths {sorted(lengths)} for "
                    f"batch_length_T={T}: it samples single transitions only (its docstring: 'only sequences of "
                    f"length 1 are possible')")
    prio = np.random.default_rng(0).random(B) + 0.1

    def step():
        buf.sample(batch_size_B=B, batch_length_T=T, beta=0.4, sample_episodes=True)
        buf.update_priorities(prio, module_id=DEFAULT_MODULE_ID)
    return step


def _rllib_uniform(n_steps: int):
    pytest.importorskip("ray.rllib")
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    buf = _rllib_filled(EpisodeReplayBuffer, n_steps)
    got = buf.sample(batch_size_B=B, batch_length_T=T)           # a dict of [B, T, ...] arrays
    assert got["obs"].shape[:2] == (B, T), "RLlib's EpisodeReplayBuffer no longer cuts sequences of batch_length_T"

    def step():
        buf.sample(batch_size_B=B, batch_length_T=T)
    return step


BUILD = {"pal-seq": _pal_seq, "pal-transitions": _pal_transitions, "rllib-episode": _rllib,
         "rllib-episode-uniform": _rllib_uniform}


@pytest.mark.parametrize("n_steps, impl", CASES)
def test_sequence_sample_update(benchmark, n_steps, impl):
    try:
        step = BUILD[impl](n_steps)
    except pytest.skip.Exception as e:                  # recorded with its reason in the suite's JSON
        conftest._skipped.append(dict(peer=impl, op="sequence_sample_update", capacity=n_steps, batch=B,
                                      sweep=SWEEP, reason=str(e.msg)))
        raise
    benchmark.extra_info.update(peer=impl, op="sequence_sample_update", batch=B, seq_len=T, capacity=n_steps,
                                sweep=SWEEP)
    benchmark(step)
