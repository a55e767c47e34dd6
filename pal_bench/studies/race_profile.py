"""Where a race run's time goes: ``pal-bench race-profile CONTESTANT [--seconds S]``.

Runs one race contestant exactly as ``pal-bench race`` does (same task, seed, split), but for ``--seconds``
of wall-clock time and with the target out of reach, and says where the time went:

- RLlib and tianshou (one process, one thread: RLlib with 0 env runners and a local learner) run under
  cProfile; each function's own time is charged to the package its code lives in, and a built-in's
  (torch's kernels, Box2D's step, numpy's C loops) to the package of the Python function that called it,
  so the areas add up to the profiled time. cProfile slows Python-heavy code more than C, so read shares
  against each other, not seconds against an unprofiled run; the cumulative time of the race's
  evaluation (``greedy_return``) is shown apart, since its env steps and forward passes fall in those areas.
- PAL's contestants (worker threads and processes, which cProfile would not see) report their trainer's own
  per-phase times (``summary.json``'s ``phase_seconds``, the ``pal-bench profile`` table) per worker role.

The first ``learning_starts`` env steps collect without updates and count in the profile: on LunarLander
they take PAL about 20 s and RLlib under cProfile about 110 s of the default 300 s.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import io
import json
import pstats
import sys
import time
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import SECONDS, UsageError, duration, positive_int, rng_seed
from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import Conditions
from pal_bench.paths import RESULTS
from pal_bench.studies.race import CONTESTANTS, TASKS, TRACKS
from pal_bench.studies.race.contestants import TRACK_CONTESTANTS
from pal_bench.studies.race.contestants.pal import BACKENDS as PAL_BACKENDS
from pal_bench.studies.race.run import run_one
from pal_bench.studies.race.task import SettingsMismatch

# (area, substrings of a code path that put a function in it), first match wins
AREAS = (
    ("replay buffer", ("pal_bench/integrations/", "pal_bench/_replay", "pal_bench/_rows", "pal_bench/_segment",
                       "replay_buffers/", "tianshou/data/buffer")),
    ("race evaluation loop", ("pal_bench/studies/race",)),
    ("environment (gymnasium, Box2D)", ("gymnasium/", "Box2D")),
    ("torch (forward, backward, optimizer)", ("torch/",)),
    ("RLlib and Ray", ("ray/",)),
    ("tianshou", ("tianshou/",)),
    ("numpy", ("numpy/",)),
)
OTHER = "other Python (stdlib, glue)"
# RLlib's DQN loop by component: (label, code path substrings, function name); each component's cumulative time
# (what it calls included) from functions that do not call one another in that loop
BUFFERS = ("replay_buffers/prioritized_episode_buffer.py", "pal_bench/integrations/rllib/")
COMPONENTS = (
    ("env runner: env steps, exploration forward passes, episode bookkeeping",
     ("rllib/env/single_agent_env_runner.py",), "sample"),
    ("replay buffer add", BUFFERS, "add"),
    ("replay buffer sample", BUFFERS, "sample"),
    ("replay buffer update_priorities", BUFFERS, "update_priorities"),
    ("learner update: batch from episodes, forward, backward, optimizer", ("rllib/core/learner/learner_group.py",),
     "update"),
    ("race evaluation (greedy episodes)", ("pal_bench/studies/race/clock.py",), "greedy_return"),
)


def area_of(path: str) -> str:
    """The area of a function whose code lives at ``path`` (OTHER if none matches)."""
    path = path.replace("\\", "/")
    for area, parts in AREAS:
        if any(p in path for p in parts):
            return area
    return OTHER


def area_seconds(stats: pstats.Stats) -> dict[str, float]:
    """Own time per area: a Python function's own time in its file's area; a built-in's (file ``~``) split
    over its callers by the time each spent in it, in the caller's area (``OTHER`` when the caller is also
    a built-in). Sums to the profile's total own time."""
    out: collections.Counter = collections.Counter()
    for (path, _line, _name), (_cc, _nc, tt, _ct, callers) in stats.stats.items():
        if path != "~":
            out[area_of(path)] += tt
            continue
        by_caller = sum(c[2] for c in callers.values())
        if not callers or by_caller <= 0:
            out[OTHER] += tt
            continue
        for (cpath, _cl, _cn), c in callers.items():
            out[OTHER if cpath == "~" else area_of(cpath)] += tt * c[2] / by_caller
    return dict(out)


def cumulative(stats: pstats.Stats, name: str, paths: tuple[str, ...] = ("",)) -> float:
    """Cumulative seconds of the functions called ``name`` whose code path holds one of ``paths`` (0 if none ran)."""
    return sum(v[3] for (p, _l, n), v in stats.stats.items()
               if n == name and any(part in p.replace("\\", "/") for part in paths))


