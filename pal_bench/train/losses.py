"""The learner's step pieces that every backend's learner shares: the parameters each loss trains, the
gradients of the losses, and the check that the losses are finite."""

from __future__ import annotations

import torch

from pal_bench.train.errors import Diverged


def check_losses(losses: dict, update: int, worker: str) -> None:
    """Raise ``Diverged`` when a loss of ``losses`` (group -> scalar tensor) is NaN or inf: one ``isfinite`` over
    the losses per update (the per-term look only once one is bad). Called before priorities and gradients use
    them, so a non-finite |TD| never reaches ``update_priorities``."""
    values = list(losses.values())
    total = values[0] if len(values) == 1 else torch.stack([v.detach() for v in values])
    if bool(torch.isfinite(total).all()):
        return
    bad = ", ".join(f"{g} loss = {float(v.detach())}" for g, v in losses.items() if not bool(torch.isfinite(v)))
    raise Diverged(f"training diverged: non-finite {bad} at update {update} ({worker}); no checkpoint is written "
                   f"from this state (lower lr, set grad_clip, or look for NaN/inf rewards or observations)")


def param_groups(algo, nets) -> dict[str, list[torch.nn.Parameter]]:
    """Per loss group (``algo.GROUPS``: group -> network names, e.g. {"actor": ["actor"], "critic": ["q1", "q2"]}),
    the parameters it trains, in a fixed order."""
    return {g: [p for m in mods for p in nets[m].parameters()] for g, mods in algo.GROUPS.items()}


def gradients(losses: dict, groups: dict) -> dict[str, list[torch.Tensor]]:
    """Per group of ``losses``, d loss / d its parameters (detached, one tensor per parameter of ``groups[g]``)."""
    return {g: [x.detach() for x in torch.autograd.grad(loss, groups[g])] for g, loss in losses.items()}
