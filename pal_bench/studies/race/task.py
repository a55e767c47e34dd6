"""What a race is: the task (environment, target, budget, evaluation) and, per track, what each contestant trains.

- **matched** track: every contestant trains the same learner (``Matched``) on the same data rhythm; what each
  actually built and did (network size, updates per env step, torch threads, ...) is read back from the framework
  and checked against it (``check_matched``), before training and again after.
- **tuned** track: each framework at its authors' own settings for the task (each contestant module's ``TUNED``,
  with the example file it follows).

Stored runs carry ``settings_hash`` of their task and contestant settings: a stored run whose hash differs from the
code's is run again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass

TRACKS = ("matched", "tuned")


@dataclass(frozen=True)
class Task:
    """The environment, the target, the budget per run and the evaluation every contestant gets."""

    env: str
    target: float                  # mean greedy evaluation return that counts as solved
    max_steps: int                 # env-step budget per run
    max_wall_s: float              # training wall-clock budget per run (s, evaluation excluded)
    eval_interval: int             # env steps between evaluations
    eval_episodes: int             # greedy episodes per evaluation, on fixed seeds
    learning_starts: int           # env steps collected before the first update
    eps_decay_steps: int           # env steps over which epsilon decays linearly from 1 to its final value
    speed_span: int                # speed rounds: env steps timed after learning starts
    probe_env_steps: int = 40_000  # the speed probe before each run (probe.py): random env steps ...
    probe_updates: int = 2_000     # ... and matched-network updates (about 5 s on LunarLander here)


TASKS = {
    "full": Task(env="LunarLander-v3", target=200.0, max_steps=500_000, max_wall_s=1_200.0, eval_interval=10_000,
                 eval_episodes=10, learning_starts=10_000, eps_decay_steps=75_000, speed_span=20_000),
    "quick": Task(env="CartPole-v1", target=200.0, max_steps=50_000, max_wall_s=240.0, eval_interval=2_500,
                  eval_episodes=5, learning_starts=1_000, eps_decay_steps=10_000, speed_span=5_000),
    # seconds per contestant: for tests of the race itself, not a result
    "smoke": Task(env="CartPole-v1", target=500.0, max_steps=2_000, max_wall_s=120.0, eval_interval=1_000,
                  eval_episodes=2, learning_starts=500, eps_decay_steps=1_000, speed_span=500, probe_env_steps=500,
                  probe_updates=20),
}


# (observation size, number of actions) of each task's environment, for checks of stored runs without gymnasium
# (a test holds them to ``env_dims``)
ENV_DIMS = {"LunarLander-v3": (8, 4), "CartPole-v1": (4, 2)}


@functools.cache
def env_dims(env_id: str) -> tuple[int, int]:
    """(observation size, number of actions) of a discrete-action gymnasium environment."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    try:
        return int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    finally:
        env.close()


@dataclass(frozen=True)
class Matched:
    """The learner of the matched track: Double DQN, an MLP of ``hidden`` ReLU layers, Huber loss (delta 1) times
    the prioritized-replay importance weights, averaged over the batch; gradient norm clipped at ``grad_clip``; Adam;
    n-step returns; prioritized replay with a constant beta; a hard target copy every ``target_update`` updates;
    epsilon-greedy from 1 to ``eps_end`` over the task's ``eps_decay_steps``; one environment; exactly
    ``updates_per_step`` updates per env step once learning starts; one torch thread per process."""

    double_q: bool = True
    dueling: bool = False
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    loss: str = "huber(delta=1) x importance weights, batch mean"
    grad_clip: float = 10.0
    lr: float = 5e-4
    batch_size: int = 128
    gamma: float = 0.99
    n_step: int = 3
    buffer_capacity: int = 200_000
    alpha: float = 0.6
    beta: float = 0.4
    target_update: int = 250
    eps_end: float = 0.05
    n_envs: int = 1
    updates_per_step: float = 0.25
    torch_threads: int = 1

    def epsilon(self, env_step: int, decay_steps: int) -> float:
        """Epsilon at ``env_step``: 1 -> ``eps_end`` linearly over ``decay_steps`` env steps, then ``eps_end``."""
        return max(self.eps_end, 1.0 - (1.0 - self.eps_end) * env_step / decay_steps)

    def n_params(self, obs_dim: int, n_actions: int) -> int:
        """Parameters of the online Q-network: obs_dim -> hidden... -> n_actions, with biases (8-256-256-4:
        69,124)."""
        sizes = (obs_dim, *self.hidden, n_actions)
        return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


MATCHED = Matched()
UPDATES_TOLERANCE = 0.02           # a matched run's measured updates per env step may be off by this fraction


class SettingsMismatch(ValueError):
    """A matched contestant does not do the matched work (the message names what differs)."""


