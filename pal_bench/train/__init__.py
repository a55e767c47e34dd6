"""The parallel actor / learner / parameter-server trainer, on threads, processes or Ray (``backends/``);
``make_trainer`` picks the backend of a config.

``Trainer`` and ``WorkerError`` are imported when first asked for (PEP 562): importing the config alone (the CLI's
argument parsing, a study's settings) does not import torch, which takes a second or two of every command's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pal_bench.train.config import ConfigError, TrainConfig, make_config, validate
from pal_bench.train.envs import register as _register_envs

if TYPE_CHECKING:
    from pal_bench.train.backends.threads import Trainer
    from pal_bench.train.driver import WorkerError

_register_envs()


def __getattr__(name: str):
    if name == "Trainer":
        from pal_bench.train.backends.threads import Trainer

        return Trainer
    if name == "WorkerError":
        from pal_bench.train.driver import WorkerError

        return WorkerError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from pal_bench.train.backends.threads import Trainer

    return Trainer(cfg, resume=resume, overwrite=overwrite)


__all__ = ["ConfigError", "TrainConfig", "Trainer", "WorkerError", "make_config", "make_trainer", "validate"]
