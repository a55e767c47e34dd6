"""How much memory does each replay buffer need per transition, in each of its memory modes?
``pal-bench memory --workload atari --impl pal,cpprb,tianshou,sb3 --capacity 1e5 [--mode full,stack] --out DIR``.

Each (implementation, mode, capacity) is measured in a fresh Python process: it imports the implementation,
reads its resident memory (``/proc/self/status`` VmRSS), makes the buffer and fills it to capacity with the
workload's rows (one stream, real episodes; ``pal_bench.workloads``) through the implementation's fastest public
path, frees the fill data (``gc`` and glibc's ``malloc_trim``) and reads VmRSS and the peak (VmHWM) again.
``rss_bytes`` is the growth of VmRSS, ``peak_rss_bytes`` the growth of the peak over the start,
``bytes_per_transition`` = ``rss_bytes`` / the transitions the buffer holds (PAL's frame modes spend some rows on
context and tail frames: they hold fewer transitions than rows).

Where a capacity would not fit in this machine's memory, the point is measured at the largest tried capacity that
fits (each capacity is first measured at a tenth of it) and extrapolated linearly, marked ``extrapolated_from``.
Writes ``DIR/memory.csv`` (and its conditions beside it); the stored table is ``results/memory.csv``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import CAPACITY, Range, choice_list, number_list
from pal_bench.bench.adapters.registry import ADAPTERS, adapter_class, available
from pal_bench.bench.publishing import Publication, md, missing, source, store
from pal_bench.conditions import Conditions, add_force_flag, meminfo_bytes, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import Column, UsageError, read_table
from pal_bench.workloads import MODES, WORKLOADS, get_workload

COLUMNS = ["impl", "workload", "mode", "capacity", "transitions", "rss_bytes", "peak_rss_bytes",
           "bytes_per_transition", "fill_s", "extrapolated_from", "status"]
_NUM = Range(0, 1e18)
MEMORY_COLUMNS = {"impl": Column(str), "workload": Column(str), "mode": Column(str, choices=MODES),
                  "capacity": Column(int, CAPACITY), "status": Column(str),
                  **{k: Column(float, _NUM, required=False) for k in ("transitions", "rss_bytes", "peak_rss_bytes",
                                                                      "bytes_per_transition", "fill_s",
                                                                      "extrapolated_from")}}
INTERLEAVING_COLUMNS = {"impl": Column(str), "workload": Column(str), "mode": Column(str, choices=MODES),
                        "streams": Column(int, Range(1, 10**6)), "chunk": Column(int, Range(1, 10**9)),
                        "draws": Column(int, Range(1, 10**9)), "wrong": Column(int, Range(0, 10**9)),
                        "wrong_share": Column(float, Range(0, 1))}
DEFAULT_IMPLS = ("pal", "pal-uniform", "cpprb", "tianshou", "sb3")
FIT_SHARE = 0.6          # a point is measured only if its estimate takes at most this share of available memory
CHILD_TIMEOUT_S = 3600
WARM_CAPACITY = 64       # the throw-away buffer made first in each fresh process


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    avail = meminfo_bytes("MemAvailable")
    if avail is None:
        raise RuntimeError("/proc/meminfo has no MemAvailable")
    return avail


def _release() -> None:
    """Collect garbage and give freed heap back to the OS (glibc ``malloc_trim``), the same for every buffer."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def measure_here(impl: str, workload: str, mode: str, capacity: int) -> dict:
    """One point, in this process (call it in a fresh one: ``measure``)."""
    cls = adapter_class(impl)
    w = get_workload(workload)
    # a small one first, so that the implementation's imports, JIT compiles and caches are not counted
    warm = cls(WARM_CAPACITY, workload=w, mode=mode)
    del warm
    _release()
    base, base_peak = _status_kb("VmRSS"), _status_kb("VmHWM")
    t0 = time.perf_counter()
    adapter = cls(capacity, workload=w, mode=mode)
    fill_s = time.perf_counter() - t0
    _release()
    rss, peak = _status_kb("VmRSS"), _status_kb("VmHWM")
    held = adapter.transitions()
    grow = (rss - base) * 1024
    return {"impl": impl, "workload": workload, "mode": mode, "capacity": capacity, "transitions": held,
            "rss_bytes": grow, "peak_rss_bytes": (max(peak, base_peak) - base) * 1024,
            "bytes_per_transition": grow / held, "fill_s": round(fill_s, 3), "extrapolated_from": "",
            "status": "ok"}


