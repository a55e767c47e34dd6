"""What a contestant did, counted at run time from its framework's own objects, never from its configuration.

A contestant attaches a ``RunCounters`` to the objects it built (``Contestant.attach``): a step hook on the torch
optimizer that trains the online Q-network (``torch.optim.Optimizer.register_step_post_hook``), the target
network's weights (a copy is seen as a change of them between two optimizer steps), the framework's own env-step
counter, the call that writes the loss's TD errors back as priorities (its length: the batch the loss saw) and the
exploration the framework uses (epsilon read from its objects at the env steps it is seen at). ``as_dict()`` is
stored in each run (``counters``) and ``task.check_counted`` compares it with the matched settings.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from pal_bench.studies.race.task import EPS_SEEN_EVERY  # epsilon is recorded at most once per this many env steps


class RunCounters:
    """Counters of one run, fed by hooks on the framework's objects (thread-safe: PAL's learner is a thread).

    - ``optimizer_steps``: steps of the online network's optimizer;
    - ``first_update_env_step``: the framework's env-step count at its first optimizer step;
    - ``target_copies``: changes of the target network's weights, checked after every optimizer step and at the end;
    - ``batch_sizes``: {rows: how many priority updates had that many} (the TD errors the loss produced);
    - ``eps_seen``: [[env step, epsilon], ...] as the framework's exploration had it.
    """

    def __init__(self, env_steps: Callable[[], int] | None = None):
        self.env_steps = env_steps
        self.optimizer_steps = 0
        self.first_update_env_step: int | None = None
        self.target_copies = 0
        self.batch_sizes: Counter[int] = Counter()
        self.eps_seen: list[list[float]] = []
        self._target: list | None = None
        self._last: list | None = None
        self._lock = threading.Lock()
        self._handles: list = []

    # ------------------------------------------------------------------ hooks

    def watch_optimizer(self, optimizer) -> None:
        """Count ``optimizer``'s steps (a step post-hook; removed by ``detach``)."""
        self._handles.append(optimizer.register_step_post_hook(lambda opt, args, kwargs: self.stepped()))

    def watch_loss_rows(self, module) -> None:
        """Count the rows of every forward of the online Q-network ``module`` made with gradients on: the batch the
        loss is computed on (the frameworks evaluate the next observations and the target network without
        gradients)."""
        import torch

        def pre(mod, args, kwargs):
            if torch.is_grad_enabled():
                x = args[0] if args else next(iter(kwargs.values()))
                rows = _rows(x)
                if rows is not None:
                    self.priorities(rows)

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

    def watch_target(self, parameters) -> None:
        """Watch the target network's weights (an iterable of tensors): every change between two checks is a copy."""
        self._target = [p for p in parameters]
        self._last = self._fingerprint()

    def _fingerprint(self) -> list:
        import torch

        with torch.no_grad():
            return [p.detach().flatten()[:256].clone() for p in self._target]

    def _check_target(self) -> None:
        if self._target is None:
            return
        import torch

        now = self._fingerprint()
        if any(not torch.equal(a, b) for a, b in zip(now, self._last)):
            self.target_copies += 1
            self._last = now

    def stepped(self, env_steps: int | None = None) -> None:
        """One optimizer step (``env_steps``: the framework's env-step count at it, where the hook gets it)."""
        with self._lock:
            self.optimizer_steps += 1
            if self.first_update_env_step is None:
                at = env_steps if env_steps is not None else self.env_steps() if self.env_steps else None
                self.first_update_env_step = None if at is None else int(at)
            self._check_target()

    def saw_env_steps(self, env_steps: int) -> None:
        """The framework told its env-step count (e.g. RLlib passes it to its learner after each update): the first
        update's, if no other source gave it."""
        with self._lock:
            if self.first_update_env_step is None and self.optimizer_steps:
                self.first_update_env_step = int(env_steps)

    def priorities(self, n: int) -> None:
        """A loss computed on ``n`` rows (its TD errors, written back as priorities)."""
        with self._lock:
            self.batch_sizes[int(n)] += 1

    def epsilon(self, env_step: int, eps: float) -> None:
        """The framework's epsilon at ``env_step`` (kept at most once per ``EPS_SEEN_EVERY`` env steps)."""
        with self._lock:
            if not self.eps_seen or env_step - self.eps_seen[-1][0] >= EPS_SEEN_EVERY:
                self.eps_seen.append([int(env_step), float(eps)])

    def detach(self) -> None:
        """Remove the hooks (the last target check first)."""
        with self._lock:
            self._check_target()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def as_dict(self, env_steps: int, learning_starts: int) -> dict:
        """The counts, with ``updates_per_env_step`` over the env steps after ``learning_starts`` and the batch size
        most priority updates had."""
        learning = max(1, env_steps - learning_starts)
        batch = self.batch_sizes.most_common(1)[0][0] if self.batch_sizes else None
        return {"env_steps": int(env_steps), "optimizer_steps": self.optimizer_steps,
                "target_copies": self.target_copies,
                "first_update_env_step": self.first_update_env_step, "batch_size": batch,
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "updates_per_env_step": round(self.optimizer_steps / learning, 5),
                "eps_seen": self.eps_seen}


def _rows(x) -> int | None:
    """The leading dimension of a network's input: a tensor, or a mapping / tianshou Batch holding one."""
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    for key in ("obs", "observation"):
        try:
            v = x[key]
        except (KeyError, TypeError, IndexError, AttributeError):
            continue
        if getattr(v, "shape", None) is not None and len(v.shape):
            return int(v.shape[0])
    return None
