"""The core-split solver on synthetic curves with known answers."""

import json
import math
import re

import pytest

from pal_bench.studies.dse import solve, table


def test_linear_curves_on_56_cores_balance_the_two_sides():
    # f_a = 1000 x transitions/s, f_l = 100 x updates/s, 0.25 updates per transition:
    # learners supply 400 x transitions/s, so the balance is 1000 x_a = 400 x_l -> (16, 40)
    best, t, frontier = solve([1000.0 * x for x in range(1, 56)], [100.0 * x for x in range(1, 56)], 0.25, 56)
    assert (best.actors, best.learners) == (16, 40)
    assert best.transitions_per_s == 16_000 and best.updates_per_s == 4_000
    assert len(t) == sum(1 for a in range(1, 56) for b in range(1, 56) if a + b <= 56)   # exhaustive
    assert frontier.cores.tolist() == list(range(2, 57))
    assert frontier.transitions_per_s.is_monotonic_increasing


def test_saturating_curves_pick_the_fewest_cores_at_the_plateau():
    f_a = {x: min(1000.0 * x, 3000.0) for x in range(1, 57)}   # saturates at 3 actor cores
    f_l = {x: min(100.0 * x, 500.0) for x in range(1, 57)}     # learners could feed 5000/s at 0.1
    best, _, _ = solve(f_a, f_l, 0.1, 56)
    assert (best.actors, best.learners, best.transitions_per_s) == (3, 3, 3000.0)
    assert best.bottleneck == "actors"


def test_two_cores_leave_one_split_and_the_command_uses_it():
    best, t, _ = solve({1: 800.0, 2: 1500.0}, {1: 90.0, 2: 170.0}, 0.25, 2)
    assert len(t) == 1 and (best.actors, best.learners) == (1, 1)
    assert best.transitions_per_s == 360.0 and best.bottleneck == "learners"
    assert "--actors 1 --learners 1" in best.command("dqn", "CartPole-v1", 0.25)


@pytest.mark.parametrize("args, msg", [
    (([1.0], [1.0], 0.0, 4), "ratio"),
    (([1.0], [-1.0], 0.25, 4), "f_l"),
    (([math.nan], [1.0], 0.25, 4), "f_a"),
    (([1.0], [1.0], 0.25, 1), "max_cores"),
    (({3: 1.0}, {3: 1.0}, 0.25, 4), "no split"),
])
def test_bad_inputs_are_clear_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        table(*args)


