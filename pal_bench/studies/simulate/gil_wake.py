"""What a wake-up costs when two threads of one process share the GIL (issue 50's probe of the model's miss on
oversubscribed and async splits; docs/simulation.md).

A *busy* thread runs the trainer's own learner update in a loop (a batch sampled from the shared buffer, the DQN
losses and their gradients, one optimizer step of the parameter server). A second thread of the same process
either wakes from a 2 ms timer (as the driver's pump and a polling waiter do) or is woken by an event the busy
thread sets after each update (as a gradient wakes the async parameter server), and records how late it runs
Python after its wake-up was due (µs); or it is a second learner thread running the same update, never waiting
(as two learner threads of the thread backend, or of the driver, do). Each condition runs for ``seconds`` with
the other cores idle, and the wake-ups again with one spinning process on every other core (every core busy).
Also the busy thread's updates/s in each: what the other thread costs the thread that was running.

``python -m pal_bench.studies.simulate.gil_wake [--seconds S] [--rounds N] [--out DIR] [--force]`` writes
``DIR/simulation_gil_wake.csv`` (one row per condition and round) with its ``.meta.json``; it measures only on a quiet
machine (``--force``: anyway, marked noisy).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pal_bench.argtypes import Range, number
from pal_bench.paths import RESULTS

FILE = "simulation_gil_wake.csv"
TIMER_S = 0.002            # the waking thread's sleep (the driver's pump period, processes/shared.POLL_S)
CONDITIONS = (             # (name, the busy thread runs, every other core spun, how the second thread wakes)
    ("learner alone", True, False, None),
    ("learner alone", True, True, None),
    ("timer, no learner", False, False, "timer"),
    ("timer beside the learner", True, False, "timer"),
    ("timer beside the learner", True, True, "timer"),
    ("event from the learner", True, False, "event"),
    ("event from the learner", True, True, "event"),
    ("a second learner beside the learner", True, False, "learner"),
)


def _spin(stop, ready, parent: int) -> None:
    """(a spawned process) Keep one core busy until ``stop`` is set or the parent is gone (killed too: the kernel
    kills this process with its parent)."""
    import signal

    from pal_bench.train.backends.processes.shared import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C reaches the parent, which stops this one
    die_with_parent()
    ready.release()
    while not stop.is_set() and os.getppid() == parent:
        for _ in range(10_000):
            pass


def learner_update():
    """One learner update of the trainer's own code (DQN, CartPole-v1, one torch thread), as a callable."""
    import torch

    from pal_bench.studies.scaling.measure import transitions
    from pal_bench.train import make_config
    from pal_bench.train.core import RunCore
    from pal_bench.train.losses import gradients, param_groups
    from pal_bench.train.param_server import ParameterServer
    from pal_bench.train.replay_spec import make_buffer

    torch.set_num_threads(1)
    cfg = make_config("dqn", "CartPole-v1")
    core = RunCore(cfg)
    buf = make_buffer(dataclasses.replace(cfg, buffer_capacity=100_000), core.fields())
    buf.add_batch(**transitions(core, 5_000))
    nets, targets = core.networks(), core.networks()
    ps = ParameterServer(core.algo, nets, targets, dataclasses.replace(cfg, aggregation="sync"), 1)
    groups = param_groups(core.algo, nets)

    def update() -> None:
        batch = core.to_tensors(buf.sample(cfg.batch_size))
        ps.apply(gradients(core.algo.losses(nets, targets, batch, cfg, 1)[0], groups))
    return update


def one_condition(update, seconds: float, busy: bool, spin_others: bool, wake: str | None,
                  second_update=None) -> dict:
    """One condition's figures: the second thread's wake-ups and their lateness (µs: mean; median, p90, p99 as the
    upper-rank order statistics), the busy thread's updates/s (and with ``wake`` "learner" the second learner's,
    whose ``second_update`` must have its own objects). The clock covers the measurement only, not the start or
    the stop. Every thread and process it starts is stopped before it returns, error or Ctrl-C; an error in either
    thread is raised here."""
    from pal_bench.conditions import usable_cores

    if wake == "learner" and second_update is None:
        raise ValueError("a second learner needs its own update (second_update), not the first one's objects")
    ctx = mp.get_context("spawn")
    others = max(0, usable_cores() - 1) if spin_others else 0
    # process-shared primitives (named semaphores in /dev/shm) only where a spinner process needs them
    spin_stop, ready = (ctx.Event(), ctx.Semaphore(0)) if others else (threading.Event(), threading.Semaphore(0))
    stop, woken = threading.Event(), threading.Event()
    spinners = [ctx.Process(target=_spin, args=(spin_stop, ready, os.getpid()), daemon=True) for _ in range(others)]
    updates, second, set_at, late, errors = [0], [0], [0.0], [], []

    def guarded(body):
        def run() -> None:
            try:
                body()
            except BaseException as e:      # reaches the caller
                errors.append(e)
                stop.set()
        return run

    def learner() -> None:
        while not stop.is_set():
            update()
            updates[0] += 1
            if wake == "event" and not woken.is_set():     # lateness from the set that wakes the thread
                set_at[0] = time.perf_counter()
                woken.set()

    def waker() -> None:
        while wake is not None and not stop.is_set():
            if wake == "learner":               # not a waker: a second learner thread, never waiting
                second_update()
                second[0] += 1
            elif wake == "timer":
                t0 = time.perf_counter()
                time.sleep(TIMER_S)
                late.append((time.perf_counter() - t0 - TIMER_S) * 1e6)
            elif woken.wait(0.1):
                t = time.perf_counter()
                due = set_at[0]
                woken.clear()
                late.append((t - due) * 1e6)

    threads = [threading.Thread(target=guarded(waker), daemon=True)] + (
        [threading.Thread(target=guarded(learner), daemon=True)] if busy else [])
    started: list = []
    wall = 0.0
    try:
        for p in spinners:
            p.start()
            started.append(p)
        for _ in started:                   # every spinner spinning before the clock starts
            if not ready.acquire(timeout=60):
                raise RuntimeError("a spinning process did not start within 60 s")
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        stop.wait(seconds)
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        spin_stop.set()
        for t in threads:
            if t.is_alive():
                t.join(60)
        for p in started:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a probe thread did not stop within 60 s (an update that never returns)")
    late.sort()

    def q(f: float) -> float:
        return late[min(len(late) - 1, int(f * len(late)))] if late else float("nan")

    return {"wakes": len(late), "late_mean_us": statistics.fmean(late) if late else float("nan"),
            "late_median_us": q(0.5), "late_p90_us": q(0.9), "late_p99_us": q(0.99),
            "learner_updates_per_s": updates[0] / wall if busy else float("nan"),
            "second_learner_updates_per_s": second[0] / wall if wake == "learner" else float("nan")}


