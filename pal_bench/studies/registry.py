"""Every study that publishes: ``pal-bench report`` and the docs' generated blocks collect them from here and
from nowhere else. Adding a study: its module exports ``PUBLICATION`` (``pal_bench.bench.publishing``), and one
line here names that module. Publication modules import light (no torch, no Ray), so that the report does not
load a trainer to draw a table."""

from __future__ import annotations

import importlib

from pal_bench.bench.publishing import Block, Publication

STUDIES = (
    "pal_bench.studies.latency.publish",
    "pal_bench.studies.fanout",
    "pal_bench.studies.training",
    "pal_bench.studies.scaling.publish",
    "pal_bench.studies.dse",
    "pal_bench.studies.concurrency",
    "pal_bench.studies.shared_buffer",
    "pal_bench.studies.plugin.publish",
    "pal_bench.studies.race.publish",
    "pal_bench.studies.longhaul.publish",
    "pal_bench.studies.aggregation.publish",
)


def publications() -> list[Publication]:
    """Each registered study's ``PUBLICATION``, in registry order."""
    return [importlib.import_module(name).PUBLICATION for name in STUDIES]


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
