"""The learning runs behind the learning tests, one function each, and the seed sweep that sets their thresholds.

Each function runs one seeded training run and returns the quantities its test asserts on. The
tests call them with one seed; ``python tests/learning_runs.py RUN --seeds 0-9`` runs them over
many seeds (each seed in its own process, ``--jobs`` at a time) and appends one row per seed to
``results/learning_sweeps.csv`` (with the machine, load before/after and commit), then prints the
distribution (min, median) that the test's docstring quotes.

Runs: trainer-sync, trainer-async (the thread trainer, DQN CartPole-v1, 2 actors / 2 learners), ray and ray-node
(the Ray backend, 2 actor processes / 1 learner, Ray actors or the one-node placement), r2d2 and ddqn-novel (the
thread trainer, lockstep, on the partially observable CartPole without velocities: R2D2, and Double DQN for
reference), tianshou (tianshou's DQN on PAL's vector buffer), rllib (RLlib DQN with PAL's drop-in buffer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "results" / "learning_sweeps.csv"


# ------------------------------------------------------------------------------------------ the runs

def trainer_dqn_cartpole(seed: int, aggregation: str, out_dir: str, **kw) -> dict:
    """The thread trainer: DQN on CartPole-v1, 2 actors + 2 learners, 40k env steps, 0.5 updates per step;
    ``kw`` overrides config fields (the test stops at its threshold with ``stop_return``)."""
    from pal_bench.train import Trainer, make_config

    cfg = make_config("dqn", "CartPole-v1", out_dir=out_dir, actors=2, learners=2, steps=40_000,
                      aggregation=aggregation, eval_interval=5_000, eval_episodes=2, hidden=(128, 128), seed=seed,
                      updates_per_step=0.5, progress=False, **kw)
    with Trainer(cfg) as tr:
        s = tr.run()
    return {"best": max(e["mean_return"] for e in s["eval"]), "summary": s, "run_dir": str(cfg.run_dir()),
            "curve": [(e["env_steps"], round(e["mean_return"], 1)) for e in s["eval"]]}


def ray_dqn_cartpole(seed: int, out_dir: str, placement: str = "pack") -> dict:
    """The Ray backend: DQN on CartPole-v1, 2 actor processes + 1 learner, 20k env steps (needs a Ray session).
    ``placement`` "pack": buffer, parameter server and workers in Ray actors; "node": the one-node placement
    (the process backend's shared-memory pieces, actor processes started by Ray)."""
    from pal_bench.train import make_config, make_trainer

    cfg = make_config("dqn", "CartPole-v1", out_dir=out_dir, backend="ray", ray_placement=placement,
                      hidden=(64, 64), eval_episodes=3, progress=False, actors=2, learners=1, steps=20_000,
                      eval_interval=5_000, seed=seed)
    with make_trainer(cfg) as tr:
        s = tr.run()
    return {"best": max(e["mean_return"] for e in s["eval"]), "summary": s, "cfg": cfg, "run_dir": str(cfg.run_dir()),
            "curve": [(e["env_steps"], round(e["mean_return"], 1)) for e in s["eval"]]}


def trainer_no_velocity(algo: str, seed: int, out_dir: str, **kw) -> dict:
    """The thread trainer (1 actor + 1 learner, lockstep) on ``pal_bench/CartPoleNoVel-v0`` with the algorithm's
    defaults for it (30k env steps; r2d2: sequences of 20 overlapping by 10, burn-in 5), greedy evaluation of 5
    episodes every 5k steps; ``kw`` overrides config fields."""
    from pal_bench.train import make_config, make_trainer

    cfg = make_config(algo, "pal_bench/CartPoleNoVel-v0", out_dir=out_dir, seed=seed, progress=False, **kw)
    with make_trainer(cfg) as tr:
        s = tr.run()
    return {"best": max(e["mean_return"] for e in s["eval"]), "summary": s, "run_dir": str(cfg.run_dir()),
            "curve": [(e["env_steps"], round(e["mean_return"], 1)) for e in s["eval"]]}


def tianshou_dqn_cartpole(seed: int) -> dict:
    """tianshou 2.0.1's DQN + Collector + OffPolicyTrainer on PAL's prioritized vector buffer, CartPole-v1.

    Seeded end to end: numpy's global RNG (tianshou's buffers sample from it, PAL's drop-in too),
    torch, and the training and test environments. ``best`` is the best greedy test return over the
    epochs (10 episodes each), ``final`` one more greedy test after training.
    """
    import gymnasium as gym
    import torch
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    from pal_bench.integrations.tianshou import PALPrioritizedVectorReplayBuffer

    n_train, n_test = 8, 10
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64x64 MLP: threads only add overhead
    try:
        np.random.seed(seed)
        torch.manual_seed(seed)
        train_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_train)])
        test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_test)])
        train_envs.seed(seed)
        test_envs.seed(seed + 100)
        space = gym.make("CartPole-v1").action_space
        space.seed(seed)
        policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[64, 64]),
                                         action_space=space, eps_training=0.1, eps_inference=0.0)
        algo = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
                   target_update_freq=320)
        buf = PALPrioritizedVectorReplayBuffer(20_000, n_train, alpha=0.6, beta=0.4)
        train_c = Collector(algo, train_envs, buf, exploration_noise=True)
        test_c = Collector(algo, test_envs)
        start = time.perf_counter()
        train_c.reset()
        train_c.collect(n_step=64 * n_train)
        stats = algo.run_training(OffPolicyTrainerParams(
            training_collector=train_c, test_collector=test_c, max_epochs=6, epoch_num_steps=5000,
            collection_step_num_env_steps=16, test_step_num_episodes=n_test, batch_size=64,
            update_step_num_gradient_steps_per_sample=0.1, stop_fn=lambda mean_return: mean_return >= 195,
            test_in_training=False, verbose=False, show_progress=False))
        final = test_c.collect(n_episode=n_test, reset_before_collect=True)
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return {"best": float(stats.best_score), "final": float(final.returns_stat.mean), "env_steps": stats.train_step,
            "seconds": elapsed, "buffer": buf}


