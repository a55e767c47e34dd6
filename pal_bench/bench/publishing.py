"""Publishing, as asv does it: every study owns its tables and figures; this module knows none of them.

A study exports one ``Publication``: its generated blocks (``name -> builder(results) -> markdown``) and an
``outputs(results, figures)`` step that rewrites what it derives from its stored results (figures, tidy
CSVs). ``pal_bench.studies.registry`` lists the studies; ``pal_bench.report`` loops over them.

README.md and ``docs/*.md`` carry blocks between markers::

    <!-- BEGIN generated:NAME -->
    ...
    <!-- END generated:NAME -->

``regenerate(files, results, blocks)`` replaces each block's body with ``blocks[NAME](results)``; with
``check=True`` it writes nothing and returns the blocks whose committed text differs (a CI test does
that). Each table ends with a line naming its source file(s) and the conditions they were measured
under (``pal_bench.conditions``); a result measured at a 1-minute load above half the cores is marked
**noisy**.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pal_bench import conditions

if TYPE_CHECKING:
    import pandas as pd
from pal_bench.paths import ROOT

BLOCK = re.compile(r"(<!-- BEGIN generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END generated:(?P=name) -->)",
                   re.S)
DOC_ORDER = ("latency", "trainer", "scaling", "backends", "plugin", "race", "longhaul", "aggregation", "measuring")

Block = Callable[[Path], str]


def no_outputs(results: Path, figures: bool) -> list[Path]:
    return []


@dataclass(frozen=True)
class Publication:
    """What one study publishes from its stored results: ``blocks`` (generated markdown, by block name) and
    ``outputs(results, figures)`` (the files it derives: figures when ``figures`` is true, tidy tables;
    returns their paths)."""

    study: str
    blocks: Mapping[str, Block] = field(default_factory=dict)
    outputs: Callable[[Path, bool], list[Path]] = no_outputs


# ------------------------------------------------------------------ a study's closing steps

def store(df: pd.DataFrame, path: Path, measured: conditions.Conditions | None = None,
          float_format: str = "%.4f") -> Path:
    """Write ``df`` to ``path`` as CSV (its folder made; never half-written over a good file) and, with
    ``measured``, the conditions it was measured under beside it. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conditions.atomic_write_text(path, df.to_csv(index=False, float_format=float_format))
    if measured is not None:
        measured.write(path)
    return path


def show(publication: Publication, results: Path, *blocks: str) -> list[Path]:
    """What a study prints last: the named blocks of its publication as they now read, and its figures redrawn
    from ``results`` (their paths printed). Returns the files ``outputs`` wrote."""
    for name in blocks:
        print(publication.blocks[name](results))
    written = publication.outputs(results, True)
    for f in written:
        print(f"{'figure' if f.suffix == '.png' else 'wrote'}: {f}")
    return written


# ------------------------------------------------------------------ pieces of a block

def git_stamp(path: Path) -> str:
    """'stored by commit abc123 of 2026-12-01': the last commit that stored ``path`` ('' outside git)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"stored by commit {out[0]} of {out[1]}" if len(out) == 2 else ""


def source(results: Path, *names: str) -> str:
    """The caption's last line: each source file and its recorded conditions."""
    parts = []
    for name in names:
        path = results / name
        meta = conditions.read_meta(path)
        if meta is None and path.suffix == ".json" and path.exists():
            meta = json.loads(path.read_text()).get("conditions")
        if meta:
            parts.append(f"`results/{name}`: {conditions.describe(meta)}")
        else:       # (no git-derived text here: a generated block must not depend on the clone's history)
            parts.append(f"`results/{name}`: conditions not recorded (measured before they were)")
    return "Source: " + "; ".join(parts) + "."


def missing(name: str, command: str) -> str:
    """The block of a result not stored yet: which command writes it."""
    return f"_Not measured yet: `{command}` writes `results/{name}`._\n"


def md(df: pd.DataFrame, floatfmt: str | tuple[str, ...] = ".1f", index: bool = False) -> str:
    """Markdown with missing values left blank; ``floatfmt`` may be one format per column."""
    return df.astype(object).where(df.notna(), None).to_markdown(index=index, floatfmt=floatfmt, missingval="")


def table(caption: str, df: pd.DataFrame, results: Path, *sources: str, floatfmt: str | tuple[str, ...] = ".1f",
          index: bool = False) -> str:
    """A block's usual shape: caption, the table, the source line."""
    return caption + "\n\n" + md(df, floatfmt, index) + "\n\n" + source(results, *sources) + "\n"


# ------------------------------------------------------------------ the docs' generated blocks

def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, then the study pages in reading order (pages not listed in ``DOC_ORDER`` last)."""
    pages = sorted((root / "docs").glob("*.md"), key=lambda p: (DOC_ORDER.index(p.stem) if p.stem in DOC_ORDER
                                                                else len(DOC_ORDER), p.stem))
    return [root / "README.md", *pages]


def regenerate(files: list[Path], results: Path, blocks: Mapping[str, Block], check: bool = False) -> list[str]:
    """Rebuild every generated block of ``files`` from ``blocks``; returns ``file:name`` of the blocks that
    changed (with ``check``, nothing is written). An unknown block name raises ``KeyError``."""
    changed: list[str] = []
    cache: dict[str, str] = {}
    for path in files:
        text = path.read_text()

        def body(m: re.Match, path=path) -> str:
            name = m.group("name")
            if name not in blocks:
                raise KeyError(f"{path}: unknown generated block {name!r}; known: {', '.join(blocks)}")
            if name not in cache:
                cache[name] = blocks[name](results).rstrip("\n") + "\n"
            new = cache[name]
            if path.parent.name != "docs":      # README links from the root, the docs pages from docs/
                new = new.replace("](../results/", "](results/")
            if new != m.group("body"):
                changed.append(f"{path.name}:{name}")
            return m.group(1) + new + m.group(4)

        new_text = BLOCK.sub(body, text)
        if not check and new_text != text:
            conditions.atomic_write_text(path, new_text)
    return changed


def names_in(path: Path) -> list[str]:
    """The generated block names of one page, in order."""
    return [m.group("name") for m in BLOCK.finditer(path.read_text())]
