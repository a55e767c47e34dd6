"""Training-step time with each framework's own prioritized buffer and with PAL's drop-in.

The PAL paper's plug-in experiment: the same RLlib (or tianshou) training loop, same seed,
config and number of iterations, once with the framework's prioritized replay buffer and once
with ``pal_bench.integrations``' drop-in. For each configuration (framework/algorithm, train
batch size, number of env runners) it reports the median time of one training iteration, the
share of it spent inside the buffer (add + sample + priority update, timed by wrapping the
buffer instance's methods) and the speedup default / PAL.

``pal-bench plugin-bench [--full]`` writes ``results/plugin.csv`` (one row per configuration and
buffer), ``results/plugin.md`` and ``results/figures/plugin.png``. Quick (default): 2 warm-up and
5 timed iterations of 200 env steps each, env runners 0 and 1; ``--full``: 10 timed iterations of
1000 steps, env runners 0..cores-1 (at least 0 and 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
BUFFER_METHODS = ("add", "sample", "update_priorities", "get_metrics")


@dataclasses.dataclass(frozen=True)
class Case:
    framework: str          # "rllib-dqn", "rllib-sac" or "tianshou-dqn"
    env: str
    batch_size: int
    env_runners: int
    buffer: str             # "default" or "pal"

    @property
    def name(self) -> str:
        return f"{self.framework}[{self.env}-B={self.batch_size}-runners={self.env_runners}-{self.buffer}]"


class BufferClock:
    """Wrap a buffer instance's methods so the seconds spent inside them are summed."""

    def __init__(self, buffer, methods=BUFFER_METHODS):
        self.seconds = 0.0
        for name in methods:
            if hasattr(buffer, name):
                setattr(buffer, name, self._timed(getattr(buffer, name)))

    def _timed(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return wrapper


def rllib_algo(case: Case, seed: int, steps_per_iter: int, learning_starts: int):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.sac import SACConfig

    buffer_type = ("pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer" if case.buffer == "pal"
                   else "PrioritizedEpisodeReplayBuffer")
    config = DQNConfig() if case.framework == "rllib-dqn" else SACConfig()
    config = (config.environment(case.env)
              .env_runners(num_env_runners=case.env_runners, num_envs_per_env_runner=1)
              .training(train_batch_size_per_learner=case.batch_size,
                        num_steps_sampled_before_learning_starts=learning_starts,
                        replay_buffer_config={"type": buffer_type, "capacity": 100_000, "alpha": 0.6, "beta": 0.4})
              .reporting(min_sample_timesteps_per_iteration=steps_per_iter)
              .debugging(seed=seed))
    return config.build_algo()


def time_rllib(case: Case, seed: int, warmup: int, iters: int, steps_per_iter: int) -> dict:
    learning_starts = 1_000
    algo = rllib_algo(case, seed, steps_per_iter, learning_starts)
    try:
        # fill past learning_starts, then warm up with learning on
        while True:
            r = algo.train()
            if r["env_runners"]["num_env_steps_sampled_lifetime"] > learning_starts:
                break
        for _ in range(warmup):
            algo.train()
        clock = BufferClock(algo.local_replay_buffer)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            algo.train()
            times.append(time.perf_counter() - t0)
        return timing(times, clock.seconds) | {"buffer_len": len(algo.local_replay_buffer)}
    finally:
        algo.stop()


def timing(times: list[float], buffer_s: float) -> dict:
    """Median and IQR of the iteration times (s) and the buffer's share of their sum."""
    q75, q25 = np.percentile(times, [75, 25])
    return {"iteration_s": float(np.median(times)), "iteration_iqr_s": float(q75 - q25),
            "buffer_share": buffer_s / sum(times), "iterations": len(times)}


def time_tianshou(case: Case, seed: int, warmup: int, iters: int, steps_per_iter: int) -> dict:
    from pal_bench.integrations.tianshou_dqn import dqn_iterations

    return dqn_iterations(case, seed, warmup, iters, steps_per_iter, BufferClock)


def cases(full: bool, cores: int) -> list[Case]:
    runners = list(range(0, max(2, cores))) if full else [0, 1]
    out = []
    for framework, env in (("rllib-dqn", "LunarLander-v3"), ("rllib-sac", "Pendulum-v1"),
                           ("tianshou-dqn", "LunarLander-v3")):
        for batch in (32, 256):
            for r in (runners if framework.startswith("rllib") else [0]):
                for buffer in ("default", "pal"):
                    out.append(Case(framework, env, batch, r, buffer))
    return out


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["framework", "env", "batch_size", "env_runners"]
    d = df[df.buffer == "default"].set_index(keys)
    p = df[df.buffer == "pal"].set_index(keys)
    t = pd.DataFrame({"default_ms": d.iteration_s * 1e3, "pal_ms": p.iteration_s * 1e3,
                      "speedup": d.iteration_s / p.iteration_s,
                      "buffer_share_default": d.buffer_share, "buffer_share_pal": p.buffer_share}).reset_index()
    # the speedup if the buffer took no time at all (Amdahl bound for replacing the buffer)
    t["bound"] = 1 / (1 - t.buffer_share_default)
    return t


def draw(t: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.framework}\nB={r.batch_size} runners={r.env_runners}" for r in t.itertuples()]
    x = np.arange(len(t))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(t) + 2), 4))
    ax.bar(x - 0.2, t.default_ms, 0.4, label="framework's own buffer")
    ax.bar(x + 0.2, t.pal_ms, 0.4, label="PAL drop-in")
    for xi, r in zip(x, t.itertuples()):
        ax.text(xi, max(r.default_ms, r.pal_ms) * 1.02, f"{r.speedup:.2f}x", ha="center", fontsize=7)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("median time per training iteration (ms)")
    ax.set_title("training iteration: default buffer vs PAL's drop-in", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench plugin-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="10 iterations of 1000 steps, env runners up to cores-1")
    ap.add_argument("--only", nargs="+", choices=["rllib-dqn", "rllib-sac", "tianshou-dqn"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    warmup, iters, steps = (3, 10, 1_000) if args.full else (2, 5, 200)
    from pal_bench.scaling import usable_cores

    todo = [c for c in cases(args.full, usable_cores()) if not args.only or c.framework in args.only]
    rows = []
    t_start = time.perf_counter()
    for i, case in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}, {time.perf_counter() - t_start:.0f} s] {case.name} ...", file=sys.stderr, flush=True)
        fn = time_tianshou if case.framework.startswith("tianshou") else time_rllib
        r = fn(case, args.seed, warmup, iters, steps)
        rows.append(dataclasses.asdict(case) | r | {"steps_per_iteration": steps})
        print(f"[{i}/{len(todo)}] {case.name}: {r['iteration_s'] * 1e3:.1f} ms/iteration, "
              f"buffer {r['buffer_share']:.0%}", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "plugin.csv", index=False, float_format="%.5f")
    t = speedup_table(df)
    import platform

    text = (f"`pal-bench plugin-bench{' --full' if args.full else ''}` on {platform.node()} ({os.cpu_count()} cores): "
            f"median of {iters} training iterations of {steps} env steps each (after {warmup} warm-up iterations "
            f"past learning_starts), same seed and config; buffer_share = time inside the buffer's add/sample/"
            f"update_priorities / iteration time; bound = speedup if the buffer took no time.\n\n"
            + t.to_markdown(index=False, floatfmt=".2f") + "\n")
    (args.out / "plugin.md").write_text(text)
    print(text)
    print(f"figure: {draw(t, args.out / 'figures' / 'plugin.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
