"""The real trainer with many workers on this 2-core machine: oversubscribed on purpose, a functional check, not a
speed claim. What only shows with many workers (per-worker memory and file descriptors, start-up time, the
supervisor's polling, the rate rule with many reservers) must still give a run that holds its budget and its update
rate and leaves nothing behind: no process, no /dev/shm segment, no file descriptor of this process."""

import multiprocessing as mp
import os

import pytest

from pal_bench.train import make_config, make_trainer


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("pal")}


def _fds() -> int:
    """This process's open file descriptors, but matplotlib's font files (its font cache keeps the ones it has
    loaded open: once, not per run)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += not os.readlink(f"/proc/self/fd/{fd}").endswith((".ttf", ".otf", ".afm"))
        except OSError:
            pass
    return n


# (processes at 16 as well took 18 s of CI for what 32 covers)
@pytest.mark.parametrize("backend, actors, steps", [("processes", 32, 6_000), ("threads", 16, 4_000)])
def test_many_actors_hold_the_budget_and_the_rate_and_leave_nothing(tmp_path, backend, actors, steps):
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()     # the first spawn starts it (one pipe for this process's life)
    shm, fds = _shm(), _fds()
    cfg = make_config("dqn", "CartPole-v1", backend=backend, actors=actors, learners=1, steps=steps,
                      learning_starts=1_000, batch_size=32, hidden=(32, 32), out_dir=str(tmp_path), name="many",
                      progress=False, eval_episodes=0, eval_interval=0)
    with make_trainer(cfg) as tr:
        s = tr.run()
        max_updates = tr.rate.max_updates
    assert s["env_steps"] == steps
    assert s["updates"] == max_updates == (steps - 1_000) * cfg.updates_per_step   # the rate rule, exactly
    assert s.get("restarts", []) == [] and s.get("transitions_lost", 0) == 0
    assert {f"actor{i}" for i in range(actors)} <= set(s["phase_seconds"])        # every actor reported its timers
    assert not mp.active_children()
    assert _shm() <= shm
    assert _fds() <= fds
