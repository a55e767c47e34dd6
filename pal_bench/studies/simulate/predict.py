"""Predictions past the cores we have: f_a(n), f_l(n) and the whole trainer's env steps/s at n = 1..64 cores per
backend, each with an interval from the measured inputs (the model re-run on inputs resampled from the measured
rounds), the core split the paper's exhaustive search would pick from the predicted curves, which shared resource
limits each point (and whether that makes it untrustworthy), and which input moves the largest prediction most.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

from pal_bench.argtypes import CORES, int_ranges
from pal_bench.studies.simulate.calibrate import fit, inputs_for, median_inputs, resample
from pal_bench.studies.simulate.model import CHUNK, Inputs, Workload, simulate

SATURATED = 0.85      # a shared resource held this share of the run or more: the point is past its knee
SENSITIVE = ("act_us", "env_us", "insert_us", "insert_call_us", "insert_lock_us", "sample_us", "sample_lock_us",
             "grad_us", "prio_us", "prio_lock_us", "apply_us", "snapshot_load_us", "mem_bw_total", "ray_call_us",
             "ray_learner_remote_us", "lp_handoff_us", "lp_process_us", "lp_driver_us")
LEARNING = {"updates_per_step": 0.25, "learning_starts": 1_000}


DEFAULT_CORES = "1,2,3,4,6,8,12,16,24,32,48,64"
# the core counts whose f_a and f_l the split search at n cores interpolates (those below n, and n): fixed, so that a
# point's split does not depend on which other points were asked for (powers of two: the published predictions')
SPLIT_GRID = tuple(2**k for k in range(11))
cores_type = int_ranges(CORES)      # --cores: 1-64, 1,2,4 (each 1..1024)


def parse_cores(text: str) -> list[int]:
    """``1-64`` or ``1,2,4,8``: the core counts (each 1..1024); ValueError otherwise."""
    try:
        return cores_type(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None


def split_grid(n: int) -> list[int]:
    """The core counts the split search at ``n`` cores reads the curves at: ``SPLIT_GRID`` below ``n``, and ``n``."""
    return [k for k in SPLIT_GRID if k < n] + [n]


def _workload(backend: str, mode: str, n: int, actors: int = 1, learners: int = 1) -> Workload:
    c = CHUNK[backend]
    if mode == "f_a":
        return Workload(backend, n, n, 1, "f_a", steps=min(600 * n + 2_000 + 4 * c * n, 40_000), chunk=c, **LEARNING)
    if mode == "f_l":
        return Workload(backend, n, 1, n, "f_l", updates=min(60 * n + 200, 1_500), chunk=c, **LEARNING)
    return Workload(backend, n, actors, learners, "end_to_end", steps=min(800 * n + 5_000, 20_000), chunk=c,
                    **LEARNING)


def limit_of(busy: dict) -> str:
    """The shared resource held longest, with its share (``lock 0.93``), when past ``SATURATED``."""
    name, share = max(busy.items(), key=lambda kv: kv[1])
    return f"{name} {share:.2f}" if share >= SATURATED else ""


def best_split(fa: dict[int, float], fl: dict[int, float], cores: int, ratio: float) -> tuple[int, int]:
    """The paper's exhaustive search on curves: actors + learners <= ``cores`` maximising the env steps/s both
    sides sustain, min(f_a(x_a), f_l(x_l) / ratio); between the core counts simulated the curves are
    interpolated linearly."""
    xa, xl = sorted(fa), sorted(fl)

    def at(curve, xs, x):
        return float(np.interp(x, xs, [curve[k] for k in xs]))

    best, split = -1.0, (1, 1)
    for a in range(1, cores):
        for lrn in range(1, cores - a + 1):
            if (v := min(at(fa, xa, a), at(fl, xl, lrn) / ratio)) > best:
                best, split = v, (a, lrn)
    return split


def curves(inp: Inputs, backend: str, cores: list[int], progress=print) -> pd.DataFrame:
    """f_a, f_l at every ``cores`` value, and end to end at the split ``best_split`` picks at n cores from f_a and
    f_l at ``split_grid(n)`` (simulated as well where not asked for): each point's rows are the same whichever other
    points are asked for."""
    rows, sims = [], {}

    def curve(mode: str, n: int) -> dict:
        if (mode, n) not in sims:
            sims[mode, n] = simulate(inp, _workload(backend, mode, n))
        return sims[mode, n]

    def value(mode: str, n: int) -> float:
        r = curve(mode, n)
        return r["updates_per_s"] if mode == "f_l" else r["env_steps_per_s"]

    for n in cores:
        for mode in ("f_a", "f_l"):
            rows.append({"backend": backend, "cores": n, "curve": mode, "actors": n if mode == "f_a" else 0,
                         "learners": n if mode == "f_l" else 0, "predicted": value(mode, n),
                         "limit": limit_of(curve(mode, n)["busy"])})
    for n in cores:
        if n < 2:
            continue
        fa = {k: value("f_a", k) for k in split_grid(n)}
        fl = {k: value("f_l", k) for k in split_grid(n)}
        a, lrn = best_split(fa, fl, n, LEARNING["updates_per_step"])
        r = simulate(inp, _workload(backend, "end_to_end", n, a, lrn))
        rows.append({"backend": backend, "cores": n, "curve": "end_to_end", "actors": a, "learners": lrn,
                     "predicted": r["env_steps_per_s"], "limit": limit_of(r["busy"])})
        progress(f"{backend} {n} cores: f_a {fa[n]:.0f}, f_l {fl[n]:.0f}, end to end {a} + {lrn}: "
                 f"{r['env_steps_per_s']:.0f} env steps/s")
    return pd.DataFrame(rows)


def fitted(rounds_or_row, backend: str, one_worker: dict | None, cores: int) -> Inputs:
    row = rounds_or_row if isinstance(rounds_or_row, dict) else median_inputs(rounds_or_row)
    fa1, fl1 = (one_worker or {}).get("f_a"), (one_worker or {}).get("f_l")
    return fit(inputs_for(row, backend), backend, fa1, fl1, cores, LEARNING)[0]


def _curves_quietly(inp: Inputs, backend: str, cores: list[int]) -> pd.DataFrame:
    return curves(inp, backend, cores, progress=lambda m: None)


def predict(rounds: pd.DataFrame, backend: str, cores: list[int], one_worker: dict | None = None,
            samples: int = 10, seed: int = 0, progress=print, residuals=None,
            workers: int | None = None) -> pd.DataFrame:
    """``curves`` on the median inputs, with ``lo`` / ``hi``: the 5th and 95th percentiles over ``samples``
    resampled inputs (each input drawn from one measured round), and ``lo90`` / ``hi90``, the stated 90% interval:
    those draws combined with the model's own error, ``residuals`` (the development set's relative errors,
    ``validate.interval``; None: the draws alone). The draws run in ``workers`` processes (default: the usable
    cores)."""
    from concurrent.futures import ProcessPoolExecutor

    from pal_bench.conditions import usable_cores
    from pal_bench.studies.simulate.validate import interval

    cal = int(median_inputs(rounds).get("cores", 2))
    rng = np.random.default_rng(seed)
    fits = [fitted(rounds, backend, one_worker, cal)] + [fitted(resample(rounds, rng), backend, one_worker, cal)
                                                        for _ in range(samples)]
    workers = max(1, min(workers or usable_cores(), len(fits)))
    quiet = lambda m: None   # noqa: E731
    if workers == 1:
        frames = [curves(fits[0], backend, cores, progress)] + [curves(f, backend, cores, quiet) for f in fits[1:]]
    else:
        import multiprocessing as mp

        progress(f"{backend}: the median inputs and {samples} resampled draws in {workers} processes ...")
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            frames = list(pool.map(_curves_quietly, fits, [backend] * len(fits), [cores] * len(fits)))
    out = frames[0]
    draws = [d.predicted.to_numpy() for d in frames[1:]]
    if draws:
        a = np.vstack(draws)
        out["lo"], out["hi"] = np.percentile(a, 5, axis=0), np.percentile(a, 95, axis=0)
    a = np.vstack([out.predicted.to_numpy(), *draws])
    r = np.asarray([] if residuals is None else residuals, dtype=float)
    bands = [interval(a[:, k], r) for k in range(a.shape[1])]
    out["lo90"], out["hi90"] = [b[0] for b in bands], [b[1] for b in bands]
    return out


def _segments(phase: str):
    def change(inp: Inputs, w: Workload, k: float):
        n = inp.gil_segments.get(phase, 1)
        return replace(inp, gil_segments=inp.gil_segments | {phase: max(1, round(n * k))}), w
    return change


def _handoff(inp: Inputs, w: Workload, k: float):
    return replace(inp, gil_handoff={p: v * k for p, v in inp.gil_handoff.items()}), w


def _quantum(inp: Inputs, w: Workload, k: float):
    return inp, replace(w, quantum_us=w.quantum_us * k)


def _background(inp: Inputs, w: Workload, k: float):
    # +10% of a core's worth where none is assumed (a multiplier of 0 says nothing)
    return replace(inp, background_cores=inp.background_cores * k if inp.background_cores else 0.1 * (k - 1)), w


def _corun(inp: Inputs, w: Workload, k: float):
    return replace(inp, corun_slowdown=min(0.9, inp.corun_slowdown * k)), w


# the model's parameters that were chosen, not measured (docs/simulation.md, "Named assumptions"), or measured on
# 2 cores and applied at every core count: each moved by +10% as the measured inputs are
CHOSEN = {"gil_segments.apply": _segments("apply"), "gil_segments.grad": _segments("grad"),
          "gil_segments.act": _segments("act"), "gil_handoff (all phases)": _handoff,
          "quantum_us (time slice)": _quantum, "background_cores": _background,
          "corun_slowdown (measured at 2 cores)": _corun}
MEASURED_AT_SCALE = ("reserve_us", "reserve_us_per_actor", "pump_poll_us", "buffer_actor_row_us")


def sensitivity(inp: Inputs, backend: str, cores: int, step: float = 0.1,
                measured: tuple[str, ...] = ()) -> pd.DataFrame:
    """How much each input moves the predicted f_a and f_l at ``cores``: the relative change for +``step`` (10%) on
    that input, largest first; ``kind`` says whether the input was measured or chosen (``CHOSEN``: the GIL pieces,
    the handoff cost, the time slice, the background cores, the co-run slowdown measured on this machine's cores),
    except the ``CHOSEN`` names in ``measured`` (the Ray backends' background cores where ``ray_idle`` is stored)."""
    def at(i: Inputs, wf=lambda w: w) -> dict:
        fa = simulate(i, wf(_workload(backend, "f_a", cores)))["env_steps_per_s"]
        fl = simulate(i, wf(_workload(backend, "f_l", cores)))["updates_per_s"]
        return {"f_a": fa, "f_l": fl}

    base = at(inp)
    rows = []
    for name in (*SENSITIVE, *MEASURED_AT_SCALE):
        if getattr(inp, name) == 0:
            continue
        got = at(inp.scaled(**{name: 1 + step}))
        rows.append({"input": name, "kind": "measured", **{f"{k} change": got[k] / base[k] - 1 for k in base}})
    for name, change in CHOSEN.items():
        changed, _ = change(inp, _workload(backend, "f_a", cores), 1 + step)
        got = at(changed, lambda w, c=change: c(inp, w, 1 + step)[1])
        rows.append({"input": name, "kind": "measured" if name in measured else "chosen",
                     **{f"{k} change": got[k] / base[k] - 1 for k in base}})
    df = pd.DataFrame(rows)
    df["largest"] = df[[c for c in df if c.endswith("change")]].abs().max(axis=1)
    return df.sort_values("largest", ascending=False, kind="stable").drop(columns="largest").reset_index(drop=True)
