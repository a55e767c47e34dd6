"""The parallel trainer: learning, rate control, reproducibility, faults, bad configs, resume."""

import itertools
import os
import signal
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pal_bench.train import ConfigError, Trainer, WorkerError, make_config
from pal_bench.train.algos import dqn
from pal_bench.train.recorder import RunRecorder

FAST = dict(hidden=(64, 64), eval_interval=0, eval_episodes=2, progress=False)


def pal_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("pal-")]


def cfg_for(tmp_path, algo="dqn", env="CartPole-v1", **kw):
    return make_config(algo, env, out_dir=str(tmp_path), **(FAST | kw))


@pytest.mark.parametrize("aggregation", ["sync", "async"])
def test_dqn_cartpole_2_actors_2_learners_learns(tmp_path, aggregation):
    """DQN on CartPole-v1, 2 actor threads + 2 learner threads, 40k env steps at 0.5 updates per step, seed 1.

    Asserted: the best of up to 8 greedy evaluations (2 episodes each, every 5k steps) >= 130; the run stops at
    the first that reaches it (``stop_return``). A random policy scores about 20.
    2 actors + 2 learners are not lockstepped, so a seed's run also varies with thread timing (machine load).
    Seed sweep (`python tests/learning_runs.py trainer-sync --seeds 0-9 --jobs 2`, and trainer-async; two
    runs at once on the 2 cores; AMD EPYC, 2026-12-01): sync min 189.5, median 316.5; async min 182.5,
    median 317.0; so 130 sits 29% below the worst of the 20 runs. (At 0.25 updates per step 1 of 8 async
    seeds plateaued below 150 in an earlier sweep: hence 0.5.)
    """
    from learning_runs import trainer_dqn_cartpole

    r = trainer_dqn_cartpole(seed=1, aggregation=aggregation, out_dir=str(tmp_path), stop_return=130.0)
    s = r["summary"]
    assert r["best"] >= 130, r["curve"]
    assert s["reached_return"]["mean_return"] >= 130 and s["env_steps"] <= 40_000
    assert s["updates"] > 0.4 * (s["env_steps"] - 1_000)         # 0.5 updates per step after learning_starts
    assert s["dropped_stale_gradients"] < 0.05 * s["updates"]
    assert (Path(r["run_dir"]) / "eval.csv").exists()
    assert (Path(r["run_dir"]) / "learning_curve.png").exists()
    assert pal_threads() == []


def test_stop_return_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    cfg = cfg_for(tmp_path, steps=20_000, learning_starts=500, batch_size=32, eval_interval=1_000,
                  stop_return=-1.0, deterministic=False)
    with Trainer(cfg) as tr:
        s = tr.run()
    assert s["reached_return"] == s["eval"][0] and s["reached_return"]["env_steps"] >= 1_000
    assert s["env_steps"] < 20_000
    assert pal_threads() == []


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac"])
def test_continuous_algorithms_smoke(tmp_path, algo):
    cfg = cfg_for(tmp_path, algo=algo, env="Pendulum-v1", actors=1, learners=2, deterministic=False,
                  steps=1_200, learning_starts=600, batch_size=64, eval_interval=1_200)
    with Trainer(cfg) as tr:
        s = tr.run()
    assert s["env_steps"] == 1_200 and s["updates"] > 0
    assert np.isfinite(s["final_eval_return"])
    assert pal_threads() == []


@pytest.mark.parametrize("actors, learners", [(1, 1), (4, 1), (1, 4)])
def test_rate_control_holds_updates_per_step(tmp_path, actors, learners):
    cfg = cfg_for(tmp_path, actors=actors, learners=learners, steps=6_000, learning_starts=500,
                  batch_size=32, updates_per_step=0.25, deterministic=False)
    with Trainer(cfg) as tr:
        s = tr.run()
    measured = s["updates"] / (s["env_steps"] - cfg.learning_starts)
    assert measured == pytest.approx(0.25, rel=0.10), s


def test_one_actor_one_learner_is_reproducible(tmp_path):
    def run(name):
        cfg = cfg_for(tmp_path, steps=3_000, learning_starts=500, batch_size=32, seed=3, name=name)
        with Trainer(cfg) as tr:
            tr.run()
            return [r for _, r, _, _ in tr.episodes], {k: v.clone() for k, v in tr.ps.nets.state_dict().items()}

    eps_a, w_a = run("a")
    eps_b, w_b = run("b")
    assert eps_a == eps_b
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


_steps = itertools.count()


class ExplodingCartPole(gym.Wrapper):
    """CartPole whose 400th step, counted over every instance, raises: exactly one actor hits it."""

    def step(self, action):
        if next(_steps) == 400:
            raise RuntimeError("environment exploded")
        return super().step(action)