def check_matched(name: str, facts: dict, obs_dim: int, n_actions: int, measured: bool = False,
                  exact_types: bool = False) -> None:
    """Refuse a matched contestant whose ``facts`` (read back from what it built, or after the run, ``measured``:
    from its logs) differ from ``MATCHED``: parameter count, torch threads, environments, batch, n-step, target
    period, double Q, dueling, and (configured before, measured after) updates per env step within
    ``UPDATES_TOLERANCE``. ``exact_types`` (facts read back from a stored file): a value must also be of the matched
    value's type (``True`` is not 1, ``128.0`` is not 128; an int stands for a float)."""
    m = MATCHED
    want = {"n_params": m.n_params(obs_dim, n_actions), "torch_threads": m.torch_threads, "n_envs": m.n_envs,
            "batch_size": m.batch_size, "n_step": m.n_step, "target_update": m.target_update,
            "double_q": m.double_q, "dueling": m.dueling, "gamma": m.gamma, "lr": m.lr, "grad_clip": m.grad_clip,
            "buffer_capacity": m.buffer_capacity, "alpha": m.alpha, "beta": m.beta}
    def same(got, v) -> bool:
        if not exact_types:
            return got == v
        kind = (float, int) if type(v) is float else (type(v),)
        return type(got) in kind and got == v

    bad = [f"{k} = {facts.get(k)!r} (matched: {v!r})" for k, v in want.items() if not same(facts.get(k), v)]
    ups = facts.get("updates_per_step")
    if ups is None or abs(ups - m.updates_per_step) > UPDATES_TOLERANCE * m.updates_per_step:
        bad.append(f"updates_per_step = {ups!r} (matched: {m.updates_per_step}, within "
                   f"{UPDATES_TOLERANCE:.0%}{', measured from its logs' if measured else ''})")
    if bad:
        raise SettingsMismatch(f"{name} does not do the matched work: " + "; ".join(bad))


FIRST_UPDATE_SLACK = 64            # env steps: the first update may come this much after learning starts (an actor
#                                    runs ahead by the rate rule's slack, RLlib samples a fragment at a time)
TARGET_COPY_SLACK = 1              # target copies: within one of (optimizer steps / target period)
EPS_SEEN_EVERY = 1_000             # (counters.EPS_SEEN_EVERY: epsilon is recorded once per this many env steps)
EPS_TOLERANCE = 0.02               # epsilon seen may differ by this much from the matched schedule (RLlib reads its
#                                    steps once per train() call: a staircase, 0.013 above the line on LunarLander)


def check_counted(name: str, counted: dict, task: Task, learning_starts: int) -> None:
    """Refuse a matched run whose run-time counts (``counters.RunCounters.as_dict``: from hooks on the framework's
    optimizer, target network, loss input and exploration) differ from ``MATCHED``: updates per env step after
    ``learning_starts`` (optimizer steps counted), the batch the loss saw, target copies per optimizer step, the env
    step of the first update, and epsilon at every env step it was seen."""
    import math

    m, bad = MATCHED, []
    ups = counted.get("updates_per_env_step")
    if not isinstance(ups, (int, float)) or not math.isfinite(ups) or \
            abs(ups - m.updates_per_step) > UPDATES_TOLERANCE * m.updates_per_step:
        bad.append(f"counted updates per env step {ups!r} (matched: {m.updates_per_step}, within "
                   f"{UPDATES_TOLERANCE:.0%})")
    sizes = counted.get("batch_sizes") or {}
    if counted.get("batch_size") != m.batch_size or set(sizes) != {str(m.batch_size)}:
        bad.append(f"the loss saw batches of {sizes!r} rows (matched: {m.batch_size}, every one)")
    steps, copies = counted.get("optimizer_steps") or 0, counted.get("target_copies")
    if copies is None or abs(copies - steps / m.target_update) > TARGET_COPY_SLACK + 1e-9:
        bad.append(f"{copies!r} target copies in {steps} optimizer steps (matched: one every {m.target_update})")
    first = counted.get("first_update_env_step")
    if steps and (first is None or not learning_starts <= first <= learning_starts + FIRST_UPDATE_SLACK):
        bad.append(f"first update at env step {first!r} (matched: {learning_starts}, at most "
                   f"{FIRST_UPDATE_SLACK} later)")
    seen = counted.get("eps_seen") or []
    off = [(t, e) for t, e in seen if not (isinstance(e, (int, float)) and math.isfinite(e))
           or abs(e - m.epsilon(t, task.eps_decay_steps)) > EPS_TOLERANCE]
    # epsilon must have been seen along the whole decay the run went through (one look per 1,000 env steps)
    reach = min(task.eps_decay_steps, counted.get("env_steps") or 0) - 2 * EPS_SEEN_EVERY
    if off:
        t, e = off[0]
        bad.append(f"epsilon {e!r} at env step {t!r} (matched: {m.epsilon(t, task.eps_decay_steps):.3f})")
    elif not seen or max(t for t, _ in seen) < reach:
        bad.append(f"epsilon was seen only up to env step {max((t for t, _ in seen), default=None)!r} (the run went "
                   f"through its decay to {reach + 2 * EPS_SEEN_EVERY})")
    if bad:
        raise SettingsMismatch(f"{name} did not do the matched work, as counted while it ran: " + "; ".join(bad))


def settings_hash(*parts) -> str:
    """A short hash of JSON-able settings: what a stored run must still match to be reused."""
    def plain(x):
        return dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x
    text = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def suffix(task_name: str) -> str:
    """The file-name suffix of a task's results: '' for the full race, '_quick' for --quick."""
    return "" if task_name == "full" else f"_{task_name}"
