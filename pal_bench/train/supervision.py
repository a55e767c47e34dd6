"""What the driver decides about its workers, the same on every backend: how often a dead worker is restarted,
and the seeds each actor incarnation steps its environments and draws its exploration with.

Seeds come from the run's seed, the actor, its incarnation (0 for the first process or thread, +1 for each
restart) and the env steps the run had when it resumed, so that a restarted actor or a resumed run does not
replay the episodes of the one before it, and a run made again with the same seed makes the same ones. Nothing of
an actor's random state is checkpointed: it is derived again.
"""

from __future__ import annotations

import numpy as np

MAX_RESTARTS = 5            # per worker: more deaths than this end the run (ActorGaveUp, or the Ray backend's error)


def actor_rng(seed: int, actor: int, incarnation: int = 0, resumed_steps: int = 0) -> np.random.Generator:
    """The generator of an actor's exploration (epsilon draws, random actions); a first incarnation of a fresh run
    draws what the thread backend always drew ([seed, actor])."""
    later = [incarnation, resumed_steps] if incarnation or resumed_steps else []
    return np.random.default_rng([seed, actor, *later])


def env_seeds(seed: int, actor: int, envs: int, incarnation: int = 0, resumed_steps: int = 0) -> list[int]:
    """The reset seeds of an actor's ``envs`` environments."""
    return [seed * 100_003 + actor * envs + i + resumed_steps + 7919 * incarnation for i in range(envs)]
