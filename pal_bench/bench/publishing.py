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

Every value read from a results file is data, never markup: results directories are shared and downloaded, and
the pages are rendered (GitHub, ``pal-bench report``'s HTML). ``md`` escapes every cell and header of a table
(``esc``), builders pass any other value from a file that enters their text through ``esc`` (prose) or ``code``
(an inline code span), and markdown the code itself writes into a cell (``**chosen**``) is wrapped in ``Markup``.

A builder that cannot use what is stored (a row or point it needs is missing, a column relabelled) raises;
``regenerate(..., skipped=[...])`` then leaves that block as it was and notes why (``SKIPPABLE``; ``Unusable`` for
a message that already names the file and what is missing).
"""

from __future__ import annotations

import numbers
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pal_bench import conditions
from pal_bench.argtypes import UsageError
from pal_bench.paths import ROOT
from pal_bench.stored_tables import read_json

if TYPE_CHECKING:
    import pandas as pd

BLOCK = re.compile(r"(<!-- BEGIN generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END generated:(?P=name) -->)",
                   re.S)
DOC_ORDER = ("latency", "workloads", "trainer", "scaling", "backends", "plugin", "race", "longhaul", "aggregation",
             "measuring")

Block = Callable[[Path], str]


class Unusable(ValueError):
    """A stored result a builder cannot publish from; the message names the file and what is missing in it."""


#: what a builder raises on a results file it did not expect (another version's, someone else's, an interrupted
#: run's): ``pal-bench report`` skips the block or figure with one line instead of ending in a traceback
SKIPPABLE = (KeyError, IndexError, ValueError, TypeError, AttributeError, ZeroDivisionError,
             UsageError, RecursionError)    # UsageError: a stored file that is not a small regular file


def reason(error: BaseException) -> str:
    """One line on why a block or figure was skipped."""
    if isinstance(error, Unusable):
        return str(error)
    return f"{type(error).__name__}: {error}".splitlines()[0] if str(error) else type(error).__name__


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


class Markup(str):
    """Markdown the code itself wrote (``Markup("**chosen**")``): ``esc`` and ``md`` pass it through. Never wrap
    text read from a file in it."""


# markdown's own characters in a value: a backslash, a backtick (a code span: it also swallows the `|` between
# cells), `*`, `|`, `_` where it could open emphasis (after a space or punctuation, before a non-space: `_x`, not
# `add_batch` or `share_%`), and `]` directly before `(` (the only way to close an inline link or image:
# `[x](javascript:...)`)
_MARKDOWN = re.compile(r"[\\`*|]|\](?=\()|(?<![^\W_])_(?=\S)")


def esc(value: object) -> str:
    """``value`` (text read from a results file) as markdown that shows it and nothing else, in a table cell or in
    prose: line breaks become spaces, HTML's ``<``, ``&`` and ``"`` entities (no tag can open; ``>`` alone
    opens none and stays as it is, so ``>= 200`` reads as written), and markdown's characters are
    backslash-escaped. ``Markup`` passes through unchanged."""
    if isinstance(value, Markup):
        return str(value)
    text = " ".join(str(value).splitlines())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
    return _MARKDOWN.sub(lambda m: "\\" + m.group(0), text)


def code(value: object) -> str:
    """``value`` as an inline code span (``results/x.csv``), or as escaped text where a code span could not hold
    it (a backtick, a line break or a ``|``)."""
    text = str(value)
    return esc(text) if re.search(r"[`|\r\n]", text) else f"`{text}`"


def _meta(path: Path) -> dict | None:
    """The recorded conditions of ``path`` with every string escaped (``esc``); None where none were recorded or
    they cannot be read."""
    try:
        meta = conditions.read_meta(path)
        if meta is None and path.suffix == ".json" and path.exists():
            meta = read_json(path).get("conditions")
    except (OSError, ValueError, AttributeError, UsageError):
        return None

    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return esc(v) if isinstance(v, str) else v
    return clean(meta) if isinstance(meta, dict) else None


def source(results: Path, *names: str) -> str:
    """The caption's last line: each source file and its recorded conditions."""
    parts = []
    for name in names:
        meta = _meta(results / name)
        try:
            described = conditions.describe(meta) if meta else None
        except (AttributeError, TypeError, ValueError):     # conditions stored in another shape
            described = "conditions unreadable"
        if described:
            parts.append(f"{code(f'results/{name}')}: {described}")
        else:       # (no git-derived text here: a generated block must not depend on the clone's history)
            parts.append(f"{code(f'results/{name}')}: conditions not recorded (measured before they were)")
    return "Source: " + "; ".join(parts) + "."


def missing(name: str, command: str) -> str:
    """The block of a result not stored yet: which command writes it."""
    return f"_Not measured yet: `{command}` writes `results/{name}`._\n"


def _cell(v: object) -> object:
    """A table cell: numbers as they are (``floatfmt`` formats them), anything else escaped (``esc``)."""
    return v if v is None or isinstance(v, (numbers.Number, bool)) else esc(v)


def md(df: pd.DataFrame, floatfmt: str | tuple[str, ...] = ".1f", index: bool = False) -> str:
    """The one way a frame becomes a markdown table: missing values left blank, every other cell, header and
    (with ``index``) index label that is not a number escaped (``esc``); ``floatfmt`` may be one format per
    column. Every generated table goes through here."""
    t = df.astype(object).apply(lambda col: col.map(_cell, na_action="ignore")).astype(object).where(df.notna(), None)
    t.columns = t.columns.map(_cell)
    if index:
        t.index = t.index.map(_cell).rename(None if t.index.name is None else esc(t.index.name))
    return t.to_markdown(index=index, floatfmt=floatfmt, missingval="")


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


def regenerate(files: list[Path], results: Path, blocks: Mapping[str, Block], check: bool = False,
               skipped: list[str] | None = None) -> list[str]:
    """Rebuild every generated block of ``files`` from ``blocks``; returns ``file:name`` of the blocks that
    changed (with ``check``, nothing is written). An unknown block name raises ``KeyError``. With ``skipped`` (a
    list), a builder that raises one of ``SKIPPABLE`` leaves its block as it was and adds one line to ``skipped``
    (which block, why); without it, the error propagates."""
    changed: list[str] = []
    cache: dict[str, str | None] = {}
    for path in files:
        text = path.read_text()

        def body(m: re.Match, path=path) -> str:
            name = m.group("name")
            if name not in blocks:
                raise KeyError(f"{path}: unknown generated block {name!r}; known: {', '.join(blocks)}")
            if name not in cache:
                try:
                    cache[name] = blocks[name](results).rstrip("\n") + "\n"
                except SKIPPABLE as e:
                    if skipped is None:
                        raise
                    cache[name] = None
                    skipped.append(f"block {name} of {path.name} (left as it was): {reason(e)}")
            new = cache[name]
            if new is None:
                return m.group(0)
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
