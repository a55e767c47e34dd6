"""The learner's check on its losses, shared by every backend's learner loop."""

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
