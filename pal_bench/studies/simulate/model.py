"""A discrete-event model of the trainer (SimPy): actors, learners, the parameter server, direct apply or
all-reduce, the shared buffer's lock, the rate rule, weight publication and the machine's cores, memory bandwidth
and (threads) the GIL, for each backend; remote actors on other nodes feeding an inserter.

Every worker is a SimPy process that alternates phases; a phase costs its measured service time (``Inputs``, µs)
on one of its node's ``cores`` (a FIFO ``Resource``: a phase holds a core for at most ``quantum_us`` at a time, so
oversubscribed workers take turns as the OS time-slices them; one longer than ``MAX_SLICES`` quanta, in that many
slices). What a backend changes is which resources a phase also holds:

- **threads**: every worker is a thread of one process. A phase's GIL share (``Inputs.gil``) runs holding the GIL
  (a ``Resource`` of one), in ``gil_segments`` pieces with the GIL released between them (torch releases it around
  each operator); a GIL that changes hands costs the phase's measured ``gil_handoff``;
- **processes** (and Ray's one-node placement, "ray-node"): actors are processes (no GIL among them); learners
  and the parameter server are threads of the driver and share its GIL, as on the thread backend;
- **learner-processes** (the process backend with ``learner_processes``): learners are processes too (their
  sample, gradients and priorities outside any GIL, plus ``lp_process_us`` of weights pull and gradient publish);
  each update crosses to the driver's proxy thread and back (``lp_handoff_us`` each way), which reads the
  gradient (``lp_driver_us``) and applies it under the driver's GIL;
- **learner-allreduce** (the same with ``aggregation = "allreduce"``): the driver only grants the rounds
  (``lp_handoff_us`` each way); each learner writes its gradient to shared memory and reads the others' (half of
  ``publish_us`` and of ``pull_us`` each), and applies the averaged step itself, outside any GIL, learner 0
  publishing the weights;
- **ray** (Ray actors for every part): actors, learners, the buffer and the parameter server are processes;
  an actor's insert (per chunk) and weights fetch are remote calls of ``ray_call_us``, a learner's update waits
  ``ray_learner_remote_us`` beyond its own work and the buffer's and parameter server's (its calls, serialization,
  the object store); each keeps the node's cores busy for its measured CPU (``ray_call_cpu_us``,
  ``ray_learner_remote_cpu_us``, spread over as many processes as it takes to fit in the wait), and the buffer
  and parameter-server actors serve one call at a time.

The buffer's mutex is a ``Resource`` of one (``lock_shards`` of them for a sharded buffer) held for the measured
lock hold of each insert, sample and priority update (samples without it with ``seqlock_sampling``). Weight copies
(a learner publishing, an actor pulling a newer version) cost their measured time, stretched when the copies in
flight together ask more bandwidth than ``mem_bw_total``. The rate rule is ``train.rate_policy.RatePolicy`` itself.
With ``nodes`` > 0 the actors run on that many other nodes (each with ``cores``) and send chunks of ``chunk`` rows
to one inserter on the learners' node (a round trip of ``inserter_call_us`` plus ``inserter_row_us`` a row, one
chunk at a time: the inserter's measured ceiling).

``simulate(inputs, Workload(...))`` returns env steps/s and updates/s in simulated time, and the share of the run
each shared resource was held.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import simpy

from pal_bench.train.rate_policy import RatePolicy, default_slack

MAX_CALL_US = 1e7      # the longest one call (a phase, a lock hold, a copy, a round trip) the inputs may say: 10 s
MAX_SLICES = 16        # a phase longer than this many quanta is cut into this many slices (its events stay bounded;
#                        the measured phases, under 10 ms, are never cut so coarsely)
BACKENDS = ("threads", "processes", "learner-processes", "learner-allreduce", "ray-node", "ray")
# rows per insert call: local_buffer, ray_chunk
CHUNK = {"threads": 1, "processes": 1, "learner-processes": 1, "learner-allreduce": 1, "ray-node": 1, "ray": 256}
AGGREGATIONS = ("sync", "async", "allreduce")


@dataclass(frozen=True)
class Inputs:
    """What one worker's work costs on this machine (µs), measured (``inputs.measure``), and the named
    assumptions beyond the measurements (defaults documented in docs/simulation.md)."""

    # actor, per env step
    act_us: float                    # policy forward (inference)
    env_us: float                    # the environment's step
    insert_us: float                 # local buffer and its share of one add_batch (per row)
    insert_lock_us: float            # of which the buffer's lock is held (per row)
    # learner, per update
    sample_us: float                 # buffer.sample of one batch
    sample_lock_us: float            # of which under the lock
    grad_us: float                   # losses, backward
    prio_us: float                   # update_priorities of one batch
    prio_lock_us: float              # of which under the lock
    apply_us: float                  # one optimizer step (the parameter server's or the sole learner's)
    # weights
    weight_bytes: int                # online + target networks, float32
    publish_us: float                # one version into the shared block (SharedWeights.publish)
    pull_us: float                   # one version out of it into an actor's networks (SharedWeights.read)
    mem_bw_total: float              # bytes/s all cores together (a STREAM-like copy on every core at once)
    snapshot_load_us: float = 0.0    # the parameter server's snapshot into a thread's networks (load_snapshot): a
    #                                  thread actor's weights pull, and a learner's when it does not step the
    #                                  server's own networks (several learners, or async)
    insert_lock_call_us: float = 0.0  # the buffer's lock held per add_batch call beyond its rows
    insert_call_us: float = 0.0      # of insert_us, the part paid once per add_batch call (lock included)
    # transports
    ray_call_us: float = 0.0         # one Ray remote call's round trip (caller's wait), µs
    ray_call_cpu_us: float = 0.0     # the node's CPU one such call keeps busy (caller, callee, Ray's own), µs
    ray_learner_remote_us: float = 0.0      # a Ray learner's wait per update beyond the parts modelled on their own
    #                                         (its sample and gradient calls: transport, serialization, the
    #                                         parameter-server actor's answer, the weights out of the object store)
    ray_learner_remote_cpu_us: float = 0.0  # the node's CPU per update behind that wait, every process together
    lp_handoff_us: float = 0.0       # learner processes: one crossing between a learner process and its proxy thread
    lp_process_us: float = 0.0       # learner processes: the process's weights pull and gradient publish per update
    lp_driver_us: float = 0.0        # learner processes: the proxy thread's gradient read per update (driver's GIL)
    ps_grad_us: float = 0.0          # the parameter server's cost per gradient it averages (sync, >1 learner)
    allreduce_alpha_us: float = 0.0  # all-reduce: latency per ring step
    allreduce_bw: float = 1e9        # all-reduce: bytes/s per link
    inserter_call_us: float = 0.0    # a remote actor's chunk: round trip to the inserter beyond the rows' own time
    inserter_row_us: float = 0.0     # the inserter's time per row (its ceiling, with chunks in flight)
    # the GIL (threads; learners and the parameter server on the process backend)
    gil: dict = field(default_factory=lambda: {"act": 0.6, "env": 1.0, "insert": 1.0, "sample": 0.5,
                                               "grad": 0.4, "prio": 0.5, "apply": 0.5, "copy": 0.2,
                                               "load": 0.5, "pump": 1.0})
    gil_segments: dict = field(default_factory=lambda: {"act": 8, "grad": 40, "apply": 12, "load": 12})
    gil_handoff: dict = field(default_factory=dict)   # µs a GIL changing hands costs, per phase (measured)
    # the costs that grow with workers (issue 49's measurements, results/reservation_cost.csv, pump_cost.csv) and the
    # driver's periodic work: shared-control backends (processes, learner processes, ray-node)
    reserve_us: float = 0.0          # one step reservation under the control block's lock, at no actors
    reserve_us_per_actor: float = 0.0  # its growth per registered actor (a linear fit over 1-256 actors)
    pump_poll_us: float = 0.0        # one poll of the driver's pump (its GIL), at no actor queues
    pump_poll_us_per_queue: float = 0.0  # its growth per actor queue
    pump_period_us: float = 2_000.0  # the pump's period (the trainer's constant, processes/shared.POLL_S)
    wait_poll_us: float = 500.0      # a waiting learner thread or actor process looks at the shared counters this
    #                                  often (the trainer's constants: SharedRate.POLL_S, the actor's sleep)
    buffer_actor_row_us: float = 0.0  # Ray: the buffer actor's floor per row received (its measured sink ceiling)
    background_cores: float = 0.0    # cores other processes keep busy (Ray's raylet and GCS, the driver)
    corun_slowdown: float = 0.0      # one core's slowdown with every core busy (measured on this machine's cores)

    def scaled(self, **factors: float) -> Inputs:
        """A copy with some inputs multiplied (sensitivity analysis): ``scaled(env_us=1.1)``."""
        return replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


@dataclass(frozen=True)
class Workload:
    """What is simulated: ``mode`` "f_a" (actors only, no learning), "f_l" (learners only on a filled buffer) or
    "end_to_end" (both, under the rate rule)."""

    backend: str
    cores: int                       # per node
    actors: int = 1
    learners: int = 1
    mode: str = "end_to_end"
    aggregation: str = "sync"        # "sync": one parameter-server round per update of every learner; "async":
    #                                  the parameter server applies each learner's gradient as it comes;
    #                                  "allreduce": learners average among themselves and each applies
    updates_per_step: float = 0.25
    learning_starts: int = 1_000
    steps: int = 6_000               # env steps (f_a, end_to_end)
    updates: int = 600               # updates (f_l)
    chunk: int = 1                   # rows per add_batch (processes: the local buffer; ray: ray_chunk)
    slack: int | None = None         # rate rule: steps actors may run ahead (None: the trainer's default_slack)
    lock_shards: int = 1             # the buffer split in this many shards, one lock each
    seqlock_sampling: bool = False   # samples read without the lock (optimistic readers)
    nodes: int = 0                   # 0: actors on the learners' node; n: on n other nodes, through the inserter
    quantum_us: float = 2_000.0      # longest a phase holds a core before yielding it (OS time slice)


class _Node:
    """One machine's cores (background load, e.g. Ray's own processes, makes every core a bit slower; so does
    every other busy core: ``corun`` with all of them busy, in proportion below that)."""

    def __init__(self, env: simpy.Environment, cores: int, background: float, quantum_us: float,
                 corun: float = 0.0):
        self.env, self.quantum_us, self.n, self.corun = env, quantum_us, cores, corun
        self.cores = simpy.Resource(env, capacity=cores)
        self.speed = max(0.05, cores - background) / cores    # the background load's share taken off every core

    def cpu(self, us: float):
        """``us`` of one core's time, in slices of at most the quantum (at most ``MAX_SLICES`` of them)."""
        left, quantum = us, max(self.quantum_us, us / MAX_SLICES)
        while left > 1e-9:
            piece = min(left, quantum)
            with self.cores.request() as req:
                yield req
                busy = (self.cores.count - 1) / (self.n - 1) if self.n > 1 else 0.0
                yield self.env.timeout(piece / (self.speed * (1 - self.corun * busy)))
            left -= piece