def measure(impl: str, workload: str, mode: str, capacity: int) -> dict:
    """One point in a fresh process; a failure is a row with ``status`` saying why."""
    cmd = [sys.executable, "-m", "pal_bench.studies.memory", "--child", json.dumps([impl, workload, mode, capacity])]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return _failed(impl, workload, mode, capacity, f"no result in {CHILD_TIMEOUT_S} s")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return _failed(impl, workload, mode, capacity, last[:200])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _failed(impl, workload, mode, capacity, why: str) -> dict:
    return dict.fromkeys(COLUMNS, "") | {"impl": impl, "workload": workload, "mode": mode, "capacity": capacity,
                                          "status": f"failed: {why}"}


def points(impls, workload: str, modes, capacities) -> list[tuple[str, str, int]]:
    """The (impl, mode, capacity) points to measure: every mode each implementation has for the workload."""
    w = get_workload(workload)
    out = []
    for impl in impls:
        have = [m for m in adapter_class(impl).MODES if m in w.modes]
        for mode in modes or have:
            if mode in have:
                out += [(impl, mode, c) for c in capacities]
    return out


def study(impls, workload: str, modes, capacities, progress=print) -> pd.DataFrame:
    rows = []
    todo = points(impls, workload, modes, capacities)
    for i, (impl, mode, cap) in enumerate(todo):
        progress(f"[memory {i + 1}/{len(todo)}] {impl} {mode} at {cap:,}")
        for r in measure_fitting(impl, workload, mode, cap, progress):
            rows.append(r)
            progress(f"    {r['capacity']:,}: {r['status']}, {r['bytes_per_transition'] or 0:,.0f} B per transition"
                     + (f" (extrapolated from {r['extrapolated_from']:,})" if r["extrapolated_from"] else ""))
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.drop_duplicates(["impl", "workload", "mode", "capacity"], keep="last")


def measure_fitting(impl: str, workload: str, mode: str, capacity: int, progress=print) -> list[dict]:
    """The rows of one point: ``capacity`` measured if it fits, else extrapolated. A capacity of 10,000 or more is
    first measured at a tenth of it (smaller still while its rows stored in full would not fit), that row kept
    too, and the full capacity measured only when that measurement says it fits."""
    probe = capacity // 10 if capacity >= 10_000 else capacity
    while probe > 1000 and probe * get_workload(workload).row_bytes > FIT_SHARE * available_bytes():
        probe //= 10
    first = measure(impl, workload, mode, probe)
    if first["status"] != "ok" or probe == capacity:
        return [first]
    need = first["rss_bytes"] / probe * capacity
    if need <= FIT_SHARE * available_bytes():
        return [first, measure(impl, workload, mode, capacity)]
    progress(f"    {need / 2**30:.1f} GiB would not fit: extrapolating from {probe:,}")
    scale = capacity / probe
    return [first, first | {"capacity": capacity, "transitions": round(first["transitions"] * scale),
                            "rss_bytes": round(need), "peak_rss_bytes": round(first["peak_rss_bytes"] * scale),
                            "fill_s": "", "extrapolated_from": probe}]


# ------------------------------------------------------------------ several streams interleaved

INTERLEAVE_IMPLS = ("pal", "cpprb", "tianshou")     # SB3's add takes every env of one vector env at once: it cannot
                                                    # be handed one stream's chunk at a time


