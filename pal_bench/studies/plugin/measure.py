"""Training-step time with each framework's own prioritized buffer and with PAL's drop-in.

The PAL paper's plug-in experiment: the same RLlib (or tianshou) training loop, same seed,
config and number of iterations, once with the framework's prioritized replay buffer and once
with ``pal_bench.integrations``' drop-in. For each configuration (framework/algorithm, train
batch size, number of env runners) it reports the median time of one training iteration, the
share of it spent inside the buffer (add + sample + priority update, timed by wrapping the
buffer instance's methods) and the speedup default / PAL.

The two runs of a configuration are built side by side and their timed iterations alternate
(ABBA), so load on a shared machine hits both alike. ``pal-bench plugin-bench [--full]`` writes
``results/plugin.csv`` (one row per configuration and buffer, with every timed iteration) and
``results/figures/plugin.png``; the table (``publish``) is printed and lives in docs/plugin.md.
Quick (default): 2 warm-up and 5 timed iterations of 200 env
steps each, env runners 0 and 1; ``--full``: 10 timed iterations of 1000 steps, env runners
0..cores-1 (at least 0 and 1). tianshou's iterations take about a tenth of RLlib's, so its cases
time ``TIANSHOU_ITERATIONS`` (4) times as many, for intervals of a useful width at little cost.
``--only``/``--batch``/``--runners`` pick configurations and ``--iterations`` sets the timed iterations (for
a narrower interval where the buffer-only bound is small, e.g. SAC at batch 32); a partial run writes only its
own rows, so give it its own ``--out`` to keep the stored table.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import MAX_COUNT, Range, nonneg_int, number, rng_seed
from pal_bench.bench.publishing import show, store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy, usable_cores
from pal_bench.paths import RESULTS
from pal_bench.studies.plugin.publish import PUBLICATION
from pal_bench.train.backends.ray.session import local_ray

BUFFER_METHODS = ("add", "sample", "update_priorities", "get_metrics")
ENVS = {"rllib-dqn": "LunarLander-v3", "rllib-sac": "Pendulum-v1", "tianshou-dqn": "LunarLander-v3"}


@dataclasses.dataclass(frozen=True)
class Case:
    framework: str          # "rllib-dqn", "rllib-sac" or "tianshou-dqn"
    env: str
    batch_size: int
    env_runners: int
    buffer: str             # "default" (the framework's own) or "pal"

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

    # SAC's config validation (RLlib 2.60) accepts only RLlib's own buffer names: its PAL buffer is
    # swapped in after building (same constructor arguments), DQN's is named in the config
    dqn = case.framework == "rllib-dqn"
    buffer_type = ("pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer" if case.buffer == "pal" and dqn
                   else "PrioritizedEpisodeReplayBuffer")
    config = DQNConfig() if dqn else SACConfig()
    config = (config.environment(case.env)
              .env_runners(num_env_runners=case.env_runners, num_envs_per_env_runner=1)
              .training(train_batch_size_per_learner=case.batch_size,
                        num_steps_sampled_before_learning_starts=learning_starts,
                        replay_buffer_config={"type": buffer_type, "capacity": 100_000, "alpha": 0.6, "beta": 0.4})
              .reporting(min_sample_timesteps_per_iteration=steps_per_iter)
              .debugging(seed=seed))
    algo = config.build_algo()
    if case.buffer == "pal" and not dqn:
        from pal_bench.integrations.rllib import replace_replay_buffer

        replace_replay_buffer(algo)
    return algo


class RLlibRun:
    """One RLlib algorithm for the benchmark: ``prepare`` fills the buffer past learning_starts and
    warms up, ``iterate`` is one ``algo.train()``."""

    methods = BUFFER_METHODS

    def __init__(self, case: Case, seed: int, steps_per_iter: int, learning_starts: int = 1_000):
        local_ray()
        self.learning_starts = learning_starts
        self.algo = rllib_algo(case, seed, steps_per_iter, learning_starts)

    @property
    def buffer(self):
        return self.algo.local_replay_buffer

    def prepare(self, warmup: int) -> None:
        while self.algo.train()["env_runners"]["num_env_steps_sampled_lifetime"] <= self.learning_starts:
            pass
        for _ in range(warmup):
            self.algo.train()

    def iterate(self) -> None:
        self.algo.train()

    def close(self) -> None:
        self.algo.stop()


TIANSHOU_ITERATIONS = 4  # tianshou cases time this many times the iterations of RLlib's (see the module docstring)


def paired(make, warmup: int, iters: int) -> dict[str, dict]:
    """Build the default-buffer and the PAL-buffer run of one configuration (``make(buffer)``), prepare
    both, then time their iterations alternately (ABBA order), so that load on a shared machine hits
    both alike. Returns ``{buffer: timing}``."""
    runs: dict = {}
    try:
        for buffer in ("default", "pal"):
            runs[buffer] = make(buffer)
        for run in runs.values():
            run.prepare(warmup)
        clocks = {b: BufferClock(r.buffer, r.methods) for b, r in runs.items()}
        times: dict[str, list[float]] = {b: [] for b in runs}
        for i in range(iters):
            for b in (("default", "pal") if i % 2 == 0 else ("pal", "default")):
                t0 = time.perf_counter()
                runs[b].iterate()
                times[b].append(time.perf_counter() - t0)
        return {b: timing(times[b], clocks[b].seconds) | {"buffer_len": len(runs[b].buffer)} for b in runs}
    finally:
        for run in runs.values():
            run.close()


def timing(times: list[float], buffer_s: float) -> dict:
    """Median and IQR of the iteration times (s) and the buffer's share of their sum."""
    q75, q25 = np.percentile(times, [75, 25])
    return {"iteration_s": float(np.median(times)), "iteration_iqr_s": float(q75 - q25),
            "buffer_share": buffer_s / sum(times), "iterations": len(times),
            "times_s": " ".join(f"{t:.5f}" for t in times)}


