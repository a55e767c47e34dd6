"""What the design does at scale, by simulation: the buffer's one lock at 64 actors against batched inserts, a
sharded buffer and optimistic (seqlock) samplers; the parameter server at 16 learners against all-reduce; and Ray
actors on 1-8 other nodes feeding one inserter. Inputs: the measured rounds (``simulation_inputs.csv``), the
aggregation study's all-reduce times (``aggregation.csv``: latency per ring step and bandwidth, from its two
network sizes at 2 learners) and the two-node study's inserter ceiling (``end_to_end_ray_two_nodes.csv``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import WORKERS, Range
from pal_bench.stored_tables import THROUGHPUT, Column, read_table
from pal_bench.studies.simulate.model import MAX_CALL_US, Inputs, Workload, simulate

NODE_CORES = 16          # cores per node in the multi-node rows (a named assumption: a common cluster node)
AGGREGATION_COLUMNS = {"scheme": Column(str), "learners": Column(int, WORKERS),
                       "params": Column(int, Range(1, 10**12)),
                       "communicate_s": Column(float, Range(0, MAX_CALL_US / 1e6))}
TWO_NODES_COLUMNS = {"placement": Column(str),
                     "rows_per_s": Column(float, THROUGHPUT, required=False, default=float("nan"))}


def allreduce_inputs(results: Path) -> dict:
    """``allreduce_alpha_us`` and ``allreduce_bw`` from the aggregation study's all-reduce at 2 learners (two
    network sizes: the communication time is 2 steps x (alpha + bytes / 2 / bw)); empty when not stored."""
    path = results / "aggregation.csv"
    if not os.path.lexists(path):
        return {}
    a = read_table(path, AGGREGATION_COLUMNS, "the aggregation study's CSV")
    a = a[(a.scheme == "allreduce") & (a.learners == 2)].sort_values("params")
    if len(a) < 2:
        return {}
    small, large = a.iloc[0], a.iloc[-1]
    per_byte = (large.communicate_s - small.communicate_s) / (4 * (large.params - small.params))   # s/byte, 2 steps
    bw = 1 / max(per_byte, 1e-12)          # 2 steps x bytes / 2 = bytes: one byte-time per byte of gradient
    alpha = max(0.0, (small.communicate_s - 4 * small.params / bw) / 2)
    return {"allreduce_alpha_us": alpha * 1e6, "allreduce_bw": bw}


def inserter_inputs(results: Path, chunk: int = 256) -> dict:
    """``inserter_row_us`` (its ceiling with 4 chunks in flight) and ``inserter_call_us`` (a chunk's round trip
    beyond its rows at 1 in flight) from the two-node study; empty when not stored."""
    path = results / "end_to_end_ray_two_nodes.csv"
    if not os.path.lexists(path):
        return {}
    d = read_table(path, TWO_NODES_COLUMNS, "the two-node study's CSV")
    one = d[d.placement == "ceiling, 1 in flight"].rows_per_s.median()
    four = d[d.placement == "ceiling, 4 in flight"].rows_per_s.median()
    if not (one > 0 and four > 0):
        return {}
    row_us = 1e6 / four
    return {"inserter_row_us": row_us, "inserter_call_us": max(0.0, chunk * (1e6 / one - row_us))}


def design_inputs(results: Path) -> dict:
    """The design's inputs beyond the measured rounds, from the stored studies (``allreduce_inputs``,
    ``inserter_inputs``)."""
    return allreduce_inputs(results) | inserter_inputs(results)


def design_at_scale(inp: Inputs, results: Path, progress=print, length: float = 1.0,
                    extra: dict | None = None) -> pd.DataFrame:
    """One row per (question, variant): the simulated throughput and the shared resource held most. ``length``
    scales every simulated run's steps or updates (tests run short ones); ``extra``: ``design_inputs(results)``,
    read already."""
    inp = replace(inp, **(design_inputs(results) if extra is None else extra))
    rows = []

    def run(question: str, variant: str, w: Workload) -> None:
        w = replace(w, steps=max(1_000, int(w.steps * length)), updates=max(100, int(w.updates * length)))
        r = simulate(inp, w)
        top = max(r["busy"].items(), key=lambda kv: kv[1])
        value = r["updates_per_s"] if w.mode == "f_l" else r["env_steps_per_s"]
        rows.append({"question": question, "variant": variant, "backend": w.backend, "cores": w.cores * max(
            1, w.nodes), "actors": w.actors if w.mode != "f_l" else 0, "learners": w.learners if w.mode != "f_a"
            else 0, "mode": w.mode, "throughput": value, "busiest": top[0], "busiest_share": top[1]})
        progress(f"{question} / {variant}: {value:.0f} ({top[0]} held {top[1]:.0%})")

    lock = "the buffer's lock at 64 actors (f_a, actor processes)"
    base = Workload("processes", 64, 64, 1, "f_a", steps=40_000)
    run(lock, "one lock, one row per insert (today's default)", base)
    run(lock, "batched inserts (64 rows per add_batch: local_buffer 64)", replace(base, chunk=64))
    run(lock, "4 shards", replace(base, lock_shards=4))
    run(lock, "16 shards", replace(base, lock_shards=16))
    samplers = "the buffer's lock at 16 learners (f_l, async parameter server)"
    base = Workload("processes", 16, 1, 16, "f_l", updates=3_000, aggregation="async")
    run(samplers, "samples under the lock", base)
    run(samplers, "optimistic samplers (seqlock)", replace(base, seqlock_sampling=True))
    ps = "16 learners: parameter server against all-reduce (f_l)"
    run(ps, "driver's parameter server, sync (learners are the driver's threads)",
        Workload("processes", 16, 1, 16, "f_l", updates=3_000))
    run(ps, "driver's parameter server, sync (learners are processes: learner_processes)",
        Workload("learner-processes", 16, 1, 16, "f_l", updates=3_000))
    run(ps, "all-reduce among learner processes (shared memory; the driver only grants rounds)",
        Workload("learner-allreduce", 16, 1, 16, "f_l", updates=3_000))
    run(ps, "Ray parameter-server actor, sync (learners are processes)",
        Workload("ray", 16, 1, 16, "f_l", updates=3_000))
    run(ps, "Ray all-reduce (gloo; learners are processes)",
        Workload("ray", 16, 1, 16, "f_l", updates=3_000, aggregation="allreduce"))
    nodes = f"Ray actors on other nodes ({NODE_CORES} cores, {NODE_CORES} actors each) through one inserter (f_a)"
    for n in (1, 2, 4, 8):
        run(nodes, f"{n} node(s)", Workload("ray-node", NODE_CORES, NODE_CORES * n, 1, "f_a",
                                            steps=min(20_000 * n, 120_000), chunk=256, nodes=n))
    return pd.DataFrame(rows)


# The cheapest design candidate, measured where it can be: batched inserts are a setting already (``local_buffer``),
# so f_a of two actor processes with one row per insert against 64 rows per insert, on this machine's cores, is
# set beside what the model predicted for the same two workloads.
CANDIDATE = {"one row per insert (local_buffer 1)": 1, "batched inserts (local_buffer 64)": 64}


def candidate_check(inp: Inputs, cfg, rounds: int = 10, steps: int = 20_000, actors: int = 2,
                    progress=print) -> pd.DataFrame:
    """f_a (env steps/s) of ``actors`` actor processes at each ``CANDIDATE`` setting, measured in ``rounds``
    interleaved rounds (the order alternates), with the model's prediction for the same workload on the same cores.
    One row per (round, variant)."""
    from pal_bench.conditions import usable_cores
    from pal_bench.studies.scaling.measure import measure_fa

    cores = usable_cores()
    simulated = {name: simulate(inp, Workload("processes", cores, actors, 1, "f_a", steps=steps, chunk=k))
                 ["env_steps_per_s"] for name, k in CANDIDATE.items()}
    rows = []
    for r in range(rounds):
        names = list(CANDIDATE)[:: 1 if r % 2 == 0 else -1]
        for name in names:
            v = measure_fa(replace(cfg, backend="processes", local_buffer=CANDIDATE[name]), actors, steps)
            rows.append({"round": r, "variant": name, "local_buffer": CANDIDATE[name], "actors": actors,
                         "cores": cores, "measured": v, "simulated": simulated[name]})
            progress(f"[round {r + 1}/{rounds}] {name}: {v:.0f} env steps/s (simulated {simulated[name]:.0f})")
    return pd.DataFrame(rows)
