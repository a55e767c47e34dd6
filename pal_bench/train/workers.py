"""The actor and learner loops (one thread each) and the n-step transition builder.

Both loops read weights from the parameter server's latest immutable snapshot (a reference read,
no lock), keep their own copy of the networks, and stop when the rate controller says the budget
is spent or when the shared stop event is set.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import numpy as np
import torch

from pal_bench.train.actor import actor_loop
from pal_bench.train.learner import learner_loop
from pal_bench.train.losses import param_groups
from pal_bench.train.sequences import SequenceBuilder, stack
from pal_bench.train.supervision import actor_rng, env_seeds

ROW_FIELDS = ("obs", "act", "rew", "next_obs", "done", "disc")


class NStep:
    """Per-env n-step accumulator: emits (obs, act, R, next_obs, done, disc) with
    R = sum_k gamma^k r_k over up to n steps, disc = gamma^steps, done = terminated inside the window."""

    def __init__(self, n: int, gamma: float):
        self.n, self.gamma = n, gamma
        self.window: deque = deque()

    def push(self, obs, act, rew: float, next_obs, terminated: bool, truncated: bool) -> list[tuple]:
        self.window.append((obs, act, rew))
        out = []
        if terminated or truncated:
            while self.window:
                out.append(self._emit(next_obs, terminated))
                self.window.popleft()
        elif len(self.window) == self.n:
            out.append(self._emit(next_obs, False))
            self.window.popleft()
        return out

    def flush(self, next_obs) -> list[tuple]:
        """At the end of a run: emit what is pending as shorter windows that bootstrap from ``next_obs``."""
        out = []
        while self.window:
            out.append(self._emit(next_obs, False))
            self.window.popleft()
        return out

    def _emit(self, next_obs, done: bool) -> tuple:
        ret, disc = 0.0, 1.0
        for _, _, r in self.window:
            ret += disc * r
            disc *= self.gamma
        obs, act, _ = self.window[0]
        return obs, act, ret, next_obs, done, disc


def pin(core: int | None) -> None:
    """Pin the calling thread to ``core`` (Linux: pid 0 is the calling thread)."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[core % len(cores)]})


