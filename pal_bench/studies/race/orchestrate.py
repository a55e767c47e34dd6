"""The race in resumable pieces: every (contestant, seed) run and every speed round is stored as soon as it ends, and
the same command run again skips what is stored and still current (same settings hash), so a race of many hours
is completed over several sittings. Every run is kept: a run made again (its settings changed, the machine was busy,
or it ran slower than its contestant's speed rounds) is a new file, and the old one names it in ``superseded_by``.

Layout (``<runs>`` is ``results/race_runs`` for the full task, ``results/race_quick_runs`` for ``--quick``):
``<runs>/<track>/cpus<N>/<contestant>-s<seed>[-a<k>].json`` (one race run on a budget of N CPUs; ``-a<k>``: its
k-th run again), ``<runs>/<track>/cpus<N>/speed/<contestant>-r<round>.json`` (one speed round). Runs stored before
the core budgets (not pinned) stay in ``<runs>/<track>/`` and are read as such (``cpus`` None). The CSVs and
figures are rebuilt from these files (``results.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import Conditions, settle
from pal_bench.studies.race import runfiles
from pal_bench.studies.race.contestants import contestant_class
from pal_bench.studies.race.pin import over_budget
from pal_bench.studies.race.results import run_rate
from pal_bench.studies.race.run import launch
from pal_bench.studies.race.task import TASKS, settings_hash

SETTLE_S = 300.0          # before each run: the longest wait for the previous run's load to fade
MIN_UNREACHED_SEEDS = 5   # a contestant that reached the target in none of this many seeds runs no more of them
SLOW_RUN = 0.8            # --rerun-slow: a run whose own env steps/s after learning starts is below this fraction
#                           of its contestant's median speed round (same track and CPUs) is run again, once
MIN_SPEED_ROUNDS = 3      # ... judged only against at least this many speed rounds


def runs_dir(out: Path, task_name: str, track: str, cpus: int | None = None) -> Path:
    """Where a track's runs on a budget of ``cpus`` CPUs are stored (None: the runs stored before the budgets)."""
    base = out / ("race_runs" if task_name == "full" else f"race_{task_name}_runs") / track
    return base if cpus is None else base / f"cpus{cpus}"


def run_hash(name: str, track: str, task_name: str, cpus: int | None = None, config: int = 0) -> str:
    """The settings a stored run must still have: the task, the contestant's settings on the track, its CPUs and
    (tuned track) its configuration."""
    task = TASKS[task_name]
    if cpus is None:
        return settings_hash(task, track, name, contestant_class(name).settings(name, track, task))
    return settings_hash(task, track, name, contestant_class(name).settings(name, track, task, cpus, config),
                         {"cpus": cpus, "config": config})


def load_runs(directory: Path, pattern: str = "*-s*.json", cpus: int | None = None) -> list[dict]:
    """Every usable run stored in ``directory`` matching ``pattern`` (in a ``speed`` directory: speed rounds), each
    with its
    ``run_id``; files that are not one skipped with a line (``runfiles.load``)."""
    check = runfiles.speed_problem if directory.name == "speed" else runfiles.run_problem
    return runfiles.load(directory, pattern, check, cpus)


def current_runs(runs: list[dict]) -> list[dict]:
    """The runs no other stored run replaced (named in its ``rerun_of``)."""
    return runfiles.current(runs)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _store(path: Path, run: dict, key: str, measured: Conditions) -> dict:
    conditions = measured.finish()
    run |= {"settings_hash": key, "noisy": measured.noisy(), "conditions": conditions,
            "commit": conditions.get("commit"), "own_cores": conditions.get("own_cores")}
    run["over_budget"] = over_budget(run["own_cores"], run.get("cpus"))
    run.pop("run_id", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(run))
    return run | {"run_id": path.stem}


