"""RLlib (ray 2.60, new API stack) drop-in: a prioritized episode replay buffer stored in PAL's Cython buffer.

Use it through the algorithm config, as a dotted string (RLlib 2.60 rejects a class object here)::

    config.training(replay_buffer_config={
        "type": "pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer",
        "capacity": 50_000, "alpha": 0.6, "beta": 0.4,
    })

SAC's config check accepts only RLlib's own buffer names: build SAC with a small RLlib buffer, then swap
it with ``replace_replay_buffer(algo, capacity=...)`` before training.

Layout: each env step of an episode chunk is one PAL row ``(obs, next_obs, action, reward, terminated,
truncated, t)``, with specs inferred from the first episode. Python keeps two int64 arrays indexed by
slot: the transition id of the row's successor in its episode (-1: none yet) and an episode serial
(for metrics). Chunks of one episode may arrive over several ``add`` calls, interleaved with others;
the successor link joins them. The ring overwrites the oldest transitions (RLlib evicts whole
episodes); an n-step walk stops at the episode's end, at a successor not yet added or overwritten.

Modules: ``buffer`` (the buffer and its layout), ``episodes`` (the episode objects ``sample`` returns),
``metrics`` (RLlib's metrics at a fraction of the bookkeeping), ``swap`` (``replace_replay_buffer``).
"""

from pal_bench.integrations.rllib.buffer import PALPrioritizedEpisodeReplayBuffer
from pal_bench.integrations.rllib.swap import replace_replay_buffer

__all__ = ["PALPrioritizedEpisodeReplayBuffer", "replace_replay_buffer"]
