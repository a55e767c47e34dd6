"""Gradients averaged among the learners themselves (``aggregation = "allreduce"``) over gloo: one all-reduce per
update round among the Ray backend's learner actors, which may be on several nodes. Each learner then steps its own
copy of the networks with the parameter server's update rule, so no gradient passes through a parameter server.
(The process backend's learner processes, on one node, average through their shared gradient blocks instead:
``processes.learner.AllReduceSink``.)"""

from __future__ import annotations

import torch


def average_gradients(grads: dict | None, groups: dict, learners: int) -> dict | None:
    """Average ``grads`` (group -> tensors) over the ``learners`` of the default process group: one all-reduce of
    every group's gradients (zeros for a group this learner has no gradient of, or for all of them when ``grads``
    is ``{}``: a round without an update of its own), a count per group and a have-batch flag. Returns the averaged
    gradients of every group some learner had, or None when some learner passed ``grads`` None (it stops: all stop
    here)."""
    import torch.distributed as dist

    names = sorted(groups)
    parts, counts = [], []
    for g in names:
        mine = grads is not None and g in grads
        parts += [t.reshape(-1) for t in grads[g]] if mine else [torch.zeros(p.numel()) for p in groups[g]]
        counts.append(float(mine))
    flat = torch.cat(parts + [torch.tensor(counts + [float(grads is not None)])])
    dist.all_reduce(flat)
    if flat[-1] < learners:
        return None
    out, offset = {}, 0
    for i, g in enumerate(names):
        seg = []
        for p in groups[g]:
            seg.append(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        count = float(flat[len(flat) - 1 - len(names) + i])
        if count > 0:
            out[g] = [x / count for x in seg]
    return out