def _supersede(directory: Path, old: dict, new_id: str) -> None:
    """Mark the stored run ``old`` as superseded by the run ``new_id`` (the file rewritten whole, atomically)."""
    path = directory / f"{old['run_id']}.json"
    kept = {k: v for k, v in old.items() if k != "run_id"} | {"superseded_by": new_id}
    atomic_write_text(path, json.dumps(kept))
    old["superseded_by"] = new_id


def _stem(name: str, seed: int, config: int | None) -> str:
    """A run's file stem: ``name-s<seed>`` (a race run) or ``name-c<config>-s<seed>`` (a tuning run)."""
    return f"{name}-s{seed}" if config is None else f"{name}-c{config}-s{seed}"


def _next_id(directory: Path, stem: str) -> str:
    """The file name (without .json) of the next run of ``stem``: ``stem``, then ``stem-a1``, ``stem-a2``..."""
    k = 0
    while os.path.lexists(directory / f"{stem}{f'-a{k}' if k else ''}.json"):
        k += 1
    return f"{stem}{f'-a{k}' if k else ''}"


def _cpu(run: dict) -> str:
    """The CPU model a run or speed round ran on (sessions may run on different machines)."""
    return str(((run.get("conditions") or {}).get("machine") or {}).get("cpu", "?"))


def slow_runs(runs: list[dict], speed: list[dict], below: float = SLOW_RUN) -> dict[str, float]:
    """``{run_id: its rate / its contestant's median speed round}`` for the current first runs slower than ``below``
    that median, the speed rounds taken on the same CPU model as the run (runs that are themselves a run made again
    are not judged again; a contestant with fewer than ``MIN_SPEED_ROUNDS`` speed rounds on that CPU is not
    judged)."""
    import numpy as np

    rounds: dict[tuple[str, str], list[float]] = {}
    for r in speed:
        if r.get("env_steps_per_s"):
            rounds.setdefault((r["contestant"], _cpu(r)), []).append(float(r["env_steps_per_s"]))
    med = {k: float(np.median(v)) for k, v in rounds.items() if len(v) >= MIN_SPEED_ROUNDS}
    out = {}
    for r in current_runs(runs):
        rate, key = run_rate(r), (r["contestant"], _cpu(r))
        if r.get("rerun_of") or rate is None or key not in med:
            continue
        if rate < below * med[key]:
            out[r["run_id"]] = rate / med[key]
    return out


def run_race(track: str, task_name: str, names: list[str], seeds: int, out: Path, max_minutes: float | None = None,
             rerun_noisy: bool = False, rerun_slow: bool = False, settle_s: float = SETTLE_S,
             launch_run: Callable[..., dict] = launch, cpus: int = 2) -> bool:
    """Run every (contestant, seed < ``seeds``) of ``track`` on ``cpus`` CPUs not stored and current; each seed's
    contestants in an order rotated by the seed; on the tuned track each contestant at its best configuration of
    the stored tuning search (``tuning.best_configs``; its published example, configuration 0, before a search is
    stored; a search stored in part is a ``UsageError``). A contestant that reached the target in none of its first
    ``MIN_UNREACHED_SEEDS`` seeds runs no more (its runs are lower bounds). ``max_minutes``: start no run after
    that many minutes (at least one runs).
    ``rerun_noisy`` / ``rerun_slow``: run again the stored runs during which the machine was busy, or whose own env
    steps/s after learning start is below ``SLOW_RUN`` of its contestant's median speed round (``slow_runs``: one
    pass; a run made again is not judged again). A run made again is stored beside the one it replaces, which keeps
    its outcome and names it in ``superseded_by``. True when every run is stored."""
    directory = runs_dir(out, task_name, track, cpus)
    configs = {}
    if track == "tuned":
        from pal_bench.studies.race.results import tuning_frame
        from pal_bench.studies.race.tuning import best_configs, search_left

        searched = tuning_frame(load_runs(directory / "tuning", "*-c*-s*.json"))
        if left := search_left(searched, names):
            from pal_bench.argtypes import UsageError

            raise UsageError(f"the tuning search is stored in part ({left} of its runs are missing): its best "
                             f"configurations are not known yet; run `pal-bench race --track tuned --tune` to "
                             f"finish it first")
        configs = best_configs(searched)
    jobs = [(seed, name, configs.get(name, 0) if track == "tuned" else 0, None) for seed in range(seeds)
            for name in names[seed % len(names):] + names[:seed % len(names)]]
    slow = {}
    if rerun_slow:
        speed = load_runs(directory / "speed", "*-r*.json")
        slow = slow_runs(current_runs(load_runs(directory)), speed)
        for run_id, f in sorted(slow.items()):
            _say(f"{run_id}: {f:.2f}x its contestant's median speed round after learning start: run again")
    return _campaign(directory, "*-s*.json", jobs, track, task_name, out, cpus, max_minutes, rerun_noisy, slow,
                     settle_s, launch_run, stop_unreached=True)


