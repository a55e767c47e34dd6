"""Numeric ranges and argparse types, declared once and shared by every subcommand and the training config.

A flag's value is parsed and range-checked by its argparse ``type``, so a bad value ends in argparse's usage
and one error line naming the flag (exit status 2) before anything is measured or written. ``Range`` is the
same check the config applies to its fields (``pal_bench.train.config.FIELD_RANGES``).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass


def printable(name: str) -> str:
    """``name`` safe to print: every non-printable character (control and escape sequences, undecodable bytes)
    and the backslash written as a Python escape (``\\x1b``, ``\\udcff``, ``\\\\``)."""
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in name)


class UsageError(Exception):
    """A user error found by a command itself (a missing file, a bad column): ``pal-bench`` prints it as one
    line and exits with status 2."""


MAX_COUNT = 2**53               # steps, transitions, rounds, intervals: exact in float64, far inside int64
SEED_MAX = 2**32 - 1            # numpy's legacy seeding (np.random.seed) takes [0, 2**32)


def _fmt(x: float) -> str:
    """A bound as people write it: 1, 0.5, 2**40, 2**32 - 1."""
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, int) and x >= 2**16:
        for off, tail in ((0, ""), (1, " - 1")):
            if (x + off) & (x + off - 1) == 0:
                return f"2**{(x + off).bit_length() - 1}{tail}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """Bounds of a number (``None``: unbounded on that side); every value must also be finite."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return f"in {'(' if self.lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f"{'>' if self.lo_open else '>='} {_fmt(lo)}"
        if hi is not None:
            return f"{'<' if self.hi_open else '<='} {_fmt(hi)}"
        return "finite"

    def problem(self, v: float) -> str | None:
        """Why ``v`` is out of range ("must be >= 1"), or None when it is in range."""
        if isinstance(v, float) and not math.isfinite(v):
            return "must be a finite number" + ("" if str(self) == "finite" else f" {self}")
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return f"must be {'>' if self.lo_open else '>='} {_fmt(self.lo)}"
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return f"must be {'<' if self.hi_open else '<='} {_fmt(self.hi)}"
        return None


COUNT = Range(1, MAX_COUNT)         # at least one
WORKERS = Range(1, 4096)            # actors, learners, env copies, threads, processes
CAPACITY = Range(1, 2**40)          # what the replay buffer accepts (pyx/_replay.pyx)
FANOUT = Range(2, 4096)             # the sum tree's fan-out K, likewise
NONNEG = Range(0, MAX_COUNT)        # 0 allowed (often: off)
SEED = Range(0, SEED_MAX)
POSITIVE = Range(0, lo_open=True)   # a finite number > 0
NONNEG_FLOAT = Range(0)
FINITE = Range()
CORES = Range(1, 1024)              # simulated cores of one machine (simulate --cores, --sensitivity)
SECONDS = Range(0.1, 86_400)        # a duration a command runs or measures for (s): a tenth of a second to a day


def parse_int(text: str) -> int:
    """An integer written as ``12``, ``-3`` or ``1e6`` (a float that is a whole number); ValueError otherwise."""
    try:
        return int(text)
    except ValueError:
        v = float(text)
        if not (math.isfinite(v) and v.is_integer()):
            raise ValueError(text) from None
        return int(v)


def _check(value: float, rng: Range, text: str) -> float:
    if (why := rng.problem(value)) is not None:
        raise argparse.ArgumentTypeError(f"{why}, got {text!r}")
    return value


def number(rng: Range, kind: type = int) -> Callable[[str], float]:
    """An argparse ``type``: ``kind`` (int or float) in ``rng``; a bad value is argparse's one-line error."""
    def parse(text: str) -> float:
        try:
            value = parse_int(text) if kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} "
                                             f"{rng}, got {text!r}") from None
        return _check(value, rng, text)

    parse.__name__ = f"{kind.__name__} {rng}"
    return parse


def number_list(rng: Range, kind: type = int) -> Callable[[str], list]:
    """An argparse ``type``: a comma-separated list of ``kind`` in ``rng`` (at least one, no empty items)."""
    item = number(rng, kind)

    def parse(text: str) -> list:
        items = text.split(",")
        if not text or any(not s.strip() for s in items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers {rng}, got {text!r}")
        try:
            return [item(s.strip()) for s in items]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in {text!r})") from None

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def int_ranges(rng: Range) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated integers and ranges ``a-b`` (``1-64``, ``1,2,4,8-12``), each in ``rng``;
    the sorted distinct values."""
    def parse(text: str) -> list[int]:
        out: set[int] = set()
        for part in text.split(","):
            found = re.fullmatch(r"\s*([0-9]{1,12})\s*(?:-\s*([0-9]{1,12})\s*)?", part)
            lo, hi = (int(found[1]), int(found[2] or found[1])) if found else (None, None)
            if lo is None or lo > hi or rng.problem(lo) or rng.problem(hi):
                raise argparse.ArgumentTypeError(f"expected integers or ranges a-b (1-64, 1,2,4) {rng}, got "
                                                 f"{part.strip()!r} (in {text!r})")
            out.update(range(lo, hi + 1))
        return sorted(out)

    parse.__name__ = "list of int"
    return parse


def choice_list(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of names from ``choices`` (at least one, each once)."""
    known = tuple(choices)

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",")]
        if not text or "" in names:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(known)}; got {text!r}")
        if bad := [n for n in names if n not in known]:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; choose from {', '.join(known)}")
        return list(dict.fromkeys(names))

    parse.__name__ = "list"
    return parse


positive_int = number(COUNT)
workers = number(WORKERS)
nonneg_int = number(NONNEG)
rng_seed = number(SEED)
positive_float = number(POSITIVE, float)
nonneg_float = number(NONNEG_FLOAT, float)
finite_float = number(FINITE, float)
duration = number(SECONDS, float)        # --seconds and other durations (s)
