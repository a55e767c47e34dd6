"""The costs that grow with workers, as the model's inputs: from the scaling study's worker-cost tables
(``pal-bench scaling --reservation-cost``: ``results/reservation_cost.csv``, ``pump_cost.csv``) a linear fit in the
number of actors (queues), the Ray buffer actor's floor per row from the two-node study's measured sink ceiling
(``design.inserter_inputs``), and Ray's own busy cores when nothing is asked of it (``ray_idle``:
``ray_idle_cores``). Each is an input of the model; a table not stored leaves its inputs at 0 (not modelled; Ray's
idle cores: the chosen ``calibrate.BACKGROUND_CORES``), which ``stored_costs`` reports."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import numpy as np

from pal_bench.argtypes import WORKERS, Range, UsageError
from pal_bench.stored_tables import Column, read_table

MAX_COST_US = 1e4      # one reservation, pump poll or row: measured 0.4-40 µs; 10 ms is far past any machine
US = Range(0, MAX_COST_US)
RESERVATION_COLUMNS = {"actors": Column(int, WORKERS), "us_per_reservation": Column(float, US)}
PUMP_COLUMNS = {"queues": Column(int, WORKERS), "us_per_poll": Column(float, US)}
RAY_IDLE_COLUMNS = {"round": Column(int, Range(0, 10**6)),
                    "condition": Column(str, choices=("machine", "session", "learners")),
                    "learners": Column(int, Range(0, 4096)), "seconds": Column(float, Range(0, 10**5, lo_open=True)),
                    "busy_cores": Column(float, Range(0, 4096))}
RAY_IDLE = "simulation_ray_idle.csv"          # ``python -m pal_bench.studies.simulate.ray_idle``
MAX_IDLE_ROWS = 10_000       # rows of a stored idle measurement read back (--rounds 100: a few hundred)
FILES = ("reservation_cost.csv", "pump_cost.csv", "end_to_end_ray_two_nodes.csv", RAY_IDLE)


def linear(x, y) -> tuple[float, float]:
    """Least-squares intercept and slope of ``y`` over ``x``, both at least 0 (one point: flat)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return max(0.0, float(np.mean(y))), 0.0
    slope, icpt = (float(v) for v in np.polyfit(x, y, 1))
    if slope < 0:                                   # falling with more workers: flat at the mean
        slope, icpt = 0.0, float(np.mean(y))
    return max(0.0, icpt), slope


def _bounded(a: float, b: float, what: str, label: str) -> tuple[float, float]:
    """The fitted line must stay under ``MAX_COST_US`` up to 4096 workers (else a simulation would crawl)."""
    if a + b * WORKERS.hi > MAX_COST_US:
        raise UsageError(f"{label}: {what} reaches {a + b * WORKERS.hi:.3g} µs at {WORKERS.hi:.0f} workers; at most "
                         f"{MAX_COST_US:.0f} µs is read as a cost")
    return a, b


def reservation_inputs(df, label: str = "reservation_cost.csv") -> dict:
    a, b = _bounded(*linear(df.actors, df.us_per_reservation), "a reservation", label)
    return {"reserve_us": a, "reserve_us_per_actor": b}


def pump_inputs(df, label: str = "pump_cost.csv") -> dict:
    a, b = _bounded(*linear(df.queues, df.us_per_poll), "a pump poll", label)
    return {"pump_poll_us": a, "pump_poll_us_per_queue": b}


def stored_costs(results: Path) -> dict:
    """The model's inputs from the stored worker-cost tables (each file checked; a file not stored: its inputs
    left out)."""
    from pal_bench.studies.simulate.design import inserter_inputs

    out: dict = {}
    if os.path.lexists(path := results / "reservation_cost.csv"):
        out |= reservation_inputs(read_table(path, RESERVATION_COLUMNS, "the reservation-cost table", min_rows=1),
                                  str(path))
    if os.path.lexists(path := results / "pump_cost.csv"):
        out |= pump_inputs(read_table(path, PUMP_COLUMNS, "the pump-cost table", min_rows=1), str(path))
    if row_us := inserter_inputs(results).get("inserter_row_us"):
        if row_us > MAX_COST_US:
            raise UsageError(f"{results / 'end_to_end_ray_two_nodes.csv'}: a sink ceiling of {1e6 / row_us:.3g} "
                             f"rows/s ({row_us:.3g} µs a row); at most {MAX_COST_US:.0f} µs a row is read")
        out["buffer_actor_row_us"] = row_us
    if os.path.lexists(path := results / RAY_IDLE):
        df = read_table(path, RAY_IDLE_COLUMNS, "Ray's idle CPU as `python -m pal_bench.studies.simulate.ray_idle` "
                        "writes it", min_rows=1)
        if len(df) > MAX_IDLE_ROWS:
            raise UsageError(f"{path}: {len(df)} rows, at most {MAX_IDLE_ROWS} are read")
        try:
            check_idle_rows(df)
            out["ray_idle_cores"] = idle_cores(df)
            out["ray_session_idle_cores"] = idle_cores(df, "session")
        except ValueError as e:
            raise UsageError(f"{path}: {e}") from None
    return out


def measure_here(progress=print) -> dict:
    """The same inputs measured on this machine (``--check-here``; a few seconds): reservations at 1, 16 and 64
    actors, pump polls at 1, 16 and 64 queues (Ray's idle CPU: ``ray_idle``, which ``--check-here`` runs itself)."""
    from pal_bench.studies.scaling.worker_costs import pump_cost, reservation_cost

    res = reservation_cost([1, 16, 64], rounds=5_000, repeats=3, seconds=0.2, progress=progress)
    pump = pump_cost([1, 16, 64], rounds=5_000, repeats=3, progress=progress)
    return reservation_inputs(res) | pump_inputs(pump)


def check_idle_rows(df) -> None:
    """A stored measurement's rows agree with themselves: ``learners`` is 0 exactly where the condition is not
    "learners", and no (round, condition, learners) appears twice; ``ValueError`` naming the row otherwise."""
    for i, r in enumerate(df.itertuples(), 1):
        if (r.condition == "learners") != (r.learners > 0):
            raise ValueError(f"row {i}: condition {r.condition!r} with {r.learners} learners (learners: 1 or more; "
                             "machine and session: 0)")
    dup = df.duplicated(["round", "condition", "learners"])
    if dup.any():
        i = int(dup.to_numpy().argmax()) + 1
        raise ValueError(f"row {i}: round {df['round'].iloc[i - 1]}, {df.condition.iloc[i - 1]} measured twice")


def idle_cores(df, condition: str = "learners") -> float:
    """Ray's own busy cores: per round ``condition`` ("learners": one learner's processes up, the inputs' per-update
    configuration; "session": the session alone) less the machine alone, the median over rounds (at least 0)."""
    alone = df[df.condition == "machine"].set_index("round").busy_cores
    mine = df[(df.condition == condition) & (df.learners == (1 if condition == "learners" else 0))]
    per_round = (mine.set_index("round").busy_cores - alone).dropna()
    if per_round.empty:
        raise ValueError(f"no round with both the machine alone and the {condition} condition"
                         + (" at one learner" if condition == "learners" else ""))
    return max(0.0, float(statistics.median(per_round.tolist())))
