"""The speed probe every race run records just before it: a fixed piece of work that depends on the machine only,
so that wall times from different sittings are compared only when the machine was as fast.

The probe: ``Task.probe_env_steps`` random steps of the task's environment (40,000), then ``Task.probe_updates`` (2,000)
Double DQN updates
of the matched network on random batches of 128 (Adam, Huber loss, one torch thread). ``probe_s`` is their
seconds. A run whose probe is more than ``PROBE_TOLERANCE`` slower or faster than the median probe of the stored
race is flagged (``--rerun-slow`` runs it again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pal_bench.studies.race.task import MATCHED, Task

PROBE_TOLERANCE = 0.10


def speed_probe(task: Task, seed: int = 0, env_steps: int | None = None, updates: int | None = None,
                now: Callable[[], float] = time.perf_counter) -> dict:
    """Time the probe in this process: ``{"probe_s", "probe_env_s", "probe_update_s"}`` (seconds); by default the
    task's ``probe_env_steps`` and ``probe_updates``."""
    env_steps = task.probe_env_steps if env_steps is None else env_steps
    updates = task.probe_updates if updates is None else updates
    import gymnasium as gym
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(MATCHED.torch_threads)
    env = gym.make(task.env)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    t0 = now()
    for _ in range(env_steps):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    t1 = now()
    obs_dim, n_act = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    sizes = (obs_dim, *MATCHED.hidden, n_act)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    q = torch.nn.Sequential(*layers[:-1])
    target = torch.nn.Sequential(*[type(m)(m.in_features, m.out_features) if isinstance(m, torch.nn.Linear) else m
                                   for m in q])
    opt = torch.optim.Adam(q.parameters(), lr=MATCHED.lr)
    B = MATCHED.batch_size
    batch = {k: torch.as_tensor(v) for k, v in {
        "obs": rng.standard_normal((B, obs_dim), dtype=np.float32),
        "next_obs": rng.standard_normal((B, obs_dim), dtype=np.float32),
        "act": rng.integers(0, n_act, B), "rew": rng.standard_normal(B, dtype=np.float32),
        "w": rng.random(B, dtype=np.float32)}.items()}
    t2 = now()
    for _ in range(updates):
        with torch.no_grad():
            a2 = q(batch["next_obs"]).argmax(1, keepdim=True)
            y = batch["rew"] + MATCHED.gamma * target(batch["next_obs"]).gather(1, a2).squeeze(1)
        qa = q(batch["obs"]).gather(1, batch["act"][:, None]).squeeze(1)
        loss = (batch["w"] * F.smooth_l1_loss(qa, y, reduction="none")).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(q.parameters(), MATCHED.grad_clip)
        opt.step()
    t3 = now()
    return {"probe_s": round((t1 - t0) + (t3 - t2), 3), "probe_env_s": round(t1 - t0, 3),
            "probe_update_s": round(t3 - t2, 3)}


def probe_outliers(probes: dict, tolerance: float = PROBE_TOLERANCE) -> dict:
    """``{run key: probe_s / median}`` for the runs whose probe is more than ``tolerance`` off the median of all of
    ``probes`` (``{run key: probe_s}``)."""
    if not probes:
        return {}
    med = float(np.median(list(probes.values())))
    return {k: round(v / med, 3) for k, v in probes.items() if abs(v / med - 1) > tolerance}


def probe_spread(probes) -> tuple[float, float, float]:
    """(median, min / median, max / median) of probe seconds."""
    v = np.asarray(list(probes), dtype=float)
    med = float(np.median(v))
    return med, float(v.min() / med), float(v.max() / med)
