"""The race in resumable pieces: every (contestant, seed) run and every speed round is stored as soon as it ends, and
the same command run again skips what is stored and still current (same settings hash), so a race of many hours
is completed over several sittings.

Layout (``<runs>`` is ``results/race_runs`` for the full task, ``results/race_quick_runs`` for ``--quick``):
``<runs>/<track>/<contestant>-s<seed>.json`` (one race run), ``<runs>/<track>/speed/<contestant>-r<round>.json``
(one speed round of one contestant); the CSVs and figures are rebuilt from these files (``results.py``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import Conditions, settle
from pal_bench.studies.race.contestants import contestant_class
from pal_bench.studies.race.probe import probe_outliers
from pal_bench.studies.race.run import launch
from pal_bench.studies.race.task import TASKS, settings_hash

SETTLE_S = 300.0          # before each run: the longest wait for the previous run's load to fade
MIN_UNREACHED_SEEDS = 5   # a contestant that reached the target in none of this many seeds runs no more of them


def runs_dir(out: Path, task_name: str, track: str) -> Path:
    return out / ("race_runs" if task_name == "full" else f"race_{task_name}_runs") / track


def run_hash(name: str, track: str, task_name: str) -> str:
    """The settings a stored run must still have: the task and the contestant's settings on the track."""
    task = TASKS[task_name]
    return settings_hash(task, track, name, contestant_class(name).settings(name, track, task))


def load_runs(directory: Path, pattern: str = "*-s*.json") -> list[dict]:
    """Every run stored in ``directory`` matching ``pattern`` (unreadable files skipped, with a line)."""
    runs = []
    for path in sorted(directory.glob(pattern)):
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            print(f"pal-bench race: skipping {path} ({e})", file=sys.stderr)
    return runs


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _store(path: Path, run: dict, key: str, measured: Conditions) -> dict:
    conditions = measured.finish()
    run |= {"settings_hash": key, "noisy": measured.noisy(), "conditions": conditions,
            "commit": conditions.get("commit")}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(run))
    return run


def run_race(track: str, task_name: str, names: list[str], seeds: int, out: Path, max_minutes: float | None = None,
             rerun_noisy: bool = False, rerun_slow: bool = False, settle_s: float = SETTLE_S,
             launch_run: Callable[..., dict] = launch) -> bool:
    """Run every (contestant, seed < ``seeds``) of ``track`` not stored and current; each seed's contestants in an
    order rotated by the seed. A contestant that reached the target in none of its first ``MIN_UNREACHED_SEEDS``
    seeds runs no more (its runs are lower bounds). ``max_minutes``: start no run after that many minutes (at least
    one runs). ``rerun_noisy`` / ``rerun_slow``: run again the stored runs during which the machine was busy, or
    whose speed probe is more than 10% off the median probe of the stored race. True when every run is stored."""
    directory = runs_dir(out, task_name, track)
    directory.mkdir(parents=True, exist_ok=True)
    log = out / "race.log"
    stored = {(r["contestant"], r["seed"]): r for r in load_runs(directory)}
    slow = set()
    if rerun_slow:
        probes = {k: r["probe_s"] for k, r in stored.items() if r.get("probe_s")}
        slow = set(probe_outliers(probes))
        for k in sorted(slow):
            _say(f"{k[0]} seed {k[1]}: probe {stored[k]['probe_s']:.1f} s is more than 10% off the race's median: "
                 f"run again")
    t_start, launched = time.monotonic(), 0
    todo = [(seed, name) for seed in range(seeds) for name in names[seed % len(names):] + names[:seed % len(names)]]
    for i, (seed, name) in enumerate(todo, 1):
        key = run_hash(name, track, task_name)
        run = stored.get((name, seed))
        current = (run is not None and run.get("settings_hash") == key and not (rerun_noisy and run.get("noisy"))
                   and (name, seed) not in slow)
        if current:
            continue
        mine = [r for (n, _), r in stored.items() if n == name and r.get("settings_hash") == key]
        if len(mine) >= MIN_UNREACHED_SEEDS and not any(r.get("curve") and _reached(r) for r in mine):
            continue
        if launched and max_minutes is not None and time.monotonic() - t_start > 60 * max_minutes:
            _say(f"pal-bench race: stopped after {max_minutes:g} minutes; stored runs are in {directory}; run the same "
                 f"command again to go on")
            return False
        settle(settle_s, progress=lambda m, i=i: _say(f"[{i}/{len(todo)}] {m}"))
        task = TASKS[task_name]
        _say(f"[{i}/{len(todo)}] {track}: {name} seed {seed} on {task.env} (target {task.target:g}, budget "
             f"{task.max_steps} steps / {task.max_wall_s:.0f} s of training)")
        measured = Conditions(f"race ({track}, {task_name}): {name} seed {seed}")
        run = _store(directory / f"{name}-s{seed}.json", launch_run(name, track, task_name, seed, log), key, measured)
        launched += 1
        stored[name, seed] = run
        hit = _hit(run)
        _say(f"[{i}/{len(todo)}] {name} seed {seed}: " + (
            f"target at {hit['env_steps']} steps, {hit['setup_s'] + hit['train_s']:.1f} s" if hit else
            f"not reached in {run['env_steps']} steps, {run['train_s']:.0f} s") + f" (probe {run.get('probe_s')} s)"
            + (" (noisy: the machine was busy; --rerun-noisy runs it again)" if run["noisy"] else ""))
    return True


def _hit(run: dict) -> dict | None:
    target = TASKS[run["task"]].target
    return next((e for e in run.get("curve", []) if e["mean_return"] >= target), None)


def _reached(run: dict) -> bool:
    return _hit(run) is not None


def run_speed(track: str, task_name: str, names: list[str], rounds: int, out: Path, settle_s: float = SETTLE_S,
              launch_run: Callable[..., dict] = launch) -> None:
    """Speed rounds: in each round every contestant trains for ``Task.speed_span`` env steps after learning starts
    (no evaluation), one after the other, the order rotated by one each round; each (round, contestant) is stored
    as soon as it ends and skipped when stored and current."""
    directory = runs_dir(out, task_name, track) / "speed"
    directory.mkdir(parents=True, exist_ok=True)
    log = out / "race.log"
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            path = directory / f"{name}-r{r}.json"
            key = run_hash(name, track, task_name)
            if path.exists():
                try:
                    if json.loads(path.read_text()).get("settings_hash") == key:
                        continue
                except (OSError, json.JSONDecodeError):
                    pass
            settle(settle_s, progress=lambda m, r=r: _say(f"speed round {r}: {m}"))
            measured = Conditions(f"race speed ({track}, {task_name}): {name} round {r}")
            run = launch_run(name, track, task_name, r, log, mode="speed")
            run["round"] = r
            run = _store(path, run, key, measured)
            _say(f"speed round {r}: {name} {run['env_steps_per_s']:.0f} env steps/s")
