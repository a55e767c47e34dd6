"""Race to a target return: PAL's trainer against tianshou's and RLlib's DQN, in two tracks.

``pal-bench race [--track matched|tuned] [--quick] [--seeds N] [--only NAME ...]`` runs the race in resumable
pieces; ``--speed`` runs the interleaved speed rounds; ``--rebuild`` rebuilds the CSVs, tables and figures from the
stored run files.

- **matched** (default): every contestant trains the same learner on the same data rhythm (``task.MATCHED``:
  Double DQN, obs-256-256-actions, Huber x importance weights, clip 10, Adam 5e-4, batch 128, 3-step, 200k
  prioritized replay with alpha 0.6 and beta 0.4, target every 250 updates, one environment, 0.25 updates per env
  step, one torch thread), checked from what each framework built and, after the run, from its own counters.
  Contestants: pal (threads), pal-processes, tianshou, rllib, rllib-pal.
- **tuned**: each framework at its authors' own settings for the task (PAL's process backend at its own preset,
  which the matched learner is, and its Ape-X preset; tianshou's LunarLander example; RLlib's tuned DQN examples).

Each run is its own process (``run.py``), probes the machine first (``probe.py``), evaluates with training
stopped (``clock.py``) and is stored at once (``orchestrate.py``); the same command skips what is stored and current.
Results: ``results/race.csv`` (one row per run, both tracks), ``race_curves.csv``, ``race_speed.csv`` and
``figures/race_<track>.png`` (``--quick``: ``race_quick*``); tables in docs/race.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pal_bench.argtypes import positive_float, positive_int, rng_seed
from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.studies.race.contestants import CONTESTANTS, TRACK_CONTESTANTS
from pal_bench.studies.race.task import TASKS, TRACKS, suffix

DEFAULT_SEEDS = {"matched": 10, "tuned": 5}
QUICK_SEEDS = 3                     # --quick: a first look in minutes, not a result to quote
SPEED_ROUNDS = 5


def rebuild(out: Path, task_name: str, quiet: bool = False) -> int:
    """Rebuild ``race[_quick].csv``, ``_curves.csv``, ``_speed.csv`` and the figures from the stored run files;
    print the tables."""
    from pal_bench.bench.publishing import store
    from pal_bench.conditions import write_meta
    from pal_bench.studies.race import figure, results
    from pal_bench.studies.race.orchestrate import load_runs, runs_dir

    runs, speed = [], []
    for track in TRACKS:
        d = runs_dir(out, task_name, track)
        runs += load_runs(d)
        speed += load_runs(d / "speed", "*-r*.json")
    if not runs:
        raise FileNotFoundError(f"no stored race runs under {runs_dir(out, task_name, 'matched').parent}; run "
                                f"`pal-bench race` first")
    sfx = suffix(task_name)
    df = results.runs_frame(runs)
    store(df, out / f"race{sfx}.csv", float_format="%.3f")
    curves = results.curves_frame(runs)
    store(curves, out / f"race{sfx}_curves.csv", float_format="%.3f")
    store(results.speed_frame(speed), out / f"race{sfx}_speed.csv", float_format="%.2f")
    write_meta(out / f"race{sfx}.csv", combined_conditions([r["conditions"] for r in runs]))
    if speed:
        write_meta(out / f"race{sfx}_speed.csv", combined_conditions([r["conditions"] for r in speed]))
    for track in TRACKS:
        c = curves[curves.track == track] if not curves.empty else curves
        if not c.empty:
            path = figure.draw(c, track, TASKS[task_name], out / "figures" / f"race{sfx}_{track}.png")
            if not quiet:
                print(f"figure: {path}")
    if not quiet:
        from pal_bench.studies.race.publish import race_blocks

        print(race_blocks(out, task_name))
    return 0


def combined_conditions(parts: list[dict]) -> dict:
    """The conditions of a race stored in pieces: first start, last finish, the highest loads, noisy if any run
    was, every commit that ran one."""
    meta = dict(parts[0])
    meta["what"] = meta["what"].split(":")[0]
    meta["started"] = min(p["started"] for p in parts)
    meta["finished"] = max(p["finished"] or "" for p in parts) or None
    for k in ("load_before", "load_after"):
        vals = [p[k] for p in parts if p.get(k) is not None]
        meta[k] = max(vals) if vals else None
    meta["noisy"] = any(p.get("noisy") for p in parts)
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
    ap.add_argument("--only", nargs="+", choices=CONTESTANTS, help="run only these contestants of the track")
    ap.add_argument("--speed", action="store_true",
                    help=f"run the interleaved speed rounds instead ({SPEED_ROUNDS} by default, --rounds)")
    ap.add_argument("--rounds", type=positive_int, default=SPEED_ROUNDS, help="speed rounds (with --speed)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rebuild", action="store_true", help="only rebuild the CSVs, tables and figures from stored runs")
    ap.add_argument("--max-minutes", type=positive_float, metavar="M",
                    help="start no run after M minutes (the stored runs stay; run the same command to go on)")
    ap.add_argument("--rerun-noisy", action="store_true", help="run again stored runs marked noisy (machine busy)")
    ap.add_argument("--rerun-slow", action="store_true",
                    help="run again stored runs whose speed probe is more than 10%% off the race's median probe")
    add_force_flag(ap)
    ap.add_argument("--worker", choices=CONTESTANTS, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=rng_seed, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("race", "speed"), default="race", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    task_name = args.task or ("quick" if args.quick else "full")
    names = [n for n in TRACK_CONTESTANTS[args.track] if not args.only or n in args.only]
    if args.only and not names:
        ap.error(f"--only {' '.join(args.only)}: none of them races in the {args.track} track "
                 f"({', '.join(TRACK_CONTESTANTS[args.track])})")
    if args.worker:
        from pal_bench.studies.race.run import run_one

        run = run_one(args.worker, args.track, task_name, args.seed, args.mode)
        atomic_write_text(args.worker_out, json.dumps(run))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rebuild:
        return rebuild(args.out, task_name)
    stop_on_termination()
    if refuse_if_busy("pal-bench race", args.force):
        return 2
    from pal_bench.studies.race import orchestrate

    if args.speed:
        orchestrate.run_speed(args.track, task_name, names, args.rounds, args.out)
    else:
        seeds = args.seeds or (QUICK_SEEDS if task_name == "quick" else DEFAULT_SEEDS[args.track])
        if not orchestrate.run_race(args.track, task_name, names, seeds, args.out, args.max_minutes,
                                    args.rerun_noisy, args.rerun_slow):
            return 0
    return rebuild(args.out, task_name)


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