class PhaseTimer:
    """Accumulated seconds per phase of one worker (always on; a perf_counter pair per phase)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._t
        self._t = now

    def add(self, seconds: dict[str, float]) -> None:
        """Add another timer's per-phase seconds (a worker's other process or incarnation)."""
        for phase, s in seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + s


class EnvStepper:
    """One actor's ``envs_per_actor`` environments stepped as a batch, for every backend: acting
    (uniform random actions for the continuous algorithms until ``learning_starts``), an n-step
    window per environment, and episode returns. ``policy`` supplies ``explore(t, actor)``,
    ``env_actions(actions)`` and ``act_dim`` (the thread trainer, or a worker's ``RunCore``)."""

    def __init__(self, envs, seeds: list[int], cfg, algo, policy, actor: int = 0):
        self.envs, self.cfg, self.algo, self.policy, self.actor = envs, cfg, algo, policy, actor
        self.obs, _ = envs.reset(seed=seeds)
        E = cfg.envs_per_actor
        self.builders = [NStep(cfg.n_step, cfg.gamma) for _ in range(E)]
        self.ep_ret, self.ep_len = np.zeros(E), np.zeros(E, dtype=np.int64)

    def step(self, nets, t: int, rng, timer: PhaseTimer) -> tuple[list[tuple], list[tuple[float, int]]]:
        """One step of every environment at global step ``t``; returns the n-step rows completed
        and the episodes finished, as (return, length)."""
        E = self.cfg.envs_per_actor
        if self.algo.CONTINUOUS and t <= self.cfg.learning_starts:
            actions = rng.uniform(-1, 1, (E, self.policy.act_dim)).astype(np.float32)
        else:
            actions = self.algo.act(nets, self.obs, self.policy.explore(t, self.actor), rng)
        timer.lap("inference")
        next_obs, rew, term, trunc, info = self.envs.step(self.policy.env_actions(actions))
        timer.lap("env_step")
        real_next = next_obs.copy()
        ended = np.flatnonzero(term | trunc)
        if "final_obs" in info:
            for i in ended:
                real_next[i] = info["final_obs"][i]
        rows = []
        for i in range(E):
            rows += self.builders[i].push(self.obs[i], actions[i], float(rew[i]), real_next[i], bool(term[i]),
                                          bool(trunc[i]))
        return rows, self._advance(rew, ended, next_obs)

    def _advance(self, rew: np.ndarray, ended: np.ndarray, next_obs: np.ndarray) -> list[tuple[float, int]]:
        """Count the step into the running episodes; the ones that ``ended`` as (return, length)."""
        self.ep_ret += rew
        self.ep_len += 1
        episodes = [(float(self.ep_ret[i]), int(self.ep_len[i])) for i in ended]
        self.ep_ret[ended], self.ep_len[ended] = 0.0, 0
        self.obs = next_obs
        return episodes

    def flush(self) -> list[tuple]:
        """The pending n-step windows, bootstrapped from the last observations (the budget is spent)."""
        return [row for i, b in enumerate(self.builders) for row in b.flush(self.obs[i])]

    @staticmethod
    def batch(rows: list[tuple]) -> dict:
        """Rows as ``add_batch`` fields: each of ``ROW_FIELDS`` stacked to [len(rows), ...]."""
        return {k: np.stack([r[j] for r in rows]) for j, k in enumerate(ROW_FIELDS)}


class SequenceStepper(EnvStepper):
    """R2D2's actor side of ``EnvStepper``: the same interface, but each environment carries its LSTM state
    from step to step (zeroed when its episode ends) and its steps are cut into overlapping sequences
    (``SequenceBuilder``) that store the state at their first step. ``step`` returns finished sequences."""

    def __init__(self, envs, seeds: list[int], cfg, algo, policy, actor: int = 0):
        super().__init__(envs, seeds, cfg, algo, policy, actor)
        self.builders = [SequenceBuilder(cfg.seq_len, cfg.seq_overlap) for _ in range(cfg.envs_per_actor)]
        self.state = None                       # (h, c), each (1, E, lstm); made with the first networks seen

    def step(self, nets, t: int, rng, timer: PhaseTimer) -> tuple[list[dict], list[tuple[float, int]]]:
        E = self.cfg.envs_per_actor
        if self.state is None:
            self.state = self.algo.initial_state(nets, E)
        before = self.state
        actions, self.state = self.algo.act(nets, self.obs, self.policy.explore(t, self.actor), rng, before)
        timer.lap("inference")
        next_obs, rew, term, trunc, info = self.envs.step(actions)
        timer.lap("env_step")
        ended = np.flatnonzero(term | trunc)
        final = info.get("final_obs")
        sequences = []
        h, c = before[0][0].numpy(), before[1][0].numpy()
        for i in range(E):
            last = final[i] if (term[i] or trunc[i]) and final is not None else next_obs[i]
            sequences += self.builders[i].push(self.obs[i], actions[i], float(rew[i]), bool(term[i]), bool(trunc[i]),
                                               last, (h[i], c[i]))
        if len(ended):
            self.state[0][0, ended] = 0.0
            self.state[1][0, ended] = 0.0
        return sequences, self._advance(rew, ended, next_obs)

    def flush(self) -> list[dict]:
        """The open sequences, cut where the budget ended (their last steps bootstrap from the current
        observation, as after a time limit)."""
        return [seq for i, b in enumerate(self.builders) for seq in b.flush(self.obs[i])]

    @staticmethod
    def batch(sequences: list[dict]) -> dict:
        """Sequences as ``add_batch`` fields, each [len(sequences), seq_len, ...] (``sequences.stack``)."""
        return stack(sequences)


def load_snapshot(nets, targets, snap) -> None:
    nets.load_state_dict(snap.online)
    if targets is not None:
        targets.load_state_dict(snap.target)


class ThreadStepGrant:
    """(thread backend) The driver's ``RateController`` as an actor's ``StepGrant``."""

    def __init__(self, rate, stop: threading.Event):
        self.rate, self.stop, self.spent = rate, stop, False

    def reserve(self, n: int, flush=None) -> int | None:
        held = flush is not None
        while (got := self.rate.acquire_steps(n, self.stop, held=held)) is None:
            flush()                              # paused: what the actor holds goes in first
            held = False
        if got:
            return self.rate.reserved
        self.spent = not self.stop.is_set()
        return None

    def inserted(self, steps: int) -> None:
        self.rate.steps_done(steps)

    def may_insert(self) -> bool:
        return True


class SnapshotWeights:
    """(thread backend) The parameter server's latest snapshot as an actor's ``WeightSource``."""

    def __init__(self, ps, nets, targets):
        self.ps, self.nets, self.targets = ps, nets, targets

    def pull(self, version: int) -> int:
        snap = self.ps.snapshot
        if snap.version != version:
            load_snapshot(self.nets, self.targets, snap)
        return snap.version


def actor_thread(tr, actor_id: int, stop: threading.Event) -> None:
    """(thread backend) One actor thread: its environments, networks and transports around ``actor_loop``."""
    cfg, algo = tr.cfg, tr.algo
    torch.set_num_threads(1)
    pin(actor_id if cfg.pin_cores else None)
    timer = tr.timers[f"actor{actor_id}"] = PhaseTimer()
    envs = tr.make_vector_env(actor_id)
    try:
        nets = algo.networks(tr.net_input, tr.action_space, cfg)
        targets = algo.networks(tr.net_input, tr.action_space, cfg) if cfg.actor_priorities else None
        E = cfg.envs_per_actor
        stepper = tr.make_stepper(envs, env_seeds(cfg.seed, actor_id, E, resumed_steps=tr.resumed_steps), actor_id)
        local = LocalBuffer(tr, tr.buffer, stepper, nets, targets, timer)
        timer.lap("setup")

        def on_episodes(episodes: list[tuple[float, int]]) -> None:
            for ret, length in episodes:
                tr.record_episode(ret, length)

        actor_loop(stepper, local, nets, ThreadStepGrant(tr.rate, stop), SnapshotWeights(tr.ps, nets, targets),
                   on_episodes, actor_rng(cfg.seed, actor_id, resumed_steps=tr.resumed_steps), timer, E, cfg.steps)
    finally:
        envs.close()


class LocalBuffer:
    """An actor's local buffer (Ape-X's, of ``cfg.local_buffer`` env steps): the stepper's finished items wait
    here and go to the replay buffer together, with one ``add_batch`` and one pass of actor-side priorities
    (when ``targets`` is given) instead of one per vector step. The thread and process backends' actors use it
    (Ray's send chunks of at least ``local_buffer``); the env steps it holds are counted as inserted only once
    sent (so the rate rule and a dead actor's lost transitions include them)."""

    def __init__(self, ctx, buffer, stepper, nets, targets, timer: PhaseTimer):
        self.ctx, self.buffer, self.stepper, self.nets, self.targets, self.timer = (
            ctx, buffer, stepper, nets, targets, timer)
        self.size = ctx.cfg.local_buffer
        self.items: list = []
        self.steps = 0                  # env steps behind the items held

    def put(self, items: list, steps: int, send: bool = False) -> int:
        """Hold ``items`` (finished by ``steps`` env steps); send everything once ``size`` env steps are held,
        or now with ``send``. Returns the env steps sent (0 while held)."""
        self.items += items
        self.steps += steps
        return self.send() if send or self.steps >= self.size else 0

    def send(self) -> int:
        """Insert every held item; returns the env steps they came from."""
        insert(self.ctx, self.buffer, self.stepper, self.items, self.nets, self.targets, self.timer)
        sent, self.items, self.steps = self.steps, [], 0
        return sent


def insert(ctx, buffer, stepper, items: list, nets, targets, timer: PhaseTimer) -> None:
    """Stack a stepper's finished items (``stepper.batch``) and insert them with one ``add_batch``, with
    Ape-X's actor-side priorities when ``targets`` is given (every backend's actors)."""
    if not items:
        return
    batch = stepper.batch(items)
    timer.lap("buffer_insert")                   # stacking the rows into columns is part of the insert
    if targets is not None:
        priorities = ctx.actor_priorities(nets, targets, batch)
        timer.lap("inference")
    else:
        priorities = None
    buffer.add_batch(priorities=priorities, **batch)
    timer.lap("buffer_insert")


class ThreadUpdateGrant:
    """(thread backend) The driver's ``RateController`` as a learner's ``UpdateGrant``."""

    wait_phase = "rate_wait"

    def __init__(self, tr, stop: threading.Event):
        self.tr, self.stop = tr, stop

    def acquire(self) -> int | None:
        if not self.tr.rate.acquire_update(self.stop, self.tr.actors_finished):
            return None
        return self.tr.next_update_index()

    def done(self) -> None:
        self.tr.rate.update_done()


class OwnWeights:
    """A sole learner that steps the parameter server's own networks: nothing to pull."""

    def pull(self, version: int) -> int:
        return version


class ApplyGradients:
    """(sole learner) Apply each gradient at once (``ParameterServer.apply``)."""

    phase = "apply"

    def __init__(self, ps):
        self.ps = ps

    def deliver(self, version: int, grads: dict) -> None:
        self.ps.apply(grads)


class SubmitGradients:
    """Submit each gradient to the parameter server: with ``sync`` aggregation wait until the version it was
    computed on is superseded, with ``async`` first wait until this learner's previous gradient was handled."""

    phase = "aggregation_wait"

    def __init__(self, ps, learner: int, aggregation: str, stop: threading.Event):
        self.ps, self.learner, self.aggregation, self.stop = ps, learner, aggregation, stop
        self.submitted = 0

    def deliver(self, version: int, grads: dict) -> None:
        if self.aggregation == "async":
            self.ps.wait_handled(self.learner, self.submitted, self.stop)
        self.ps.submit(self.learner, version, grads)
        self.submitted += 1
        if self.aggregation == "sync":
            self.ps.wait_version(version, self.stop)


def learner_thread(tr, learner_id: int, stop: threading.Event) -> None:
    """(thread backend) One learner thread around ``learner_loop``: a sole sync learner (``ps.direct``) computes
    on the server's networks and applies its gradients itself; otherwise a local copy of the networks pulls
    each new version and submits its gradients."""
    cfg, algo = tr.cfg, tr.algo
    torch.set_num_threads(1)
    pin(cfg.actors + learner_id if cfg.pin_cores else None)
    timer = tr.timers[f"learner{learner_id}"] = PhaseTimer()
    if tr.ps.direct:
        nets, targets, groups = tr.ps.nets, tr.ps.targets, tr.ps.params
        weights, sink = OwnWeights(), ApplyGradients(tr.ps)
    else:
        nets = algo.networks(tr.net_input, tr.action_space, cfg)
        targets = algo.networks(tr.net_input, tr.action_space, cfg)
        groups = param_groups(algo, nets)
        weights = SnapshotWeights(tr.ps, nets, targets)
        sink = SubmitGradients(tr.ps, learner_id, cfg.aggregation, stop)
    timer.lap("setup")
    try:
        learner_loop(tr.buffer, nets, targets, groups, ThreadUpdateGrant(tr, stop), weights, sink, algo, cfg,
                     tr.beta, tr.to_tensors, f"learner{learner_id}", timer)
    finally:
        tr.ps.learner_left()
