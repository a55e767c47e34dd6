"""The race's contestants, one module per framework (``pal``, ``tianshou``, ``rllib``), each a ``Contestant``.

A contestant is built (``build``: everything constructed, counted as set-up), read back (``facts``: what the
framework actually built and configured, from its own objects, never from our config), given the run's counters
(``attach``: hooks on its optimizer, target network, loss input and exploration, ``counters.py``), trained under the
race's ``Clock`` (``train``: returns the env steps and updates counted by the framework itself), and closed. The matched
track checks ``facts`` against ``task.MATCHED`` before training and the measured updates per env step after.
"""

from __future__ import annotations

import importlib

from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.task import Task


class Contestant:
    """One framework's DQN in the race. ``name`` is the contestant's (``pal-processes``), ``track`` "matched" or
    "tuned", ``cpus`` the run's core budget (1: everything on one CPU; 2 or more: the framework places its work
    with its own parallel features, e.g. RLlib a remote env runner, tianshou a subprocess environment)."""

    def __init__(self, name: str, track: str, task: Task, seed: int, cpus: int = 1, config: int = 0):
        self.name, self.track, self.task, self.seed, self.cpus = name, track, task, seed, cpus
        self.tuning = config             # (the tuned track's configuration number)

    @classmethod
    def settings(cls, name: str, track: str, task: Task, cpus: int = 1, config: int = 0) -> dict:
        """The settings this contestant is configured with on ``track`` with ``cpus`` CPUs (JSON-able, no framework
        import): they go into each stored run's settings hash, so a run whose settings changed is run again.
        ``config``: on the tuned track, the configuration of the tuning search (``tuning.SEARCH``; 0: its
        published example)."""
        raise NotImplementedError

    def build(self) -> None:
        """Construct the learner, buffer, environments and workers it needs before the first env step."""
        raise NotImplementedError

    def facts(self) -> dict:
        """What was built, read back from the framework's objects: ``n_params`` (online Q-network),
        ``torch_threads``, ``n_envs``, ``batch_size``, ``n_step``, ``target_update`` (in updates), ``double_q``,
        ``dueling``, ``gamma``, ``lr``, ``grad_clip`` (0: none), ``buffer_capacity``, ``alpha``, ``beta``,
        ``updates_per_step`` (as configured), ``loss`` (a short text), ``hidden`` (list), and anything else worth
        showing in the settings table."""
        raise NotImplementedError

    def attach(self, counters) -> None:
        """Put ``counters`` (a ``counters.RunCounters``) on the objects the framework built: its online network's
        optimizer, target network, loss input and env-step count; epsilon as its exploration has it."""
        raise NotImplementedError

    def train(self, clock: Clock) -> dict:
        """Train until ``clock.tick(steps, act)`` returns True; returns ``{"env_steps", "updates"}`` as the
        framework counted them."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop everything it started (processes, Ray, environments)."""


# contestant -> (module, class). Which track each runs in: ``TRACK_CONTESTANTS``.
REGISTRY = {
    "pal": ("pal_bench.studies.race.contestants.pal", "PALContestant"),
    "pal-processes": ("pal_bench.studies.race.contestants.pal", "PALContestant"),
    "pal-apex": ("pal_bench.studies.race.contestants.pal", "PALContestant"),
    "tianshou": ("pal_bench.studies.race.contestants.tianshou", "TianshouContestant"),
    "rllib": ("pal_bench.studies.race.contestants.rllib", "RLlibContestant"),
    "rllib-pal": ("pal_bench.studies.race.contestants.rllib", "RLlibContestant"),
}
TRACK_CONTESTANTS = {
    "matched": ("pal", "pal-processes", "tianshou", "rllib", "rllib-pal"),
    "tuned": ("pal-processes", "pal-apex", "tianshou", "rllib"),
}
# who runs when ``--only`` names no one: the matched track's core budgets without ``rllib-pal`` (PAL's buffer
# inside RLlib, a question of the plug-in study; ``--only rllib-pal`` runs it), to keep a track's sitting in hours
# the tuned track: one contestant per framework, each at its best configuration of the tuning search (PAL's Ape-X
# preset is one of PAL's configurations there; ``--only pal-apex`` runs it on its own)
DEFAULT_CONTESTANTS = {"matched": ("pal", "pal-processes", "tianshou", "rllib"),
                       "tuned": ("pal-processes", "tianshou", "rllib")}
CONTESTANTS = tuple(REGISTRY)


def contestant_class(name: str) -> type[Contestant]:
    if name not in REGISTRY:
        raise ValueError(f"unknown contestant {name!r}; choose from {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def make(name: str, track: str, task: Task, seed: int, cpus: int = 1, config: int = 0) -> Contestant:
    if name not in TRACK_CONTESTANTS[track]:
        raise ValueError(f"{name} does not race in the {track} track (it has {', '.join(TRACK_CONTESTANTS[track])})")
    if config and track != "tuned":
        raise ValueError(f"tuning configurations are for the tuned track, not {track}")
    return contestant_class(name)(name, track, task, seed, cpus, config)
