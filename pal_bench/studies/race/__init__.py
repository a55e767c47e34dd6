"""Race to a target return: PAL's trainer against tianshou's and RLlib's DQN, in two tracks, each on a core budget.

``pal-bench race [--track matched|tuned] [--cpus N] [--quick] [--seeds N] [--only NAME ...]`` runs the race in
resumable pieces; ``--speed`` runs the interleaved speed rounds; ``--rerun-slow`` one pass of reruns by measured
speed; ``--rebuild`` rebuilds the CSVs, tables and figures from the stored run files.

- **matched** (default): every contestant trains the same learner on the same data rhythm (``task.MATCHED``:
  Double DQN, obs-256-256-actions, Huber x importance weights, clip 10, Adam 5e-4, batch 128, 3-step, 200k
  prioritized replay with alpha 0.6 and beta 0.4, target every 250 updates, one environment, 0.25 updates per env
  step, one torch thread), checked from what each framework built and, while it runs, from hooks on its objects
  (``counters.py``: optimizer steps, target copies, the first update's env step, the loss's batch, epsilon).
  Contestants: pal (threads), pal-processes, tianshou, rllib (and rllib-pal with ``--only``).
- **tuned**: each framework at its authors' own settings for the task (PAL's process backend at its own preset,
  which the matched learner is, and its Ape-X preset; tianshou's LunarLander example; RLlib's tuned DQN examples).
- **core budget** (``--cpus``, default 2): every contestant's process tree is pinned to the same CPUs
  (``pin.py``); with two, each framework places its work with its own parallel features (PAL an actor process,
  tianshou a subprocess environment, RLlib a remote env runner). The CPU each run used is stored (``own_cores``).

Each run is its own process (``run.py``), probes the machine first (``probe.py``), evaluates with training
stopped (``clock.py``) and is stored at once (``orchestrate.py``); the same command skips what is stored and current,
and a run made again is stored beside the one it supersedes. Results: ``results/race.csv`` (one row per run on a
core budget, every track, superseded runs included, with its run-time counters and its matched check),
``race_unpinned.csv`` (the runs stored before the core budgets), ``race_curves.csv``, ``race_speed.csv``,
``race_tuning.csv`` and
``figures/race_<track>_<N>cpu.png`` (``--quick``: ``race_quick*``); tables in docs/race.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pal_bench.argtypes import UsageError, positive_float, positive_int, rng_seed
from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import add_force_flag, refuse_if_busy, usable_cores
from pal_bench.paths import RESULTS
from pal_bench.studies.race.contestants import CONTESTANTS, DEFAULT_CONTESTANTS, TRACK_CONTESTANTS
from pal_bench.studies.race.task import TASKS, TRACKS, suffix

DEFAULT_SEEDS = {"matched": 10, "tuned": 10}
QUICK_SEEDS = 3                     # --quick: a first look in minutes, not a result to quote
SPEED_ROUNDS = 5


def rebuild(out: Path, task_name: str, quiet: bool = False) -> int:
    """Rebuild ``race[_quick].csv`` (the runs on a core budget), ``_unpinned.csv`` (the runs stored before the core
    budgets), ``_curves.csv``, ``_speed.csv``, ``_tuning.csv`` and the figures from the stored run files (every table
    computed before any file is written); print the tables."""
    from pal_bench.bench.publishing import store
    from pal_bench.conditions import write_meta
    from pal_bench.studies.race import figure, results
    from pal_bench.studies.race.orchestrate import load_runs, runs_dir
    from pal_bench.studies.race.runfiles import budget_dirs

    runs, speed, tuning = [], [], []
    for track in TRACKS:
        for d, cpus in budget_dirs(runs_dir(out, task_name, track)):
            runs += load_runs(d, cpus=cpus)
            speed += load_runs(d / "speed", "*-r*.json")
            tuning += load_runs(d / "tuning", "*-c*-s*.json", cpus=cpus)
    if not runs and not tuning:
        raise FileNotFoundError(f"no stored race runs under {runs_dir(out, task_name, 'matched').parent}; run "
                                f"`pal-bench race` first")
    sfx = suffix(task_name)
    pinned = [r for r in runs if r.get("cpus") is not None]
    unpinned = [r for r in runs if r.get("cpus") is None]          # stored before the core budgets: kept apart
    tables = {}
    if runs:                                         # a tuning search stored before any race run has its table only
        tables = {f"race{sfx}.csv": (results.runs_frame(pinned), pinned, "%.3f"),
                  f"race{sfx}_curves.csv": (results.curves_frame(runs), None, "%.3f"),
                  f"race{sfx}_speed.csv": (results.speed_frame(speed), speed, "%.2f")}
        if unpinned:
            tables[f"race{sfx}_unpinned.csv"] = (results.runs_frame(unpinned), unpinned, "%.3f")
    if tuning:
        tables[f"race{sfx}_tuning.csv"] = (results.tuning_frame(tuning), tuning, "%.3f")
    metas = {name: combined_conditions([r.get("conditions") or {} for r in made]) for name, (_, made, _) in
             tables.items() if made}
    for name, (frame, _, fmt) in tables.items():
        store(frame, out / name, float_format=fmt)
    for name, meta in metas.items():
        write_meta(out / name, meta)
    if runs and not unpinned:                        # no run from before the budgets left: nor its table
        for stale in (out / f"race{sfx}_unpinned.csv", out / f"race{sfx}_unpinned.csv.meta.json"):
            stale.unlink(missing_ok=True)
    curves = tables[f"race{sfx}_curves.csv"][0] if runs else None
    if curves is not None and not curves.empty:
        for (track, cpus), c in curves.groupby(["track", curves.cpus.fillna(-1)]):
            cpus = None if cpus == -1 else int(cpus)
            path = figure.draw(c, track, TASKS[task_name], out / "figures" / results.figure_name(sfx, track, cpus),
                               cpus)
            if not quiet:
                print(f"figure: {path}")
    if not quiet:
        from pal_bench.studies.race.publish import race_blocks

        print(race_blocks(out, task_name))
    return 0


def combined_conditions(parts: list[dict]) -> dict:
    """The conditions of a race stored in pieces: first start, last finish, the highest loads, noisy if any run
    was, every commit that ran one (a run file's conditions are read as data: what is missing or not of its type is
    left out)."""
    def texts(key: str) -> list[str]:
        return [p[key] for p in parts if isinstance(p.get(key), str)]

    def numbers(key: str) -> list[float]:
        return [p[key] for p in parts if isinstance(p.get(key), (int, float)) and not isinstance(p.get(key), bool)]

    meta = dict(parts[0]) if parts else {}
    meta["what"] = (texts("what") or ["race"])[0].split(":")[0]
    meta["started"] = min(texts("started"), default=None)
    meta["finished"] = max(texts("finished"), default=None)
    for k in ("load_before", "load_after"):
        meta[k] = max(numbers(k), default=None)
    meta["noisy"] = any(p.get("noisy") is True for p in parts)
    meta["commit"] = ", ".join(sorted({str(p.get("commit")) for p in parts}))
    meta["runs"] = len(parts)
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench race", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--track", choices=TRACKS, default="matched", help="matched (default) or tuned")
    ap.add_argument("--quick", action="store_true", help="CartPole-v1 (default: LunarLander-v3 to 200)")
    ap.add_argument("--task", choices=sorted(TASKS), help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=positive_int,
                    help=f"seeds per contestant (default: {DEFAULT_SEEDS['matched']} matched, "
                         f"{DEFAULT_SEEDS['tuned']} tuned, {QUICK_SEEDS} with --quick; a contestant that reaches the "
                         f"target in none of its first 5 runs no more)")
    ap.add_argument("--cpus", type=positive_int, default=None,
                    help="the run's core budget: every contestant's process tree pinned to this many CPUs, each "
                         "framework using its own parallel features within them (default: 2, or the CPUs this "
                         "machine has if fewer); the race has a 1-CPU and a 2-CPU track")
    ap.add_argument("--only", nargs="+", choices=CONTESTANTS, help="run only these contestants of the track")
    ap.add_argument("--tune", action="store_true",
                    help="run the tuned track's tuning search instead: each framework's configurations "
                         "(tuning.SEARCH, the same number for each, from its own example) on 2 seeds each")
    ap.add_argument("--speed", action="store_true",
                    help=f"run the interleaved speed rounds instead ({SPEED_ROUNDS} by default, --rounds)")
    ap.add_argument("--rounds", type=positive_int, default=SPEED_ROUNDS, help="speed rounds (with --speed)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rebuild", action="store_true", help="only rebuild the CSVs, tables and figures from stored runs")
    ap.add_argument("--max-minutes", type=positive_float, metavar="M",
                    help="start no run after M minutes (the stored runs stay; run the same command to go on)")
    ap.add_argument("--rerun-noisy", action="store_true", help="run again stored runs marked noisy (machine busy)")
    ap.add_argument("--rerun-slow", action="store_true",
                    help="run again, once, the stored runs whose own env steps/s after learning start is below "
                         "80%% of their contestant's median speed round (run --speed first); the runs they replace "
                         "are kept, marked superseded_by")
    add_force_flag(ap)
    ap.add_argument("--worker", choices=CONTESTANTS, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=rng_seed, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--config", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("race", "speed"), default="race", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tune and args.track != "tuned":
        ap.error("argument --tune: it searches the tuned track's configurations: add --track tuned")
    task_name = args.task or ("quick" if args.quick else "full")
    names = [n for n in (TRACK_CONTESTANTS[args.track] if args.only else DEFAULT_CONTESTANTS[args.track])
             if not args.only or n in args.only]
    if args.only and not names:
        ap.error(f"--only {' '.join(args.only)}: none of them races in the {args.track} track "
                 f"({', '.join(TRACK_CONTESTANTS[args.track])})")
    from pal_bench.studies.race.pin import cpu_set

    cpus = args.cpus or min(2, usable_cores())
    try:
        cpu_set(cpus)                                # refused now when this machine has fewer
    except UsageError as e:
        ap.error(f"argument --cpus: {e}")
    if args.worker:
        from pal_bench.studies.race.run import run_one

        stop_on_termination()                        # SIGTERM from the race: close the contestant, then exit

        run = run_one(args.worker, args.track, task_name, args.seed, args.mode, cpus=args.cpus, config=args.config)
        atomic_write_text(args.worker_out, json.dumps(run))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rebuild:
        return rebuild(args.out, task_name)
    stop_on_termination()
    if refuse_if_busy("pal-bench race", args.force):
        return 2
    try:
        return _run(args, task_name, names, cpus)
    except KeyboardInterrupt as e:
        print(f"\npal-bench race: interrupted ({e or 'Ctrl-C'}); the runs stored so far are kept: run the same "
              f"command again to go on", file=sys.stderr)
        return 130


def _run(args, task_name: str, names: list[str], cpus: int) -> int:
    from pal_bench.studies.race import orchestrate

    if args.tune:
        orchestrate.run_tuning(task_name, names, args.out, cpus, args.seeds, args.max_minutes)
    elif args.speed:
        orchestrate.run_speed(args.track, task_name, names, args.rounds, args.out, cpus=cpus)
    else:
        seeds = args.seeds or (QUICK_SEEDS if task_name == "quick" else DEFAULT_SEEDS[args.track])
        orchestrate.run_race(args.track, task_name, names, seeds, args.out, args.max_minutes, args.rerun_noisy,
                             args.rerun_slow, cpus=cpus)
    return rebuild(args.out, task_name)              # a piece stopped by --max-minutes leaves its tables current too


def stop_on_termination() -> None:
    """SIGTERM and SIGHUP stop the race as Ctrl-C does (KeyboardInterrupt): the run in flight is killed with the
    worker process ``subprocess.run`` waits on (by default a terminated orchestrator would leave it running)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


__all__ = ["CONTESTANTS", "TASKS", "TRACKS", "main", "rebuild", "stop_on_termination"]

if __name__ == "__main__":
    sys.exit(main())
