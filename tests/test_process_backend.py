"""The process backend: actor processes on the shared-memory buffer. A run completes with the budget held,
a killed actor is restarted and accounted for, Ctrl-C and a killed driver leave no process and nothing in
/dev/shm behind."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pal_bench.train import make_config, make_trainer


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("pal_")}


def _cfg(tmp_path, **kw):
    base = dict(steps=3000, actors=2, learners=1, backend="processes", out_dir=str(tmp_path), name="p",
                progress=False, eval_episodes=1, learning_starts=500, batch_size=32)
    base.update(kw)
    return make_config("dqn", "CartPole-v1", **base)


def test_a_run_holds_the_budget_and_cleans_up(tmp_path):
    before = _shm()
    cfg = _cfg(tmp_path)
    with make_trainer(cfg) as tr:
        s = tr.run()
        assert len(tr.buffer) > 0 and tr.buffer.shared_name
    assert s["backend"] == "processes"
    assert s["env_steps"] == cfg.steps
    assert s["updates"] == tr.rate.max_updates                  # updates_per_step held across processes
    assert s["transitions_lost"] == 0 and not s["restarts"]
    assert {"actor0", "actor1", "learner0"} <= set(s["phase_seconds"])
    # the sole sync learner applies its own gradients: no server thread, no hand-off
    assert "apply" in s["phase_seconds"]["learner0"] and "aggregation_wait" not in s["phase_seconds"]["learner0"]
    assert "parameter-server" not in s["phase_seconds"] and s["ps_steps"] == s["updates"]
    # the actor processes were set up (imports, environments, weights) before the clock started
    assert s["startup_s"] > 0 and s["wall_s"] > 0
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["env_steps"] == cfg.steps
    assert (tmp_path / "p" / "checkpoints" / "latest.json").exists()
    assert not mp.active_children()
    assert _shm() == before


def _kill_actor_when(tr, ready, actor: int = 1, timeout: float = 120) -> dict:
    """Run ``tr`` in a thread, SIGKILL actor ``actor``'s process once ``ready()`` holds, and return the summary."""
    result = {}
    t = threading.Thread(target=lambda: result.update(tr.run()), daemon=True)
    t.start()
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready(), "the condition to kill the actor never held"
    victims = [p for p in mp.active_children() if p.name == f"pal-actor{actor}"]
    assert victims, "no actor process to kill"
    os.kill(victims[0].pid, signal.SIGKILL)
    t.join(180)
    assert not t.is_alive(), "the run stalled"
    return result


def test_an_actor_killed_with_sigkill_is_restarted_and_its_loss_recorded(tmp_path):
    before = _shm()
    cfg = _cfg(tmp_path, steps=6000)
    with make_trainer(cfg) as tr:
        result = _kill_actor_when(tr, lambda: tr.rate.steps >= 1500)
    assert result["env_steps"] == cfg.steps                      # the run completed its budget
    restarts = result["restarts"]
    assert len(restarts) == 1 and restarts[0]["worker"] == "actor1"
    assert 0 <= result["transitions_lost"] <= cfg.envs_per_actor   # bounded by its unsent vector step
    events = (tmp_path / "p" / "events.csv").read_text()
    assert "actor1,restart" in events
    assert not mp.active_children()
    assert _shm() == before


DRIVER = """
import signal
import sys
from pal_bench.train import make_config, make_trainer
if __name__ == "__main__":
    # a process started from a non-interactive shell's background job inherits SIGINT ignored: restore
    # Python's handler, as in an interactive terminal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = make_config("dqn", "CartPole-v1", steps=10**6, actors=2, learners=1, backend="processes",
                      out_dir=sys.argv[1], name="p", progress=False, eval_episodes=0, learning_starts=500,
                      batch_size=32)
    with make_trainer(cfg) as tr:
        try:
            tr.run()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
"""


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _start_driver(tmp_path) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    # training has started once every actor process is set up and the run wrote its config.yaml (on a loaded
    # machine the set-up alone can take several seconds; a Ctrl-C then stops a run with nothing to checkpoint)
    while not (tmp_path / "p" / "config.yaml").exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert len(_children_of(p.pid)) >= 3, "the driver did not start its 2 actor processes"   # + the tracker
    time.sleep(2)                                               # actors stepping, learner updating
    return p