def _sampled(adapter, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """obs and next_obs of one sample, in the workload's layout ([B, k, 84, 84] for stacks)."""
    if adapter.name.startswith("pal"):
        got = adapter.buf.sample(batch)
        return got["obs"], got["next_obs"]
    if adapter.name == "cpprb":
        got = adapter.buf.sample(batch)
        obs, nxt = got["obs"], got["next_obs"]
        if adapter.mode == "stack":
            obs, nxt = np.moveaxis(obs, -1, -3), np.moveaxis(nxt, -1, -3)
        return obs.reshape(batch, *adapter.workload.obs_shape), nxt.reshape(batch, *adapter.workload.obs_shape)
    if adapter.name == "tianshou":
        got, _ = adapter.buf.sample(batch)
        return np.asarray(got.obs), np.asarray(got.obs_next)
    raise ValueError(f"no interleaving check for {adapter.name}")


def interleaving_check(impl: str, workload: str, mode: str, capacity: int = 4000, n_streams: int = 4,
                       chunk: int = 10, draws: int = 2000) -> dict:
    """Several environment streams inserted as a parallel trainer's actors insert them (chunks of ``chunk`` steps,
    streams taking turns), each chunk through the implementation's own insert path (cpprb: ``on_episode_end()``
    after every chunk as well as at episode ends, the only way its API has to end a stream); then ``draws``
    sampled transitions are compared with the rows that were inserted. Returns the fraction whose observation or
    next observation is not one that was inserted with it."""
    w = get_workload(workload)
    adapter = adapter_class(impl)(capacity, workload=w, mode=mode)      # filled: then overwritten by the streams
    rows = w.streams(capacity, seed=11, n_streams=n_streams, chunk=chunk)
    truth = {rows["obs"][i].tobytes(): rows["next_obs"][i] for i in range(capacity)}
    sid = rows.pop("stream")
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    for a, b in zip(starts, [*starts[1:], capacity]):
        part = {k: v[a:b] for k, v in rows.items()}
        if impl.startswith("pal") and mode != "full":
            adapter.buf.add_batch(**part)
        else:
            adapter._fill_chunk(part)
            if impl == "cpprb" and mode != "full":
                adapter.buf.on_episode_end()
    wrong = 0
    for _ in range(draws // 100):
        obs, nxt = _sampled(adapter, 100)
        for o, n in zip(obs, nxt):
            want = truth.get(np.ascontiguousarray(o).tobytes())
            wrong += want is None or not np.array_equal(want, n)
    return {"impl": impl, "workload": workload, "mode": mode, "streams": n_streams, "chunk": chunk,
            "draws": draws // 100 * 100, "wrong": int(wrong), "wrong_share": wrong / (draws // 100 * 100)}


def _stored(out: Path, interleaved: bool) -> pd.DataFrame | None:
    """The table already stored in ``out`` (None: none), checked column by column (UsageError naming the file)."""
    name, columns = ("interleaving.csv", INTERLEAVING_COLUMNS) if interleaved else ("memory.csv", MEMORY_COLUMNS)
    path = out / name
    if not os.path.lexists(path):
        return None
    return read_table(path, columns, f"the stored {name}")


def _merged(old: pd.DataFrame | None, new: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """``old``'s rows (other workloads, implementations, capacities) with ``new``'s replacing those of its keys."""
    if old is None or old.empty:
        return new
    old = old[~old.set_index(key).index.isin(new.set_index(key).index)]
    return pd.concat([old[[c for c in new.columns if c in old.columns]], new], ignore_index=True)


# ------------------------------------------------------------------ publication

def memory_block(results: Path) -> str:
    path = results / "memory.csv"
    if not path.exists():
        return missing("memory.csv", "pal-bench memory --workload atari --capacity 1e5,1e6")
    df = read_table(path, MEMORY_COLUMNS, "memory per transition as `pal-bench memory` writes it")
    df = df[df.status == "ok"].copy()
    df["GiB"] = df.rss_bytes / 2**30
    df["bytes/transition"] = df.bytes_per_transition
    df["measured"] = [f"extrapolated from {int(e):,}" if e == e else "measured" for e in df.extrapolated_from]
    show_cols = ["workload", "impl", "mode", "capacity", "transitions", "bytes/transition", "GiB", "measured"]
    df = df.sort_values(["workload", "capacity", "impl", "mode"])
    return ("Resident memory a filled buffer adds, per transition it holds (growth of VmRSS in a fresh process; "
            "peak in the CSV).\n\n" + md(df[show_cols], (".0f", ".0f", ".0f", ".0f", ".0f", ".0f", ".2f", ""))
            + "\n\n" + source(results, "memory.csv") + "\n")


def interleaving_block(results: Path) -> str:
    path = results / "interleaving.csv"
    if not path.exists():
        return missing("interleaving.csv", "pal-bench memory --workload atari --interleaved")
    df = read_table(path, INTERLEAVING_COLUMNS, "interleaving checks as `pal-bench memory --interleaved` writes them",
                    min_rows=1)
    df["wrong %"] = 100 * df.wrong_share
    n, c, d = int(df.streams.iloc[0]), int(df.chunk.iloc[0]), int(df.draws.iloc[0])
    return (f"{n} environment streams inserted in chunks of {c} steps, taking turns (as actors insert them); "
            f"{d} sampled transitions per row compared with the ones inserted: the share whose observation or next "
            "observation was never inserted with it.\n\n"
            + md(df[["workload", "impl", "mode", "wrong", "draws", "wrong %"]], (".0f", ".0f", ".0f", ".0f", ".0f",
                                                                                 ".1f"))
            + "\n\n" + source(results, "interleaving.csv") + "\n")


PUBLICATION = Publication("memory", {"memory": memory_block, "interleaving": interleaving_block})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", choices=list(WORKLOADS), default="atari")
    ap.add_argument("--impl", type=choice_list(ADAPTERS), default=list(DEFAULT_IMPLS),
                    help=f"comma-separated implementations, of {', '.join(ADAPTERS)} "
                         f"(default {','.join(DEFAULT_IMPLS)}; those not installed are skipped)")
    ap.add_argument("--capacity", type=number_list(CAPACITY), default=[10**5],
                    help="comma-separated capacities (default 1e5)")
    ap.add_argument("--mode", type=choice_list(MODES), help=f"memory modes, of {', '.join(MODES)} "
                    "(default: every mode each implementation has)")
    ap.add_argument("--interleaved", action="store_true",
                    help=f"instead: insert several streams in turns into {', '.join(INTERLEAVE_IMPLS)} in each memory "
                         "mode and count the sampled transitions that are wrong (DIR/interleaving.csv)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_force_flag(ap)
    args = ap.parse_args(argv)
    if args.child:
        try:
            impl, workload, mode, capacity = json.loads(args.child)
            capacity = int(capacity)
        except (ValueError, TypeError) as e:
            ap.error(f"--child: {e}")
        print(json.dumps(measure_here(impl, workload, mode, capacity)))
        return 0
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is not a directory")
    try:                       # what is stored there is read (and refused) before hours of measuring, not after
        args.out.mkdir(parents=True, exist_ok=True)
        old = _stored(args.out, args.interleaved)
    except (OSError, UsageError) as e:
        ap.error(f"--out {args.out}: {e}")
    impls = []
    for impl in args.impl:
        why = available(impl)
        if why:
            print(f"skipping {impl}: {why}", file=sys.stderr)
        else:
            impls.append(impl)
    if refuse_if_busy("pal-bench memory", args.force):
        return 2
    if args.interleaved:
        todo = points([i for i in impls if i in INTERLEAVE_IMPLS], args.workload, args.mode, [0])
        if not todo:
            ap.error(f"--interleaved: nothing to check ({', '.join(INTERLEAVE_IMPLS)} in the modes "
                     f"{get_workload(args.workload).modes} of {args.workload})")
        with Conditions(f"interleaved streams, {args.workload}") as c:
            df = pd.DataFrame([interleaving_check(impl, args.workload, mode) for impl, mode, _ in todo])
        store(_merged(old, df, ["impl", "workload", "mode"]), args.out / "interleaving.csv", c)
        print(interleaving_block(args.out))
        return 0
    with Conditions(f"memory per transition, {args.workload}") as c:
        df = study(impls, args.workload, args.mode, args.capacity,
                   progress=lambda m: print(m, file=sys.stderr, flush=True))
    store(_merged(old, df, ["impl", "workload", "mode", "capacity"]), args.out / "memory.csv", c)
    print(memory_block(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
