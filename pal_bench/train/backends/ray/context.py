"""Ray-specific helpers of the Ray backend's workers: chunk sizes, the rate slack with chunks in flight,
and weights as numpy arrays for the object store. What a worker rebuilds from the config (algorithm,
spaces, step helpers) is ``pal_bench.train.core.RunCore``, the same for every backend."""

from __future__ import annotations

import math

from pal_bench.train import rate_policy
from pal_bench.train.config import TrainConfig


def max_updates(cfg: TrainConfig) -> int:
    """Learner updates in the whole budget (``rate_policy.max_updates``)."""
    return rate_policy.max_updates(cfg.steps, cfg.learning_starts, cfg.updates_per_step)


def chunk_size(cfg: TrainConfig) -> int:
    """Transitions per actor chunk: ``ray_chunk`` (at least ``local_buffer``) rounded up to whole vector steps."""
    e = cfg.envs_per_actor
    return max(e, math.ceil(max(cfg.ray_chunk, cfg.local_buffer) / e) * e)


def rate_slack(cfg: TrainConfig) -> int:
    """Transitions actors may run ahead of the learners: the thread trainer's slack, and at least
    two chunks per actor so that collection and insertion overlap."""
    return rate_policy.default_slack(cfg, chunk_size(cfg))


def to_numpy(tensors):
    """A state dict (or a list of tensors) as numpy arrays: Ray ships those without pickling them."""
    if isinstance(tensors, dict):
        return {k: v.detach().numpy() for k, v in tensors.items()}
    return [t.detach().numpy() for t in tensors]


def from_numpy(arrays):
    """Back to tensors, sharing the arrays' memory (read-only when they come from the object store:
    the tensors are only read, ``load_state_dict`` and the optimizers copy)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if isinstance(arrays, dict):
            return {k: torch.from_numpy(v) for k, v in arrays.items()}
        return [torch.from_numpy(v) for v in arrays]


def restarted_by_ray() -> bool:
    """True in an actor that Ray restarted after a failure."""
    import warnings

    try:
        import ray

        with warnings.catch_warnings():   # Ray 2.60 reads a deprecated property inside
            warnings.simplefilter("ignore", DeprecationWarning)
            return ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed
    except Exception:   # noqa: BLE001 - outside an actor
        return False


def cpu_share(workers: int) -> float:
    """CPUs per worker when ``workers`` share the cluster's CPUs (at most 1, rounded down to 0.01 so that
    the shares fit)."""
    import ray

    return math.floor(100 * min(1.0, ray.cluster_resources().get("CPU", 1.0) / workers)) / 100
