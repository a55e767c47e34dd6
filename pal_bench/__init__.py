"""PAL-Bench: benchmarking and profiling for parallel RL systems.

Core data structures (Cython, compiled from ``pyx/``):

- ``SumTree``: K-ary sum tree with batch update/get/find, O(1) total and min non-zero leaf.
- ``PrioritizedReplayBuffer``: thread-safe prioritized replay on the sum tree.
- ``ReplayBuffer``: its uniform counterpart, the floor of a buffer without a tree.
"""

from pal_bench._replay import PrioritizedReplayBuffer, ReplayBuffer
from pal_bench._sumtree import DEFAULT_FANOUT, SumTree

__all__ = ["DEFAULT_FANOUT", "PrioritizedReplayBuffer", "ReplayBuffer", "SumTree"]
__version__ = "0.1.0"
