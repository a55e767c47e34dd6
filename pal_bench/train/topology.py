"""Run layouts beyond one machine's actors and learners (``cfg.topology`` other than "local") are plug-ins.

A package registers each of its topologies with the trainer that runs it and the checks its config needs;
``train`` knows none of them by name. Registration happens through the entry-point group
``pal_bench.topologies`` (see pyproject.toml: ``pal_bench.studies.longhaul`` registers "learner-replay" and
"buffer-replay"), loaded the first time a topology is looked up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from pal_bench.train.errors import ConfigError

if TYPE_CHECKING:
    from pal_bench.train.config import TrainConfig

LOCAL = "local"


@dataclass(frozen=True)
class Topology:
    name: str
    trainer: Callable[..., object]          # trainer(cfg, resume=False): run(), close(), context manager
    validate: Callable[[TrainConfig], None]  # raises ConfigError for a config this topology cannot run


_registry: dict[str, Topology] = {}
_loaded = False


def register(topology: Topology) -> None:
    _registry[topology.name] = topology


def _load_plugins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for ep in entry_points(group="pal_bench.topologies"):
            ep.load()()


def names() -> list[str]:
    """"local" and every registered topology."""
    _load_plugins()
    return [LOCAL, *_registry]


def get(name: str) -> Topology:
    """The registered topology ``name`` (ConfigError naming the choices otherwise)."""
    _load_plugins()
    if name not in _registry:
        raise ConfigError(f"topology must be one of {', '.join(names())}, got {name!r}")
    return _registry[name]
