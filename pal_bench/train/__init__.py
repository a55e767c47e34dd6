"""The parallel actor / learner / parameter-server trainer, on threads, processes or Ray (``backends/``);
``make_trainer`` picks the backend of a config."""

from pal_bench.train.backends.threads import Trainer
from pal_bench.train.config import ConfigError, TrainConfig, make_config, validate
from pal_bench.train.driver import WorkerError
from pal_bench.train.envs import register as _register_envs

_register_envs()


def make_trainer(cfg: TrainConfig, resume: bool = False, overwrite: bool = False) -> Trainer:
    """``Trainer`` for ``cfg.backend == "threads"``, ``ProcessTrainer`` (pal_bench.train.backends.processes) for
    "processes", for "ray" ``RayNodeTrainer`` (pal_bench.train.backends.ray.node; ``cfg.placement`` "node", the
    default) or ``RayTrainer`` (pal_bench.train.backends.ray; "pack" or "spread"), and the registered topology's
    trainer (``pal_bench.train.topology``) for any ``cfg.topology`` but "local". ``resume``: continue the run in
    ``cfg.run_dir()`` from its checkpoint; ``overwrite``: replace a run already there (refused otherwise)."""
    if cfg.topology != "local":
        from pal_bench.train import topology

        return topology.get(cfg.topology).trainer(cfg, resume=resume)
    if cfg.backend == "ray" and cfg.placement == "node":
        from pal_bench.train.backends.ray.node import RayNodeTrainer

        return RayNodeTrainer(cfg, resume=resume, overwrite=overwrite)
    if cfg.backend == "ray":
        from pal_bench.train.backends.ray import RayTrainer

        return RayTrainer(cfg, resume=resume, overwrite=overwrite)
    if cfg.backend == "processes":
        from pal_bench.train.backends.processes import ProcessTrainer

        return ProcessTrainer(cfg, resume=resume, overwrite=overwrite)
    return Trainer(cfg, resume=resume, overwrite=overwrite)


__all__ = ["ConfigError", "TrainConfig", "Trainer", "WorkerError", "make_config", "make_trainer", "validate"]
