"""The parallel actor / learner / parameter-server trainer (threads in one process)."""

from pal_bench.train.config import ConfigError, TrainConfig, make_config, validate
from pal_bench.train.trainer import Trainer, WorkerError


def make_trainer(cfg: TrainConfig, resume: bool = False) -> Trainer:
    """``Trainer`` for ``cfg.backend == "threads"``, ``ProcessTrainer`` (pal_bench.train.process_backend) for
    "processes", ``RayTrainer`` (pal_bench.train.ray_backend) for "ray",
    ``LonghaulTrainer`` (pal_bench.longhaul) for a long-haul ``cfg.topology``."""
    if cfg.topology != "local":
        from pal_bench.longhaul.trainer import LonghaulTrainer

        return LonghaulTrainer(cfg, resume=resume)
    if cfg.backend == "ray":
        from pal_bench.train.ray_backend import RayTrainer

        return RayTrainer(cfg, resume=resume)
    if cfg.backend == "processes":
        from pal_bench.train.process_backend import ProcessTrainer

        return ProcessTrainer(cfg, resume=resume)
    return Trainer(cfg, resume=resume)


__all__ = ["ConfigError", "TrainConfig", "Trainer", "WorkerError", "make_config", "make_trainer", "validate"]
