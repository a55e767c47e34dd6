"""Where the process backend's end-to-end rate goes with its actor process beside the driver's learner (issue 50's
probe of the model's largest misses: the end-to-end splits of the in-process backends with an actor process,
+33% to +93% in the development set; docs/simulation.md). ``--backend ray-node`` measures the same for Ray's
one-node placement (the process trainer whose actor process Ray starts: ``RayNodeTrainer``), whose async splits
are the development set's largest misses with no more workers than cores.

Measures, interleaved in each round (the order rotated round by round), DQN on CartPole-v1:

- the one-worker rates the model is fitted to (the scaling study's): f_a(1), one actor process collecting without
  learning (transitions/s), and f_l(1), one learner thread of the driver on a filled buffer (updates/s);
- the whole trainer at the split 1 + 1 (one actor process, one learner thread of the driver; ``steps``
  transitions after learning starts, as the scaling study's end-to-end points), sync and async aggregation, placed
  three ways: ``free`` (the operating system places the driver's threads and the actor process, as the scaling study
  ran), ``apart`` (the driver pinned to one CPU, the actor process to another: the model's picture) and ``together``
  (everything on one CPU: one core's worth). Ray's own processes (its raylet, GCS and idle workers: 0.03 core idle,
  ``ray_idle``) start from the driver once it is placed and keep its CPUs.

Per trainer run, from the moment every actor process is set up (the trainer's clock) to the end of its workers (every
thread joined and the actor process reaped; before the logs and the final checkpoint): transitions/s and
updates/s (the trainer's summary), the CPU cores kept busy by the driver (all its threads) and by the actor process
(CPU seconds per wall second, ``getrusage`` and ``/proc``; a Ray actor process, not this process's child, from its
``/proc`` at both ends), their involuntary context switches per second (a thread
taken off its CPU for another), each CPU's busy and stolen share (``/proc/stat``: steal is time the hypervisor gave to
another guest; whether the two CPUs are threads of one core), the CPUs each side may use, the actor's restarts, the
actor's phases in µs per env step and the learner's in µs per
update (the phase timers are wall time: a phase includes its waits for the CPU and the GIL).

``python -m pal_bench.studies.simulate.end_to_end_parts [--backend processes|ray-node] [--steps N] [--updates N]
[--rounds N] [--out DIR] [--force]`` writes ``DIR/simulation_end_to_end_parts.csv`` (``ray-node``:
``simulation_end_to_end_parts_ray_node.csv``; one row per condition and round) with its ``.meta.json``, only on a
quiet machine (``--force``: anyway, marked noisy). ``--model`` measures nothing: it sets each stored round's trainer
runs against the model fitted to that round's f_a(1) and f_l(1) (``against_the_model``) and prints the errors.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from pal_bench.argtypes import Range, number
from pal_bench.paths import RESULTS

FILE = "simulation_end_to_end_parts.csv"
BACKEND = "processes"
FILES = {"processes": FILE, "ray-node": "simulation_end_to_end_parts_ray_node.csv"}     # backend -> its stored file
PLACEMENTS = ("free", "apart", "together")
AGGREGATIONS = ("sync", "async")
ONE_WORKER = ("f_a(1)", "f_l(1)")
TRAINER_CONDITIONS = {f"1 + 1 {agg}, {place}": (agg, place) for agg in AGGREGATIONS for place in PLACEMENTS}


def cpu_times() -> dict[int, tuple[int, int, int]]:
    """{cpu: (busy, stolen, total) clock ticks since boot} from ``/proc/stat`` (busy: user, nice, system, irq,
    softirq; total: those, idle, iowait and steal); empty where it cannot be read."""
    out = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or len(fields) < 8:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
        busy = user + nice + system + irq + softirq
        out[int(name[3:])] = (busy, steal, busy + idle + iowait + steal)
    return out


def _tids(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir() if t.name.isdigit()]
    except OSError:
        return []


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` (and what they start afterwards) onto ``cpus``; a thread that ended since it
    was listed is skipped, any other refusal (a CPU this process may not use) raises ``OSError``."""
    for tid in _tids(pid):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def masks(pid: int) -> dict[int, set[int]]:
    """{thread id: the CPUs it may use} for every live thread of ``pid``."""
    out = {}
    for tid in _tids(pid):
        with contextlib.suppress(ProcessLookupError):
            out[tid] = os.sched_getaffinity(tid)
    return out


