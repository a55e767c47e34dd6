"""The race's clock, evaluation and stop rule, shared by every contestant's training loop.

Times (seconds) a run records:

- ``setup_s``: from before the contestant is built to its first env step (imports excluded, framework start-up
  included);
- ``train_s``: training time, evaluation excluded: every contestant's training stands still while it is evaluated
  (the framework loops are sequential; PAL's driver pauses its workers), and the evaluation's seconds are kept
  apart as ``eval_s``;
- ``wall_s``: ``setup_s + train_s + eval_s``.

The wall-clock budget (``Task.max_wall_s``) counts training time. A speed round (``mode="speed"``) evaluates
nothing and stops ``Task.speed_span`` env steps after learning starts, timing that span alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from pal_bench.studies.race.task import Task


def greedy_return(act: Callable[[np.ndarray], int], env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` greedy episodes acting with ``act(obs) -> action``, on env seeds fixed by
    ``seed`` (the same for every contestant)."""
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
    """Evaluation schedule, curve, stop rule and timing of one run (``mode`` "race" or "speed")."""

    def __init__(self, task: Task, seed: int, mode: str = "race", now: Callable[[], float] = time.perf_counter,
                 quiet: bool = False):
        if mode not in ("race", "speed"):
            raise ValueError(f"mode must be 'race' or 'speed', got {mode!r}")
        self.task, self.seed, self.mode, self.now, self.quiet = task, seed, mode, now, quiet
        self.t0 = now()
        self.t_train0: float | None = None
        self.setup_s: float | None = None
        self.eval_s = 0.0
        self.next_eval = task.eval_interval
        self.curve: list[dict] = []
        self.span: dict = {}             # speed mode: steps and training seconds at the span's start and end
        self.phase_seconds: dict = {}    # PAL's trainer: worker -> phase -> s

    def started(self) -> None:
        """The contestant is built: its training clock starts."""
        t = self.now()
        self.setup_s, self.t_train0 = t - self.t0, t

    def train_s(self) -> float:
        """Training seconds so far (evaluation excluded)."""
        return 0.0 if self.t_train0 is None else self.now() - self.t_train0 - self.eval_s

    def tick(self, steps: int, act: Callable[[np.ndarray], int]) -> bool:
        """Called by a contestant's loop after each chunk of env steps (``steps`` so far): evaluates when due
        (timed apart) and returns True when the run must stop (target reached, budget spent, or the speed span
        done)."""
        if self.mode == "speed":
            return self.speed_tick(steps)
        if steps >= self.next_eval:
            while self.next_eval <= steps:
                self.next_eval += self.task.eval_interval
            self.evaluate(steps, act)
        return self.done(steps)

    def evaluate(self, steps: int, act: Callable[[np.ndarray], int]) -> float:
        """One evaluation at ``steps``, its seconds kept out of the training clock; appended to the curve."""
        t_train = self.train_s()
        t = self.now()
        ret = greedy_return(act, self.task.env, self.task.eval_episodes, self.seed)
        took = self.now() - t
        self.record(steps, t_train, took, ret)
        return ret

    def record(self, steps: int, train_s: float, eval_took_s: float, ret: float) -> None:
        """Add an evaluation (done elsewhere, e.g. by PAL's driver) to the curve: at ``steps`` env steps after
        ``train_s`` training seconds, taking ``eval_took_s``."""
        self.curve.append({"env_steps": int(steps), "train_s": round(train_s, 3),
                           "eval_s": round(self.eval_s, 3),          # evaluation seconds before this one
                           "setup_s": round(self.setup_s or 0.0, 3), "mean_return": ret})
        self.eval_s += eval_took_s
        if not self.quiet:
            print(f"  {steps:>8} steps {train_s:7.1f} s training  return {ret:8.1f}", file=sys.stderr, flush=True)

    def reached(self) -> bool:
        return bool(self.curve) and self.curve[-1]["mean_return"] >= self.task.target

    def done(self, steps: int) -> bool:
        return self.reached() or steps >= self.task.max_steps or self.train_s() >= self.task.max_wall_s

    def speed_tick(self, steps: int) -> bool:
        """Speed mode: mark the span's start (the first tick at or past learning start) and its end."""
        if "start_steps" not in self.span and steps >= self.task.learning_starts:
            self.span |= {"start_steps": int(steps), "start_s": self.train_s()}
        if "start_steps" in self.span and steps >= self.span["start_steps"] + self.task.speed_span:
            self.span |= {"end_steps": int(steps), "end_s": self.train_s()}
            return True
        return steps >= self.task.max_steps

    def speed(self) -> float:
        """Env steps per training second over the speed span (NaN if it was not completed)."""
        if "end_s" not in self.span:
            return float("nan")
        return (self.span["end_steps"] - self.span["start_steps"]) / max(self.span["end_s"] - self.span["start_s"],
                                                                          1e-9)
