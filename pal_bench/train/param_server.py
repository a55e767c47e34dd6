"""The parameter server: aggregates learners' gradients, applies the optimizers, owns the target
networks and publishes immutable, versioned weight snapshots (readers swap a reference, no lock).

``sync``: one gradient from every active learner per version, averaged, then one step (a learner
that has finished leaves the round, so the last, partial round is still applied). ``async``: every
gradient is applied as it arrives unless it was computed on weights more than ``max_staleness``
versions old (then it is dropped and counted).

One learner with ``sync`` aggregation (``direct``): its gradient is the whole round, so the learner applies it
in its own thread (``apply``: the same step, with no hand-off to the server's thread and no wait for the new
version; the server's thread is not needed). Measured on DQN CartPole-v1 with the process backend (1 actor
process + 1 learner thread, 2-core AMD EPYC): the hand-off and wait took 43% of the learner's time.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch

from pal_bench.train.errors import Diverged
from pal_bench.train.losses import param_groups


@dataclass(frozen=True)
class Snapshot:
    version: int
    online: dict       # state_dict of the online networks (tensors owned by the snapshot)
    target: dict


def _clone(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The joint L2 norm of ``grads``, as ``clip_grad_norm`` computes it (mixed devices or dtypes: per tensor)."""
    if any(g.device != grads[0].device or g.dtype != grads[0].dtype for g in grads):
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).double().cpu() for g in grads]))
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor | None = None) -> None:
    """Scale the gradients of ``params`` in place so that their joint L2 norm is at most ``max_norm``: the same
    bits as ``torch.nn.utils.clip_grad_norm_`` (tested), without its per-call grouping by device and dtype
    (about 45 instead of 100 µs for DQN's six CPU tensors). Mixed devices or dtypes go to torch's. ``norm``: the
    gradients' ``grad_norm`` when the caller has it already."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if any(g.device != grads[0].device or g.dtype != grads[0].dtype for g in grads):
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    if norm is None:
        norm = grad_norm(grads)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))


class ParameterServer:
    def __init__(self, algo, nets: torch.nn.ModuleDict, targets: torch.nn.ModuleDict, cfg, n_learners: int):
        self.algo, self.nets, self.targets, self.cfg = algo, nets, targets, cfg
        self.n_learners = n_learners
        self.params = param_groups(algo, nets)
        # fused: one kernel over every tensor of the group (on CPU about half the time of the per-tensor loop)
        self.optimizers = {g: torch.optim.Adam(ps, lr=cfg.critic_lr if g == "critic" else cfg.lr, fused=True)
                           for g, ps in self.params.items()}
        self.inbox: queue.Queue = queue.Queue()
        self.version = 0
        self.snapshot = Snapshot(0, _clone(nets.state_dict()), _clone(targets.state_dict()))
        self.dropped_stale = 0
        self.applied = 0
        self.active = n_learners
        self.changed = threading.Condition()
        self.handled = [0] * n_learners     # gradients of each learner applied or dropped
        self.times = {"aggregate_s": 0.0, "publish_s": 0.0}

    @property
    def direct(self) -> bool:
        """Whether the sole learner applies its own gradients (``apply``) instead of submitting them."""
        return self.n_learners == 1 and self.cfg.aggregation == "sync"

    def apply(self, grads: dict) -> None:
        """(``direct`` only) Apply the sole learner's gradient now, in the caller's thread: the sync round of
        one that ``serve`` would run, published before this returns. It takes ``grads`` over: clipping may scale
        them in place."""
        if not self.direct:
            raise RuntimeError("apply() is for one learner with sync aggregation; submit() otherwise")
        self._step([grads], [0])
        self._handled(0)

    def submit(self, learner: int, base_version: int, grads: dict) -> None:
        """``grads``: group -> list of tensors aligned with ``self.params[group]``."""
        self.inbox.put((learner, base_version, grads))

    def serve(self, stop: threading.Event) -> None:
        pending: dict[int, tuple[int, dict]] = {}
        while not stop.is_set():
            try:
                learner, base, grads = self.inbox.get(timeout=0.05)
            except queue.Empty:
                if pending and len(pending) >= self.active:   # learners left: apply the partial round
                    self._step([g for _, g in pending.values()], list(pending))
                    for lid in pending:
                        self._handled(lid)
                    pending.clear()
                continue
            if self.cfg.aggregation == "async":
                if self.version - base > self.cfg.max_staleness:
                    self.dropped_stale += 1
                else:
                    self._step([grads], [learner])
                self._handled(learner)
            else:
                pending[learner] = (base, grads)
                if len(pending) >= self.active:
                    self._step([g for _, g in pending.values()], list(pending))
                    for lid in pending:
                        self._handled(lid)
                    pending.clear()

    def _step(self, grad_list: list[dict], learners: list[int] | None = None) -> None:
        """Average ``grad_list`` per group and step the optimizers; ``Diverged`` (naming the group, the step and
        ``learners``, the learners the gradients came from) before any weight changes when a group's gradient is
        not finite: its norm, which clipping needs anyway, is checked once per group."""
        t0 = time.perf_counter()
        groups = [g for g in self.params if any(g in d for d in grad_list)]
        norms = {}
        for group in groups:
            contributions = [g[group] for g in grad_list if group in g]
            for i, p in enumerate(self.params[group]):
                p.grad = (contributions[0][i] if len(contributions) == 1
                          else torch.stack([c[i] for c in contributions]).mean(0))
            grads = [p.grad for p in self.params[group] if p.grad is not None]
            norms[group] = norm = grad_norm(grads) if grads else None
            if norm is not None and not bool(torch.isfinite(norm)):
                for o in self.optimizers.values():
                    o.zero_grad(set_to_none=True)
                who = ("learner" + ", learner".join(map(str, learners))) if learners else "a learner"
                raise Diverged(f"training diverged: non-finite gradient of the {group} loss (norm {float(norm)}) at "
                               f"parameter-server step {self.version + 1} (from {who}); the weights were not "
                               f"changed and no checkpoint is written from this state (lower lr, set grad_clip, "
                               f"or look for NaN/inf rewards or observations)")
        for group in groups:
            if self.cfg.grad_clip > 0:
                clip_grad_norm(self.params[group], self.cfg.grad_clip, norms[group])
            self.optimizers[group].step()
            self.optimizers[group].zero_grad(set_to_none=True)
        version = self.version + 1
        self.applied += len(grad_list)
        targets_changed = self.algo.update_targets(self.nets, self.targets, self.cfg, version) is not False
        t1 = time.perf_counter()
        # publish: the snapshot first, then the version number that waiters look at; unchanged targets keep
        # the previous snapshot's tensors (no snapshot's tensors are ever written)
        target = _clone(self.targets.state_dict()) if targets_changed else self.snapshot.target
        self.snapshot = Snapshot(version, _clone(self.nets.state_dict()), target)
        with self.changed:
            self.version = version
            self.changed.notify_all()
        self.times["aggregate_s"] += t1 - t0
        self.times["publish_s"] += time.perf_counter() - t1

    def _handled(self, learner: int) -> None:
        with self.changed:
            self.handled[learner] += 1
            self.changed.notify_all()

    def wait_handled(self, learner: int, count: int, stop: threading.Event) -> None:
        """Block (bounded waits) until ``count`` gradients of ``learner`` were applied or dropped: async
        learners keep at most one gradient in flight, so the inbox cannot grow stale."""
        with self.changed:
            while self.handled[learner] < count and not stop.is_set():
                self.changed.wait(0.05)

    def learner_left(self) -> None:
        with self.changed:
            self.active -= 1

    def wait_version(self, after: int, stop: threading.Event) -> None:
        """Block (bounded waits) until a version newer than ``after`` is published, or stop."""
        with self.changed:
            while self.version <= after and not stop.is_set():
                self.changed.wait(0.05)

    def state_dict(self) -> dict:
        return {"version": self.version, "online": self.nets.state_dict(), "target": self.targets.state_dict(),
                "optimizers": {g: o.state_dict() for g, o in self.optimizers.items()}}

    def load_weights(self, online: dict, target: dict, version: int) -> None:
        """Take weights stepped elsewhere (all-reduce learners) as version ``version``: the networks, the targets
        and the snapshot; the optimizers' state is left as it is."""
        self.nets.load_state_dict(online)
        self.targets.load_state_dict(target)
        self.version = version
        self.snapshot = Snapshot(version, _clone(self.nets.state_dict()), _clone(self.targets.state_dict()))

    def load_state_dict(self, state: dict) -> None:
        self.nets.load_state_dict(state["online"])
        self.targets.load_state_dict(state["target"])
        for g, o in self.optimizers.items():
            o.load_state_dict(state["optimizers"][g])
        self.version = state["version"]
        self.snapshot = Snapshot(self.version, _clone(self.nets.state_dict()), _clone(self.targets.state_dict()))