def cases(full: bool, cores: int) -> list[Case]:
    """Configurations (``buffer`` left as "default"; each is measured with both buffers)."""
    runners = list(range(0, max(2, cores))) if full else [0, 1]
    out = []
    for framework, env in ENVS.items():
        for batch in (32, 256):
            for r in (runners if framework.startswith("rllib") else [0]):
                out.append(Case(framework, env, batch, r, "default"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench plugin-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="10 iterations of 1000 steps, env runners up to cores-1")
    ap.add_argument("--only", nargs="+", choices=["rllib-dqn", "rllib-sac", "tianshou-dqn"],
                    help="these frameworks only")
    ap.add_argument("--batch", nargs="+", type=int, choices=[32, 256], help="these train batch sizes only")
    ap.add_argument("--runners", nargs="+", type=nonneg_int,
                    help="these env-runner counts only (RLlib; tianshou runs 0)")
    ap.add_argument("--iterations", type=number(Range(2, MAX_COUNT)),
                    help="timed iterations per configuration, at least 2 for the ABBA order and a bootstrap interval "
                         "(default: 5, or 10 with --full; tianshou's cases time 4x as many), for narrower intervals "
                         "where the bound is small")
    ap.add_argument("--seed", type=rng_seed, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    todo = [c for c in cases(args.full, usable_cores()) if (not args.only or c.framework in args.only)
            and (not args.batch or c.batch_size in args.batch) and (not args.runners or c.env_runners in args.runners)]
    if not todo:
        ap.error("no configuration matches --only/--batch/--runners")
    if refuse_if_busy("pal-bench plugin-bench", args.force):
        return 2
    measured = Conditions("plug-in benchmark")
    warmup, iters, steps = (3, 10, 1_000) if args.full else (2, 5, 200)
    iters = args.iterations or iters
    rows = []
    t_start = time.perf_counter()
    for i, case in enumerate(todo, 1):
        label = case.name.replace("-default]", "]")
        print(f"[{i}/{len(todo)}, {time.perf_counter() - t_start:.0f} s] {label} ...", file=sys.stderr, flush=True)
        if case.framework.startswith("tianshou"):
            from pal_bench.studies.plugin.tianshou_run import TianshouRun

            def make(buffer, case=case):
                return TianshouRun(dataclasses.replace(case, buffer=buffer), args.seed, steps)
        else:
            def make(buffer, case=case):
                return RLlibRun(dataclasses.replace(case, buffer=buffer), args.seed, steps)
        result = paired(make, warmup, iters * (TIANSHOU_ITERATIONS if case.framework.startswith("tianshou") else 1))
        for buffer, r in result.items():
            rows.append(dataclasses.asdict(case) | {"buffer": buffer} | r | {"steps_per_iteration": steps})
        d, p = result["default"], result["pal"]
        print(f"[{i}/{len(todo)}] {label}: {d['iteration_s'] * 1e3:.0f} ms -> {p['iteration_s'] * 1e3:.0f} ms per "
              f"iteration ({d['iteration_s'] / p['iteration_s']:.2f}x), buffer {d['buffer_share']:.0%} -> "
              f"{p['buffer_share']:.0%}", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    store(df, args.out / "plugin.csv", measured, "%.5f")
    show(PUBLICATION, args.out, "plugin")
    return 0

