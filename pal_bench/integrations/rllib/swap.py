"""Swapping an RLlib algorithm's replay buffer for PAL's after it is built (SAC's config accepts only RLlib's
own buffer names)."""

from __future__ import annotations

from typing import Any

from pal_bench.integrations.rllib.buffer import PALPrioritizedEpisodeReplayBuffer


def replace_replay_buffer(algo: Any, **kwargs: Any) -> PALPrioritizedEpisodeReplayBuffer:
    """Swap ``algo.local_replay_buffer`` for a new ``PALPrioritizedEpisodeReplayBuffer``; call before training.

    For SAC, whose ``SACConfig.validate`` (RLlib 2.60) rejects any buffer ``type`` but RLlib's four own
    names. Constructor arguments: ``algo.config.replay_buffer_config`` (less ``type``), updated by ``kwargs``.
    """
    config = {k: v for k, v in algo.config.replay_buffer_config.items() if k != "type"}
    algo.local_replay_buffer = PALPrioritizedEpisodeReplayBuffer(**{**config, **kwargs})
    return algo.local_replay_buffer