def _is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker: not a worker; it ignores SIGINT and leaves when the driver exits."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_stops_every_process_within_2_s_and_checkpoints(tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group): the actor processes are gone within
    2 s (asserted with room for a loaded machine: 5 s), the driver writes a checkpoint and exits, and then no
    child at all is left (the resource tracker included)."""
    before = _shm()
    p = _start_driver(tmp_path)
    kids = _children_of(p.pid)
    actors = [k for k in kids if not _is_resource_tracker(k)]
    assert len(actors) == 2, f"expected 2 actor processes, found {actors} among the driver's children {kids}"
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    # the actors' time is what is bounded; the resource tracker only leaves once the driver has checkpointed
    while any(_running(k) for k in actors) and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    gone_after = time.monotonic() - t0
    out, _ = p.communicate(timeout=60)
    assert "interrupted" in out
    deadline = time.monotonic() + 30                     # the resource tracker leaves after the driver
    while any(_running(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [k for k in kids if _running(k)]
    assert gone_after < 5, f"actor processes still running {gone_after:.1f} s after Ctrl-C"
    assert (tmp_path / "p" / "checkpoints" / "latest.json").exists()
    assert _shm() == before


def test_a_killed_driver_leaves_nothing_after_the_next_run(tmp_path):
    before = _shm()
    p = _start_driver(tmp_path)
    kids = _children_of(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    deadline = time.monotonic() + 10                            # actors die with their parent
    while any(Path(f"/proc/{k}").exists() for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    # the resource tracker child may outlive the driver briefly; the actors must not
    assert _shm() != before                                     # the killed driver's segments are still there
    # same run directory (replacing what the killed run left): stale segments replaced
    with make_trainer(_cfg(tmp_path, steps=1000), overwrite=True) as tr:
        tr.run()
    assert _shm() == before


@pytest.mark.parametrize("bad", [{"deterministic": True}, {"aggregation": "allreduce"}, {"env_backend": "async"}])
def test_settings_the_process_backend_cannot_honour_are_rejected(tmp_path, bad):
    from pal_bench.train import ConfigError, validate

    with pytest.raises(ConfigError):
        validate(_cfg(tmp_path, **bad))


def test_a_learner_error_stops_the_run_with_the_error_and_every_actor(tmp_path):
    from pal_bench.train import WorkerError

    before = _shm()
    with make_trainer(_cfg(tmp_path)) as tr:
        def broken(sample):
            raise RuntimeError("learner exploded")

        tr.to_tensors = broken
        with pytest.raises(WorkerError, match="learner exploded"):
            tr.run()
    assert not mp.active_children()
    assert _shm() == before


def test_an_actor_failing_while_setting_up_is_an_error_not_a_restart(tmp_path):
    """A script without the ``__main__`` guard: its spawned actor re-runs the script and dies before it is set up;
    the run stops at once with a hint (not after a round of restarts), and nothing is left behind."""
    before = _shm()
    script = tmp_path / "no_guard.py"
    script.write_text("from pal_bench.train import make_config, make_trainer\n"
                      "cfg = make_config('dqn', 'CartPole-v1', backend='processes', steps=2000, progress=False,"
                      f" eval_episodes=0, out_dir={str(tmp_path)!r})\n"
                      "with make_trainer(cfg) as tr:\n    tr.run()\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert "actor0 process failed while setting up" in p.stderr and "__name__ ==" in p.stderr, p.stderr[-2000:]
    assert "restart" not in p.stderr
    assert _shm() == before


def test_resume_goes_on_from_the_checkpoint(tmp_path):
    before = _shm()
    with make_trainer(_cfg(tmp_path, steps=2000)) as tr:
        first = tr.run()
    with make_trainer(_cfg(tmp_path, steps=3000), resume=True) as tr:
        assert tr.rate.steps == first["env_steps"] == 2000
        assert len(tr.buffer) > 1500                        # the saved rows, in the new shared segment
        second = tr.run()
    assert second["env_steps"] == 3000
    assert second["updates"] == tr.rate.max_updates
    assert _shm() == before


def test_an_actor_killed_holding_the_reservation_lock_does_not_stall_the_others(tmp_path, monkeypatch):
    """Actor 1 stalls inside the reservation lock (the fault seam) and is killed there: the driver releases
    the lock for the others, restarts actor 1, and the run completes its budget."""
    from pal_bench.train.backends.processes import ProcessTrainer
    from pal_bench.train.backends.processes.shared import (
        HOLDER,
        TOTAL_INSERTED,
        TOTAL_RESERVED,
        inserted_slot,
        reserved_slot,
    )
    from pal_bench.train.faults import StallInReservation

    monkeypatch.setattr(ProcessTrainer, "faults", StallInReservation(actor=1, after=800))
    before = _shm()
    cfg = _cfg(tmp_path, steps=4000)
    with make_trainer(cfg) as tr:
        # HOLDER == actor 1 with its 800 transitions in: it is stalled inside the lock
        result = _kill_actor_when(tr, lambda: tr.counters[HOLDER] == 2 and tr.counters[inserted_slot(1)] >= 800)
        assert tr.counters[TOTAL_RESERVED] == sum(tr.counters[reserved_slot(a)] for a in range(cfg.actors))
        assert tr.counters[TOTAL_INSERTED] == sum(tr.counters[inserted_slot(a)] for a in range(cfg.actors))
    assert result["env_steps"] == cfg.steps
    assert len(result["restarts"]) == 1
    assert _shm() == before


# ---------------------------------------------------------------------- learner processes

def test_learner_processes_hold_the_budget_and_clean_up(tmp_path, monkeypatch):
    """... and the proxy threads that apply the learner processes' gradients in the driver run torch on one thread
    (torch's default, a thread per core, took the cores the worker processes need: 0.58x end to end, 2026-12-05;
    torch's thread count is per calling thread, so the proxy sets its own)."""
    import threading

    import torch

    set_in = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_in.append((threading.current_thread().name, n)),
                                                             real(n)))
    before = _shm()
    cfg = _cfg(tmp_path, actors=1, learners=2, learner_processes=True)
    with make_trainer(cfg) as tr:
        s = tr.run()
    assert {("pal-learner0", 1), ("pal-learner1", 1)} <= set(set_in), set_in
    assert s["learner_processes"] is True
    assert s["env_steps"] == cfg.steps
    assert s["updates"] == tr.rate.max_updates
    assert s["ps_steps"] == -(-s["updates"] // 2)       # sync: one gradient per learner a step (the last alone)
    for i in (0, 1):                     # the process's own phases and its proxy's, under one name
        assert {"sample", "forward_backward", "rate_wait", "aggregation_wait"} <= set(s["phase_seconds"][f"learner{i}"])
    assert not mp.active_children()
    assert _shm() == before


def test_a_failing_learner_process_stops_the_run_with_its_error(tmp_path, monkeypatch):
    from pal_bench.train import WorkerError

    before = _shm()
    from pal_bench.train.backends.processes import ProcessTrainer
    from pal_bench.train.faults import LearnerFailsAfter

    monkeypatch.setattr(ProcessTrainer, "faults", LearnerFailsAfter(updates=20))
    with make_trainer(_cfg(tmp_path, actors=1, learner_processes=True)) as tr:
        with pytest.raises(WorkerError, match="injected learner failure after 20 updates"):
            tr.run()
    assert not mp.active_children()
    assert _shm() == before


def test_a_learner_process_killed_with_sigkill_stops_the_run(tmp_path):
    from pal_bench.train import WorkerError

    before = _shm()
    with make_trainer(_cfg(tmp_path, actors=1, steps=10**6, learner_processes=True)) as tr:
        def kill_when_learning():
            deadline = time.monotonic() + 120
            while tr.rate.done < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(tr._lprocs[0].pid, signal.SIGKILL)

        threading.Thread(target=kill_when_learning, daemon=True).start()
        with pytest.raises(WorkerError, match=r"learner0 process died \(exit code -9 \(signal 9\)"):
            tr.run()
    assert not mp.active_children()
    assert _shm() == before


def test_learner_processes_need_the_process_backend(tmp_path):
    from pal_bench.train import ConfigError, validate

    with pytest.raises(ConfigError, match="learner_processes"):
        validate(_cfg(tmp_path, backend="threads", learner_processes=True))


def test_scaling_measures_learner_processes_and_cleans_up():
    from pal_bench.studies.scaling import measure as scaling

    before = _shm()
    cfg = make_config("dqn", "CartPole-v1", backend="processes", learner_processes=True, batch_size=32)
    assert scaling.label(cfg) == "learner-processes"
    assert scaling.measure_fl(cfg, 2, 40, filled=600) > 0
    assert not mp.active_children()
    assert _shm() == before


def test_a_waiting_learner_polls_rarely_only_while_its_update_is_far_off():
    """The driver's learner polls the shared counters every 0.5 ms next to its update, every 10 ms while the
    update lacks more than FAR_STEPS env steps (the prefill), and at the near rate again once they come."""
    import threading

    import numpy as np

    from pal_bench.train.backends.processes.shared import HEADER, count_inserted
    from pal_bench.train.backends.processes.trainer import SharedRate

    cfg = make_config(algo="dqn", env="CartPole-v1", backend="processes", actors=2, steps=10_000,
                      learning_starts=1_000, updates_per_step=0.25)
    counters = np.zeros(HEADER + 2 * cfg.actors, dtype=np.int64)
    lock = threading.Lock()
    rate = SharedRate(cfg, counters)
    assert rate._poll_s("learner") == SharedRate.FAR_POLL_S          # 1,004 steps short of update 1
    count_inserted(counters, lock, 0, 500)
    count_inserted(counters, lock, 1, 1_004 - 500 - SharedRate.FAR_STEPS - 1)
    assert rate._poll_s("learner") == SharedRate.FAR_POLL_S          # FAR_STEPS + 1 short
    count_inserted(counters, lock, 1, 1)                               # exactly FAR_STEPS short
    assert rate._poll_s("learner") == SharedRate.POLL_S
    rate = SharedRate(cfg, np.zeros_like(counters))                   # far off again ...
    assert rate._poll_s("learner") == SharedRate.FAR_POLL_S
    rate.paused = True                                                # ... but a checkpoint's pause: watch closely
    assert rate._poll_s("learner") == SharedRate.POLL_S