def rllib_dqn_config(seed: int = 0):
    """RLlib 2.60 DQN on CartPole-v1 with PAL's drop-in buffer, seeded (RLlib's ``debugging(seed)`` seeds its
    env runners, torch and numpy; the drop-in's own RNG gets the same seed)."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        DQNConfig().environment("CartPole-v1")
        .env_runners(num_env_runners=0, rollout_fragment_length=4)
        .training(lr=1e-3, train_batch_size_per_learner=64, n_step=3, target_network_update_freq=500,
                  num_steps_sampled_before_learning_starts=500, epsilon=[(0, 1.0), (3000, 0.02)],
                  replay_buffer_config={"type": "pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer",
                                        "capacity": 20_000, "alpha": 0.6, "beta": 0.4, "seed": seed})
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64], head_fcnet_hiddens=[64]))
        .reporting(min_sample_timesteps_per_iteration=1000, metrics_num_episodes_for_smoothing=20)
        .debugging(seed=seed)
    )


# 100 was reached after 3-5 iterations over seeds 0-9 (median 3): a budget of 8 leaves 3 to spare
RLLIB_ITERATIONS, RLLIB_STOP = 8, 100.0


def rllib_dqn_cartpole(seed: int) -> dict:
    """Train until the smoothed episode return reaches ``RLLIB_STOP`` or ``RLLIB_ITERATIONS`` iterations of 1000
    env steps pass (needs a Ray session). The caller stops ``algo``."""
    t0 = time.perf_counter()
    algo = rllib_dqn_config(seed).build_algo()
    returns = []
    for _ in range(RLLIB_ITERATIONS):
        returns.append(float(algo.train()["env_runners"]["episode_return_mean"]))
        if returns[-1] >= RLLIB_STOP:
            break
    return {"best": max(returns), "first": returns[0], "returns": returns, "algo": algo,
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------ the sweep

def run_one(name: str, seed: int) -> dict:
    """One seed of ``name``: the asserted quantities as plain numbers."""
    if name in ("trainer-sync", "trainer-async"):
        with tempfile.TemporaryDirectory() as d:
            r = trainer_dqn_cartpole(seed, name.split("-")[1], d)
        s = r["summary"]
        return {"best": r["best"], "final": s["final_eval_return"], "updates": s["updates"],
                "dropped": s["dropped_stale_gradients"], "wall_s": s["wall_s"], "curve": r["curve"]}
    if name in ("ray", "ray-node"):
        from pal_bench.train.backends.ray import session as ray_session

        with tempfile.TemporaryDirectory() as d, ray_session.session(num_cpus=2, log_to_driver=False):
            r = ray_dqn_cartpole(seed, d, "node" if name == "ray-node" else "pack")
        s = r["summary"]
        return {"best": r["best"], "final": s["final_eval_return"], "updates": s["updates"], "wall_s": s["wall_s"],
                "curve": r["curve"]}
    if name in ("r2d2", "ddqn-novel"):
        with tempfile.TemporaryDirectory() as d:
            r = trainer_no_velocity(name.split("-")[0], seed, d)
        s = r["summary"]
        return {"best": r["best"], "final": s["final_eval_return"], "updates": s["updates"], "wall_s": s["wall_s"],
                "curve": r["curve"]}
    if name == "tianshou":
        r = tianshou_dqn_cartpole(seed)
        return {"best": r["best"], "final": r["final"], "env_steps": r["env_steps"], "wall_s": r["seconds"]}
    if name == "rllib":
        import ray
        import torch

        torch.set_num_threads(1)
        ray.init(address="local", num_cpus=1, include_dashboard=False, configure_logging=False)
        try:
            r = rllib_dqn_cartpole(seed)
            r.pop("algo").stop()
        finally:
            ray.shutdown()
        return {"best": r["best"], "first": r["first"], "returns": [round(x, 1) for x in r["returns"]],
                "wall_s": r["seconds"]}
    raise SystemExit(f"unknown run {name!r}; choose from {', '.join(RUNS)}")


RUNS = ("trainer-sync", "trainer-async", "ray", "ray-node", "r2d2", "ddqn-novel", "tianshou", "rllib")


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


def sweep(name: str, seeds: list[int], jobs: int, out: Path) -> list[dict]:
    import pandas as pd

    from pal_bench.conditions import Conditions

    def one(seed: int) -> dict:
        with Conditions(f"learning sweep {name} seed {seed}") as c:
            p = subprocess.run([sys.executable, __file__, "--one", name, str(seed)], capture_output=True, text=True,
                               env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-4000:], file=sys.stderr)
            raise RuntimeError(f"{name} seed {seed} failed (exit {p.returncode})")
        got = json.loads(p.stdout.strip().splitlines()[-1])
        meta = c.as_dict()
        row = {"run": name, "seed": seed, **{k: v for k, v in got.items() if not isinstance(v, list)},
               "detail": json.dumps({k: v for k, v in got.items() if isinstance(v, list)}),
               "load_before": meta["load_before"], "load_after": meta["load_after"], "noisy": meta["noisy"],
               "cpu": meta["machine"]["cpu"], "commit": meta["commit"], "date": meta["started"],
               "torch": meta["versions"].get("torch", "")}
        print(f"{name} seed {seed}: best {row['best']:.1f}  " + "  ".join(
            f"{k} {v}" for k, v in got.items() if k != "best"), flush=True)
        return row

    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, seeds))
    df = pd.DataFrame(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(out) if out.exists() else None
    merged = df if old is None else pd.concat([old, df], ignore_index=True)
    merged.to_csv(out, index=False, float_format="%.2f")
    best = df.best.to_numpy()
    print(f"{name}: {len(best)} seeds, best return min {best.min():.1f}, median {np.median(best):.1f}, "
          f"max {best.max():.1f} -> {out}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", choices=RUNS)
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 1,3,5-7 (default 0-9)")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once (default 1)")
    ap.add_argument("--out", type=Path, default=SWEEPS)
    ap.add_argument("--one", nargs=2, metavar=("RUN", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]))))
        return 0
    if not args.run:
        ap.error("name a run")
    sweep(args.run, parse_seeds(args.seeds), args.jobs, args.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
