"""Where one plug-in benchmark iteration goes: ``python -m pal_bench.studies.plugin_profile rllib-dqn 256 0 pal``.

Builds the benchmark's run for one configuration (framework, train batch, env runners, buffer "default" or
"pal"), fills it past learning_starts, then times ``--iterations`` training iterations with each buffer method
timed separately (µs per call and share of the iterations). For tianshou, the calls into the buffer's segment
tree (``buffer.weight``: tianshou's ``SegmentTree`` or PAL's ``PALSegmentTree``) are timed too: what a faster tree
can save at most. ``--cprofile`` runs them under cProfile instead and prints the entries with the most cumulative
time (cProfile inflates Python-heavy code: compare shares, not seconds).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import time

from pal_bench.studies.plugin import ENVS, Case, RLlibRun


def _timed(fn, name: str, seconds: collections.Counter, calls: collections.Counter):
    """``fn`` wrapped so that each call adds its seconds to ``seconds[name]`` and one to ``calls[name]``."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - t0
            calls[name] += 1
    return timed


class _TimedTree:
    """Forwards tianshou's segment-tree calls (``[]``, ``[] =``, ``reduce``, ``get_prefix_sum_idx``) to ``tree``,
    timed as ``"segment tree"``."""

    def __init__(self, tree, seconds: collections.Counter, calls: collections.Counter):
        self._tree = tree
        self._get, self._set, self.reduce, self.get_prefix_sum_idx = (
            _timed(fn, "segment tree", seconds, calls)
            for fn in (tree.__getitem__, tree.__setitem__, tree.reduce, tree.get_prefix_sum_idx))

    def __getitem__(self, index):
        return self._get(index)

    def __setitem__(self, index, value):
        self._set(index, value)

    def __len__(self) -> int:
        return len(self._tree)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("framework", choices=sorted(ENVS))
    ap.add_argument("batch", type=int)
    ap.add_argument("runners", type=int)
    ap.add_argument("buffer", choices=["default", "pal"])
    ap.add_argument("--steps", type=int, default=200, help="env steps per iteration (default 200)")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="run under cProfile and print the top entries")
    args = ap.parse_args(argv)
    case = Case(args.framework, ENVS[args.framework], args.batch, args.runners, args.buffer)
    if args.framework.startswith("tianshou"):
        from pal_bench.integrations.tianshou_dqn import TianshouRun

        run = TianshouRun(case, 0, args.steps)
    else:
        run = RLlibRun(case, 0, args.steps)
    try:
        run.prepare(1)
        seconds, calls = collections.Counter(), collections.Counter()
        for name in run.methods:
            fn = getattr(run.buffer, name, None)
            if fn is not None:
                setattr(run.buffer, name, _timed(fn, name, seconds, calls))
        if hasattr(getattr(run.buffer, "weight", None), "get_prefix_sum_idx"):  # tianshou: inside those calls
            run.buffer.weight = _TimedTree(run.buffer.weight, seconds, calls)
        prof = cProfile.Profile() if args.cprofile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        for _ in range(args.iterations):
            run.iterate()
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
    finally:
        run.close()
    print(f"{case.name}: {args.iterations} iterations of {args.steps} env steps in {wall:.2f} s"
          + (" (under cProfile)" if prof else ""))
    for name in sorted(seconds, key=seconds.get, reverse=True):
        print(f"  {name:18s} {calls[name]:6d} calls {seconds[name] * 1e6 / calls[name]:9.1f} µs/call "
              f"{seconds[name] / wall:6.1%} of the iterations")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