class _Machine:
    """The learners' node with its shared resources: the GIL, the buffer's locks, the parameter server, the
    buffer actor, the inserter and the memory bandwidth; and the remote actors' nodes."""

    def __init__(self, env: simpy.Environment, inp: Inputs, w: Workload):
        self.env, self.inp, self.w = env, inp, w
        self.node = _Node(env, w.cores, inp.background_cores, w.quantum_us, inp.corun_slowdown)
        self.remote = [_Node(env, w.cores, inp.background_cores, w.quantum_us, inp.corun_slowdown)
                       for _ in range(w.nodes)]
        self.gil = simpy.Resource(env, capacity=1)
        self.gil_owner = None
        self.locks = [simpy.Resource(env, capacity=1) for _ in range(max(1, w.lock_shards))]
        self.buffer_actor = simpy.Resource(env, capacity=1)
        self.ps = simpy.Resource(env, capacity=1)          # the parameter server applies one gradient at a time
        self.inserter = simpy.Resource(env, capacity=1)
        self.control = simpy.Resource(env, capacity=1)     # the shared control block's lock (step reservations)
        self.copies = 0
        self.busy = {"lock": 0.0, "gil": 0.0, "ps": 0.0, "buffer_actor": 0.0, "inserter": 0.0, "copy": 0.0,
                     "control": 0.0}

    def cpu(self, us: float, node: _Node | None = None):
        yield from (node or self.node).cpu(us)

    def held(self, resource: simpy.Resource, name: str, body):
        """Run ``body`` (a generator) holding ``resource``; its time counts as ``name``'s busy time."""
        with resource.request() as req:
            yield req
            t0 = self.env.now
            yield from body
            self.busy[name] += self.env.now - t0

    def work(self, who, us: float, phase: str, in_gil_process: bool, node: _Node | None = None):
        """A phase of ``us``: its GIL share holding the GIL (in ``gil_segments`` pieces) where the worker shares a
        process's GIL, the rest on a core alone."""
        g = self.inp.gil.get(phase, 1.0) if in_gil_process else 0.0
        if g <= 0:
            yield from self.cpu(us, node)
            return
        n = max(1, self.inp.gil_segments.get(phase, 1))
        held, free = g * us / n, (1 - g) * us / n
        for _ in range(n):
            with self.gil.request() as req:
                yield req
                t0 = self.env.now
                if self.gil_owner != who:
                    if self.gil_owner is not None and (h := self.inp.gil_handoff.get(phase, 0.0)) > 0:
                        yield self.env.timeout(h)
                    self.gil_owner = who
                yield from self.cpu(held, node)
                self.busy["gil"] += self.env.now - t0
            if free > 0:
                yield from self.cpu(free, node)

    def locked(self, us: float, shard: int = 0):
        yield from self.held(self.locks[shard % len(self.locks)], "lock", self.cpu(us))

    def copy(self, who, us: float, nbytes: int, in_gil_process: bool, node: _Node | None = None):
        """A weights copy measured at ``us`` alone, moving ``nbytes``: stretched when the copies in flight together
        ask more than the machine's bandwidth (and, in a process of threads, under the GIL's ``copy`` share)."""
        self.copies += 1
        try:
            demand = self.copies * nbytes / (us * 1e-6)
            yield from self.work(who, us * max(1.0, demand / self.inp.mem_bw_total), "copy", in_gil_process, node)
        finally:
            self.copies -= 1
            self.busy["copy"] += nbytes / self.inp.mem_bw_total * 1e6    # µs of the whole machine's bandwidth


