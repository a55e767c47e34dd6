"""One race run, in its own process: probe the machine, build the contestant, check it, train it under the clock.

``launch`` starts ``python -m pal_bench.studies.race --worker NAME ...`` (so that Ray, torch thread pools and
imports of one contestant cannot slow another), with one torch/OpenMP thread per process for every contestant;
``run_one`` is what that process does.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.contestants import make
from pal_bench.studies.race.counters import RunCounters
from pal_bench.studies.race.pin import TreeWatch, cpu_set, pin_self
from pal_bench.studies.race.probe import speed_probe
from pal_bench.studies.race.task import MATCHED, TASKS, Task, check_counted, check_matched, env_dims


def run_one(name: str, track: str, task_name: str, seed: int, mode: str = "race", task: Task | None = None,
            cpus: int | None = None, config: int = 0) -> dict:
    """Probe (race mode), build, read back and check (matched track: before training, and the measured updates per
    env step after), train, close. Returns the run's record (times in seconds). ``task``: a variant of
    ``TASKS[task_name]`` (the race profile's longer budget and unreachable target). ``cpus``: the run's core budget
    (the contestant's parallel features follow it; ``launch`` pinned this process to that many CPUs; None: the
    CPUs this process may use), recorded with the CPUs the run's process tree could use at the end of training.
    ``config``: the tuned track's configuration (``tuning.SEARCH``; 0: the contestant's published example)."""
    import torch

    task = task or TASKS[task_name]
    allowed = sorted(os.sched_getaffinity(0))
    cpus = cpus or len(allowed)
    if len(allowed) > cpus:
        raise RuntimeError(f"a run with a budget of {cpus} CPU(s) may use {len(allowed)} ({allowed}): start it "
                           f"through launch(), which pins it")
    torch.set_num_threads(MATCHED.torch_threads)
    probe = speed_probe(task, seed) if mode == "race" else {}
    obs_dim, n_actions = env_dims(task.env)
    clock = Clock(task, seed, mode)
    contestant = make(name, track, task, seed, cpus, config)
    contestant.mode = mode
    counters = RunCounters()
    try:
        contestant.build()
        facts = contestant.facts()
        if track == "matched":
            check_matched(name, facts, obs_dim, n_actions)
        contestant.attach(counters)
        watch = TreeWatch()                     # every thread of the run's processes while it trains
        clock.started()
        try:
            measured = contestant.train(clock)
        finally:
            used = watch.stop()
        counters.detach()
    finally:
        contestant.close()
    if len(used) > cpus:
        raise RuntimeError(f"{name} ran outside its budget of {cpus} CPU(s): its processes could use {used}")
    train_s = measured.get("train_s", clock.train_s())
    starts = facts.get("learning_starts", task.learning_starts)
    learning = max(1, measured["env_steps"] - starts)
    ups = measured["updates"] / learning
    counted = counters.as_dict(measured["env_steps"], starts)
    if track == "matched":
        check_matched(name, facts | {"updates_per_step": ups}, obs_dim, n_actions, measured=True)
        check_counted(name, counted, task, starts)
    run = {"contestant": name, "track": track, "task": task_name, "seed": seed, "mode": mode, "config": config,
           "setup_s": round(clock.setup_s or 0.0, 3), "train_s": round(train_s, 3), "eval_s": round(clock.eval_s, 3),
           "env_steps": int(measured["env_steps"]), "updates": int(measured["updates"]),
           "updates_per_env_step": round(ups, 5), "n_params": facts.get("n_params"),
           "torch_threads": facts.get("torch_threads"), "facts": facts, "curve": clock.curve,
           "cpus": cpus, "cpu_set": allowed, "tree_cpus": used, "counters": counted} | probe
    run["wall_s"] = round(run["setup_s"] + run["train_s"] + run["eval_s"], 3)
    if clock.phase_seconds:
        run["phase_seconds"] = clock.phase_seconds
    if mode == "speed":
        span = clock.span
        run["span"] = span
        run["env_steps_per_s"] = clock.speed()
        # updates per second over the span: the run's measured updates per env step times its env steps per second
        run["updates_per_s"] = run["env_steps_per_s"] * ups
    else:
        run["env_steps_per_s"] = round(run["env_steps"] / max(train_s, 1e-9), 1)
    return run


STOP_GRACE_S = 30.0        # a stopped run's processes get this long to close (shared memory, Ray) before SIGKILL


def launch(name: str, track: str, task_name: str, seed: int, log: Path, mode: str = "race", cpus: int = 2,
           config: int = 0) -> dict:
    """Run one contestant in its own process (one torch/OpenMP thread) and process group, pinned with everything it
    starts to the first ``cpus`` CPUs this process may use (``pin.cpu_set``); its evaluations stream to ``log``.
    Interrupted (Ctrl-C, or SIGTERM through ``stop_on_termination``), the run's process group gets SIGTERM (the
    worker closes its contestant: shared memory, Ray) and SIGKILL after ``STOP_GRACE_S``. RuntimeError naming the
    log when it fails (a matched contestant that does not do the matched work included)."""
    cpu_list = cpu_set(cpus)
    fd, name_out = tempfile.mkstemp(suffix=".json", prefix="pal-race-run-")
    os.close(fd)
    out = Path(name_out)
    try:
        cmd = [sys.executable, "-m", "pal_bench.studies.race", "--worker", name, "--track", track, "--task",
               task_name, "--seed", str(seed), "--mode", mode, "--cpus", str(cpus), "--config", str(config),
               "--worker-out", str(out)]
        threads = str(MATCHED.torch_threads)
        env = dict(os.environ, PYTHONWARNINGS="ignore", RAY_DEDUP_LOGS="0", OMP_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads)
        with open(log, "a") as lf:
            lf.write(f"\n=== {name} ({track}, {task_name}) seed {seed} {mode}\n")
            lf.flush()
            proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=functools.partial(pin_self, cpu_list))
            try:
                rc = proc.wait()
            except BaseException:
                _stop_group(proc)
                raise
        if rc != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(f"{name} ({track}) seed {seed} failed with exit code {rc}: "
                               f"{tail[0] if tail else ''} (see {log})")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group, SIGKILL to what is left after ``STOP_GRACE_S``."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:                                   # the worker ended: anything still in its group goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
