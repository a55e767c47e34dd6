"""Long-haul link between a buffer node (at the edge, near the actors) and a remote learner.

``link``: the link model that delays and throttles real (serialized) messages; ``experiment``: the
two replay topologies (``learner-replay``, ``buffer-replay``) measured over it; ``nodes``: the buffer node,
the learner and the evaluator; ``trainer``: ``pal-bench train --topology``; ``publish``: tables and figures.
"""

from pal_bench.studies.longhaul.link import PRESETS, Link, LinkSpec, Packet, Receiver

TOPOLOGIES = ("learner-replay", "buffer-replay")   # replay at the learner, or at the buffer node

__all__ = ["PRESETS", "TOPOLOGIES", "Link", "LinkSpec", "Packet", "Receiver"]