def run_tuning(task_name: str, names: list[str], out: Path, cpus: int = 2, seeds: int | None = None,
               max_minutes: float | None = None, settle_s: float = SETTLE_S,
               launch_run: Callable[..., dict] = launch) -> bool:
    """The tuned track's search: every configuration of ``tuning.SEARCH`` of each contestant on ``seeds`` (default
    ``TUNING_SEEDS``) seeds, interleaved (seed by seed, configuration by configuration, the contestants' order
    rotated), stored under ``<tuned>/cpus<N>/tuning/<contestant>-c<k>-s<seed>.json``. True when all are stored."""
    from pal_bench.studies.race.tuning import SEARCH, TUNING_SEEDS

    missing = [n for n in names if n not in SEARCH]
    if missing:
        raise ValueError(f"no tuning configurations for {', '.join(missing)} (only {', '.join(SEARCH)})")
    seeds = seeds or TUNING_SEEDS
    width = max(len(SEARCH[n]) for n in names)
    jobs = []
    for seed in range(seeds):
        for config in range(width):
            k = (seed * width + config) % len(names)
            jobs += [(seed, name, config, config) for name in names[k:] + names[:k] if config < len(SEARCH[name])]
    directory = runs_dir(out, task_name, "tuned", cpus) / "tuning"
    return _campaign(directory, "*-c*-s*.json", jobs, "tuned", task_name, out, cpus, max_minutes, False, {},
                     settle_s, launch_run, stop_unreached=False)


def _campaign(directory: Path, pattern: str, jobs: list[tuple[int, str, int, int | None]], track: str,
              task_name: str, out: Path, cpus: int, max_minutes: float | None, rerun_noisy: bool,
              slow: dict, settle_s: float, launch_run: Callable[..., dict], stop_unreached: bool) -> bool:
    """Run the ``jobs`` (seed, contestant, configuration, configuration in the file name or None) not stored and
    current in ``directory``, each stored as soon as it ends; a run made again supersedes the stored one."""
    with runfiles.race_lock(directory):
        return _run_jobs(directory, pattern, jobs, track, task_name, out, cpus, max_minutes, rerun_noisy, slow,
                         settle_s, launch_run, stop_unreached)


