"""Run the benchmark suites and write their results: ``python -m pal_bench.bench.run``.

Runs each suite in ``suites/`` with pytest-benchmark (GC off, warm-up on), stores the raw
pytest-benchmark JSON (machine info included) in ``results/``; ``make bench`` then rebuilds the tidy CSV, the
tables and the figures from the stored JSON (``pal_bench.report``). Progress: pytest's verbose lines,
one per case with how many are done and left, and pytest's verbose result lines.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from pal_bench.argtypes import choice_list
from pal_bench.bench import suite_json
from pal_bench.bench.adapters import ADAPTERS
from pal_bench.bench.adapters.registry import COMPONENTS, TEST_ONLY, adapter_class
from pal_bench.bench.protocol import BufferNameError
from pal_bench.conditions import Conditions, add_force_flag, atomic_write_text, refuse_if_busy
from pal_bench.paths import RESULTS, ROOT
from pal_bench.workloads import WORKLOADS

SUITES = ["latency_vs_capacity", "latency_vs_batch", "latency_vs_fanout", "tree_vs_buffer", "shared_vs_private",
          "sequence_replay"]


# the suites that take any workload (the others measure LunarLander rows only: the tree, fan-out, sharing, sequences)
WORKLOAD_SUITES = ["latency_vs_capacity", "latency_vs_batch"]


def buffer_names(text: str) -> list[str]:
    """An argparse ``type``: comma-separated buffer names, each a built-in adapter, an entry point of
    ``pal_bench.buffers`` or ``module:Class`` that loads (``pal_bench.bench.protocol``)."""
    names = choice_list([*ADAPTERS, *COMPONENTS, *TEST_ONLY, *(n for n in text.split(",") if n.strip())])(text)
    for name in names:
        try:
            adapter_class(name)
        except BufferNameError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def user_path() -> str:
    """PYTHONPATH for a suite's process (which runs in ``suites/``): the current directory first, so that a
    ``module:Class`` found from here is found there too."""
    given = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([os.getcwd(), *given])


def results_dir(results: Path, workload: str) -> Path:
    """Where a workload's suite results go: ``results/`` for LunarLander (the stored results), else
    ``results/workloads/<name>/``."""
    return results if workload == "lunarlander" else results / "workloads" / workload


def run_suite(suite: str, sweep: str, results: Path, peers: str | None, extra: list[str],
              workload: str = "lunarlander", env: dict[str, str] | None = None, timeout_s: float | None = None) -> int:
    """Run ``suites/test_<suite>.py`` into ``results/<suite>.json``; ``env``: more environment for it (the
    capacities, a user's module path); ``timeout_s``: stop it after so long (exit status 124). Returns pytest's
    exit status."""
    results.mkdir(parents=True, exist_ok=True)
    skips = results / f"{suite}.skipped.tmp"
    env = dict(os.environ, **(env or {}), PAL_BENCH_SWEEP=sweep, OMP_NUM_THREADS="1", PAL_BENCH_SKIPS=str(skips),
               PAL_BENCH_WORKLOAD=workload)
    if peers:
        env["PAL_BENCH_PEERS"] = peers
    cmd = [
        sys.executable, "-m", "pytest", str(ROOT / "suites" / f"test_{suite}.py"), "-v", "-p", "no:cacheprovider",
        "--benchmark-only", "--benchmark-disable-gc", "--benchmark-warmup=on",
        "--benchmark-min-rounds=20", f"--benchmark-max-time={0.25 if sweep == 'quick' else 1.0}",
        "--benchmark-columns=median,iqr,rounds", "--benchmark-sort=name",
        f"--benchmark-json={results / f'{suite}.json'}", *extra,
    ]
    print(f"== suite {suite} ({sweep} sweep, {workload} rows)", flush=True)
    with Conditions(f"suite {suite} ({sweep} sweep, workload {workload})") as c:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT / "suites", start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"suite {suite}: stopped after {timeout_s:g} s", file=sys.stderr, flush=True)
            rc = 124
        finally:                              # a timeout, Ctrl-C or SIGTERM here: the suite's processes go too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finish_json(results / f"{suite}.json", skips, dict(c.finish(), workload=workload))
    return rc


SAMPLE = 200   # round times kept per case (evenly spaced over the run) for bootstrap intervals


def finish_json(path: Path, skips: Path, meta: dict | None = None) -> None:
    """Replace the per-round timings of a pytest-benchmark JSON (tens of MB) by an evenly spaced sample
    of ``SAMPLE`` of them (``stats.data_sample``, for bootstrap intervals), keeping its statistics and
    machine info, so the stored file stays small enough to commit; add the skipped cases with their
    reasons under ``"skipped"`` and the run's conditions under ``"conditions"``."""
    if not path.exists():
        return
    data = json.loads(path.read_text())
    for b in data["benchmarks"]:
        rounds = b["stats"].pop("data", None)
        if rounds:
            keep = np.linspace(0, len(rounds) - 1, min(SAMPLE, len(rounds))).round().astype(int)
            b["stats"]["data_sample"] = [rounds[i] for i in keep]
    if meta is not None:
        data["conditions"] = meta
    if skips.exists():
        data["skipped"] = json.loads(skips.read_text())
        skips.unlink()
    atomic_write_text(path, json.dumps(data, indent=1))


def compare(stored: Path, new: Path) -> None:
    """pytest-benchmark's own comparison (per case, grouped by name), then one line per case with
    the change of its median."""
    subprocess.call([sys.executable, "-c", "from pytest_benchmark.cli import main; main()", "compare",
                     "--columns=median,iqr", "--sort=name", "--group-by=name", str(stored), str(new)])
    old, _ = suite_json.load(stored)
    cur, _ = suite_json.load(new)
    both = old[old.status == "ok"].merge(cur[cur.status == "ok"], on="name", suffixes=("_stored", "_new"))
    if both.empty:
        print(f"no case of {new.name} is in the stored results")
        return
    both["change_%"] = (both.median_us_new / both.median_us_stored - 1) * 100
    print(f"\n== {stored.stem}: median change per case (new vs stored; + is slower)")
    print(both[["name", "median_us_stored", "median_us_new", "change_%"]].to_string(
        index=False, float_format=lambda v: f"{v:.2f}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", choices=["quick", "full"], default="quick",
                    help="quick (default: capacities to 1e6, short timing) or full (to 1e7, longer)")
    ap.add_argument("--suite", action="append", choices=SUITES, help="suite to run (repeatable; default all)")
    ap.add_argument("--peers", type=buffer_names,
                    help=f"comma-separated buffers: of {', '.join(ADAPTERS)}, an entry point of the group "
                         "pal_bench.buffers, or module:Class (default: all built-in ones installed; with a workload "
                         "other than lunarlander also pal-out and floor-gather)")
    ap.add_argument("--workload", choices=list(WORKLOADS), default="lunarlander",
                    help="the transition every buffer stores (default lunarlander: the stored results); others "
                         f"run {', '.join(WORKLOAD_SUITES)} into results/workloads/<name>/")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--compare", action="store_true",
                    help="run into results/tmp/ and compare with the stored results (pytest-benchmark compare)")
    add_force_flag(ap)
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.workload != "lunarlander":
        other = [s for s in args.suite or [] if s not in WORKLOAD_SUITES]
        if other:
            ap.error(f"--workload {args.workload}: suites {other} measure LunarLander rows only "
                     f"(workload suites: {', '.join(WORKLOAD_SUITES)})")
    if refuse_if_busy("pal_bench.bench.run", args.force):
        return 2
    stored = results_dir(args.results, args.workload)
    out = stored / "tmp" if args.compare else stored
    rc = 0
    for suite in args.suite or (SUITES if args.workload == "lunarlander" else WORKLOAD_SUITES):
        rc |= run_suite(suite, args.sweep, out, ",".join(args.peers or []), args.pytest_args, args.workload,
                        env={"PYTHONPATH": user_path()})
        if args.compare and (stored / f"{suite}.json").exists():
            compare(stored / f"{suite}.json", out / f"{suite}.json")
    if not args.compare:
        print("stored; `python -m pal_bench.report` (make figures) rebuilds the tables and figures", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