class _Run:
    """The shared state of one simulated run: counters of the rate rule, the weights' version, the sync round."""

    def __init__(self, env: simpy.Environment, w: Workload):
        self.env = env
        slack = w.slack if w.slack is not None else default_slack(SimpleNamespace(
            rate_slack=0, learners=w.learners, updates_per_step=w.updates_per_step, actors=w.actors,
            envs_per_actor=1, local_buffer=1), w.chunk if w.chunk > 1 else 0)
        self.policy = RatePolicy(w.updates_per_step, w.learning_starts if w.mode == "end_to_end" else 0,
                                 w.steps, slack)
        self.reserved = self.inserted = self.started = self.done = 0
        self.version = 0
        self.changed = env.event()   # fires when the counters move (waiters re-check)
        self.round_grads = 0
        self.round_event = None
        self.pending = 0             # updates started whose gradient has not reached its round yet

    def poke(self) -> None:
        ev, self.changed = self.changed, self.env.event()
        ev.succeed()


def simulate(inp: Inputs, w: Workload, seed: int = 0) -> dict:
    """Run the model of ``w`` on ``inp``: ``env_steps_per_s``, ``updates_per_s`` (per simulated second of the
    run's length) and ``busy``, the share of the run each shared resource was held."""
    if w.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {w.backend!r}")
    if w.mode not in ("f_a", "f_l", "end_to_end"):
        raise ValueError(f"mode must be f_a, f_l or end_to_end, got {w.mode!r}")
    if w.aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {w.aggregation!r}")
    env = simpy.Environment()
    m, run = _Machine(env, inp, w), _Run(env, w)
    threads = w.backend == "threads"
    if w.backend == "learner-allreduce":
        w = replace(w, aggregation="allreduce")
    lp = w.backend in ("learner-processes", "learner-allreduce")
    learner_gil = w.backend in ("threads", "processes", "ray-node", "learner-processes")   # the driver's GIL
    own_gil = learner_gil and not lp                 # a learner's own work: in the driver's threads, or not
    ray = w.backend == "ray"
    shared_control = w.backend in ("processes", "learner-processes", "learner-allreduce", "ray-node")
    import random

    rng = random.Random(seed)

    def remote(wall_us: float, cpu_us: float):
        """A Ray call's wait of at least ``wall_us``, its ``cpu_us`` on the node's cores meanwhile, spread over as
        many processes as it takes to fit in the wait (caller, callee, Ray's own)."""
        t0 = env.now
        if cpu_us > 0:
            k = max(1, min(w.cores, -int(-cpu_us // max(wall_us, 1e-9))))
            yield simpy.AllOf(env, [env.process(m.cpu(cpu_us / k)) for _ in range(k)])
        if wall_us > env.now - t0:
            yield env.timeout(wall_us - (env.now - t0))

    def insert_chunk(i: int, rows: int, node):
        if node is not None:                            # a remote actor: the chunk crosses to the inserter
            yield env.timeout(inp.inserter_call_us)
            yield from m.held(m.inserter, "inserter", _inserter_rows(rows, i))
        elif ray:                                       # one remote add_batch per chunk, served one at a time
            yield from remote(inp.ray_call_us, inp.ray_call_cpu_us)
            # (no faster than the measured sink ceiling of a Ray actor receiving rows)
            extra = max(0.0, inp.buffer_actor_row_us * rows - add_hold(rows))
            yield from m.held(m.buffer_actor, "buffer_actor", _then(m.cpu(extra), m.locked(add_hold(rows), i)))
        else:
            yield from m.locked(add_hold(rows), i)

    def add_hold(rows: int) -> float:
        return inp.insert_lock_call_us + inp.insert_lock_us * rows

    # the measured insert (one row per call) holds the lock for add_hold(1) of it; the rest is the actor's own, a
    # part per add_batch call (insert_call_us beyond the lock's hold per call) and a part per row
    call_part = max(inp.insert_call_us, inp.insert_lock_call_us)
    own_call_us = call_part - inp.insert_lock_call_us
    own_insert_us = max(0.0, inp.insert_us - call_part - inp.insert_lock_us)

    def _inserter_rows(rows: int, i: int):
        yield from m.cpu(inp.inserter_row_us * rows)
        yield from m.locked(add_hold(rows), i)

    def wait_change():
        """Until the counters move: woken at once (a condition), or (shared-control backends: the waiter polls
        the shared words) at the next poll after they moved."""
        if shared_control and inp.wait_poll_us > 0:
            yield env.timeout(inp.wait_poll_us)
        else:
            yield run.changed

    def reserve():
        if shared_control and (us := inp.reserve_us + inp.reserve_us_per_actor * w.actors) > 0:
            yield from m.held(m.control, "control", m.cpu(us))

    def pump():
        """The driver's pump thread: every ``pump_period_us`` one poll of the actors' queues under its GIL."""
        us = inp.pump_poll_us + inp.pump_poll_us_per_queue * w.actors
        while True:
            yield env.timeout(inp.pump_period_us)
            yield from m.work("pump", us, "pump", True)

    def actor(i):
        node = m.remote[i % w.nodes] if w.nodes else None
        version, rows = 0, 0
        while True:
            if w.mode == "end_to_end":
                while not run.policy.budget_spent(run.reserved) and not run.policy.actor_may_step(
                        run.reserved, run.started):
                    yield from wait_change()
            if run.policy.budget_spent(run.reserved):
                break
            yield from reserve()
            run.reserved += 1
            if run.version > version:                   # a newer version: copy it into the actor's networks
                if ray:                                 # from the object store: a remote fetch first
                    yield from remote(inp.ray_call_us, inp.ray_call_cpu_us)
                elif node is not None:
                    yield env.timeout(inp.ray_call_us)
                if threads:                             # the server's snapshot into the thread's networks
                    yield from m.work(("a", i), inp.snapshot_load_us, "load", threads)
                else:
                    yield from m.copy(("a", i), inp.pull_us, inp.weight_bytes, threads, node)
                version = run.version
            yield from m.work(("a", i), inp.act_us, "act", threads, node)
            yield from m.work(("a", i), inp.env_us, "env", threads, node)
            yield from m.work(("a", i), own_insert_us, "insert", threads, node)
            rows += 1
            if rows >= w.chunk or run.reserved >= w.steps:
                if not ray and node is None and own_call_us > 0:     # add_batch's own cost, once per call
                    yield from m.work(("a", i), own_call_us, "insert", threads, node)
                yield from insert_chunk(i, rows, node)
                run.inserted += rows
                rows = 0
                run.poke()
        if rows:                                        # another actor took the last steps: send what is held
            if not ray and node is None and own_call_us > 0:
                yield from m.work(("a", i), own_call_us, "insert", threads, node)
            yield from insert_chunk(i, rows, node)
            run.inserted += rows
            run.poke()

    def sample(j):
        shard = rng.randrange(len(m.locks))
        if ray:                                         # the last batch's priorities ride on this call (its wait:
            #                                             in the learner's remote wait)
            body = _then(m.locked(inp.sample_lock_us + inp.prio_lock_us, shard),
                         m.cpu(inp.sample_us - inp.sample_lock_us + inp.prio_us - inp.prio_lock_us))
            yield from m.held(m.buffer_actor, "buffer_actor", body)
            return shard
        if w.seqlock_sampling:
            yield from m.work(("l", j), inp.sample_lock_us, "sample", own_gil)
        else:
            yield from m.locked(inp.sample_lock_us, shard)
        yield from m.work(("l", j), inp.sample_us - inp.sample_lock_us, "sample", own_gil)
        return shard

    def _then(a, b):
        yield from a
        yield from b

    def learner(j):
        version = 0
        # a learner thread that does not step the server's own networks loads each new snapshot (a learner
        # process reads the shared block instead: in lp_process_us)
        pulls = not ray and not lp and (w.learners > 1 or w.aggregation != "sync")
        while run.started < target_updates:
            if w.mode == "end_to_end":
                while run.started < target_updates and not run.policy.learner_may_start(run.inserted, run.started):
                    yield from wait_change()
                if run.started >= target_updates:
                    break
            run.started += 1
            run.pending += 1
            run.poke()
            if pulls and run.version > version:          # the newest snapshot into the learner's networks
                version = run.version
                yield from m.work(("l", j), inp.snapshot_load_us, "load", own_gil)
            if lp:                                       # the proxy thread grants the update to the process
                yield env.timeout(inp.lp_handoff_us)
            shard = yield from sample(j)
            yield from m.work(("l", j), inp.grad_us, "grad", own_gil)
            if not ray:                                  # (Ray: with the next sample call)
                yield from m.locked(inp.prio_lock_us, shard)
                yield from m.work(("l", j), inp.prio_us - inp.prio_lock_us, "prio", own_gil)
            if lp:                                       # weights pull and gradient publish, back to the proxy,
                yield from m.cpu(inp.lp_process_us)      # which reads the gradient under the driver's GIL
                yield env.timeout(inp.lp_handoff_us)
                if w.aggregation != "allreduce":         # (all-reduce: the gradient stays in the learners)
                    yield from m.work(("l", j), inp.lp_driver_us, "apply", learner_gil)
            if ray:                                      # the calls' waits beyond the buffer's and server's work
                yield from remote(*ray_remote)
            direct = w.learners == 1 and w.aggregation == "sync"
            if direct or w.aggregation == "async":
                run.pending -= 1
            if direct:                                   # the sole sync learner applies its own gradient
                yield from m.work(("l", j), inp.apply_us, "apply", learner_gil)
                yield from publish(("l", j))
            elif w.aggregation == "async":               # the parameter server applies each gradient in turn;
                if previous[j] is not None:              # a learner waits only for its previous one
                    yield previous[j]
                previous[j] = env.process(m.held(m.ps, "ps", _then(
                    m.work("ps", inp.apply_us, "apply", learner_gil), publish("ps"))))
            else:                                        # sync / allreduce: the round waits for every learner
                yield from aggregate(j)
            run.done += 1
            run.poke()

    def aggregate(j):
        run.round_grads += 1
        run.pending -= 1
        # the round closes with every learner in it, or with the last updates of the run (fewer than learners)
        last = run.round_grads == w.learners or (run.pending == 0 and run.started >= target_updates)
        ev = run.round_event = run.round_event or env.event()
        if w.aggregation == "allreduce":                 # a ring: 2 (L - 1) steps, each 1/L of the gradient
            L = w.learners
            if not last:
                yield ev
            else:
                run.round_grads, run.round_event = 0, None
                ev.succeed()
            if lp:                                       # through shared memory: its gradient written, L read
                # (a gradient: half the weights' bytes); every learner reads every block, so L learners move
                # L (L + 1) gradients a round through the machine's memory: a copy, stretched past its bandwidth
                yield from m.copy(("l", j), (inp.publish_us + L * inp.pull_us) / 2, (L + 1) * inp.weight_bytes // 2,
                                  False)
            else:
                yield from m.cpu(2 * (L - 1) * (inp.allreduce_alpha_us + inp.weight_bytes / 2 / L
                                                 / inp.allreduce_bw * 1e6))
            yield from m.work(("l", j), inp.apply_us, "apply", own_gil)     # in the learner's own process
            if j == 0:
                yield from publish(("l", j))
            return
        if not last:
            yield ev
            return
        run.round_grads, run.round_event = 0, None

        def server():
            yield from m.work("ps", inp.ps_grad_us * w.learners + inp.apply_us, "apply", learner_gil)
            yield from publish("ps")

        yield from m.held(m.ps, "ps", server())
        ev.succeed()

    def publish(who):
        if not threads and not ray:                      # (threads: the server's snapshot, inside apply_us;
            #                                              Ray: the object store's put, inside the remote wait)
            yield from m.copy(who, inp.publish_us, inp.weight_bytes, learner_gil)
        run.version += 1

    # a Ray learner's measured wait and CPU per update, less what the model charges on its own: the buffer actor's
    # sample and priority update and the parameter server's step
    served = inp.sample_us + inp.prio_us + inp.apply_us
    ray_remote = (max(0.0, inp.ray_learner_remote_us - served), max(0.0, inp.ray_learner_remote_cpu_us - served))
    previous: dict[int, simpy.Process | None] = dict.fromkeys(range(w.learners))
    target_updates = {"f_l": w.updates, "f_a": 0}.get(w.mode, run.policy.max_updates)
    if w.mode == "f_l":
        run.inserted = run.reserved = w.steps
    procs = []
    if w.mode in ("f_a", "end_to_end"):
        procs += [env.process(actor(i)) for i in range(w.actors)]
    if w.mode in ("f_l", "end_to_end") and target_updates > 0:
        procs += [env.process(learner(j)) for j in range(w.learners)]
    if shared_control and inp.pump_poll_us + inp.pump_poll_us_per_queue > 0 and w.mode != "f_l":
        env.process(pump())                              # (runs until the workers are done)
    env.run(until=simpy.AllOf(env, procs))
    pending_applies = [p for p in previous.values() if p is not None and p.is_alive]
    if pending_applies:                                  # the run ends when the last gradient is applied
        env.run(until=simpy.AllOf(env, pending_applies))
    seconds = env.now / 1e6
    steps = w.steps if w.mode != "f_l" else 0
    return {"env_steps_per_s": steps / seconds if steps else 0.0,
            "updates_per_s": run.done / seconds if run.done else 0.0,
            "seconds": seconds, "updates": run.done, "env_steps": steps,
            "busy": {k: v / max(env.now, 1e-9) / (len(m.locks) if k == "lock" else 1) for k, v in m.busy.items()}}


def throughput(inp: Inputs, w: Workload) -> float:
    """The number a curve plots: f_a in env steps/s, f_l in updates/s, end to end env steps/s."""
    r = simulate(inp, w)
    return r["updates_per_s"] if w.mode == "f_l" else r["env_steps_per_s"]