gym.register("PalTest/ExplodingCartPole-v0", entry_point=lambda **kw: ExplodingCartPole(gym.make("CartPole-v1")))


def test_env_error_in_one_actor_stops_everything_and_surfaces(tmp_path):
    cfg = cfg_for(tmp_path, env="PalTest/ExplodingCartPole-v0", actors=2, learners=2, steps=50_000,
                  learning_starts=200, batch_size=32)
    with pytest.raises(WorkerError, match="(?s)actor.*environment exploded"):
        with Trainer(cfg) as tr:
            tr.run()
    assert pal_threads() == []


def test_learner_error_stops_everything_and_surfaces(tmp_path, monkeypatch):
    real = dqn.losses

    def failing(nets, targets, batch, cfg, update):
        if update == 20:
            raise ValueError("learner blew up")
        return real(nets, targets, batch, cfg, update)

    monkeypatch.setattr(dqn, "losses", failing)
    cfg = cfg_for(tmp_path, actors=2, learners=2, steps=50_000, learning_starts=200, batch_size=32)
    with pytest.raises(WorkerError, match="(?s)learner.*learner blew up"):
        with Trainer(cfg) as tr:
            tr.run()
    assert pal_threads() == []


def test_ctrl_c_stops_cleanly_and_checkpoints(tmp_path):
    cfg = cfg_for(tmp_path, actors=2, learners=1, steps=10**6, learning_starts=200, batch_size=32)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    # a process started in the background by a non-interactive shell inherits SIGINT ignored (and Python
    # then installs no handler): Ctrl-C as a terminal delivers it needs Python's default handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Trainer(cfg) as tr:
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                tr.run()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert pal_threads() == []
    ckpt, buf = RunRecorder(tmp_path / cfg.run_name(), "").checkpoint_files()
    assert ckpt.exists() and buf.exists()


def test_checkpoint_and_resume_continue_the_run(tmp_path):
    cfg = cfg_for(tmp_path, steps=2_000, learning_starts=500, batch_size=32, name="r")
    with Trainer(cfg) as tr:
        tr.run()
    cfg2 = cfg_for(tmp_path, steps=3_000, learning_starts=500, batch_size=32, name="r")
    with Trainer(cfg2, resume=True) as tr:
        assert tr.rate.steps == 2_000 and len(tr.buffer) == 2_000
        assert all(torch.equal(v, first_v) for v, first_v in
                   zip(tr.ps.nets.state_dict().values(),
                       torch.load(RunRecorder(tmp_path / "r", "r").checkpoint_files()[0],
                                  weights_only=True)["ps"]["online"].values()))
        s = tr.run()
    assert s["env_steps"] == 3_000
    assert s["updates"] == pytest.approx(0.25 * 2_500, abs=2)


@pytest.mark.parametrize("kw, field", [
    (dict(algo="nope"), "algo"),
    (dict(env="NoSuchEnv-v0"), "env"),
    (dict(algo="sac", env="CartPole-v1"), "algo"),
    (dict(actors=0), "actors"),
    (dict(learners=-1), "learners"),
    (dict(learning_starts=20_000, buffer_capacity=10_000), "learning_starts"),
    (dict(updates_per_step=0), "updates_per_step"),
    (dict(stop_return=float("nan")), "stop_return"),
    (dict(stop_return=100.0, eval_episodes=0), "stop_return"),
    (dict(bogus=1), "bogus"),
])
def test_bad_configs_fail_before_any_thread(tmp_path, kw, field):
    before = threading.active_count()
    with pytest.raises(ConfigError, match=field):
        algo = kw.pop("algo", "dqn")
        env = kw.pop("env", "CartPole-v1")
        Trainer(make_config(algo, env, out_dir=str(tmp_path), **kw))
    assert threading.active_count() == before


def test_async_env_backend_and_several_envs_per_actor(tmp_path):
    cfg = cfg_for(tmp_path, actors=1, learners=1, envs_per_actor=2, env_backend="async", steps=1_000,
                  learning_starts=200, batch_size=32, deterministic=False)
    with Trainer(cfg) as tr:
        s = tr.run()
    assert s["env_steps"] == 1_000 and s["updates"] > 0
    assert pal_threads() == []


def test_pin_sets_the_calling_threads_affinity_only():
    from pal_bench.train.workers import pin

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    before = os.sched_getaffinity(0)
    seen = {}

    def body():
        pin(1)
        seen["inside"] = os.sched_getaffinity(0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert len(seen["inside"]) == 1 and seen["inside"] <= before
    assert os.sched_getaffinity(0) == before
