"""Every study, in one place: ``pal-bench report`` and the docs' generated blocks collect the studies'
publications from here, and ``pal-bench`` its study subcommands. Adding a study: its module (or package)
with a ``main(argv)`` and a ``PUBLICATION`` (``pal_bench.bench.publishing``), and one ``Study`` line here.
Publication modules import light (no torch, no Ray), so that the report does not load a trainer to draw a
table; this module imports none of them until asked."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from pal_bench.bench.publishing import Block, Publication


@dataclass(frozen=True)
class Study:
    """``publication``: the module exporting ``PUBLICATION`` (None: publishes nothing); ``command``: its
    ``pal-bench`` subcommand, run by ``main(argv)`` of module ``main`` (None: no subcommand)."""

    publication: str | None
    command: str | None = None
    main: str | None = None
    help: str = ""


STUDIES = (
    Study("pal_bench.studies.latency.publish", "latency", "pal_bench.studies.latency.measure",
          "your replay buffer (module:Class) timed beside PAL, the peers and the floor, checked first"),
    Study("pal_bench.studies.conformance", "check-buffer", "pal_bench.studies.conformance",
          "check a replay buffer's semantics (sampling, weights, priorities, bad input), one line per property"),
    Study("pal_bench.studies.fanout", "fanout", "pal_bench.studies.fanout",
          "sample + update latency against the sum tree's fan-out K"),
    Study("pal_bench.studies.shared_buffer", "shared-buffer", "pal_bench.studies.shared_buffer",
          "the shared-memory buffer across processes against a private one"),
    Study("pal_bench.studies.concurrency", "concurrency", "pal_bench.studies.concurrency",
          "the buffer under concurrent writers and samplers"),
    Study("pal_bench.studies.training"),
    Study("pal_bench.studies.scaling.publish", "scaling", "pal_bench.studies.scaling.measure",
          "actor and learner throughput against workers, per backend"),
    Study("pal_bench.studies.dse"),
    Study("pal_bench.studies.plugin.publish", "plugin-bench", "pal_bench.studies.plugin.measure",
          "training-iteration time with each framework's buffer vs PAL's drop-in"),
    Study("pal_bench.studies.race.publish", "race", "pal_bench.studies.race",
          "time to a target return: PAL's trainer vs RLlib and tianshou DQN"),
    Study(None, "race-profile", "pal_bench.studies.race_profile",
          "where one race contestant's time goes (cProfile areas, or PAL's per-phase times)"),
    Study("pal_bench.studies.longhaul.publish", "longhaul", "pal_bench.studies.longhaul.experiment",
          "replay at the learner or at the buffer node, over a long-haul link"),
    Study("pal_bench.studies.aggregation.publish", "aggregation", "pal_bench.studies.aggregation.measure",
          "share of a training iteration spent aggregating gradients, per scheme"),
    Study("pal_bench.studies.memory", "memory", "pal_bench.studies.memory",
          "resident memory per transition of each buffer in each of its memory modes"),
    Study("pal_bench.studies.atari_run", "atari-run", "pal_bench.studies.atari_run",
          "Ape-X on Pong with actor processes: frames/s, updates/s, memory per process"),
    Study("pal_bench.studies.simulate.publish", "simulate", "pal_bench.studies.simulate.cli",
          "the trainer simulated past this machine's cores: inputs, validation, predicted curves"),
)


def commands() -> dict[str, tuple[str, str]]:
    """``pal-bench`` subcommand -> (module with ``main(argv)``, help)."""
    return {s.command: (s.main, s.help) for s in STUDIES if s.command}


def publications() -> list[Publication]:
    """Each study's ``PUBLICATION``, in registry order."""
    return [importlib.import_module(s.publication).PUBLICATION for s in STUDIES if s.publication]


def blocks() -> dict[str, Block]:
    """Every generated block by name; two studies claiming one name is an error."""
    out: dict[str, Block] = {}
    owner: dict[str, str] = {}
    for pub in publications():
        for name, build in pub.blocks.items():
            if name in out:
                raise ValueError(f"generated block {name!r} is claimed by both {owner[name]} and {pub.study}")
            out[name], owner[name] = build, pub.study
    return out
