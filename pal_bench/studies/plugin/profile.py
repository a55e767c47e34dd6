"""Where one plug-in benchmark iteration goes: ``python -m pal_bench.studies.plugin.profile rllib-dqn 256 0 pal``.

Builds the benchmark's run for one configuration (framework, train batch, env runners, buffer "default" or
"pal"), fills it past learning_starts, then times ``--iterations`` training iterations with each buffer method
timed separately (µs per call and share of the iterations). For tianshou, the calls into the buffer's segment
tree (``buffer.weight``: tianshou's ``SegmentTree`` or PAL's ``PALSegmentTree``) are timed too: what a faster tree
can save at most. ``--cprofile`` runs them under cProfile instead and prints the entries with the most cumulative
time (cProfile inflates Python-heavy code: compare shares, not seconds). ``--cold-probe`` instead times a few
fixed calls twice at every priority update, right after the training step (cold caches) and at once again
(warm): ``np.abs`` of 32 floats and, for tianshou, the tree's ``get_prefix_sum_idx`` and ``[]`` of 32 slots and
``update_weight`` itself (repeating it changes nothing); medians in µs.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import time

import numpy as np

from pal_bench.argtypes import nonneg_int, positive_int
from pal_bench.studies.plugin.measure import ENVS, Case, RLlibRun


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


def _cold_probe(buffer, samples: collections.defaultdict) -> None:
    """Wrap ``buffer``'s priority update so that each call first times its probes twice (cold, then warm)
    into ``samples[label]`` (µs), then runs; for tianshou the update itself runs twice, timed alike."""
    name = "update_weight" if hasattr(buffer, "update_weight") else "update_priorities"
    update = getattr(buffer, name)
    values = np.linspace(-1.0, 1.0, 32)
    probes = [("np.abs(32 floats)", lambda: np.abs(values))]
    tree = getattr(buffer, "weight", None)
    if hasattr(tree, "get_prefix_sum_idx"):
        targets, slots = np.linspace(0.01, 0.99, 32), np.arange(0, 1_000, 1_000 // 32)[:32]
        probes += [("tree get_prefix_sum_idx(32)", lambda: tree.get_prefix_sum_idx(targets * tree.reduce())),
                   ("tree[32 slots]", lambda: tree[slots])]

    def run_twice(label, fn):
        for state in ("cold", "warm"):
            t0 = time.perf_counter()
            fn()
            samples[f"{label} {state}"].append((time.perf_counter() - t0) * 1e6)

    def probed(*args, **kwargs):
        for label, fn in probes:
            run_twice(label, fn)
        if name == "update_weight":  # idempotent: same slots, same weights
            run_twice(name, lambda: update(*args, **kwargs))
            return None
        return update(*args, **kwargs)

    setattr(buffer, name, probed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("framework", choices=sorted(ENVS))
    ap.add_argument("batch", type=positive_int)
    ap.add_argument("runners", type=nonneg_int)
    ap.add_argument("buffer", choices=["default", "pal"])
    ap.add_argument("--steps", type=positive_int, default=200, help="env steps per iteration (default 200)")
    ap.add_argument("--iterations", type=positive_int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="run under cProfile and print the top entries")
    ap.add_argument("--cold-probe", action="store_true",
                    help="time fixed calls cold (after the training step) and warm at each priority update")
    args = ap.parse_args(argv)
    case = Case(args.framework, ENVS[args.framework], args.batch, args.runners, args.buffer)
    if args.framework.startswith("tianshou"):
        from pal_bench.studies.plugin.tianshou_run import TianshouRun

        run = TianshouRun(case, 0, args.steps)
    else:
        run = RLlibRun(case, 0, args.steps)
    try:
        run.prepare(1)
        seconds, calls = collections.Counter(), collections.Counter()
        samples: collections.defaultdict = collections.defaultdict(list)
        if args.cold_probe:
            _cold_probe(run.buffer, samples)
        else:
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
    for label, values in samples.items():
        print(f"  {label:34s} median {np.median(values):7.1f} µs over {len(values)} updates")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
