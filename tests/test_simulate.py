"""The trainer's discrete-event model (pal_bench.studies.simulate): what each shared resource does to the
throughput, the one-worker fit, the leave-one-out check on stored points, the split search, and the command on
small inputs. Everything here runs the model on made-up inputs (no measurement)."""

import json
from dataclasses import replace

import pandas as pd
import pytest

from pal_bench.studies.simulate.calibrate import fit, inputs_for
from pal_bench.studies.simulate.model import Inputs, Workload, simulate, throughput
from pal_bench.studies.simulate.predict import best_split, parse_cores

BASE = dict(gil_handoff={"act": 5.0},
            act_us=60.0, env_us=40.0, insert_us=20.0, insert_lock_us=2.0, sample_us=150.0, sample_lock_us=60.0,
            grad_us=600.0, prio_us=60.0, prio_lock_us=30.0, apply_us=150.0, weight_bytes=2 * 4 * 5_000,
            publish_us=20.0, pull_us=30.0, mem_bw_total=8e9)
INP = Inputs(**BASE)

# one measured round, as inputs.measure writes it (made up)
ROUND = {"cores": 2, "weight_bytes": 40_000, "publish_us": 20.0, "pull_us": 30.0, "mem_bw_core": 5e9,
         "mem_bw_total": 8e9, "gil_handoff.act": 5.0,
         "ray_call_us": 300.0, "insert_lock_us": 2.0, "sample_lock_us": 60.0, "prio_lock_us": 30.0,
         "sample_us": 150.0, "grad_us": 600.0, "prio_us": 60.0, "apply_us": 150.0,
         "threads.act_us": 60.0, "threads.env_us": 40.0, "threads.insert_us": 20.0,
         "processes.act_us": 62.0, "processes.env_us": 41.0, "processes.insert_us": 12.0,
         "gil.act": 0.6, "gil.env": 1.0, "gil.sample": 0.5, "gil.grad": 0.4, "gil.apply": 0.5}


def fa(backend, actors, cores=2, inp=INP, steps=3_000):
    return throughput(inp, Workload(backend, cores, actors, 1, "f_a", steps=steps))


def test_actor_processes_scale_with_cores_and_threads_share_the_gil():
    one = fa("processes", 1)
    assert one == pytest.approx(1e6 / (60 + 40 + 20), rel=0.01)   # one actor: its phases (insert holds the lock)
    assert fa("processes", 2) == pytest.approx(2 * one, rel=0.02)          # two cores, no shared resource
    assert fa("processes", 4) == pytest.approx(2 * one, rel=0.05)          # oversubscribed: still two cores
    # threads: the env step and insert hold the GIL entirely, inference 60%: two threads gain at most the
    # GIL-free share, and the handoffs cost
    two = fa("threads", 2)
    assert fa("threads", 1) == pytest.approx(one, rel=0.01)
    assert two < 1.3 * one


def test_the_buffer_lock_caps_the_actors():
    slow = Inputs(**BASE | {"insert_lock_us": 100.0, "insert_us": 100.0})
    r = simulate(slow, Workload("processes", 16, 16, 1, "f_a", steps=8_000))
    assert r["env_steps_per_s"] == pytest.approx(1e4, rel=0.05)            # one row per 100 µs of lock
    assert r["busy"]["lock"] > 0.95


def test_end_to_end_keeps_the_rate_rule():
    w = Workload("processes", 2, 1, 1, "end_to_end", steps=3_000, learning_starts=500, updates_per_step=0.25)
    r = simulate(INP, w)
    assert r["updates"] == (3_000 - 500) * 0.25 and r["env_steps"] == 3_000
    w2 = Workload("threads", 2, 1, 2, "end_to_end", steps=3_000, learning_starts=500, aggregation="async")
    assert simulate(INP, w2)["updates"] == 625


def test_bad_workloads_are_refused():
    with pytest.raises(ValueError, match="backend"):
        simulate(INP, Workload("mpi", 2))
    with pytest.raises(ValueError, match="mode"):
        simulate(INP, Workload("threads", 2, mode="f_x"))


