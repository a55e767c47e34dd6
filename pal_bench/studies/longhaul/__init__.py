"""Long-haul link between a buffer node (at the edge, near the actors) and a remote learner.

``link``: the link model that delays and throttles real (serialized) messages; ``experiment``: the
two replay topologies (``learner-replay``, ``buffer-replay``) measured over it.
"""

from pal_bench.studies.longhaul.link import PRESETS, Link, LinkSpec, Packet, Receiver

__all__ = ["PRESETS", "Link", "LinkSpec", "Packet", "Receiver"]