def _run_jobs(directory: Path, pattern: str, jobs: list, track: str, task_name: str, out: Path, cpus: int,
              max_minutes: float | None, rerun_noisy: bool, slow: dict, settle_s: float,
              launch_run: Callable[..., dict], stop_unreached: bool) -> bool:
    log = out / "race.log"
    stored = {(r["contestant"], r["seed"], r.get("config", 0)): r
              for r in current_runs(load_runs(directory, pattern, cpus))}
    t_start, launched = time.monotonic(), 0
    task = TASKS[task_name]
    for i, (seed, name, config, in_name) in enumerate(jobs, 1):
        key = run_hash(name, track, task_name, cpus, config)
        run = stored.get((name, seed, config))
        why = (None if run is None else "its settings changed" if run.get("settings_hash") != key else
               "the machine was busy" if rerun_noisy and run.get("noisy") else
               "slower than its speed rounds" if run["run_id"] in slow else "")
        if why == "":
            continue
        mine = [r for (n, _, c), r in stored.items() if n == name and c == config and r.get("settings_hash") == key]
        if stop_unreached and len(mine) >= MIN_UNREACHED_SEEDS and not any(
                r.get("curve") and _reached(r) for r in mine):
            continue
        if launched and max_minutes is not None and time.monotonic() - t_start > 60 * max_minutes:
            _say(f"pal-bench race: stopped after {max_minutes:g} minutes; stored runs are in {directory}; run the same "
                 f"command again to go on")
            return False
        settle(settle_s, progress=lambda m, i=i: _say(f"[{i}/{len(jobs)}] {m}"))
        what = f"{name}" + (f" configuration {config}" if in_name is not None or config else "")
        _say(f"[{i}/{len(jobs)}] {track}, {cpus} CPU(s): {what} seed {seed} on {task.env} (target {task.target:g}, "
             f"budget {task.max_steps} steps / {task.max_wall_s:.0f} s of training)"
             + (f"; again: {why}" if why else ""))
        measured = Conditions(f"race ({track}, {task_name}, {cpus} CPUs): {what} seed {seed}")
        new_id = _next_id(directory, _stem(name, seed, in_name))
        fresh = launch_run(name, track, task_name, seed, log, cpus=cpus, config=config)
        if run is not None:
            fresh |= {"rerun_of": run["run_id"], "rerun_reason": why}
        fresh = _store(directory / f"{new_id}.json", fresh, key, measured)
        if run is not None:
            _supersede(directory, run, new_id)
        launched += 1
        stored[name, seed, config] = fresh
        hit = _hit(fresh)
        _say(f"[{i}/{len(jobs)}] {what} seed {seed}: " + (
            f"target at {hit['env_steps']} steps, {hit['setup_s'] + hit['train_s']:.1f} s" if hit else
            f"not reached in {fresh['env_steps']} steps, {fresh['train_s']:.0f} s")
            + f" (own cores {fresh.get('own_cores')} of {cpus})"
            + (" (noisy: the machine was busy; --rerun-noisy runs it again)" if fresh["noisy"] else "")
            + (" (OVER ITS CPU BUDGET: left out of the tables)" if fresh["over_budget"] else ""))
    return True


def _hit(run: dict) -> dict | None:
    target = TASKS[run["task"]].target
    return next((e for e in run.get("curve", []) if e["mean_return"] >= target), None)


def _reached(run: dict) -> bool:
    return _hit(run) is not None


def run_speed(track: str, task_name: str, names: list[str], rounds: int, out: Path, settle_s: float = SETTLE_S,
              launch_run: Callable[..., dict] = launch, cpus: int = 2) -> None:
    """Speed rounds: in each round every contestant trains for ``Task.speed_span`` env steps after learning starts
    (no evaluation), one after the other, the order rotated by one each round; each (round, contestant) is stored
    as soon as it ends and skipped when stored and current."""
    directory = runs_dir(out, task_name, track, cpus) / "speed"
    with runfiles.race_lock(directory):
        _speed_rounds(directory, track, task_name, names, rounds, out, settle_s, launch_run, cpus)


def _speed_rounds(directory: Path, track: str, task_name: str, names: list[str], rounds: int, out: Path,
                  settle_s: float, launch_run: Callable[..., dict], cpus: int) -> None:
    log = out / "race.log"
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            path = directory / f"{name}-r{r}.json"
            key = run_hash(name, track, task_name, cpus)
            done = [x for x in load_runs(directory, f"{name}-r{r}.json") if x.get("settings_hash") == key]
            if done:
                continue
            settle(settle_s, progress=lambda m, r=r: _say(f"speed round {r}: {m}"))
            measured = Conditions(f"race speed ({track}, {task_name}, {cpus} CPUs): {name} round {r}")
            run = launch_run(name, track, task_name, r, log, mode="speed", cpus=cpus)
            run["round"] = r
            run = _store(path, run, key, measured)
            _say(f"speed round {r}: {name} {run['env_steps_per_s']:.0f} env steps/s")