def measure(seconds: float = 4.0, rounds: int = 3, progress=print):
    """Every condition of ``CONDITIONS``, ``seconds`` each, in ``rounds`` rounds: one row per condition and
    round (a pandas DataFrame)."""
    import pandas as pd

    update, second = learner_update(), learner_update()
    rows = []
    for r in range(rounds):
        for k, (name, busy, spin_others, wake) in enumerate(CONDITIONS, 1):
            where = "every core busy" if spin_others else "other cores idle"
            progress(f"[gil wake round {r + 1}/{rounds}, {k}/{len(CONDITIONS)}] {name}, {where} ...")
            rows.append({"round": r, "condition": name, "cores": where, "wake": wake or "",
                         **one_condition(update, seconds, busy, spin_others, wake,
                                         second if wake == "learner" else None)})
    return pd.DataFrame(rows)


def output_target(ap: argparse.ArgumentParser, out: Path, name: str) -> Path:
    """``out / name`` for a probe's CSV, checked before anything is measured (``ap.error`` otherwise, creating
    nothing): ``out`` a folder, or a path whose nearest existing folder takes a new file (tried, not assumed: root
    passes any permission check); no folder or link where the CSV or its ``.meta.json`` goes. ``write_csv`` makes
    the missing folders when it writes."""
    from pal_bench.argtypes import printable
    from pal_bench.conditions import meta_path

    shown = printable(str(out))
    target = out / name
    if os.path.lexists(out) and not out.exists():
        ap.error(f"--out {shown}: a link to nothing")
    if out.exists() and not out.is_dir():
        ap.error(f"--out {shown}: not a folder")
    for path in (target, meta_path(target)):
        if os.path.lexists(path) and (path.is_dir() or path.is_symlink()):
            ap.error(f"{printable(str(path))}: a folder or a link is there; a measurement writes a plain file")
    existing = out.absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        ap.error(f"--out {shown}: {printable(str(existing))} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        ap.error(f"--out {shown}: {printable(str(existing))} is not writable ({e.strerror or e})")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.simulate.gil_wake", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=number(Range(0.1, 600), float), default=4.0,
                    help="seconds per condition (default 4)")
    ap.add_argument("--rounds", type=number(Range(1, 100)), default=3, help="rounds of every condition (default 3)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for simulation_gil_wake.csv")
    ap.add_argument("--force", action="store_true", help="measure on a busy machine too (marked noisy)")
    args = ap.parse_args(argv)
    target = output_target(ap, args.out, FILE)
    return measure_and_write("gil_wake", "GIL wake-up probe", target, args.force, argv,
                             lambda: measure(args.seconds, args.rounds))


def measure_and_write(module: str, what: str, target: Path, force: bool, argv: list[str] | None, measure_rows,
                      float_format: str = "{:,.1f}") -> int:
    """A probe's measurement (``measure_rows()``, a DataFrame) on a quiet machine (``force``: anyway, marked noisy;
    1 when refused), under its ``Conditions``, written to ``target`` with its ``.meta.json`` and printed; 0 when
    written. ``module``: the probe's module under ``pal_bench.studies.simulate``, for the recorded command."""
    from pal_bench.conditions import Conditions, refuse_if_busy
    from pal_bench.studies.simulate.stored import write_csv

    if refuse_if_busy(what, force):
        return 1
    command = " ".join([f"python -m pal_bench.studies.simulate.{module}", *(argv if argv is not None else
                                                                          sys.argv[1:])])
    with Conditions(f"{what} (simulation, issue 50)", command=command) as c:
        df = measure_rows()
    path = write_csv(df, target, c)
    print(df.to_string(index=False, float_format=float_format.format))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
