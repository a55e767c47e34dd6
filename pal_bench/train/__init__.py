"""The parallel actor / learner / parameter-server trainer (threads in one process)."""

from pal_bench.train.config import ConfigError, TrainConfig, make_config, validate
from pal_bench.train.trainer import Trainer, WorkerError

__all__ = ["ConfigError", "TrainConfig", "Trainer", "WorkerError", "make_config", "validate"]
