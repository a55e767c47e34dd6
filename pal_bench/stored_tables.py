"""Stored CSV tables read as untrusted data: the inputs ``pal-bench simulate`` and ``pal-bench dse`` compute from.

A table is opened without following a symbolic link and without blocking (a FIFO cannot stall the command), must
be a regular file of at most ``MAX_TABLE_BYTES`` in UTF-8, and every column the caller uses is checked cell by cell
(present, of its kind, in its ``Range``) before anything is computed from it. Anything wrong is a ``UsageError``:
one line naming the file, and the column, row (1 = the first line under the header) and value where one is at
fault; ``pal-bench`` prints it and exits with status 2.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import WORKERS, Range, UsageError, parse_int
from pal_bench.untrusted import read_bytes

MAX_TABLE_BYTES = 16 << 20      # the stored tables are a few kB; 16 MiB is far past any of them
TRUE, FALSE = ("true", "1"), ("false", "0")
THROUGHPUT = Range(0.01, 1e9)     # a measured rate (transitions, updates or rows per second)


@dataclass(frozen=True)
class Column:
    """What a column must hold: ``kind`` float, int, bool or str; numbers in ``rng``; strings among ``choices``
    (when given). An empty cell is refused in a ``required`` column; in an optional one it reads as missing
    (NaN, None, or ``default`` for a bool), and an optional column that is absent is added with ``default`` when
    one is given."""

    kind: type = float
    rng: Range | None = None
    required: bool = True
    choices: tuple[str, ...] | None = None
    default: object = None


SCALING_BACKENDS = ("threads", "processes", "learner-processes", "learner-allreduce", "ray", "ray-node")
# the f_a / f_l curves `python -m pal_bench.studies.scaling` writes (results/scaling*.csv): dse and simulate read them
SCALING_COLUMNS = {"curve": Column(str, choices=("f_a", "f_l")), "threads": Column(int, WORKERS),
                   "throughput": Column(float, THROUGHPUT),
                   "oversubscribed": Column(bool, required=False, default=False),
                   "backend": Column(str, required=False, choices=SCALING_BACKENDS),
                   **{k: Column(str, required=False) for k in ("env_backend", "algo", "env")}}
SCALING_WHAT = "f_a/f_l curves as `python -m pal_bench.studies.scaling` writes them"


def read_csv(path: Path, label: str | None = None, **kw) -> pd.DataFrame:
    """``pd.read_csv`` of a stored results file read through ``read_bytes`` (a regular file, bounded, no link
    followed: a FIFO or a link to /dev/zero is a ``UsageError``, not a hang)."""
    return pd.read_csv(io.BytesIO(read_bytes(path, label=label)), **kw)


def read_json(path: Path, max_bytes: int = MAX_TABLE_BYTES, label: str | None = None):
    """A stored JSON file (results, conditions) read through ``read_bytes``; text that is not UTF-8 JSON, or nests
    past Python's recursion limit, is a ``UsageError`` naming it."""
    label = label or str(path)
    try:
        return json.loads(read_bytes(path, max_bytes, label).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else f"not JSON ({str(e).splitlines()[0]})"
        raise UsageError(f"{label}: {why}") from None


def read_table(path: Path, columns: Mapping[str, Column], what: str = "", min_rows: int = 0,
               label: str | None = None) -> pd.DataFrame:
    """``path`` as a DataFrame whose ``columns`` are checked and converted (float, int, bool or str; other columns
    are left as text). ``what`` says which table was expected and ``label`` names the file (default: its path) in
    the error line."""
    label = label or str(path)
    try:
        text = read_bytes(path, label=label).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{label}: not UTF-8 text (byte {e.start}){_hint(what)}") from None
    try:
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (ValueError, RecursionError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise UsageError(f"{label}: not a CSV table ({first[:120]}){_hint(what)}") from None
    absent = [name for name, col in columns.items() if col.required and name not in df.columns]
    if absent:
        raise UsageError(f"{label}: missing column(s) {', '.join(absent)}{_hint(what)}")
    if len(df) < min_rows:
        raise UsageError(f"{label}: {len(df)} rows, at least {min_rows} expected{_hint(what)}")
    for name, col in columns.items():
        if name in df.columns:
            df[name] = _checked(df[name], label, name, col)
        elif col.default is not None:
            df[name] = col.default
    return df


def _hint(what: str) -> str:
    return f" (expected {what})" if what else ""


def _checked(cells: pd.Series, label: str, name: str, col: Column) -> pd.Series:
    out = []
    for row, cell in enumerate(cells, start=1):
        text = "" if cell is None or (isinstance(cell, float) and math.isnan(cell)) else str(cell).strip()
        where = f"{label}: column {name}, row {row}"
        if not text:
            if col.required:
                raise UsageError(f"{where}: empty")
            out.append(col.default if col.default is not None else (None if col.kind is str else math.nan))
            continue
        out.append(_value(text, where, col))
    dtype = {float: "float64", bool: "bool"}.get(col.kind)
    if col.kind is int and not any(isinstance(v, float) for v in out):
        dtype = "int64"
    return pd.Series(out, index=cells.index, dtype=dtype if out else None)


def _value(text: str, where: str, col: Column):
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    if col.kind is str:
        if col.choices is not None and text not in col.choices:
            raise UsageError(f"{where}: {shown} is not one of {', '.join(col.choices)}")
        return text
    if col.kind is bool:
        if text.lower() not in TRUE + FALSE:
            raise UsageError(f"{where}: {shown} is not True or False")
        return text.lower() in TRUE
    try:
        value = parse_int(text) if col.kind is int else float(text)
    except (ValueError, OverflowError):
        raise UsageError(f"{where}: {shown} is not {'an integer' if col.kind is int else 'a number'}") from None
    if (why := (col.rng or Range()).problem(value)) is not None:
        raise UsageError(f"{where}: {shown} {why}")
    return value
