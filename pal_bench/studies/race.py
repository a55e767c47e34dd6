"""Race to a target return: PAL's parallel trainer against RLlib's and tianshou's DQN.

``pal-bench race [--quick] [--seeds N] [--only NAME ...]``: every contestant trains DQN on the
same task with the same network shape and, as far as each framework allows, the same
hyperparameters (``Task``); every ``eval_interval`` env steps each is evaluated the same way
(``eval_episodes`` greedy episodes on a separately seeded env, ``greedy_return``), and a run
stops at the first evaluation whose mean return reaches the target, or at its budget (env steps
or wall-clock seconds) and is then reported as not reaching it. Wall-clock time counts from
before the contestant is built (framework start-up included, also reported alone as
``setup_s``) and includes evaluation, which costs every contestant the same episodes.

Each run is a separate process (``python -m pal_bench.studies.race --worker ...``), so Ray, torch
thread pools and imports of one contestant cannot slow another. Each run is stored as soon as it ends
(``results/race[_quick]_runs/<contestant>-s<seed>.json``: its evaluations, set-up and wall time, split, the
task's settings and the conditions it ran under); the same command run again skips the stored runs that match
its settings, so a long race can be completed in several sittings (``--max-minutes M`` starts no run after M
minutes; ``--rerun-noisy`` runs again those during which the machine was busy). Results: ``results/race.csv``
(one row per run), ``results/race_curves.csv`` (every evaluation) and ``results/figures/race.png``
(return against wall-clock time); the table (``pal_bench.bench.tables``) is printed and lives in docs/race.md.
``--quick`` is CartPole-v1 with
one seed; the full profile is LunarLander-v3 at target 200 with 3 seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import positive_float, positive_int, rng_seed
from pal_bench.atomic import atomic_write_text
from pal_bench.bench.conditions import Conditions, add_force_flag, refuse_if_busy, settle, write_meta

ROOT = Path(__file__).resolve().parents[2]
CONTESTANTS = ("pal", "pal-processes", "pal-apex", "rllib", "rllib-pal", "tianshou")
# PAL's trainer: contestant -> (backend, preset). "pal-apex" is the Ape-X preset (one learner, per-actor epsilon,
# dueling Double DQN, actor-side priorities) on actor processes, with the actors of the solver's split
PAL_BACKENDS = {"pal": "threads", "pal-processes": "processes", "pal-apex": "processes"}
PAL_PRESETS = {"pal-apex": "apex"}


@dataclasses.dataclass(frozen=True)
class Task:
    """One race: environment, target and budget, and the shared DQN hyperparameters."""

    env: str
    target: float                  # mean greedy evaluation return that counts as solved
    max_steps: int                 # env-step budget per run
    max_wall_s: float              # wall-clock budget per run (s)
    eval_interval: int             # env steps between evaluations
    eval_episodes: int
    hidden: tuple[int, ...]
    lr: float
    gamma: float = 0.99
    batch_size: int = 128
    n_step: int = 3
    buffer_capacity: int = 100_000
    learning_starts: int = 1_000
    updates_per_step: float = 0.25  # learner updates (batches) per env step
    target_update: int = 200        # learner updates between hard target-network copies
    eps_end: float = 0.05
    eps_fraction: float = 0.2       # of max_steps over which epsilon decays from 1 to eps_end
    alpha: float = 0.6
    beta: float = 0.4


TASKS = {
    "quick": Task(env="CartPole-v1", target=200.0, max_steps=50_000, max_wall_s=240.0, eval_interval=2_500,
                  eval_episodes=5, hidden=(128, 128), lr=1e-3),
    "full": Task(env="LunarLander-v3", target=200.0, max_steps=500_000, max_wall_s=1_800.0, eval_interval=10_000,
                 eval_episodes=10, hidden=(256, 256), lr=5e-4, buffer_capacity=200_000, learning_starts=10_000,
                 target_update=250, eps_fraction=0.15),
    # a few seconds per contestant: for tests of the race itself, not a result
    "smoke": Task(env="CartPole-v1", target=500.0, max_steps=3_000, max_wall_s=120.0, eval_interval=1_000,
                  eval_episodes=2, hidden=(32, 32), lr=1e-3, learning_starts=500, batch_size=32),
}


def greedy_return(act: Callable[[np.ndarray], int], env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes acting with ``act(obs) -> action``."""
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=10_000 + 1_000 * seed + k)
            done, total = False, 0.0
            while not done:
                obs, r, term, trunc, _ = env.step(act(obs))
                total += float(r)
                done = term or trunc
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns))


