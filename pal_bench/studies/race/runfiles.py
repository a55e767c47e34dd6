"""The race's stored run files, read as untrusted data: each through the bounded reader (a regular file, no link,
at most 16 MiB of UTF-8 JSON), checked field by field before anything uses it, and skipped with one line naming
it (escaped) when it does not hold what a run or a speed round holds. Which runs are current follows from the runs
themselves: a run is superseded when another stored run names it in ``rerun_of``. A directory of runs is written by
one race at a time (``race_lock``).
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from pal_bench.argtypes import UsageError, printable
from pal_bench.stored_tables import read_json
from pal_bench.studies.race.task import TASKS, TRACKS

MAX_CPUS = 4096
MAX_STEPS = 10**12
BUDGET_DIR = re.compile(r"cpus([1-9][0-9]{0,3})")


def finite_number(v, lo: float = 0.0, hi: float = 1e12) -> bool:
    """A number in [lo, hi], not a bool (nor an integer too large for a float, which JSON allows)."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    except OverflowError:
        return False


def whole_count(v, hi: int = MAX_STEPS) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def run_problem(run, stem: str) -> str | None:
    """Why a stored race run cannot be used (None when it can): the fields every table and the orchestrator read,
    with their types and ranges, and the file's name matching its contestant."""
    from pal_bench.studies.race.contestants import CONTESTANTS

    if not isinstance(run, dict):
        return "not a JSON object"
    if run.get("contestant") not in CONTESTANTS:
        return f"unknown contestant {run.get('contestant')!r}"
    if not stem.startswith(f"{run['contestant']}-"):
        return f"its name does not start with its contestant's ({run['contestant']})"
    if run.get("track") not in TRACKS or run.get("task") not in TASKS:
        return "unknown track or task"
    if not whole_count(run.get("seed"), 2**63) or not whole_count(run.get("config", 0), 10**6):
        return "seed or configuration not a whole number >= 0"
    for k in ("env_steps", "updates"):
        if not whole_count(run.get(k)):
            return f"{k} not a whole number in [0, 1e12]"
    for k in ("setup_s", "train_s", "eval_s", "wall_s", "env_steps_per_s"):
        if not finite_number(run.get(k)):
            return f"{k} not a finite number >= 0"
    if not finite_number(run.get("updates_per_env_step"), 0.0, 1e6):
        return "updates_per_env_step not a finite number >= 0"
    curve = run.get("curve")
    if not isinstance(curve, list) or not all(
            isinstance(e, dict) and whole_count(e.get("env_steps")) and all(finite_number(e.get(k)) for k in (
                "train_s", "eval_s", "setup_s")) and finite_number(e.get("mean_return"), -1e12) for e in curve):
        return "curve not a list of evaluations (env_steps, train_s, eval_s, setup_s, mean_return)"
    cpus = run.get("cpus")
    if cpus is not None and not (whole_count(cpus, MAX_CPUS) and cpus >= 1):
        return f"cpus {cpus!r} not a whole number in [1, {MAX_CPUS}]"
    if run.get("own_cores") is not None and not finite_number(run["own_cores"], 0.0, MAX_CPUS * 2):
        return "own_cores not a finite number >= 0"
    if not isinstance(run.get("conditions", {}), dict):
        return "conditions not an object"
    for k in ("rerun_of", "superseded_by", "commit", "settings_hash"):
        if run.get(k) is not None and not isinstance(run[k], str):
            return f"{k} not text"
    return None


def speed_problem(run, stem: str) -> str | None:
    """Why a stored speed round cannot be used (None when it can)."""
    from pal_bench.studies.race.contestants import CONTESTANTS

    if not isinstance(run, dict):
        return "not a JSON object"
    if run.get("contestant") not in CONTESTANTS or not stem.startswith(f"{run['contestant']}-"):
        return "unknown contestant, or not the one its name says"
    if run.get("track") not in TRACKS or not whole_count(run.get("round"), 10**6):
        return "unknown track, or round not a whole number >= 0"
    for k in ("env_steps_per_s", "updates_per_s", "updates_per_env_step"):
        if not finite_number(run.get(k)):
            return f"{k} not a finite number >= 0"
    if not isinstance(run.get("conditions", {}), dict):
        return "conditions not an object"
    return None


