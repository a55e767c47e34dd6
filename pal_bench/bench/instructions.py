"""Instructions per buffer operation, counted by valgrind's callgrind: deterministic, whatever the load.

``count(candidates)`` runs one Python process under callgrind. For each candidate buffer it fills a
full buffer (capacity ``CAPACITY``, LunarLander fields) and then calls each operation ``CALLS[op]``
times inside ``pal_bench._measure.measured_region``; callgrind collects only inside that function
(``--toggle-collect``) and dumps a profile part when it returns (``--dump-after``), so every
(candidate, operation) has its own part. From each part it sums the *self* instructions of the
functions in the project's own compiled objects (``_replay``, ``_segment``, ``_sumtree``): the Cython core,
its argument checks and its C loops. Python's interpreter, numpy and libc are left out on purpose:
numpy and libc pick code by CPU feature (AVX-512 on some machines of this kind, AVX2 on others), so
their counts differ between machines; the project's objects are compiled with the same portable
flags everywhere. (Their totals are reported too, for information.)

A candidate is ``pal`` (the real ``PrioritizedReplayBuffer``), ``double:OP`` (the real buffer wrapped
so that OP does its work twice) or ``slower:OP:FACTOR`` (OP does FACTOR times its work on average,
e.g. ``slower:sample:1.5``). The check must fail for each of those.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

OPS = ("add", "add_batch", "sample", "update_priorities")
CAPACITY = 10**5
BATCH = 256
CALLS = {"add": 200, "add_batch": 20, "sample": 20, "update_priorities": 20}   # calls per counted region
PROJECT_OBJECTS = re.compile(r"(^|/)_(replay|segment|sumtree)\.[^/]*\.so$")
# the C function Cython emits for measured_region's Python entry (--dump-after takes no wildcards)
MARKER = "__pyx_pw_9pal_bench_8_measure_1measured_region"


class ValgrindMissing(RuntimeError):
    pass


class Slowed:
    """The real buffer, but ``op`` does ``factor`` times its work on average (``factor`` >= 1: each call runs
    the real operation once, plus once more whenever the accumulated extra reaches a whole call; 1.5
    repeats every second call, 2 every call). Used to show that the check catches a slower ``op``."""

    def __init__(self, buf, op: str, factor: float = 2.0):
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}; choose from {', '.join(OPS)}")
        if not factor >= 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.buf, self.op, self.extra, self._owed = buf, op, factor - 1, 0.0

    def __getattr__(self, name):
        fn = getattr(self.buf, name)
        if name != self.op:
            return fn

        def slower(*args, **kw):
            self._owed += self.extra
            while self._owed >= 1 - 1e-9:
                self._owed -= 1
                fn(*args, **kw)
            return fn(*args, **kw)
        return slower


def parse_spec(spec: str) -> tuple[str, float] | None:
    """``pal`` -> None; ``double:OP`` -> (OP, 2.0); ``slower:OP:FACTOR`` -> (OP, FACTOR). ValueError otherwise."""
    kind, _, rest = spec.partition(":")
    if kind == "pal" and not rest:
        return None
    op, _, factor = rest.partition(":")
    try:
        if kind == "double" and not factor and op in OPS:
            return op, 2.0
        if kind == "slower" and op in OPS and float(factor) >= 1:
            return op, float(factor)
    except ValueError:
        pass
    raise ValueError(f"unknown candidate {spec!r}: 'pal', 'double:OP' or 'slower:OP:FACTOR' (FACTOR >= 1) with OP "
                     f"one of {', '.join(OPS)}")


def make_candidate(spec: str):
    """The buffer named by ``spec`` (see ``parse_spec``), fresh, of ``CAPACITY``."""
    from pal_bench import PrioritizedReplayBuffer
    from pal_bench.bench.adapters.base import ALPHA, LUNAR_FIELDS

    slowed = parse_spec(spec)
    buf = PrioritizedReplayBuffer(CAPACITY, LUNAR_FIELDS, alpha=ALPHA, seed=0)
    return buf if slowed is None else Slowed(buf, *slowed)


def drive(candidates: list[str]) -> None:
    """Inside callgrind: for each candidate, fill a buffer, then one counted region per operation."""
    from pal_bench._measure import measured_region
    from pal_bench.bench.adapters.base import lunar_batch, lunar_row

    rng = np.random.default_rng(0)
    priorities = [rng.random(BATCH) * 2 for _ in range(CALLS["update_priorities"])]
    row, batch = lunar_row(), lunar_batch(BATCH, seed=7)
    for spec in candidates:
        count_regions(make_candidate(spec), row, batch, priorities, measured_region)


def count_regions(buf, row: dict, batch: dict, priorities: list[np.ndarray], measured_region) -> None:
    """Fill ``buf`` to capacity, then one counted region per operation, in ``OPS`` order
    (part k of the run is candidate k // 4, operation OPS[k % 4])."""
    from pal_bench.bench.adapters.base import BETA, lunar_batch

    fill = lunar_batch(4096, seed=1)
    for _ in range(CAPACITY // 4096 + 1):
        buf.add_batch(**fill)
    idx = buf.sample(BATCH, beta=BETA)["indices"]
    pool = iter(priorities * 2)
    regions = {
        "add": lambda: buf.add(**row),
        "add_batch": lambda: buf.add_batch(**batch),
        "sample": lambda: buf.sample(BATCH, beta=BETA),
        "update_priorities": lambda: buf.update_priorities(idx, next(pool)),
    }
    for op in OPS:
        measured_region(regions[op], CALLS[op])


class CompressedNames:
    """callgrind's compressed names: ``(id) name`` the first time, ``(id)`` after."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def resolve(self, value: str) -> str:
        m = re.match(r"\((\d+)\)(?: (.*))?", value)
        if not m:
            return value
        if m.group(2) is not None:
            self.names[m.group(1)] = m.group(2)
        return self.names.get(m.group(1), "")


def callgrind_command(valgrind: str, out: Path, argv: list[str]) -> list[str]:
    """valgrind's command line that counts only inside ``measured_region`` and dumps one part per call of it."""
    return [valgrind, "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={MARKER}",
            f"--dump-after={MARKER}", f"--callgrind-out-file={out}", "--dump-instr=no", "--compress-pos=no", *argv]


def parse_part(path: Path) -> tuple[int, int]:
    """(self instructions in the project's objects, all instructions) of one callgrind profile part."""
    resolve = CompressedNames().resolve
    ob, project, total, skip_next = "", 0, 0, False
    events_ir = 0
    for line in path.read_text().splitlines():
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            if skip_next:                      # the inclusive cost of the call on the line before
                skip_next = False
                continue
            parts = line.split()
            if len(parts) > 1 + events_ir:
                ir = int(parts[1 + events_ir])
                total += ir
                if PROJECT_OBJECTS.search(ob):
                    project += ir
        elif line.startswith("ob="):
            ob = resolve(line[3:])
        elif line.startswith("calls="):
            skip_next = True
        elif line.startswith("cob="):
            resolve(line[4:])                   # registers a compressed object name; does not change ob
        elif line.startswith("events:"):
            events_ir = line.split()[1:].index("Ir")
    return project, total


def count(candidates: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """``{candidate: {op: {"project": instructions per call, "total": ...}}}``, measured under callgrind."""
    for spec in candidates:
        parse_spec(spec)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise ValgrindMissing("valgrind is not installed (Debian: apt-get install valgrind); the instruction-count "
                              "check needs it")
    with tempfile.TemporaryDirectory(prefix="pal-callgrind-") as d:
        out = Path(d) / "cg.out"
        cmd = callgrind_command(valgrind, out, [sys.executable, "-m", "pal_bench.bench.instructions", *candidates])
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"the callgrind run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        parts = sorted(Path(d).glob("cg.out.*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
        counted = [parse_part(f) for f in parts]
    counted = [c for c in counted if c[1] > 0]      # the final dump at exit collects nothing
    want = len(candidates) * len(OPS)
    if len(counted) != want:
        raise RuntimeError(f"expected {want} counted regions from callgrind, got {len(counted)} "
                           f"(is {MARKER} in pal_bench._measure?)")
    result: dict[str, dict[str, dict[str, float]]] = {}
    for k, (project, total) in enumerate(counted):
        spec, op = candidates[k // len(OPS)], OPS[k % len(OPS)]
        result.setdefault(spec, {})[op] = {"project": project / CALLS[op], "total": total / CALLS[op]}
    return result


if __name__ == "__main__":           # the process callgrind runs
    drive(sys.argv[1:] or ["pal"])
    print(json.dumps({"ok": True}))
