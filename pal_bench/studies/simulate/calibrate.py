"""From measured inputs to the model's ``Inputs`` for a backend, and the one fit the model makes: per backend, the
actor phases and the learner phases each scaled so that the model's one-worker f_a and f_l equal the measured
one-worker points (``fit``). Everything else (two workers, every split, other core counts) is predicted.

The inputs file (``results/simulation_inputs.csv``, one row per measurement round) holds flat columns:
``threads.act_us`` / ``processes.act_us`` ... (actor phases per backend), ``sample_us`` ... (learner phases),
``insert_lock_us`` ..., ``publish_us``, ``pull_us``, ``mem_bw_core``, ``mem_bw_total``, ``gil.act`` ...,
``gil_handoff.act`` ..., ``ray_call_us``, ``ray_call_cpu_us``, ``ray.learner_remote_us`` ... ``INPUT_COLUMNS`` says what
each must hold (``read_inputs`` checks a stored file against it before anything is simulated).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pal_bench.argtypes import NONNEG, WORKERS, Range
from pal_bench.stored_tables import Column, read_table
from pal_bench.studies.simulate.model import CHUNK, MAX_CALL_US, Inputs, Workload, throughput

ACTOR_PHASES = ("act_us", "env_us", "insert_us", "insert_call_us")
LEARNER_PHASES = ("sample_us", "grad_us", "prio_us", "apply_us")

# the cores Ray's own processes (raylet, GCS, the Ray threads of the driver and the actor processes) keep busy while
# a run goes, by backend: measured (``ray_idle``, the stored ``ray_idle_cores``) where stored, else this assumption
BACKGROUND_CORES = {"threads": 0.0, "processes": 0.0, "learner-processes": 0.0, "learner-allreduce": 0.0,
                    "ray-node": 0.1, "ray": 0.1}
RAY_BACKENDS = ("ray", "ray-node")


# the costs that grow with workers (``costs.stored_costs``: from the worker-cost tables, not the inputs file)
COST_INPUTS = ("reserve_us", "reserve_us_per_actor", "pump_poll_us", "pump_poll_us_per_queue", "buffer_actor_row_us")

# what each stored input may hold: a cost (µs per call) at most MAX_CALL_US (10 s; the measured ones are 0.01 µs to
# 8 ms), a phase every env step or update pays at least 1 ns (the model's time must move), shares in [0, 1]; the
# columns later rounds added are optional (an empty cell or no column: not measured then)
COST = Range(0, MAX_CALL_US)
PHASE = Range(1e-3, MAX_CALL_US)
SHARE = Range(0, 1)
RATE = Range(0, 1e9)                          # calls per second (one-worker f_a, f_l: a few thousand)
MEM_BW = Range(1e9, 1e14)                     # bytes/s copied: 1 GB/s to 100 TB/s (measured: about 15 GB/s)
_ACTOR = ("act_us", "env_us", "insert_us")
INPUT_COLUMNS: dict[str, Column] = {
    "round": Column(int, NONNEG, required=False), "cores": Column(int, WORKERS),
    **{f"{b}.{k}": Column(float, PHASE) for b in ("threads", "processes") for k in _ACTOR},
    **{f"{b}.insert_call_us": Column(float, COST, required=False) for b in ("threads", "processes")},
    **{f"{b}.f_a_1": Column(float, RATE, required=False) for b in ("threads", "processes")},
    **{k: Column(float, PHASE) for k in ("sample_us", "grad_us", "prio_us", "apply_us", "publish_us", "pull_us")},
    **{k: Column(float, COST) for k in ("insert_lock_us", "sample_lock_us", "prio_lock_us")},
    **{k: Column(float, COST, required=False) for k in (
        "insert_lock_call_us", "snapshot_load_us", "ps_grad_us", "ray_call_us", "ray_call_cpu_us",
        "ray.learner_remote_us", "ray.learner_remote_cpu_us", "lp.process_us", "lp.handoff_us", "lp.driver_us")},
    **{k: Column(float, RATE, required=False) for k in ("f_l_1", "lp.f_l_1", "ray.f_l_1")},
    **{k: Column(float, Range(0, 1e4), required=False) for k in COST_INPUTS},     # (costs.MAX_COST_US)
    "weight_bytes": Column(int, Range(1, 10**9)),          # online + target networks: at most 1 GB (measured 139 kB)
    "mem_bw_total": Column(float, MEM_BW), "mem_bw_core": Column(float, MEM_BW, required=False),
    "corun_slowdown": Column(float, Range(0, 0.9), required=False),
    **{f"gil.{p}": Column(float, SHARE) for p in ("act", "env", "sample", "grad", "apply")},
    **{f"gil.{p}": Column(float, SHARE, required=False) for p in ("insert", "load")},
    **{f"gil_handoff.{p}": Column(float, COST, required=False) for p in ("act", "env", "insert", "sample", "grad",
                                                                         "apply", "load")},
    **{f"speedup2.{p}": Column(float, Range(0, 64), required=False) for p in ("act", "env", "insert", "sample",
                                                                                "grad", "apply", "load")},
}


def read_inputs(path: Path) -> pd.DataFrame:
    """The measured rounds stored at ``path`` (``simulation_inputs.csv``), every column checked against
    ``INPUT_COLUMNS``: a ``UsageError`` naming the file, column, row and value otherwise."""
    return read_table(path, INPUT_COLUMNS, "the inputs `pal-bench simulate --measure-inputs` writes", min_rows=1)


def inputs_for(row: dict | pd.Series, backend: str) -> Inputs:
    """The model's ``Inputs`` for ``backend`` from one round of measured inputs (``inputs.measure``)."""
    actor = "threads" if backend == "threads" else "processes"
    lock = {"insert_lock_us": row["insert_lock_us"], "sample_lock_us": row["sample_lock_us"],
            "prio_lock_us": row["prio_lock_us"]}
    # (older rounds did not probe the insert: all of it under the GIL)
    gil = {"act": row["gil.act"], "env": row["gil.env"], "insert": _number(row.get("gil.insert"), 1.0),
           "sample": row["gil.sample"], "grad": row["gil.grad"], "prio": row["gil.sample"],
           "apply": row["gil.apply"], "copy": 0.0, "load": _number(row.get("gil.load"))}
    handoff = {p: _number(row.get(f"gil_handoff.{p}")) for p in ("act", "env", "insert", "sample", "grad", "apply",
                                                                 "load")}
    handoff["prio"] = handoff["sample"]
    # Ray's idle CPU, where measured (``ray_idle``): the background of the Ray backends, and out of the per-call and
    # per-update CPU the inputs measured as the whole machine's, the idle CPU that ran through the call's round trip
    # (a session with one actor up: the session's idle) or the update's wall (the learner's processes up: 1e6 /
    # ray.f_l_1 µs, the wall the inputs divided by)
    idle = _number(row.get("ray_idle_cores"), float("nan"))
    measured_idle = bool(pd.notna(idle))
    background = idle if measured_idle and backend in RAY_BACKENDS else BACKGROUND_CORES[backend]
    call_us, call_cpu_us = _number(row.get("ray_call_us")), _number(row.get("ray_call_cpu_us"))
    remote_us, remote_cpu_us = _number(row.get("ray.learner_remote_us")), _number(row.get("ray.learner_remote_cpu_us"))
    if measured_idle:
        session = _number(row.get("ray_session_idle_cores"), idle)
        f_l_1 = _number(row.get("ray.f_l_1"))
        wall_us = 1e6 / f_l_1 if f_l_1 > 0 else remote_us + row["sample_us"] + row["grad_us"] + row["prio_us"]
        call_cpu_us = max(0.0, call_cpu_us - session * call_us)
        remote_cpu_us = max(0.0, remote_cpu_us - idle * wall_us)
    return Inputs(
        act_us=row[f"{actor}.act_us"], env_us=row[f"{actor}.env_us"],
        insert_us=max(row[f"{actor}.insert_us"], lock["insert_lock_us"]),
        sample_us=max(row["sample_us"], lock["sample_lock_us"]), grad_us=row["grad_us"],
        prio_us=max(row["prio_us"], lock["prio_lock_us"]), apply_us=row["apply_us"],
        weight_bytes=int(row["weight_bytes"]), publish_us=row["publish_us"], pull_us=row["pull_us"],
        snapshot_load_us=_number(row.get("snapshot_load_us")),
        mem_bw_total=row["mem_bw_total"],
        ray_call_us=call_us, ray_call_cpu_us=call_cpu_us,
        ray_learner_remote_us=remote_us, ray_learner_remote_cpu_us=remote_cpu_us, gil=gil,
        lp_handoff_us=_number(row.get("lp.handoff_us")), lp_process_us=_number(row.get("lp.process_us")),
        lp_driver_us=_number(row.get("lp.driver_us")),
        ps_grad_us=_number(row.get("ps_grad_us")),
        insert_call_us=_number(row.get(f"{actor}.insert_call_us")),
        insert_lock_call_us=_number(row.get("insert_lock_call_us")),
        gil_handoff=handoff, background_cores=background,
        corun_slowdown=_number(row.get("corun_slowdown")),
        **{k: _number(row.get(k)) for k in COST_INPUTS}, **lock)


