"""The trainer's per-step costs that could grow with the number of workers, timed with many workers registered
(``pal-bench scaling --reservation-cost --actors 1,16,64,256 --out DIR``):

- ``DIR/reservation_cost.csv``: one step reservation (``processes.shared.reserve_steps``, what every actor process
  and the ray-node inserter call per vector step) and one insert count, in a real shared control block with
  ``actors`` actors' counters, uncontended (µs, median of ``repeats`` blocks of ``rounds`` calls); beside it, the
  reservation as it was before issue 49 (``us_summing_all``: the rule over the sum of every actor's counter, under
  the same lock), and a contended figure: reservations/s of two processes reserving at once for ``seconds``;
- ``DIR/pump_cost.csv``: one poll of the driver's message pump (``processes.mail.Mailboxes``: the queues with
  something in them) with ``queues`` actor queues and none waiting (µs), beside a poll that tries every queue
  (``us_drain_every_queue``: the pump before issue 49).

These are single-core costs on this machine; the figure that matters at scale is how they change with the number
of actors (the acceptance: 256 actors within 1.5x of 1)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from functools import partial
from pathlib import Path

import pandas as pd

from pal_bench._segment import SharedControl
from pal_bench.bench.publishing import store
from pal_bench.train.backends.processes.mail import Mailboxes
from pal_bench.train.backends.processes.shared import (
    HEADER,
    PAUSED,
    STARTED,
    count_inserted,
    read_messages,
    reserve_steps,
    reserved_slot,
)
from pal_bench.train.rate_policy import RatePolicy

PUMP_QUEUES = (1, 16, 64)   # actor queues of the pump's poll (two descriptors each: far inside any file limit)
UNBOUNDED = RatePolicy(updates_per_step=1.0, learning_starts=0, total_steps=2**62, slack=2**62)


def _block(actors: int) -> SharedControl:
    return SharedControl.create(f"pal_cost_{os.getpid()}_{actors}", HEADER + 2 * actors)


def _per_call_us(fn, rounds: int, repeats: int) -> float:
    """Median over ``repeats`` blocks of the µs per call of ``fn()`` (``rounds`` calls a block, after a warm-up)."""
    for _ in range(min(rounds, 1_000)):
        fn()
    blocks = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        blocks.append((time.perf_counter() - t0) / rounds * 1e6)
    return statistics.median(blocks)


def _reserve_summing_all(c, lock, actor: int, n_actors: int, policy: RatePolicy, n: int) -> int:
    """The reservation before issue 49 (kept here as the baseline it is measured against): the rule over the sum
    of every actor's reserved counter, read under the lock."""
    with lock:
        reserved = sum(int(c[reserved_slot(a)]) for a in range(n_actors))
        ok = not policy.budget_spent(reserved) and not c[PAUSED] and policy.actor_may_step(reserved, int(c[STARTED]))
        if ok:
            c[reserved_slot(actor)] += n
    return reserved


def _reserving(name: str, actor: int, go, seconds: float, out) -> None:
    """(a spawned process) Reserve as fast as it can for ``seconds`` once ``go`` is set; put the count."""
    block = SharedControl.attach(name)
    try:
        c, lock = block.words, block.lock
        go.wait(30)
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(100):
                reserve_steps(c, lock, actor, UNBOUNDED, 1)
            n += 100
        out.put(n)
    finally:
        block.close()


def contended_per_s(actors: int, seconds: float, processes: int = 2) -> float:
    """Reservations/s of ``processes`` processes reserving at once in a block with ``actors`` actors."""
    ctx = mp.get_context("spawn")
    block = _block(actors)
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_reserving, args=(block.shared_name, a % actors, go, seconds, out), daemon=True)
             for a in range(processes)]
    try:
        for p in procs:
            p.start()
        time.sleep(0.2)
        go.set()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        return total / seconds
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(1)
        block.close()


def _reservation_row(actors: int, rounds: int, repeats: int) -> dict:
    block = _block(actors)
    try:
        c, lock = block.words, block.lock
        last = actors - 1                          # the last actor's counter: as far from the header as it gets
        return {"actors": actors,
                "us_per_reservation": _per_call_us(partial(reserve_steps, c, lock, last, UNBOUNDED, 1), rounds,
                                                   repeats),
                "us_per_insert": _per_call_us(partial(count_inserted, c, lock, last, 1), rounds, repeats),
                "us_summing_all": _per_call_us(partial(_reserve_summing_all, c, lock, last, actors, UNBOUNDED, 1),
                                               rounds, repeats),
                "rounds": rounds, "repeats": repeats}
    finally:
        block.close()


def reservation_cost(actors_list: list[int], rounds: int, repeats: int, seconds: float,
                     progress=print) -> pd.DataFrame:
    """``reservation_cost.csv``'s rows, one per actor count (see the module's docstring)."""
    rows = []
    for actors in actors_list:
        row = _reservation_row(actors, rounds, repeats)
        row["contended_per_s"] = contended_per_s(actors, seconds)
        rows.append(row)
        progress(f"[reservation-cost actors={actors}] {row['us_per_reservation']:.2f} µs per reservation "
                 f"(summing every actor: {row['us_summing_all']:.2f} µs); two processes at once: "
                 f"{row['contended_per_s']:,.0f} reservations/s")
    return pd.DataFrame(rows)


def _drain(queues: list, which) -> None:
    for i in which:
        for _ in read_messages(queues[i]):
            pass


def _poll_ready(mail: Mailboxes, queues: list) -> None:
    _drain(queues, mail.ready())


def _pump_row(n: int, rounds: int, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(n)]
    mail = Mailboxes()
    try:
        for i, q in enumerate(queues):
            mail.watch(i, q)
        return {"queues": n, "us_per_poll": _per_call_us(partial(_poll_ready, mail, queues), rounds, repeats),
                "us_drain_every_queue": _per_call_us(partial(_drain, queues, range(n)), max(1, rounds // 10),
                                                     repeats),
                "rounds": rounds, "repeats": repeats}
    finally:
        mail.close()
        for q in queues:
            q.close()


def pump_cost(queues_list: list[int], rounds: int, repeats: int, progress=print) -> pd.DataFrame:
    """One idle poll of the driver's pump with that many actor queues (``multiprocessing`` queues, as the process
    backend's), through ``Mailboxes`` and by trying every queue."""
    rows = []
    for n in queues_list:
        rows.append(_pump_row(n, rounds, repeats))
        progress(f"[pump-cost queues={n}] {rows[-1]['us_per_poll']:.2f} µs per idle poll (trying every queue: "
                 f"{rows[-1]['us_drain_every_queue']:.2f} µs)")
    return pd.DataFrame(rows)


def write(out: Path, actors_list: list[int], rounds: int, repeats: int, seconds: float, measured,
          progress=print) -> list[Path]:
    """Both tables into ``out`` (with the run's conditions beside each); the paths written."""
    res = reservation_cost(actors_list, rounds, repeats, seconds, progress)
    pump = pump_cost([q for q in PUMP_QUEUES if q <= max(actors_list)] or [1], rounds, repeats, progress)
    measured.finish()
    paths = []
    for name, df in (("reservation_cost.csv", res), ("pump_cost.csv", pump)):
        paths.append(store(df, out / name, measured, float_format="%.3f"))
        print(df.to_string(index=False))
    return paths