def area_table(stats: pstats.Stats) -> pd.DataFrame:
    """Areas by own time: seconds and share of the profiled total, largest first."""
    sec = area_seconds(stats)
    total = sum(sec.values()) or 1.0
    t = pd.DataFrame({"area": list(sec), "seconds": list(sec.values())})
    t["share_%"] = (100 * t.seconds / total).round(1)
    return t.sort_values("seconds", ascending=False).reset_index(drop=True)


def component_table(stats: pstats.Stats, total_s: float) -> pd.DataFrame:
    """Cumulative seconds of each ``COMPONENTS`` entry that ran, the rest of ``total_s`` as one row, and
    shares of ``total_s``."""
    sec: dict[str, float] = {}
    for label, paths, fn in COMPONENTS:
        if seconds := cumulative(stats, fn, paths):
            sec[label] = sec.get(label, 0.0) + seconds
    rows = [{"component": k, "seconds": v} for k, v in sec.items()]
    rows.append({"component": "the rest (framework loop, metrics, set-up)", "seconds": total_s - sum(sec.values())})
    t = pd.DataFrame(rows)
    t["share_%"] = (100 * t.seconds / total_s).round(1)
    return t


def profile_framework(name: str, track: str, task_name: str, task, seed: int) -> tuple[dict, pstats.Stats]:
    prof = cProfile.Profile()
    prof.enable()
    try:
        run = run_one(name, track, task_name, seed, task=task)
    finally:
        prof.disable()
    return run, pstats.Stats(prof)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench race-profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("contestant", choices=CONTESTANTS)
    ap.add_argument("--seconds", type=duration, default=300.0,
                    help=f"wall-clock to run, {SECONDS} (default 300); the run must get well past the task's "
                         "learning_starts: on the full task that takes RLlib under cProfile about 110 s")
    ap.add_argument("--seed", type=rng_seed, default=0)
    ap.add_argument("--task", choices=sorted(TASKS), default="full", help="the race's task (default: full)")
    ap.add_argument("--track", choices=TRACKS, default="matched", help="the race's track (default: matched)")
    ap.add_argument("--top", type=positive_int, default=25, help="cProfile entries to list by cumulative time")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="where the tables are stored as race_profile_<track>_<contestant>[_<task>].json "
                         "(default results/)")
    args = ap.parse_args(argv)
    # the race's task, run for --seconds with a target no evaluation reaches
    task = dataclasses.replace(TASKS[args.task], max_wall_s=args.seconds, target=1e300)
    name = args.contestant
    if name not in TRACK_CONTESTANTS[args.track]:
        ap.error(f"{name} does not race in the {args.track} track ({', '.join(TRACK_CONTESTANTS[args.track])})")
    with Conditions(f"race profile ({args.track}, {name})") as cond:
        t0 = time.perf_counter()
        try:
            if name in PAL_BACKENDS:
                run = run_one(name, args.track, args.task, args.seed, task=task)
                stats = None
            else:
                run, stats = profile_framework(name, args.track, args.task, task, args.seed)
        except SettingsMismatch as e:    # the matched track's check after the run: too short to measure its updates
            raise UsageError(f"{e}; a run of --seconds {args.seconds:g} may end before it gets well past the "
                             f"task's learning_starts ({task.learning_starts} env steps): give it more --seconds"
                             ) from None
        wall = time.perf_counter() - t0
    head = (f"{name} ({args.track}) on {task.env}, seed {args.seed}: {wall:.1f} s (set-up {run['setup_s']:.1f} s), "
            f"{len(run['curve'])} evaluations, {run['env_steps']} env steps"
            + (" (under cProfile)" if stats else f", {run['facts'].get('actors')} actor(s) + "
               f"{run['facts'].get('learners')} learner(s)"))
    print(head)
    tables: dict[str, pd.DataFrame] = {}
    if stats is None:
        from pal_bench.train.profile import phase_frame, role_table

        t = role_table(phase_frame(run["phase_seconds"]))
        t["share_%"] = (t.pop("share") * 100).round(1)
        tables["per-phase seconds per worker role (mean over the role's workers)"] = t
    else:
        if name.startswith("rllib"):
            tables["cumulative time per component of RLlib's DQN loop"] = component_table(stats, stats.total_tt)
        tables["own time per area (built-ins charged to their caller's area)"] = area_table(stats)
    for title, t in tables.items():
        print(f"\n{title}:")
        print(t.to_markdown(index=False, floatfmt=".1f"))
    evaluation = cumulative(stats, "greedy_return") if stats else None
    if stats is not None:
        print(f"\nrace evaluation (greedy_return, cumulative): {evaluation:.1f} s")
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
    path = args.out / f"race_profile_{args.track}_{name}{'' if args.task == 'full' else '_' + args.task}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({
        "contestant": name, "track": args.track, "task": args.task, "seed": args.seed, "seconds": args.seconds,
        "summary": head, "profiled": stats is not None, "evaluation_s": evaluation,
        "tables": {k: v.to_dict(orient="records") for k, v in tables.items()}, "conditions": cond.as_dict()},
        indent=1, default=float))
    print(f"stored: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
