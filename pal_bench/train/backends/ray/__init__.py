"""The trainer on Ray: actors, learners, the replay buffer and the parameter server as Ray actors,
on one machine (a local Ray started for the run) or on a cluster (``ray_address``).

Same config, algorithms, rate control, logs, checkpoints and per-phase profile as the thread
backend (``pal_bench.train.backends.threads``); the profile adds ``serialize`` and ``transport``.
See ``trainer`` (driver, failures, placement), ``buffer_actor`` (replay, rate control, buffer
checkpoints), ``ps_actor`` (aggregation, weight publishing), ``transport`` (what the shared actor and
learner loops are handed on Ray) and ``workers`` (the Ray actors that run those loops).
"""

from pal_bench.train.backends.ray.trainer import RayTrainer

__all__ = ["RayTrainer"]