def test_dse_command_on_stored_curves(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from pal_bench.cli import main

    rows = [{"curve": "f_a", "threads": x, "throughput": 1000.0 * x} for x in (1, 2, 3)]
    rows += [{"curve": "f_l", "threads": x, "throughput": 100.0 * x} for x in (1, 2, 3)]
    pd.DataFrame(rows).to_csv(tmp_path / "scaling.csv", index=False)
    monkeypatch.chdir(tmp_path)         # the command draws pal-bench-out/figures/dse.png under the working directory
    assert main(["dse", "--curves", str(tmp_path / "scaling.csv"), "--max-cores", "4", "--ratio", "0.25"]) == 0
    out = capsys.readouterr().out
    # f_l / r = 400 x: (1, 3) gives min(1000, 1200) = 1000 transitions/s, the best of the 4-core splits
    assert "1 actor(s) + 3 learner(s)" in out and "--actors 1 --learners 3" in out


def test_dse_validate_runs_the_trainer_at_every_split(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from pal_bench.cli import main

    rows = [{"curve": c, "threads": 1, "throughput": v} for c, v in (("f_a", 1000.0), ("f_l", 100.0))]
    pd.DataFrame(rows).to_csv(tmp_path / "scaling.csv", index=False)
    monkeypatch.chdir(tmp_path)
    assert main(["dse", "--curves", "scaling.csv", "--max-cores", "2", "--validate", "300", "--force"]) == 0
    out = tmp_path / "pal-bench-out"          # the default --out: never the tracked results/ unless asked
    v = pd.read_csv(out / "dse_validation.csv")
    assert len(v) == 1 and v.measured_transitions_per_s.iloc[0] > 0 and bool(v.chosen.iloc[0])
    assert "the best measured" in capsys.readouterr().out
    meta = json.loads((out / "dse_validation.csv.meta.json").read_text())
    assert {"load_before", "load_after", "machine", "commit", "versions", "noisy"} <= set(meta)
    assert (out / "figures" / "dse.png").stat().st_size > 1000
    assert not (tmp_path / "results").exists()


def test_dse_validate_in_rounds_stores_every_round_and_the_median(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from pal_bench.cli import main

    rows = [{"curve": c, "threads": 1, "throughput": v} for c, v in (("f_a", 1000.0), ("f_l", 100.0))]
    pd.DataFrame(rows).to_csv(tmp_path / "scaling.csv", index=False)
    monkeypatch.chdir(tmp_path)
    assert main(["dse", "--curves", "scaling.csv", "--max-cores", "2", "--validate", "300", "--repeats", "3",
                 "--force"]) == 0
    v = pd.read_csv(tmp_path / "pal-bench-out" / "dse_validation.csv")
    reps = [float(x) for x in v.measured_transitions_per_s_reps.iloc[0].split()]
    assert len(reps) == 3 and v.measured_transitions_per_s.iloc[0] == pytest.approx(sorted(reps)[1], abs=0.01)
    assert "(3 rounds, medians)" in capsys.readouterr().out


def test_dse_writes_only_under_out_and_follows_the_curves_algo_and_env(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from pal_bench.cli import main

    rows = [{"curve": c, "threads": x, "throughput": v * x, "algo": "dqn", "env": "CartPole-v1"}
            for x in (1, 2) for c, v in (("f_a", 1000.0), ("f_l", 100.0))]
    pd.DataFrame(rows).to_csv(tmp_path / "curves.csv", index=False)
    monkeypatch.chdir(tmp_path)
    assert main(["dse", "--curves", "curves.csv", "--out", "elsewhere"]) == 0
    assert "--algo dqn --env CartPole-v1" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.csv", "elsewhere"]
    assert (tmp_path / "elsewhere" / "figures" / "dse.png").exists()
    assert main(["dse", "--curves", "curves.csv", "--algo", "sac"]) == 2
    assert "--algo sac: the curves in curves.csv were measured with algo dqn" in capsys.readouterr().err


def test_dse_on_ray_curves_names_their_backend(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from pal_bench.cli import main

    monkeypatch.chdir(tmp_path)
    rows = [{"curve": c, "threads": x, "throughput": v * x, "backend": b}
            for b, scale in (("threads", 1.0), ("ray", 0.5)) for x in (1, 2)
            for c, v in (("f_a", 1000.0 * scale), ("f_l", 100.0 * scale))]
    df = pd.DataFrame(rows)
    df[df.backend == "ray"].to_csv(tmp_path / "scaling_ray.csv", index=False)
    df.to_csv(tmp_path / "both.csv", index=False)
    assert main(["dse", "--curves", "scaling_ray.csv", "--max-cores", "2", "--ratio", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "scaling_ray.csv (backend ray)" in out and "--backend ray" in out and " 200 transitions/s" in out
    # a CSV holding both backends needs --backend
    assert main(["dse", "--curves", "both.csv", "--max-cores", "2"]) == 2
    assert main(["dse", "--curves", "both.csv", "--max-cores", "2", "--ratio", "0.25", "--backend", "threads"]) == 0
    assert "(backend threads)" in capsys.readouterr().out


def test_scaling_sweep_repeats_each_point_and_the_table_gives_intervals(tmp_path):
    from pal_bench.studies.scaling import measure as scaling
    from pal_bench.studies.scaling.publish import scaling_block
    from pal_bench.train import make_config

    df = scaling.sweep(make_config("dqn", "CartPole-v1"), 2, 300, 10, progress=lambda m: None, repeats=2)
    assert sorted(zip(df.curve, df.threads)) == [("f_a", 1), ("f_a", 2), ("f_l", 1), ("f_l", 2)]
    assert all(len(r.split()) == 2 for r in df.throughput_reps)
    df.to_csv(tmp_path / "scaling.csv", index=False)
    text = scaling_block(tmp_path)
    assert text.count(" [") >= 2          # the 2-worker speedups carry an interval


def test_dse_prefers_the_process_backend_curves(tmp_path, monkeypatch, capsys):
    """A curves file holding the process backend's curves among others: those are used by default."""
    import pandas as pd

    from pal_bench.cli import main
    from pal_bench.studies.dse import DSE_BACKEND

    assert DSE_BACKEND == "processes"
    monkeypatch.chdir(tmp_path)
    rows = [{"curve": c, "threads": x, "throughput": v * x, "backend": b}
            for b, scale in (("threads", 1.0), ("processes", 2.0)) for x in (1, 2)
            for c, v in (("f_a", 1000.0 * scale), ("f_l", 100.0 * scale))]
    pd.DataFrame(rows).to_csv(tmp_path / "both.csv", index=False)
    assert main(["dse", "--curves", "both.csv", "--max-cores", "2", "--ratio", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "both.csv (backend processes)" in out and "--backend processes" in out and " 800 transitions/s" in out


def test_backends_measured_side_by_side_are_interleaved_point_by_point(monkeypatch):
    from pal_bench.studies.scaling import measure as scaling
    from pal_bench.train import make_config

    calls = []

    def fake(kind):
        def measure(cfg, x, n):
            calls.append((kind, x, cfg.backend))
            return 100.0 * x * (2 if cfg.backend == "processes" else 1)
        return measure
    monkeypatch.setattr(scaling, "measure_fa", fake("f_a"))
    monkeypatch.setattr(scaling, "measure_fl", fake("f_l"))
    cfgs = [make_config("dqn", "CartPole-v1", backend=b) for b in ("threads", "processes")]
    curves = scaling.sweep_backends(cfgs, 2, 10, 10, progress=lambda m: None, repeats=2)
    assert calls[:4] == [("f_a", 1, "threads"), ("f_a", 1, "processes"), ("f_l", 1, "threads"),
                         ("f_l", 1, "processes")]
    assert len(calls) == 2 * 2 * 2 * 2
    assert set(curves) == {"threads", "processes"}
    p = curves["processes"].set_index(["curve", "threads"])
    assert p.loc[("f_a", 2), "throughput"] == 400.0 and p.loc[("f_a", 2), "speedup"] == 2.0
    assert (curves["threads"].backend == "threads").all()
    with pytest.raises(SystemExit):
        scaling.main(["--backend", "threads,gpu"])


def test_dse_predict_chooses_from_the_simulated_curves_with_measured_points_in_place(tmp_path, monkeypatch, capsys):
    """``--predict``: the curves past this machine come from the simulation's CSV (interpolated between its core
    counts), the stored measured points take their place where they exist, and the output says which splits
    rest on predictions; without the simulation's CSV it says which command writes it."""
    import pandas as pd

    from pal_bench.cli import main

    monkeypatch.setattr("pal_bench.paths.RESULTS", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["dse", "--predict", "--max-cores", "64", "--ratio", "0.25"]) == 2
    assert "pal-bench simulate --backend processes --cores 1-64" in capsys.readouterr().err
    cores = (1, 2, 4, 8, 16, 32, 64)
    pd.DataFrame([{"backend": "processes", "cores": n, "curve": c, "predicted": v * n}
                  for n in cores for c, v in (("f_a", 1000.0), ("f_l", 100.0))]).to_csv(
        tmp_path / "simulation_processes.csv", index=False)
    pd.DataFrame([{"curve": c, "threads": 1, "throughput": v, "env_backend": "sync", "oversubscribed": False}
                  for c, v in (("f_a", 900.0), ("f_l", 90.0))]).to_csv(tmp_path / "scaling_processes.csv",
                                                                        index=False)
    assert main(["dse", "--predict", "--max-cores", "64", "--ratio", "0.25"]) == 0
    out = capsys.readouterr().out
    # f_a = 1000 x, f_l / 0.25 = 400 x: 18 actors + 45 learners balance (18 000 transitions/s both sides), on 63
    # of the 64 cores (a 64th core adds no 1/0.25-balanced pair)
    assert "18 actor(s) + 45 learner(s)" in out, out
    first, rows = out.split("\n")[0], out.split("\n")[1:]
    assert "f_a(1)," not in first and "f_l(1)," not in first and "f_a(2)," in first  # measured ones are not
    assert any(re.match(r"\s*18\s+45\s+63\s.*predicted$", r) for r in rows), out
    assert main(["dse", "--predict", "--max-cores", "2", "--ratio", "0.25"]) == 0      # the one split: measured
    assert any(re.match(r"\s*1\s+1\s+2\s.*measured$", r) for r in capsys.readouterr().out.split("\n"))
    # learner processes: the simulation's label; its curves come from the simulation, so only with --predict
    assert main(["dse", "--backend", "learner-processes", "--max-cores", "64"]) == 2
    assert "add --predict" in capsys.readouterr().err
    assert main(["dse", "--predict", "--backend", "learner-processes", "--max-cores", "64", "--ratio", "0.25"]) == 2
    assert "pal-bench simulate --backend learner-processes" in capsys.readouterr().err