class Clock:
    """Evaluation schedule, curve and stop rule shared by the framework loops."""

    def __init__(self, task: Task, seed: int, t0: float):
        self.task, self.seed, self.t0 = task, seed, t0
        self.next_eval = task.eval_interval
        self.curve: list[dict] = []
        self.setup_s: float | None = None
        self.phase_seconds: dict[str, dict[str, float]] = {}  # PAL's trainer: worker -> phase -> s

    def started(self) -> None:
        self.setup_s = time.perf_counter() - self.t0

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def due(self, steps: int) -> bool:
        return steps >= self.next_eval

    def record(self, steps: int, act: Callable[[np.ndarray], int]) -> bool:
        """Evaluate at ``steps``; True when the run should stop (target reached or budget spent)."""
        while self.next_eval <= steps:
            self.next_eval += self.task.eval_interval
        ret = greedy_return(act, self.task.env, self.task.eval_episodes, self.seed)
        self.curve.append({"env_steps": int(steps), "wall_s": round(self.wall(), 3), "mean_return": ret})
        print(f"  {steps:>8} steps {self.wall():7.1f} s  return {ret:8.1f}", file=sys.stderr, flush=True)
        return self.done(steps)

    def done(self, steps: int) -> bool:
        reached = bool(self.curve) and self.curve[-1]["mean_return"] >= self.task.target
        return reached or steps >= self.task.max_steps or self.wall() >= self.task.max_wall_s


# ---------------------------------------------------------------------------- contestants

def run_pal(task: Task, seed: int, clock: Clock, split: tuple[int, int], backend: str = "threads",
            preset: str | None = None) -> None:
    """PAL-Bench's trainer on ``backend`` (threads, or actor processes on the shared buffer) at ``split`` =
    (actors, learners), or in ``preset`` (apex: ``split``'s actors, one learner); its own evaluator."""
    from pal_bench.train import make_config, make_trainer

    algo = {"apex": "ddqn"}.get(preset, "dqn")
    learners = 1 if preset == "apex" else split[1]
    with tempfile.TemporaryDirectory(prefix="pal-race-") as out:
        cfg = make_config(algo, task.env, preset=preset, out_dir=out, seed=seed, actors=split[0], learners=learners,
                          steps=task.max_steps, hidden=task.hidden, lr=task.lr, gamma=task.gamma,
                          batch_size=task.batch_size, n_step=task.n_step, buffer_capacity=task.buffer_capacity,
                          learning_starts=task.learning_starts, updates_per_step=task.updates_per_step,
                          target_update=task.target_update, eps_end=task.eps_end, eps_fraction=task.eps_fraction,
                          alpha=task.alpha, beta=task.beta, eval_interval=task.eval_interval,
                          eval_episodes=task.eval_episodes, stop_return=task.target, deterministic=False,
                          progress=False, backend=backend)
        with make_trainer(cfg) as tr:
            clock.started()
            timer = _WallLimit(tr, task.max_wall_s - clock.setup_s)
            try:
                s = tr.run()
            finally:
                timer.cancel()
        clock.phase_seconds = s.get("phase_seconds", {})
        # the trainer's own evaluation (greedy, same episodes and seeds scheme); its wall clock starts
        # when its workers are set up, so add the set-up time (construction, and worker processes' start-up)
        for e in s["eval"]:
            at = e["wall_s"] + clock.setup_s + s.get("startup_s", 0.0)
            clock.curve.append({"env_steps": e["env_steps"], "wall_s": round(at, 3),
                                "mean_return": e["mean_return"]})