def test_fit_matches_the_one_worker_points():
    inp, factors = fit(inputs_for(ROUND, "processes"), "processes", 5_000.0, 800.0, 2)
    assert fa("processes", 1, inp=inp) == pytest.approx(5_000, rel=0.02)
    assert throughput(inp, Workload("processes", 2, 1, 1, "f_l", updates=400)) == pytest.approx(800, rel=0.02)
    assert factors["actor"] > 1 and factors["learner"] > 1                   # measured faster than the points


def test_leave_one_out_recovers_points_the_model_made(tmp_path):
    """Stored points made by the model itself on known inputs are predicted back within a few percent (the
    check's plumbing: each point left out, the fit on the others)."""
    from pal_bench.studies.simulate.validate import measured_points, summary, validate

    inp = inputs_for(ROUND, "processes")
    rows = []
    for curve in ("f_a", "f_l"):
        for n in (1, 2):
            w = Workload("processes", 2, n, n, curve, steps=6_000, updates=600, learning_starts=1_000)
            rows.append({"curve": curve, "threads": n, "throughput": throughput(inp, w), "oversubscribed": False,
                         "env_backend": "sync"})
    pd.DataFrame(rows).to_csv(tmp_path / "scaling_processes.csv", index=False)
    # 3,000 steps: the validation simulates a point at the steps it ran (up to 9,000), a third of the events
    r = simulate(inp, Workload("processes", 2, 1, 1, "end_to_end", steps=3_000, learning_starts=1_000))
    pd.DataFrame([{"actors": 1, "learners": 1, "measured_transitions_per_s": r["env_steps_per_s"],
                   "wall_s": 3_000 / r["env_steps_per_s"], "aggregation": "sync", "env_backend": "sync",
                   "oversubscribed": False},
                  {"actors": 1, "learners": 1, "measured_transitions_per_s": 100.0, "wall_s": 90.0,
                   "aggregation": "sync", "env_backend": "async", "oversubscribed": False}]).to_csv(
        tmp_path / "end_to_end_processes.csv", index=False)
    assert len(measured_points(tmp_path)) == 6
    v = validate(tmp_path, pd.DataFrame([ROUND]), progress=lambda m: None, samples=1, workers=1)
    s = summary(v)
    assert s["points"] == 5 and s["not_covered"] == 1                        # env in subprocesses: not modelled
    assert s["worst_abs_error"] < 0.05, v


def test_best_split_is_the_exhaustive_search_on_the_curves():
    fa_ = {1: 100.0, 2: 200.0, 3: 300.0}
    fl_ = {1: 25.0, 2: 50.0, 3: 60.0}
    assert best_split(fa_, fl_, 4, 0.25) == (2, 2)        # min(200, 200) beats (3, 1): min(300, 100)
    # interpolated: f_a(2) = 200, f_l(3) = 30 -> 120 env steps/s, the best of the 4 splits of 5 cores
    assert best_split({1: 100.0, 4: 400.0}, {1: 10.0, 4: 40.0}, 5, 0.25) == (2, 3)


def test_cores_parse_ranges_and_lists():
    assert parse_cores("1-4,8") == [1, 2, 3, 4, 8]
    for bad in ("0-4", "4-2", "x"):
        with pytest.raises(ValueError):
            parse_cores(bad)


