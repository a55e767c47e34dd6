"""Where one ``sample(256)`` + ``update_priorities(256)`` spends its instructions, step by step.

``python -m pal_bench.bench.step_costs [--capacity 1e6] [--tree DIR] [--label NAME]`` runs one sample+update
loop under valgrind's callgrind (the same counted region as ``pal_bench.bench.instructions``) with the
buffer built in ``DIR`` (default: this checkout), and attributes every instruction to a step:

- instructions in the project's compiled objects are mapped from the generated C line back to the
  ``.pyx``/``.pxd`` line Cython wrote it for, then to a step by the enclosing function and the line's
  text (``STEP_RULES``);
- libm's ``pow`` is "pow: priority transform and weights"; everything else outside the project
  (the interpreter, numpy, libc) is "Python call, argument checks, output arrays".

Counts are deterministic (whatever the machine's load), so a before/after comparison of two builds is
exact; times are not, so the docs pair these counts with measured medians. Appends to
``results/step_costs.csv`` (label, capacity, step, instructions per sample+update).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from pal_bench.atomic import atomic_open
from pal_bench.bench.instructions import PROJECT_OBJECTS, CompressedNames, ValgrindMissing, callgrind_command

CALLS = 20
BATCH = 256
OUT = Path("results/step_costs.csv")
MARK = re.compile(r'/\* "([^"]+\.(?:pyx|pxd))":(\d+)')

# (function name pattern, line text pattern or None, step); the first match wins
STEP_RULES: list[tuple[str, str | None, str]] = [
    (r"_find_step|tree_find|_last_nonzero_child", None, "descent (targets to leaves)"),
    (r"_group_min", None, "min-tree maintenance"),
    (r"_group_sum", None, "sum maintenance (parents from children)"),
    (r"tree_recompute|tree_set$|_recompute", r"mins|\bm = |cm\[|v = c\[k\]|level \+ 2|range\(t\.fanout\)|slot|with_min",
     "min-tree maintenance"),
    (r"tree_recompute|tree_set$|_recompute", None, "sum maintenance (parents from children)"),
    (r"tree_set_batch|_tree_set_batch", None, "batch update: leaf writes and deduplication"),
    (r"_lock|_unlock|_locked|_now_ns", None, "lock"),
    (r"_draw|sample", r"rng_uniform|total / n_pending|tree_total", "random targets"),
    (r"_draw|sample", r"prefetch", "gather (rows into the output)"),
    (r"_draw", r"tree_min_nonzero|tree_get|prio\[", "weight computation"),
    (r"sample", r"w\[k\]|min_p|np\.power|weights", "weight computation"),
    (r"sample", r"_copy|memcpy|rec =|RB|_row_bytes", "gather (rows into the output)"),
    (r"sample", r"n_next|pending\[n_next\]|_slot_ids\[slots|ids\[k\] < 0", "seqlock re-check"),
    (r"sample", r"np\.empty|np\.ones|malloc|free\(|out\[|dst\[|PyArray_DATA|_new_rows|_out_array|scratch",
     "output allocation"),
    (r"_new_rows|_out_array", None, "output allocation"),
    (r"_gather", None, "gather (rows into the output)"),
    (r"_draw", None, "descent (targets to leaves)"),
    (r"_copy|_prefetch_record", None, "gather (rows into the output)"),
    (r"rng_", None, "random targets"),
    (r"update_priorities", r"_slot_ids\[s\]|slots\[applied\]|values\[applied\]|iv\[b\] % ",
     "batch update: stale check"),
    (r"_stored_priority", None, "pow: priority transform and weights"),
    (r"update_priorities", r"np\.power|\*\* self\._alpha|stored|sv\[b\]", "pow: priority transform and weights"),
]
OTHER_PROJECT = "Python call, argument checks, output arrays (interpreter, numpy, libc)"
POW = "pow: priority transform and weights"


DRIVER = """
import sys
sys.path.insert(0, {tree!r})
import numpy as np
from pal_bench import PrioritizedReplayBuffer
from pal_bench._measure import measured_region
from pal_bench.bench.adapters.base import BETA, LUNAR_FIELDS, lunar_batch
buf = PrioritizedReplayBuffer({capacity}, LUNAR_FIELDS, seed=0)
fill = lunar_batch(8192, seed=1)
for _ in range(-(-{capacity} // 8192)):
    buf.add_batch(**fill)
pool = iter([np.random.default_rng(0).random({batch}) * 2 for _ in range(2 * {calls})])
measured_region(lambda: buf.update_priorities(buf.sample({batch}, beta=BETA)["indices"], next(pool)), {calls})
"""
"""The counted process (run with the checkout under test first on ``sys.path``, so an older build with
no ``step_costs`` module can be measured): fill a buffer of ``capacity`` LunarLander rows, then one
counted region of ``CALLS`` sample+update pairs."""


def _pyx_map(c_file: Path) -> list[tuple[str, int]]:
    """For each line of a Cython-generated C file, the (pyx file, line) it was generated for."""
    out, cur = [("", 0)], ("", 0)
    for line in c_file.read_text(errors="replace").splitlines():
        m = MARK.search(line)
        if m:
            cur = (m.group(1), int(m.group(2)))
        out.append(cur)
    return out


def _functions(pyx: Path) -> list[str]:
    """For each line of a .pyx/.pxd file, the name of the def/cdef function it is in ("" at module level)."""
    names, cur = [""], ""
    for line in pyx.read_text().splitlines():
        m = re.match(r"\s*(?:cp?def|def)\s+(?:inline\s+)?(?:[\w\*\[\]]+\s+)*?(\w+)\s*\(", line)
        if m and not line.strip().startswith("#"):
            cur = m.group(1)
        names.append(cur)
    return names


def classify(func: str, text: str) -> str:
    for fpat, tpat, step in STEP_RULES:
        if re.search(fpat, func) and (tpat is None or re.search(tpat, text)):
            return step
    return OTHER_PROJECT


def parse(profile: Path, tree: Path) -> dict[str, float]:
    """Instructions per sample+update call, by step, from one callgrind profile part."""
    resolve = CompressedNames().resolve
    pyx_maps: dict[str, list[tuple[str, int]]] = {}
    pyx_text: dict[str, tuple[list[str], list[str]]] = {}
    steps: dict[str, float] = defaultdict(float)
    ob = fl = cur = ""
    skip_next, events_ir = False, 0

    def step_of(c_path: str, line_no: int) -> str:
        if c_path not in pyx_maps:
            p = Path(c_path) if os.path.isabs(c_path) else tree / c_path
            pyx_maps[c_path] = _pyx_map(p) if p.exists() else []
        m = pyx_maps[c_path]
        if not m or line_no >= len(m) or not m[line_no][0]:
            return OTHER_PROJECT
        pyx, n = m[line_no]
        if pyx not in pyx_text:
            path = tree / pyx if (tree / pyx).exists() else tree / "pyx" / pyx     # .pxd markers have no folder
            if not path.exists():
                return OTHER_PROJECT
            pyx_text[pyx] = ([""] + path.read_text().splitlines(), _functions(path))
        lines, funcs = pyx_text[pyx]
        return classify(funcs[n] if n < len(funcs) else "", lines[n] if n < len(lines) else "")

    for line in profile.read_text().splitlines():
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            if skip_next:
                skip_next = False
                continue
            parts = line.split()
            if len(parts) <= 1 + events_ir:
                continue
            ir = int(parts[1 + events_ir])
            if PROJECT_OBJECTS.search(ob):
                steps[step_of(cur, int(parts[0]))] += ir
            elif "libm" in ob:
                steps[POW] += ir
            else:
                steps[OTHER_PROJECT] += ir
        elif line.startswith("ob="):
            ob = resolve(line[3:])
        elif line.startswith("fl="):
            fl = cur = resolve(line[3:])
        elif line.startswith(("fi=", "fe=")):
            cur = resolve(line[3:])
        elif line.startswith("fn="):
            cur = fl
        elif line.startswith("calls="):
            skip_next = True
        elif line.startswith(("cob=", "cfi=", "cfl=")):
            resolve(line[4:])
        elif line.startswith("events:"):
            events_ir = line.split()[1:].index("Ir")
    return {k: v / CALLS for k, v in steps.items()}


def measure(capacity: int, tree: Path) -> dict[str, float]:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise ValgrindMissing("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="pal-steps-") as d:
        out = Path(d) / "cg.out"
        cmd = callgrind_command(valgrind, out, [sys.executable, "-c", DRIVER.format(
            tree=str(tree), capacity=capacity, batch=BATCH, calls=CALLS)])
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
        if p.returncode != 0:
            raise RuntimeError(f"the callgrind run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        parts = [f for f in Path(d).glob("cg.out.*") if f.stat().st_size > 0]
        results = [parse(f, tree) for f in parts]
    results = [r for r in results if sum(r.values()) > 0]
    if len(results) != 1:
        raise RuntimeError(f"expected one counted region, got {len(results)}")
    return results[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=float, default=1e6, help="buffer capacity (default 1e6)")
    ap.add_argument("--tree", type=Path, default=Path.cwd(),
                    help="checkout whose in-place build (pal_bench/*.so, pyx/) is measured (default: here)")
    ap.add_argument("--label", default="current", help="label of this build in the CSV (default: current)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"CSV to append to (default {OUT})")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    steps = measure(int(args.capacity), tree)
    total = sum(steps.values())
    print(f"instructions per sample(256) + update_priorities(256) at capacity {args.capacity:.0e} "
          f"({args.label}, {tree}):")
    for step, n in sorted(steps.items(), key=lambda kv: -kv[1]):
        print(f"  {step:48s} {n:10.0f}  {n / total:6.1%}")
    print(f"  {'total':48s} {total:10.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new = not args.out.exists()
    rows = [r for r in (csv.DictReader(args.out.open()) if not new else [])
            if not (r["label"] == args.label and float(r["capacity"]) == args.capacity)]
    rows += [{"label": args.label, "capacity": f"{args.capacity:.0e}", "step": s, "instructions": f"{n:.0f}"}
             for s, n in steps.items()]
    with atomic_open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["label", "capacity", "step", "instructions"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