def restore(pid: int, saved: dict[int, set[int]], default: set[int]) -> None:
    """Give every live thread of ``pid`` its mask in ``saved`` (one started since: ``default``) and check that each
    holds it (``RuntimeError`` naming the thread otherwise: a probe must not leave its driver pinned)."""
    for tid in _tids(pid):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, saved.get(tid, default))
    wrong = {tid: m for tid, m in masks(pid).items() if m != saved.get(tid, default)}
    if wrong:
        raise RuntimeError(f"could not restore the CPUs of thread(s) {sorted(wrong)} of process {pid}")


def allowed(pid: int) -> str:
    """The CPUs some thread of ``pid`` may use, as a sorted space-separated list ('' when it cannot be read)."""
    seen: set[int] = set()
    for tid in _tids(pid):
        with contextlib.suppress(OSError):
            seen |= os.sched_getaffinity(tid)
    return " ".join(map(str, sorted(seen)))


def _process_cpu(pid: int) -> tuple[float, int]:
    """(CPU seconds of all its threads, involuntary context switches summed over its live threads) of a live process
    (``/proc``; NaN and 0 when it cannot be read or has ended: a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan"), 0
    if fields[0] in ("Z", "X"):
        return float("nan"), 0
    switches = 0
    for tid in _tids(pid):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        switches += next((int(line.split()[1]) for line in status.splitlines()
                          if line.startswith("nonvoluntary_ctxt_switches")), 0)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), switches


def same_core(a: int, b: int) -> bool | None:
    """Whether CPUs ``a`` and ``b`` are hardware threads of one core (``/sys``; None where it cannot be read)."""
    try:
        siblings = Path(f"/sys/devices/system/cpu/cpu{a}/topology/thread_siblings_list").read_text()
    except OSError:
        return None
    from pal_bench.argtypes import int_ranges

    try:
        return b in int_ranges(Range(0, 10**6))(siblings.strip())
    except argparse.ArgumentTypeError:
        return None


@dataclasses.dataclass
class Snapshot:
    """What the run's counters read at one moment: wall clock (s), the driver's CPU seconds and involuntary
    switches, the reaped children's, each CPU's ticks (``cpu_times``) and the live actor processes' (pid -> CPU s,
    switches)."""
    wall: float
    driver_cpu: float
    driver_switches: int
    children_cpu: float
    children_switches: int
    cpus: dict
    actors: dict

    @classmethod
    def now(cls, actor_pids=()) -> Snapshot:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(time.perf_counter(), me.ru_utime + me.ru_stime, me.ru_nivcsw, kids.ru_utime + kids.ru_stime,
                   kids.ru_nivcsw, cpu_times(), {p: _process_cpu(p) for p in actor_pids})


def usage(start: Snapshot, end: Snapshot, prefix_cpus=("a", "b"), cpus=(), children: bool = True) -> dict:
    """The run between two snapshots: the driver's and the actor processes' cores and involuntary switches per
    second (the actors' from their own ``/proc`` counters where every one is still running at ``end``, as Ray's are;
    otherwise, where they are this process's ``children``, from the reaped children's totals less what they had
    used at ``start``: they end inside the run; neither: NaN, e.g. a Ray actor process restarted), and the busy and
    stolen share of the CPUs ``cpus`` (named by ``prefix_cpus``: the run's first CPU, its second)."""
    wall = max(end.wall - start.wall, 1e-9)
    actor_cpu_before = sum(c for c, _ in start.actors.values())
    actor_switches_before = sum(s for _, s in start.actors.values())
    live = bool(start.actors) and all(p in end.actors and math.isfinite(end.actors[p][0]) for p in start.actors)
    if live:                                # still running at the end (Ray's): their own counters, both ends
        actor_cpu = sum(end.actors[p][0] for p in start.actors) - actor_cpu_before
        actor_switches = sum(end.actors[p][1] for p in start.actors) - actor_switches_before
    elif children:                          # reaped by the end (this process's children): the children's totals
        actor_cpu = end.children_cpu - start.children_cpu - actor_cpu_before
        actor_switches = end.children_switches - start.children_switches - actor_switches_before
    else:
        actor_cpu = actor_switches = float("nan")
    row = {"window_s": wall,
           "driver_cores": (end.driver_cpu - start.driver_cpu) / wall,
           "driver_switches_per_s": (end.driver_switches - start.driver_switches) / wall,
           "actor_cores": actor_cpu / wall, "actor_switches_per_s": actor_switches / wall}
    for name, cpu in zip(prefix_cpus, cpus):
        if cpu in start.cpus and cpu in end.cpus:
            busy, steal, total = (e - s for e, s in zip(end.cpus[cpu], start.cpus[cpu]))
            row[f"cpu_{name}_busy"] = busy / total if total else float("nan")
            row[f"cpu_{name}_steal"] = steal / total if total else float("nan")
    return row


def trainer_class(backend: str = BACKEND):
    """The process trainer (``backend`` "ray-node": ``RayNodeTrainer``, its actor processes started by Ray) with
    three seams for this probe: ``actor_cpus`` (pin each actor process as it starts),
    ``at_clock`` (called with the actor processes' pids once they are all set up, as the trainer's clock starts) and
    ``at_end`` (called once every worker is joined, the actor processes reaped, before the logs and the final
    checkpoint)."""
    if backend == "ray-node":
        from pal_bench.train.backends.ray.node import RayNodeTrainer as base
    else:
        from pal_bench.train.backends.processes import ProcessTrainer as base

    class Placed(base):
        actor_cpus: set[int] | None = None
        at_clock = None
        at_end = None

        def _launch(self, i, args):
            p = super()._launch(i, args)
            if self.actor_cpus is not None:
                pin(p.pid, self.actor_cpus)
            return p

        def _wait_ready(self):
            super()._wait_ready()
            if self.at_clock is not None:
                self.at_clock([p.pid for p in self._procs.values()])

        def _join(self):
            try:
                super()._join()
            finally:
                if self.at_end is not None:
                    self.at_end()

    return Placed


def trainer_run(aggregation: str, placement: str, steps: int, cpus: tuple[int, int], cfg=None, trainer=None,
                backend: str = BACKEND) -> dict:
    """One run of ``backend``'s trainer at 1 actor process + 1 learner thread (``aggregation``), placed by
    ``placement`` on ``cpus`` (the driver's CPU, the actor's; ``together``: the actor process pinned to the driver's
    CPU explicitly, as a forked one inherits it; one Ray starts comes from the raylet, which inherits the mask of the
    driver that started it; Ray is told the driver's usable CPUs, so pinned it has 1 logical CPU where free it has
    2): transitions/s, updates/s, ``usage`` from the clock's
    start to the workers' end, the CPUs each side may use (``driver_cpus``, ``actor_cpus``), the actor's restarts
    (its set-up then counts in ``actor_cores``), the actor's phases in µs per env step (``actor.<phase>_us``) and the
    learner's in µs per update (``learner.<phase>_us``). The driver's threads get their CPUs back at the end, on
    error too. ``trainer``: the class to run (default ``trainer_class(backend)``; the tests' seam)."""
    from multiprocessing import resource_tracker

    from pal_bench.studies.scaling.measure import config_for, quiet

    cfg = cfg or config_for(backend)
    ray = backend == "ray-node"
    resource_tracker.ensure_running()            # started unpinned: it outlives this run
    mine = os.getpid()
    default, saved = os.sched_getaffinity(0), masks(mine)
    marks: dict = {}
    try:
        if placement != "free":
            pin(mine, {cpus[0]})
        with tempfile.TemporaryDirectory(prefix="pal-e2e-parts-") as out:
            c = quiet(cfg, out, actors=1, learners=1, aggregation=aggregation, steps=cfg.learning_starts + steps)
            with (trainer or trainer_class(backend))(c) as tr:
                tr.actor_cpus = {"apart": {cpus[1]}, "together": {cpus[0]}}.get(placement)

                def at_clock(pids):
                    marks["start"], marks["pids"] = Snapshot.now(pids), pids
                    marks["driver_cpus"] = allowed(mine)
                    marks["actor_cpus"] = " | ".join(allowed(p) for p in pids)

                tr.at_clock = at_clock
                # (Ray's actor processes run until close; the process backend's are reaped by now, their pids
                # free for reuse: read from the children's totals instead)
                tr.at_end = lambda: marks.setdefault("end", Snapshot.now(marks.get("pids", ()) if ray else ()))
                s = tr.run()
    finally:
        restore(mine, saved, default)
    used = usage(marks["start"], marks["end"], cpus=cpus, children=not ray)   # (Ray starts its actors)
    row = {"steps": steps, "learning_starts": cfg.learning_starts, "transitions_per_s": s["env_steps_per_s"],
           "updates_per_s": s["updates_per_s"], "wall_s": s["wall_s"], **used,
           "driver_cpus": marks["driver_cpus"], "actor_cpus": marks["actor_cpus"],
           "actor_restarts": len(s.get("restarts", [])), "transitions_lost": s.get("transitions_lost", 0)}
    phases = s["phase_seconds"]
    for worker, per in (("actor0", max(1, s["env_steps"])), ("learner0", max(1, s["updates"]))):
        for phase, seconds in sorted(phases.get(worker, {}).items()):
            row[f"{worker[:-1]}.{phase}_us"] = seconds / per * 1e6
    return row


def one_worker(curve: str, steps: int, updates: int, cfg=None, backend: str = BACKEND) -> dict:
    """The scaling study's one-worker point of ``backend``: f_a(1) in transitions/s or f_l(1) in updates/s."""
    from pal_bench.studies.scaling.measure import config_for, measure_fa, measure_fl

    cfg = cfg or config_for(backend)
    if curve == "f_a(1)":
        return {"steps": steps, "transitions_per_s": measure_fa(cfg, 1, steps)}
    return {"updates": updates, "updates_per_s": measure_fl(cfg, 1, updates)}


def two_cpus() -> tuple[int, int]:
    """Two CPUs this process may use, on different cores where it may use two cores (``UsageError`` with fewer
    than two CPUs: ``apart`` needs them)."""
    from pal_bench.argtypes import UsageError

    have = sorted(os.sched_getaffinity(0))
    if len(have) < 2:
        raise UsageError(f"this probe places the actor process apart from the driver: it needs 2 CPUs, this process "
                         f"may use {len(have)}")
    apart = [b for b in have[1:] if same_core(have[0], b) is False]
    return have[0], (apart or have[1:])[0]


def measure(steps: int = 20_000, updates: int = 1_000, rounds: int = 5, progress=print, run=None, single=None,
            backend: str = BACKEND):
    """Every condition of ``backend`` in ``rounds`` rounds, the order rotated each round: one row per condition and
    round (a pandas DataFrame; a condition that fails is recorded with its ``error`` and the others go on). ``run`` /
    ``single``: what measures a trainer condition and a one-worker point (the tests' seam; default ``trainer_run``
    and ``one_worker`` of ``backend``)."""
    import functools

    import pandas as pd

    run = run or functools.partial(trainer_run, backend=backend)
    single = single or functools.partial(one_worker, backend=backend)
    cpus = two_cpus()
    shared_core = same_core(*cpus)
    names = [*ONE_WORKER, *TRAINER_CONDITIONS]
    rows = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k, name in enumerate(order, 1):
            progress(f"[end-to-end parts round {r + 1}/{rounds}, {k}/{len(names)}] {name} ...")
            aggregation, placement = TRAINER_CONDITIONS.get(name, ("", ""))
            try:
                got = run(aggregation, placement, steps, cpus) if placement else single(name, steps, updates)
            except Exception as e:                      # noqa: BLE001 - recorded; the other conditions go on
                got = {"error": f"{type(e).__name__}: {e}"}
                progress(f"  failed: {got['error']}")
            rows.append({"round": r, "backend": backend, "condition": name, "aggregation": aggregation,
                         "placement": placement, "cpu_a": cpus[0], "cpu_b": cpus[1], "same_core": shared_core, **got})
    return pd.DataFrame(rows)


def against_the_model(results: Path = RESULTS, backend: str = BACKEND):
    """``backend``'s stored measurement's trainer runs against the model, round by round: the stored inputs' medians
    (``simulation_inputs.csv`` in ``results``) fitted to the round's f_a(1) and f_l(1) (``calibrate.fit``, as the
    validation fits that backend's points), each run simulated at 1 + 1 with its aggregation and its stored
    ``steps`` on 2 cores (``together``: on 1). Returns (one row per run compared: measured and predicted
    transitions/s and the signed error (predicted - measured) / measured, a pandas DataFrame; the rows left out,
    each with why). A file with a (round, condition) twice is refused (``UsageError`` naming it)."""
    import pandas as pd

    from pal_bench.argtypes import UsageError
    from pal_bench.stored_tables import THROUGHPUT, Column, read_table
    from pal_bench.studies.simulate.calibrate import fit, inputs_for, median_inputs
    from pal_bench.studies.simulate.model import throughput
    from pal_bench.studies.simulate.stored import require_inputs
    from pal_bench.studies.simulate.validate import LEARNING, workload

    columns = {"round": Column(int, Range(0, 1000)),
               "condition": Column(str, choices=(*ONE_WORKER, *TRAINER_CONDITIONS)),
               "backend": Column(str, choices=(backend,), required=False),
               "steps": Column(int, Range(100, 10**7), required=False),
               "transitions_per_s": Column(float, THROUGHPUT, required=False),
               "updates_per_s": Column(float, THROUGHPUT, required=False)}
    path = results / FILES[backend]
    df = read_table(path, columns, what="the end-to-end parts probe's rows")
    for name in ("steps", "transitions_per_s", "updates_per_s"):       # optional: absent reads as not measured
        if name not in df:
            df[name] = float("nan")
    twice = df[df.duplicated(["round", "condition"])]
    if len(twice):
        r = twice.iloc[0]
        raise UsageError(f"{path}: round {r['round']} has {r.condition!r} more than once")
    base = inputs_for(median_inputs(require_inputs(results)), backend)
    out, left_out = [], []
    for r, g in df.groupby("round"):
        fa1 = g[g.condition == "f_a(1)"].transitions_per_s.dropna()
        fl1 = g[g.condition == "f_l(1)"].updates_per_s.dropna()
        runs = g[g.condition.isin(list(TRAINER_CONDITIONS))]
        if fa1.empty or fl1.empty:
            left_out += [(r, name, "no f_a(1) and f_l(1) measured in its round") for name in runs.condition]
            continue
        inp = fit(base, backend, float(fa1.iloc[0]), float(fl1.iloc[0]), 2, LEARNING)[0]
        for run in runs.itertuples():
            if pd.isna(run.transitions_per_s):
                left_out.append((r, run.condition, "no transitions/s (the run failed)"))
                continue
            aggregation, placement = TRAINER_CONDITIONS[run.condition]
            steps = int(run.steps) if pd.notna(run.steps) else 20_000
            point = SimpleNamespace(backend=backend, curve="end_to_end", actors=1, learners=1,
                                    aggregation=aggregation, steps=steps)
            pred = throughput(inp, workload(point, 1 if placement == "together" else 2))
            out.append({"round": r, "condition": run.condition, "measured": run.transitions_per_s,
                        "predicted": pred, "error": (pred - run.transitions_per_s) / run.transitions_per_s})
    return (pd.DataFrame(out, columns=["round", "condition", "measured", "predicted", "error"]),
            pd.DataFrame(left_out, columns=["round", "condition", "why"]))


def main(argv: list[str] | None = None) -> int:
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.gil_wake import measure_and_write, output_target

    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.simulate.end_to_end_parts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=tuple(FILES), default=BACKEND,
                    help="the trainer measured: the process backend's (default) or Ray's one-node placement's")
    ap.add_argument("--steps", type=number(Range(100, 10**7)), default=20_000,
                    help="transitions per trainer run after learning starts, and per f_a(1) run (default 20000)")
    ap.add_argument("--updates", type=number(Range(10, 10**6)), default=1_000,
                    help="updates per f_l(1) run (default 1000)")
    ap.add_argument("--rounds", type=number(Range(1, 100)), default=5, help="rounds of every condition (default 5)")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="folder for simulation_end_to_end_parts.csv (ray-node: ..._ray_node.csv)")
    ap.add_argument("--force", action="store_true", help="measure on a busy machine too (marked noisy)")
    ap.add_argument("--model", action="store_true",
                    help="measure nothing: the stored measurement (in --out) against the model, round by round")
    args = ap.parse_args(argv)
    try:
        if args.model:
            df, left_out = against_the_model(args.out, args.backend)
            if len(df):
                print(df.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
            for name, g in df.groupby("condition", sort=False):
                print(f"{name}: {len(g)} rounds, error {g.error.min():+.1%} to {g.error.max():+.1%}, "
                      f"median {g.error.median():+.1%}")
            for row in left_out.itertuples():
                print(f"left out: round {row.round}, {row.condition}: {row.why}")
            if df.empty:
                print(f"error: no trainer run in {args.out / FILES[args.backend]} could be compared", file=sys.stderr)
                return 2
            return 0
        two_cpus()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target = output_target(ap, args.out, FILES[args.backend])
    return measure_and_write("end_to_end_parts", "end-to-end parts probe", target, args.force, argv,
                             lambda: measure(args.steps, args.updates, args.rounds, backend=args.backend))


if __name__ == "__main__":
    raise SystemExit(main())