def _number(value, default: float = 0.0) -> float:
    """A stored input that older rounds may lack (None or NaN there): ``default``."""
    return default if value is None or pd.isna(value) else float(value)


def median_inputs(rounds: pd.DataFrame) -> dict:
    """Each input's median over the measured rounds."""
    return rounds.drop(columns=[c for c in ("round",) if c in rounds]).median(numeric_only=True).to_dict()


def resample(rounds: pd.DataFrame, rng: np.random.Generator) -> dict:
    """One bootstrap draw of the inputs: each input from a round drawn on its own."""
    picks = rng.integers(0, len(rounds), size=len(rounds.columns))
    return {c: rounds[c].iloc[i] for c, i in zip(rounds.columns, picks)}


def _scale(inp: Inputs, names: tuple[str, ...], k: float) -> Inputs:
    return replace(inp, **{n: getattr(inp, n) * k for n in names})


def fit(inp: Inputs, backend: str, f_a1: float | None, f_l1: float | None, cores: int,
        learning: dict | None = None) -> tuple[Inputs, dict]:
    """Scale the actor phases so that the model's f_a(1) is ``f_a1`` and the learner phases so that its f_l(1) is
    ``f_l1`` (Ray actors: the learner's remote wait and its CPU instead; either None: left as measured). Returns the
    fitted inputs and the two factors (Ray's learner factor: the remote wait's). Three passes of the fixed point (the
    model is near-linear in each side's cost at one worker)."""
    factors = {"actor": 1.0, "learner": 1.0}
    for _ in range(3):
        if f_a1:
            got = throughput(inp, Workload(backend, cores, 1, 1, "f_a", steps=4_000 + 4 * CHUNK[backend],
                                           chunk=CHUNK[backend], **(learning or {})))
            k = got / f_a1
            inp, factors["actor"] = _scale(inp, ACTOR_PHASES, k), factors["actor"] * k
        if f_l1:
            got = throughput(inp, Workload(backend, cores, 1, 1, "f_l", updates=400, chunk=CHUNK[backend],
                                           **(learning or {})))
            if backend == "ray":
                # a Ray learner's extra time is its calls' remote wait: the fit moves that wait (and the CPU behind
                # it in proportion), not the learner's own work
                old = inp.ray_learner_remote_us
                new = max(0.0, old + (1 / f_l1 - 1 / got) * 1e6)
                k = new / old if old else 1.0
                factors["learner"] *= k
                inp = replace(inp, ray_learner_remote_us=new,
                              ray_learner_remote_cpu_us=inp.ray_learner_remote_cpu_us * k)
            else:
                k = got / f_l1
                inp, factors["learner"] = _scale(inp, LEARNER_PHASES, k), factors["learner"] * k
    return inp, factors