def load(directory: Path, pattern: str = "*-s*.json", check=run_problem, cpus: int | None = None) -> list[dict]:
    """Every file in ``directory`` matching ``pattern`` that holds a usable run (``check``; with ``cpus``: stored
    with that budget), each with its ``run_id`` (the file's name without ``.json``); the others skipped with one
    line each."""
    runs = []
    try:
        paths = sorted(directory.glob(pattern))
    except OSError as e:
        _skip(directory, f"not readable ({e.strerror})")
        return runs
    for path in paths:
        try:
            run = read_json(path, label=str(path))
        except (UsageError, OSError) as e:
            _skip(path, str(e).removeprefix(f"{path}: "))
            continue
        why = check(run, path.stem)
        if why is None and cpus is not None and check is run_problem and run.get("cpus") != cpus:
            why = f"stored with cpus {run.get('cpus')!r} in the directory of {cpus}"
        if why is not None:
            _skip(path, why)
            continue
        runs.append(run | {"run_id": path.stem})
    return runs


def _skip(path: Path, why: str) -> None:
    print(f"pal-bench race: skipping {printable(str(path))}: {printable(why)}", file=sys.stderr)


def run_key(run: dict) -> tuple:
    """A run's identity among every stored run: its id (the file's name) is unique only in its own directory, so
    with its track, task and CPU budget (``matched/cpus1/pal-s7`` and ``matched/cpus2/pal-s7`` are two runs)."""
    return run.get("track"), run.get("task"), run.get("cpus"), run.get("run_id")


def superseded(runs: list[dict]) -> dict[tuple, str]:
    """{``run_key`` of a run: the id of the run that replaced it}: every run another stored run of the same track,
    task and CPU budget names in ``rerun_of``."""
    keys = {run_key(r) for r in runs}
    out = {}
    for r in runs:
        old = (*run_key(r)[:3], r.get("rerun_of"))
        if r.get("rerun_of") and old in keys and r["rerun_of"] != r["run_id"]:
            out[old] = r["run_id"]
    return out


def current(runs: list[dict]) -> list[dict]:
    """The runs no other stored run replaced."""
    gone = superseded(runs)
    return [r for r in runs if run_key(r) not in gone]


def budget_dirs(track_dir: Path) -> list[tuple[Path, int | None]]:
    """A track's run directories with their budget: the track's own (the runs stored before the core budgets,
    None), then each ``cpus<N>`` directory (N in 1..9999 written plainly; a link or another name is skipped with a
    line), in order of N."""
    out: list[tuple[Path, int | None]] = [(track_dir, None)]
    try:
        entries = sorted(track_dir.iterdir()) if track_dir.is_dir() else []
    except OSError:
        entries = []
    subs = []
    for d in entries:
        if not d.name.startswith("cpus"):
            continue
        m = BUDGET_DIR.fullmatch(d.name)
        if not m or d.is_symlink() or not d.is_dir():
            _skip(d, "not a core budget's directory (cpus<N>, a directory, not a link)")
            continue
        subs.append((d, int(m.group(1))))
    return out + sorted(subs, key=lambda t: t[1])


@contextmanager
def race_lock(directory: Path):
    """Hold ``directory``'s lock (``.lock`` in it, flock) while a race writes runs there: a second race on the same
    directory is refused at once (``UsageError``) instead of running the same seeds and overwriting them."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another pal-bench race is writing runs in {printable(str(directory))}; wait for it "
                             f"to end") from None
        yield
    finally:
        os.close(fd)