class _WallLimit:
    """Stop a Trainer after ``seconds`` (the race's wall-clock budget)."""

    def __init__(self, trainer, seconds: float):
        import threading

        self._timer = threading.Timer(max(0.0, seconds), trainer.stop.set)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def rllib_config(task: Task, seed: int, buffer: str):
    """RLlib DQN (new API stack) with the task's hyperparameters; ``buffer`` "rllib" or "pal"."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    replay = {"capacity": task.buffer_capacity, "alpha": task.alpha, "beta": task.beta,
              "type": ("pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer" if buffer == "pal"
                       else "PrioritizedEpisodeReplayBuffer")}
    decay = int(task.eps_fraction * task.max_steps)
    return (DQNConfig()
            .environment(task.env)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=1)
            .training(lr=task.lr, gamma=task.gamma, train_batch_size_per_learner=task.batch_size, n_step=task.n_step,
                      double_q=False, dueling=False, hiddens=[task.hidden[-1]],
                      num_steps_sampled_before_learning_starts=task.learning_starts,
                      # replayed transitions per sampled transition = batch x updates per step
                      training_intensity=task.batch_size * task.updates_per_step,
                      # RLlib counts the target period in sampled env steps
                      target_network_update_freq=int(task.target_update / task.updates_per_step),
                      epsilon=[(0, 1.0), (decay, task.eps_end)], replay_buffer_config=replay)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=list(task.hidden[:-1]), fcnet_activation="relu"))
            .reporting(min_sample_timesteps_per_iteration=min(1_000, task.eval_interval))
            .debugging(seed=seed))


def run_rllib(task: Task, seed: int, clock: Clock, buffer: str) -> None:
    import ray
    import torch

    from pal_bench.studies.plugin import local_ray

    local_ray()
    algo = rllib_config(task, seed, buffer).build_algo()
    clock.started()
    module = algo.get_module()

    def act(obs: np.ndarray) -> int:
        with torch.no_grad():
            out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
        return int(out["actions"][0])

    try:
        steps = 0
        while True:
            result = algo.train()
            steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
            if clock.due(steps) and clock.record(steps, act):
                break
            if clock.done(steps):
                break
    finally:
        algo.stop()
        ray.shutdown()


def run_tianshou(task: Task, seed: int, clock: Clock) -> None:
    from pal_bench.integrations.tianshou_dqn import train_dqn

    train_dqn(task, seed, clock)


def run_one(name: str, task: Task, seed: int, split: tuple[int, int]) -> dict:
    t0 = time.perf_counter()
    clock = Clock(task, seed, t0)
    if name in PAL_BACKENDS:
        run_pal(task, seed, clock, split, PAL_BACKENDS[name], PAL_PRESETS.get(name))
    elif name in ("rllib", "rllib-pal"):
        run_rllib(task, seed, clock, "pal" if name == "rllib-pal" else "rllib")
    elif name == "tianshou":
        run_tianshou(task, seed, clock)
    else:
        raise ValueError(f"unknown contestant {name!r}; choose from {', '.join(CONTESTANTS)}")
    run = {"contestant": name, "seed": seed, "setup_s": clock.setup_s, "wall_s": clock.wall(), "curve": clock.curve}
    if clock.phase_seconds:  # PAL's trainer: its per-phase times (``pal-bench profile``'s table)
        run["phase_seconds"] = clock.phase_seconds
    return run


# ---------------------------------------------------------------------------- orchestration

def dse_split(task: Task, backend: str = "threads", results: Path = ROOT / "results") -> tuple[int, int]:
    """The design-space exploration's split for this machine from the backend's stored f_a/f_l curves
    (``results/scaling.csv`` for threads, ``scaling_processes.csv`` for processes); (1, 1) when none are stored."""
    from pal_bench.studies import dse, scaling

    curves = results / ("scaling.csv" if backend == "threads" else f"scaling_{backend}.csv")
    if not curves.exists():
        return 1, 1
    c = pd.read_csv(curves)
    if "backend" in c:
        c = c[c.backend.fillna("threads") == backend]
    f = {k: dict(zip(g.threads, g.throughput)) for k, g in c.groupby("curve")}
    best, _, _ = dse.solve(f["f_a"], f["f_l"], task.updates_per_step, max(2, scaling.usable_cores()))
    return best.actors, best.learners


def summarise(run: dict, task: Task) -> dict:
    hit = next((e for e in run["curve"] if e["mean_return"] >= task.target), None)
    rets = [e["mean_return"] for e in run["curve"]]
    return {"contestant": run["contestant"], "seed": run["seed"], "env": task.env, "target": task.target,
            "reached": hit is not None, "wall_to_target_s": hit["wall_s"] if hit else None,
            "steps_to_target": hit["env_steps"] if hit else None, "setup_s": round(run["setup_s"] or 0.0, 2),
            "wall_s": round(run["wall_s"], 1), "evals": len(rets), "best_return": max(rets) if rets else None,
            "final_return": rets[-1] if rets else None, "split": run.get("split", "")}


# PAL's own contestant that the speedups are taken against: its best backend (the process backend, issue 15)
# where it raced, else the thread backend (races stored before the process backend existed)
REFERENCES = ("pal-processes", "pal")


def reference(contestants) -> str | None:
    """The PAL contestant that speedups are measured against: the first of ``REFERENCES`` that raced."""
    return next((r for r in REFERENCES if r in set(contestants)), None)


def time_to_target(g: pd.DataFrame) -> pd.Series:
    """Wall-clock seconds to target per run, a run that never reached it counted at the time it ran (its
    budget): the race's time, censored at the budget."""
    return g.wall_to_target_s.where(g.reached, g.wall_s).astype(float)