def test_simulate_command_predicts_from_stored_inputs(tmp_path, capsys):
    from pal_bench.studies.simulate.cli import main

    pd.DataFrame([ROUND | {"round": 0}, ROUND | {"round": 1, "grad_us": 660.0}]).to_csv(
        tmp_path / "simulation_inputs.csv", index=False)
    # the model's own error, as the validation stored it: two development residuals at 2 workers (the one-worker
    # point and the holdout's are not the model's development error)
    pd.DataFrame({"set": ["development", "development", "development", "holdout"], "actors": [1, 2, 1, 2],
                  "learners": [1, 0, 0, 0], "error": [0.25, -0.2, 0.9, 0.9]}).to_csv(
        tmp_path / "simulation_validation.csv", index=False)
    assert main(["--backend", "processes", "--cores", "1,2,4", "--samples", "2", "--out", str(tmp_path),
                 "--no-figure"]) == 0
    df = pd.read_csv(tmp_path / "simulation_processes.csv")
    assert set(df.curve) == {"f_a", "f_l", "end_to_end"} and set(df.cores) == {1, 2, 4}
    assert (df.lo <= df.hi).all()
    # the stated interval: every draw over 1 + each residual (a measured value 25% below to 20% above); f_a's
    # draws are all alike, so its interval is exactly that
    f_a_ = df[df.curve == "f_a"]
    assert f_a_.lo90.to_numpy() == pytest.approx((f_a_.predicted / 1.25).to_numpy(), rel=1e-5)
    assert f_a_.hi90.to_numpy() == pytest.approx((f_a_.predicted / 0.8).to_numpy(), rel=1e-5)
    assert (df.lo90 < df.lo).all() and (df.hi90 > df.hi).all()
    meta = json.loads((tmp_path / "simulation_processes.csv.meta.json").read_text())
    assert [s["file"] for s in meta["sources"]] == ["simulation_inputs.csv", "simulation_validation.csv"]
    f_a, f_l = df[df.curve == "f_a"], df[df.curve == "f_l"]
    assert (f_a.lo == f_a.hi).all()                 # the two rounds differ only in the learner's backward
    one = f_l[f_l.cores == 1].iloc[0]               # between the two rounds' own predictions (1020 and 962)
    assert 961 <= one.lo <= one.predicted <= one.hi <= 1021
    e2e = df[df.curve == "end_to_end"]
    assert ((e2e.actors + e2e.learners) <= e2e.cores).all()
    with pytest.raises(SystemExit):
        main(["--backend", "mpi", "--out", str(tmp_path)])


