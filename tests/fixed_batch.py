"""The fixed batch the race's loss tests feed every framework: two LunarLander-shaped episodes ending differently
(terminated, truncated), 16 transitions, random but fixed by the generator given."""

from __future__ import annotations

import numpy as np

OBS, ACTIONS = 8, 4
EPISODES = ((7, "terminated"), (9, "truncated"))   # two episodes ending differently: 16 transitions


def episodes(rng: np.random.Generator) -> list[list[tuple]]:
    """[(obs, act, rew, next_obs, terminated, truncated)] per episode of ``EPISODES``."""
    out = []
    for length, end in EPISODES:
        obs = rng.normal(size=(length + 1, OBS)).astype(np.float32)
        out.append([(obs[t], int(rng.integers(ACTIONS)), float(rng.normal()), obs[t + 1],
                     t == length - 1 and end == "terminated", t == length - 1 and end == "truncated")
                    for t in range(length)])
    return out