def race_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per contestant: runs, how many reached the target, wall-clock to target (median and 95% bootstrap
    interval over seeds, a run that never reached it counted at its budget; set-up included, and set-up
    alone), env steps to target (median over the runs that reached it), best greedy return, and PAL's speedup
    over it: the contestant's median time to target / the reference's (``reference``), with its interval.
    ``speedup_bound`` is ``>=`` where the contestant has runs counted at their budget (a lower bound), ``<=``
    where the reference has, ``?`` where both have."""
    from pal_bench.bench.stats import median_ci, ratio_ci

    ref = reference(runs.contestant)
    ref_t = time_to_target(runs[runs.contestant == ref]) if ref else pd.Series(dtype=float)
    ref_censored = ref is not None and not runs[runs.contestant == ref].reached.all()
    rows = []
    for name, g in runs.groupby("contestant", sort=False):
        t = time_to_target(g)
        med, lo, hi = median_ci(t)
        censored = not g.reached.all()
        row = {"contestant": name, "runs": len(g), "reached": int(g.reached.sum()),
               "median_wall_to_target_s": med, "wall_low_s": lo, "wall_high_s": hi,
               "median_setup_s": float(g.setup_s.median()),
               "median_steps_to_target": float(g.steps_to_target[g.reached].median()) if g.reached.any() else np.nan,
               "best_return": float(g.best_return.max())}
        row["speedup"], row["speedup_low"], row["speedup_high"] = (
            ratio_ci(t, ref_t) if ref is not None and name != ref else (np.nan, np.nan, np.nan))
        row["speedup_bound"] = {(True, False): ">=", (False, True): "<=", (True, True): "?"}.get(
            (censored, ref_censored), "") if np.isfinite(row["speedup"]) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def return_bands(curves: pd.DataFrame, points: int = 400) -> pd.DataFrame:
    """Greedy return against wall-clock time per contestant, over seeds: on a common time grid (``points``,
    log-spaced from the first evaluation to the last), each seed holds its latest evaluation (a run that stopped at
    the target holds its last one, up to the contestant's longest run); median, min and max over the seeds that
    have evaluated by then. Columns: contestant, wall_s, median, low, high, seeds."""
    grid = np.geomspace(float(curves.wall_s.min()), float(curves.wall_s.max()), points)
    out = []
    for name, g in curves.groupby("contestant", sort=False):
        held = []
        for _, run in g.groupby("seed"):
            run = run.sort_values("wall_s")
            i = np.searchsorted(run.wall_s.to_numpy(), grid, side="right") - 1
            held.append(np.where(i >= 0, run.mean_return.to_numpy()[np.maximum(i, 0)], np.nan))
        held = np.asarray(held)
        have = np.isfinite(held).sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)        # all-NaN columns before the first evaluation
            out.append(pd.DataFrame({"contestant": name, "wall_s": grid, "median": np.nanmedian(held, axis=0),
                                     "low": np.nanmin(held, axis=0), "high": np.nanmax(held, axis=0),
                                     "seeds": have})[(have > 0) & (grid <= g.wall_s.max())])
    return pd.concat(out, ignore_index=True)


def draw(curves: pd.DataFrame, task_name: str, task: Task, path: Path) -> Path:
    """Greedy return against wall-clock time: the median over seeds per contestant, its range shaded."""
    from pal_bench.bench.figures import save_figure
    from pal_bench.bench.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = dict(zip(CONTESTANTS, ("#d62728", "#ff7f0e", "#8c564b", "#1f77b4", "#9467bd", "#2ca02c")))
    for name, b in return_bands(curves).groupby("contestant", sort=False):
        seeds = curves[curves.contestant == name].seed.nunique()
        ax.plot(b.wall_s, b["median"], color=colors.get(name), label=f"{name} (median of {seeds})")
        ax.fill_between(b.wall_s, b.low, b.high, color=colors.get(name), alpha=0.15, lw=0)
    ax.axhline(task.target, color="k", ls="--", lw=1, label=f"target {task.target:g}")
    ax.set_xscale("log")
    ax.set_xlabel("wall-clock time (s, framework start-up included; log scale)")
    ax.set_ylabel(f"mean greedy return ({task.eval_episodes} episodes)")
    ax.set_title(f"DQN on {task.env}: time to target ({task_name}); shaded: range over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def launch(name: str, task_name: str, seed: int, split: tuple[int, int], log: Path) -> dict:
    """Run one contestant in its own process; its evaluations stream to stderr."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "pal_bench.studies.race", "--worker", name, "--task", task_name, "--seeds", "1",
           "--seed", str(seed), "--split", f"{split[0]}x{split[1]}", "--worker-out", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", RAY_DEDUP_LOGS="0")
    with open(log, "a") as lf:
        rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env).returncode
    try:
        if rc != 0:
            raise RuntimeError(f"{name} (seed {seed}) failed with exit code {rc}; see {log}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _split_arg(text: str) -> tuple[int, int]:
    """``AxL`` (e.g. 1x1): actors and learners, each >= 1."""
    try:
        a, learners = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ACTORSxLEARNERS such as 1x1, got {text!r}") from None
    if a < 1 or learners < 1:
        raise argparse.ArgumentTypeError(f"actors and learners must be >= 1, got {text!r}")
    return a, learners


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench race", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CartPole-v1, one seed (default: LunarLander-v3, 3 seeds)")
    ap.add_argument("--task", choices=sorted(TASKS), help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=positive_int, help="seeds per contestant (default: 1 quick, 3 full)")
    ap.add_argument("--only", nargs="+", choices=CONTESTANTS, help="run only these contestants")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--split", type=_split_arg,
                    help="PAL's actors x learners, e.g. 1x1 (default: the DSE choice from each backend's curves)")
    ap.add_argument("--report", action="store_true", help="only print the table and redraw the figure from stored CSVs")
    ap.add_argument("--max-minutes", type=positive_float, metavar="M",
                    help="stop after the run that is going when M minutes have passed (the stored runs stay; run "
                         "the same command to go on)")
    ap.add_argument("--rerun-noisy", action="store_true",
                    help="run again the stored runs during which the machine was busy (marked noisy)")
    add_force_flag(ap)
    ap.add_argument("--worker", choices=CONTESTANTS, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=rng_seed, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    task_name = args.task or ("quick" if args.quick else "full")
    task = TASKS[task_name]
    fixed = args.split

    def split_of(name: str) -> tuple[int, int]:
        return fixed or (dse_split(task, PAL_BACKENDS[name]) if name in PAL_BACKENDS else (1, 1))

    if args.report:
        return report(args.out, task_name)
    if args.worker:
        run = run_one(args.worker, task, args.seed, split_of(args.worker))
        args.worker_out.write_text(json.dumps(run))
        return 0
    if refuse_if_busy("pal-bench race", args.force):
        return 2
    seeds = args.seeds or (1 if task_name == "quick" else 3)
    names = args.only or list(CONTESTANTS)
    return run_race(task_name, names, seeds, split_of, args.out, args.max_minutes, args.rerun_noisy)


def run_key(task_name: str, name: str, split: tuple[int, int]) -> dict:
    """What a stored run must match to be reused: the task's settings, PAL's split, and the fields of PAL's
    preset (a changed preset, e.g. Ape-X's local buffer, runs its contestant again)."""
    from pal_bench.train.config import PRESETS

    key = {"task": task_name, "task_config": json.loads(json.dumps(dataclasses.asdict(TASKS[task_name]))),
           "split": f"{split[0]}+{split[1]}" if name in PAL_BACKENDS else ""}
    if name in PAL_PRESETS:
        key["preset"] = json.loads(json.dumps(PRESETS[PAL_PRESETS[name]]))
    return key


def stored_run(path: Path, key: dict) -> dict | None:
    """The run stored at ``path`` if it matches ``key`` (else None: it is run again)."""
    if not path.exists():
        return None
    try:
        run = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return run if all(run.get(k) == v for k, v in key.items()) else None


SETTLE_S = 300.0      # before each run: the longest wait for the previous run's load to fade


def run_race(task_name: str, names: list[str], seeds: int, split_of: Callable[[str], tuple[int, int]], out: Path,
             max_minutes: float | None = None, rerun_noisy: bool = False, settle_s: float = SETTLE_S) -> int:
    """Run every (contestant, seed) not stored yet, storing each as ``race[_task]_runs/<name>-s<seed>.json`` as
    soon as it ends (with the conditions it ran under); when all are stored, write the race's CSVs and
    draw its table and figure. ``max_minutes``: once that many minutes have passed, stop after the current
    run (each call runs at least one); ``rerun_noisy``: run again the stored runs during which the machine
    was busy. Before each run it waits (up to ``settle_s``) for the load average to fall back to half the cores,
    so that the previous run's own load does not mark the next one noisy; a machine still busy after that is
    busy with other work, and the run is marked."""
    task = TASKS[task_name]
    suffix = "" if task_name == "full" else f"_{task_name}"
    runs_dir = out / f"race{suffix}_runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = out / "race.log"
    todo = [(seed, name) for seed in range(seeds) for name in names]
    t_start, launched = time.monotonic(), 0
    stored: dict[tuple[int, str], dict] = {}
    for i, (seed, name) in enumerate(todo, 1):
        split = split_of(name)
        key = run_key(task_name, name, split)
        path = runs_dir / f"{name}-s{seed}.json"
        run = stored_run(path, key)
        if run is not None and not (rerun_noisy and run.get("noisy")):
            stored[seed, name] = run
            print(f"[{i}/{len(todo)}] {name} seed {seed}: stored ({path.name}"
                  + (", noisy" if run.get("noisy") else "") + ")", file=sys.stderr, flush=True)
            continue
        if launched and max_minutes is not None and time.monotonic() - t_start > 60 * max_minutes:
            print(f"pal-bench race: stopped after {max_minutes:g} minutes with {len(stored)} of {len(todo)} runs "
                  f"stored in {runs_dir}; run the same command again to go on", file=sys.stderr)
            return 0
        settle(settle_s, progress=lambda m, i=i: print(f"[{i}/{len(todo)}] {m}", file=sys.stderr, flush=True))
        where = f", split {split[0]}+{split[1]}" if name in PAL_BACKENDS else ""
        print(f"[{i}/{len(todo)}] {name} seed {seed} on {task.env} (target {task.target:g}, budget "
              f"{task.max_steps} steps / {task.max_wall_s:.0f} s){where}", file=sys.stderr, flush=True)
        measured = Conditions(f"race ({task_name}): {name} seed {seed}")
        run = launch(name, task_name, seed, split, log)
        launched += 1
        conditions = measured.finish()
        run |= key | {"noisy": measured.noisy(), "conditions": conditions}
        atomic_write_text(path, json.dumps(run))
        stored[seed, name] = run
        row = summarise(run, task)
        verdict = (f"target at {row['wall_to_target_s']:.1f} s, {row['steps_to_target']} steps"
                   if row["reached"] else f"not reached (best {row['best_return']})")
        print(f"[{i}/{len(todo)}] {name} seed {seed}: {verdict}" + (" (noisy: the machine was busy; "
              "--rerun-noisy runs it again)" if run["noisy"] else ""), file=sys.stderr, flush=True)
    runs = [stored[k] for k in todo]
    runs_df = pd.DataFrame([summarise(r, task) for r in runs])
    curves_df = pd.DataFrame([{"contestant": r["contestant"], "seed": r["seed"], **e}
                              for r in runs for e in r["curve"]])
    runs_df.to_csv(out / f"race{suffix}.csv", index=False, float_format="%.2f")
    curves_df.to_csv(out / f"race{suffix}_curves.csv", index=False, float_format="%.3f")
    write_meta(out / f"race{suffix}.csv", combined_conditions([r["conditions"] for r in runs]))
    return report(out, task_name)


def combined_conditions(parts: list[dict]) -> dict:
    """The conditions of a race stored in pieces: first start, last finish, the highest loads, noisy if any
    run was, every commit that ran one."""
    meta = dict(parts[0])
    meta["what"] = meta["what"].split(":")[0]
    meta["started"] = min(p["started"] for p in parts)
    meta["finished"] = max(p["finished"] or "" for p in parts) or None
    for k in ("load_before", "load_after"):
        meta[k] = max(p[k] for p in parts if p.get(k) is not None)
    meta["noisy"] = any(p.get("noisy") for p in parts)
    meta["commit"] = ", ".join(sorted({str(p.get("commit")) for p in parts}))
    meta["runs"] = len(parts)
    return meta


def report(out: Path, task_name: str) -> int:
    """Print the table (``pal_bench.bench.tables``) and redraw the figure from the stored ``race[_quick].csv`` /
    ``_curves.csv``."""
    from pal_bench.bench.tables import race_block

    task = TASKS[task_name]
    suffix = "" if task_name == "full" else f"_{task_name}"
    if not (out / f"race{suffix}_curves.csv").exists():
        raise FileNotFoundError(f"--report: no stored race in {out} (race{suffix}_curves.csv); run the race first")
    curves_df = pd.read_csv(out / f"race{suffix}_curves.csv")
    print(race_block(out, f"race{suffix}.csv"))
    print(f"figure: {draw(curves_df, task_name, task, out / 'figures' / f'race{suffix}.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