def test_missing_inputs_or_validation_name_the_command_that_makes_them(tmp_path):
    """Nothing is measured behind the user's back: a missing inputs file (or, for a prediction's interval, the
    validation) is one error naming the command."""
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.cli import main

    with pytest.raises(UsageError, match="pal-bench simulate --measure-inputs"):
        main(["--validate", "--out", str(tmp_path)])
    pd.DataFrame([ROUND]).to_csv(tmp_path / "simulation_inputs.csv", index=False)
    with pytest.raises(UsageError, match="pal-bench simulate --validate"):
        main(["--backend", "processes", "--cores", "2", "--out", str(tmp_path), "--no-figure"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simulation_inputs.csv"]


def test_sharding_batching_and_optimistic_readers_relieve_the_lock():
    slow = Inputs(**BASE | {"insert_lock_us": 50.0, "insert_us": 50.0})
    one = simulate(slow, Workload("processes", 16, 16, 1, "f_a", steps=6_000))
    four = simulate(slow, Workload("processes", 16, 16, 1, "f_a", steps=6_000, lock_shards=4))
    assert one["env_steps_per_s"] == pytest.approx(2e4, rel=0.05)           # one row per 50 µs of lock
    assert four["env_steps_per_s"] > 3 * one["env_steps_per_s"]
    heavy = Inputs(**BASE | {"sample_lock_us": 140.0})
    locked = simulate(heavy, Workload("processes", 8, 1, 8, "f_l", updates=800, aggregation="async"))
    optimistic = simulate(heavy, Workload("processes", 8, 1, 8, "f_l", updates=800, aggregation="async",
                                          seqlock_sampling=True))
    assert optimistic["busy"]["lock"] < locked["busy"]["lock"]


def test_allreduce_learners_all_apply_each_round():
    inp = Inputs(**BASE | {"allreduce_alpha_us": 100.0, "allreduce_bw": 1e9})
    r = simulate(inp, Workload("processes", 4, 1, 4, "f_l", updates=400, aggregation="allreduce"))
    assert r["updates"] == 400 and r["busy"]["ps"] == 0
    with pytest.raises(ValueError, match="aggregation"):
        simulate(INP, Workload("processes", 2, aggregation="ring"))


def test_remote_actors_are_capped_by_the_inserter():
    """Actors on other nodes send chunks to one inserter: past its ceiling (here 256 rows per 256 x 4 µs plus
    the lock) more nodes add nothing."""
    inp = Inputs(**BASE | {"inserter_row_us": 4.0, "inserter_call_us": 500.0, "ray_call_us": 300.0})
    rates = [simulate(inp, Workload("ray-node", 4, 4 * n, 1, "f_a", steps=40_000, chunk=256, nodes=n))[
        "env_steps_per_s"] for n in (1, 8)]
    ceiling = 1e6 / (4.0 + BASE["insert_lock_us"])
    assert rates[0] < 0.5 * ceiling and 0.8 * ceiling < rates[1] <= ceiling     # (the run's start and end ramp)


def test_design_at_scale_answers_each_question(tmp_path):
    from pal_bench.studies.simulate.design import allreduce_inputs, design_at_scale, inserter_inputs

    pd.DataFrame([{"scheme": "allreduce", "learners": 2, "params": p, "communicate_s": c}
                  for p, c in ((10_000, 0.002), (1_010_000, 0.010))]).to_csv(tmp_path / "aggregation.csv")
    a = allreduce_inputs(tmp_path)       # 2 alpha + 4 P / bw: 8 ms more for 4 MB more -> 0.5 GB/s, alpha 0.96 ms
    assert a["allreduce_bw"] == pytest.approx(5e8) and a["allreduce_alpha_us"] == pytest.approx(960)
    pd.DataFrame([{"placement": "ceiling, 1 in flight", "rows_per_s": 200_000.0},
                  {"placement": "ceiling, 4 in flight", "rows_per_s": 400_000.0}]).to_csv(
        tmp_path / "end_to_end_ray_two_nodes.csv")
    i = inserter_inputs(tmp_path)        # 2.5 µs a row; 256 x (5 - 2.5) µs a chunk's round trip
    assert i == {"inserter_row_us": pytest.approx(2.5), "inserter_call_us": pytest.approx(640)}
    df = design_at_scale(replace(INP, insert_lock_call_us=3.0), tmp_path, progress=lambda m: None, length=0.2)
    assert df.question.nunique() == 4 and (df.throughput > 0).all()
    lock = df[df.question.str.contains("64 actors")].set_index("variant").throughput
    assert lock.filter(like="batched").iloc[0] >= lock.filter(like="today").iloc[0]


def test_ray_end_to_end_runs_its_chunks_and_background_load_slows_every_core():
    """The Ray backend's actors send 256-row chunks: the rate rule's slack is the trainer's own (two chunks per
    actor), so a run with chunks larger than the old fixed slack ends with its budget; background load (Ray's
    own processes) takes its share off every core rather than adding speed."""
    inp = Inputs(**BASE | {"ray_call_us": 300.0})
    r = simulate(inp, Workload("ray", 2, 1, 1, "end_to_end", steps=6_000, chunk=256, learning_starts=1_000))
    assert r["env_steps"] == 6_000 and r["updates"] == 1_250
    busy = replace(inp, background_cores=1.0)
    assert fa("processes", 1, inp=busy) == pytest.approx(fa("processes", 1) / 2, rel=0.02)    # 2 cores, 1 taken


def test_gil_share_and_handoff_from_the_two_thread_speedup():
    from pal_bench.studies.simulate.inputs import gil_from_speedup

    assert gil_from_speedup(2.0, 100.0, 8) == (0.0, 0.0)          # two threads, twice the calls: never held
    assert gil_from_speedup(1.25, 100.0, 8) == (0.8, 0.0)         # held 80%: two threads serialise on it
    g, h = gil_from_speedup(0.5, 100.0, 10)                        # half the calls: every handoff costs 10 µs
    assert g == 1.0 and h == pytest.approx(10.0)
    inp = Inputs(**BASE | {"gil": {"act": 1.0, "env": 1.0, "insert": 1.0}, "gil_handoff": {"act": 10.0},
                           "gil_segments": {"act": 6}})
    assert fa("threads", 2, inp=inp) < fa("threads", 1, inp=inp)   # the handoffs make two threads slower than one


def test_the_cheapest_candidate_is_measured_beside_its_prediction(tmp_path):
    """Real actor processes (short runs): each variant measured in every round, order alternating, the model's
    prediction beside it; the published block gives the measured and the simulated ratio."""
    from pal_bench.studies.simulate.design import CANDIDATE, candidate_check
    from pal_bench.studies.simulate.publish import candidate_block
    from pal_bench.train import make_config

    cfg = make_config("dqn", "CartPole-v1", hidden=(16,))
    df = candidate_check(INP, cfg, rounds=2, steps=1_500, progress=lambda m: None)
    assert len(df) == 2 * len(CANDIDATE) and (df.measured > 0).all() and (df.simulated > 0).all()
    assert list(df.variant[:2]) == list(CANDIDATE) and list(df.variant[2:]) == list(CANDIDATE)[::-1]
    assert set(df.local_buffer) == {1, 64}
    df.to_csv(tmp_path / "simulation_candidate.csv", index=False)
    text = candidate_block(tmp_path)
    assert "measured" in text and "simulated" in text and "2 interleaved rounds" in text


def test_the_insert_s_per_call_part_is_paid_once_per_add_batch():
    """Splitting the measured insert into a part per call and a part per row changes nothing at one row per call
    (the same measured total) and makes batched inserts cheaper by the call part saved on 63 of 64 rows."""
    cases = {"measured total": INP, "split": replace(INP, insert_call_us=15.0)}
    one = {k: simulate(i, Workload("processes", 1, 1, 1, "f_a", steps=3_000))["env_steps_per_s"]
           for k, i in cases.items()}
    assert one["split"] == pytest.approx(one["measured total"], rel=1e-6)
    us = {k: 1e6 / simulate(i, Workload("processes", 1, 1, 1, "f_a", steps=3_008, chunk=64))["env_steps_per_s"]
          for k, i in cases.items()}                        # µs per env step, one actor on one core
    assert us["measured total"] - us["split"] == pytest.approx(15.0 * 63 / 64, rel=0.02)


def test_ray_learners_remote_wait_keeps_the_node_busy():
    """A Ray learner's update waits its measured remote time; the CPU behind it (buffer and parameter-server
    actors, serialization, Ray's own) runs on the node's cores meanwhile: alone it fits in the wait, but two
    learners on two cores compete for it."""
    def fl(learners, cpu):
        inp = Inputs(**BASE | {"ray_learner_remote_us": 4_000.0, "ray_learner_remote_cpu_us": cpu})
        return throughput(inp, Workload("ray", 2, 1, learners, "f_l", updates=300, chunk=256))

    # the learner's own 600 µs of gradients and the measured 4,000 µs wait, which holds the buffer's and the
    # server's 360 µs (sample, priorities, apply: modelled on their own, not counted twice)
    assert fl(1, 0.0) == pytest.approx(1e6 / (600 + 4_000), rel=0.03)
    assert fl(1, 7_000.0) == pytest.approx(fl(1, 0.0), rel=0.03)         # two processes' CPU, inside the wait
    assert fl(2, 7_000.0) < 0.8 * fl(2, 0.0)                             # two learners: the cores are the limit


def test_learners_load_the_snapshot_unless_the_sole_sync_learner():
    """A sole sync learner steps the parameter server's own networks; several learners, or an async one, load
    each new snapshot into their networks first (``snapshot_load_us``); so do thread actors (actor processes read
    the shared block instead: ``pull_us``)."""
    slow = Inputs(**BASE | {"snapshot_load_us": 800.0})

    def fl(inp, learners):
        return throughput(inp, Workload("processes", 4, 1, learners, "f_l", updates=300))

    def e2e(inp, backend, aggregation="sync"):
        return throughput(inp, Workload(backend, 4, 1, 1, "end_to_end", aggregation=aggregation, steps=3_000,
                                        learning_starts=500))

    assert fl(slow, 1) == pytest.approx(fl(INP, 1), rel=0.01)
    assert fl(slow, 2) < 0.8 * fl(INP, 2)
    assert e2e(slow, "processes", "async") < 0.8 * e2e(INP, "processes", "async")
    assert e2e(slow, "threads") < 0.8 * e2e(INP, "threads")
    assert e2e(slow, "processes") == pytest.approx(e2e(INP, "processes"), rel=0.02)


def test_learner_processes_leave_the_gil_but_cross_to_the_driver():
    """Learners as processes: their sample, gradients and priorities run outside the driver's GIL, so two of them
    on two cores beat two learner threads; each update crosses to the driver's proxy and back and is applied
    there, in series with the learner's own work."""
    inp = Inputs(**BASE | {"gil": {"sample": 1.0, "grad": 1.0, "prio": 1.0, "apply": 1.0},
                           "lp_handoff_us": 40.0, "lp_process_us": 100.0, "lp_driver_us": 50.0})

    def fl(backend, learners):
        return throughput(inp, Workload(backend, 2, 1, learners, "f_l", updates=300))

    # sample 150 + grad 600 + prio 60 + process 100 + two crossings 80 + gradient read 50 + apply 150
    assert fl("learner-processes", 1) == pytest.approx(1e6 / 1_190, rel=0.03)
    assert fl("learner-processes", 2) > 1.3 * fl("processes", 2)
    r = simulate(inp, Workload("learner-processes", 2, 1, 1, "end_to_end", steps=3_000, learning_starts=500))
    assert r["updates"] == 625 and r["env_steps"] == 3_000


def test_allreduce_learner_processes_keep_their_gradients_out_of_the_driver():
    """With ``learner-allreduce`` the driver only grants rounds: no gradient read or apply under its GIL, each
    learner applies the averaged step itself; at 16 learners on 16 cores it is not capped by the driver's GIL, as
    the proxy path is when reading a gradient there costs 400 µs (1 / 400 µs = 2,500 updates/s at most)."""
    inp = Inputs(**BASE | {"gil": {"sample": 1.0, "grad": 1.0, "prio": 1.0, "apply": 1.0},
                           "lp_handoff_us": 40.0, "lp_process_us": 100.0, "lp_driver_us": 400.0,
                           "allreduce_alpha_us": 5.0, "allreduce_bw": 1e9})

    def fl(backend, learners, cores):
        return throughput(inp, Workload(backend, cores, 1, learners, "f_l", updates=600))

    # sample 150 + grad 600 + prio 60 + process 100 + two crossings 80 + apply 150, the exchange through shared
    # memory (publish 20 + one pull 30) / 2 and learner 0's weights publish 20
    assert fl("learner-allreduce", 1, 2) == pytest.approx(1e6 / 1_185, rel=0.03)
    assert fl("learner-processes", 16, 16) < 2_500
    assert fl("learner-allreduce", 16, 16) > 2 * fl("learner-processes", 16, 16)
    r = simulate(inp, Workload("learner-allreduce", 2, 1, 2, "end_to_end", steps=3_000, learning_starts=500))
    assert r["updates"] == 625 and r["env_steps"] == 3_000


def test_a_learner_point_is_predicted_with_its_own_aggregation():
    """An f_l point with async aggregation is the server's thread applying and the learner loading each snapshot
    (the learner-parts probe: 0.63-0.79x of one sync learner), not the sync learner that applies its own."""
    from types import SimpleNamespace

    from pal_bench.studies.simulate.validate import workload

    point = dict(backend="threads", curve="f_l", actors=0, learners=1, steps=20_000, env_backend="sync")
    sync, async_ = (workload(SimpleNamespace(**point, aggregation=a), 2) for a in ("sync", "async"))
    assert (sync.aggregation, async_.aggregation) == ("sync", "async")
    inp = Inputs(**BASE | {"snapshot_load_us": 600.0})     # a load as long as the update: async is slower
    assert throughput(inp, async_) < throughput(inp, sync)
