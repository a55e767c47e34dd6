"""Learner processes that average their gradients among themselves (``backend = "processes"``,
``learner_processes``, ``aggregation = "allreduce"``): the driver grants rounds and never sees a gradient (issue 49:
each learner's gradient was read and applied by a proxy thread under the driver's GIL)."""

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch

from pal_bench.train import make_config, make_trainer
from pal_bench.train.backends.processes.trainer import LearnerDied


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("pal")}




def _cfg(tmp_path, **kw):
    base = dict(steps=3000, actors=1, learners=2, backend="processes", learner_processes=True,
                aggregation="allreduce", out_dir=str(tmp_path), name="ar", progress=False, eval_episodes=1,
                learning_starts=500, batch_size=32, hidden=(32, 32))
    base.update(kw)
    return make_config("dqn", "CartPole-v1", **base)


def test_allreduce_learners_hold_the_budget_and_step_together(tmp_path):
    """Every update of the budget is granted (the last round partly: an odd count over two learners), the weights
    take one step per round, the driver's copy is learner 0's, the driver applied no gradient itself, and nothing
    is left behind (processes, segments)."""
    shm = _shm()
    with make_trainer(_cfg(tmp_path, steps=3001)) as tr:
        initial = {k: v.clone() for k, v in tr.ps.nets.state_dict().items()}
        s = tr.run()
        max_updates = tr.rate.max_updates
        learned = tr.ps.nets.state_dict()
        assert tr.ps.applied == 0                              # no gradient passed through the driver
    assert s["updates"] == max_updates and max_updates % 2 == 1
    assert s["ps_steps"] == (max_updates + 1) // 2
    assert any(not torch.equal(initial[k], learned[k]) for k in initial)
    assert "learner_processes" in s["phase_seconds"]["rounds"] and "aggregation" in s["phase_seconds"]["learner0"]
    assert not mp.active_children()
    assert _shm() <= shm


def test_a_checkpoint_mid_run_pauses_between_rounds_and_resume_finishes(tmp_path):
    """Checkpoints every 1,000 env steps land between rounds (a round is started whole, so a pause never waits on
    half of one), hold learner 0's weights, and a resumed run's learners form a new group and finish the budget."""
    cfg = _cfg(tmp_path, steps=4000, checkpoint_interval=1000)
    with make_trainer(cfg) as tr:
        first = tr.run()
    assert first["updates"] == tr.rate.max_updates
    with make_trainer(_cfg(tmp_path, steps=6000), resume=True) as tr:
        assert tr.rate.steps == 4000
        second = tr.run()
    assert second["env_steps"] == 6000 and second["updates"] == tr.rate.max_updates
    assert second["ps_steps"] > first["ps_steps"]


def test_an_allreduce_learner_killed_stops_the_run_with_a_checkpoint_and_resume_restarts_them(tmp_path):
    """A learner process killed with SIGKILL mid-run: the round thread sees it, the run ends with ``LearnerDied``
    and a final checkpoint (the others are stopped, not left waiting in the all-reduce), and ``resume`` starts a
    new group of learners that finishes the budget."""
    shm = _shm()
    cfg = _cfg(tmp_path, steps=200_000)
    with make_trainer(cfg) as tr:
        def kill_when_learning():
            deadline = time.monotonic() + 120
            while tr.rate.done < 40 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(tr._lprocs[1].pid, signal.SIGKILL)

        threading.Thread(target=kill_when_learning, daemon=True).start()
        with pytest.raises(LearnerDied, match=r"learner1 process died .*SIGKILL.*final checkpoint"):
            tr.run()
        killed_at = tr.rate.steps
    assert not mp.active_children()
    with make_trainer(_cfg(tmp_path, steps=killed_at + 1500), resume=True) as tr:
        s = tr.run()
    assert s["env_steps"] == killed_at + 1500 and s["updates"] == tr.rate.max_updates
    assert not mp.active_children()
    assert _shm() <= shm


def test_allreduce_needs_learners_in_processes(tmp_path):
    from pal_bench.train import ConfigError, validate

    with pytest.raises(ConfigError, match="learner_processes"):
        validate(_cfg(tmp_path, learner_processes=False))
    with pytest.raises(ConfigError, match="allreduce"):
        validate(_cfg(tmp_path, backend="threads", learner_processes=False))
