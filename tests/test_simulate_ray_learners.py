"""The Ray learners probe (issue 50): the per-update arithmetic from a run's counters, every count in every round
with the order rotated, a real run that leaves nothing behind, the model set against each round's own one-learner
figures, and bad arguments or stored rows refused."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest

from pal_bench.studies.simulate import ray_learners as rl
from pal_bench.studies.simulate.inputs import learner_costs


def test_learner_costs_divide_the_run_by_its_updates_and_each_learner_by_its_share():
    got = {"updates": 200, "wall_s": 2.0, "machine_cpu_s": 3.0,
           "phase_seconds": {"learner0": {"sample": 0.1, "forward_backward": 0.3, "priority_update": 0.1, "x": 9},
                             "learner1": {"sample": 0.1, "forward_backward": 0.3, "priority_update": 0.1}}}
    c = learner_costs(got, 2)
    assert c["updates_per_s"] == pytest.approx(100) and c["machine_cores"] == pytest.approx(1.5)
    assert c["cpu_us"] == pytest.approx(15_000) and c["own_us"] == pytest.approx(5_000)   # (0.5 + 0.5) s / 200
    assert c["remote_us"] == pytest.approx(2.0 * 2 / 200 * 1e6 - 5_000)                  # a learner's 20 ms, less
    assert c["remote_cpu_us"] == pytest.approx(10_000)
    with pytest.raises(ValueError, match="0 updates"):
        learner_costs(got | {"updates": 0}, 1)
    with pytest.raises(ValueError, match="no machine CPU"):
        learner_costs(got | {"machine_cpu_s": None}, 1)


def test_every_count_in_every_round_with_the_order_rotated_and_a_failure_recorded():
    seen, calls = [], []

    def run(n, updates):
        calls.append((n, updates))
        if n == 2 and len(calls) > 2:
            raise RuntimeError("a learner died")
        return {"updates": updates, "updates_per_s": 100.0 * n}

    df = rl.measure(updates=30, learners=(1, 2), rounds=2, progress=seen.append, run=run)
    assert list(zip(df["round"], df.learners)) == [(0, 1), (0, 2), (1, 2), (1, 1)]
    assert calls == [(1, 30), (2, 30), (2, 30), (1, 30)]
    failed = df[(df["round"] == 1) & (df.learners == 2)]
    assert failed.error.tolist() == ["RuntimeError: a learner died"] and failed.updates_per_s.isna().all()
    assert len(seen) == 5 and "failed: RuntimeError" in seen[-2]


def test_a_real_run_measures_and_leaves_no_ray_process_or_segment():
    pytest.importorskip("ray")
    import time

    from pal_bench.train import make_config

    shm = set(os.listdir("/dev/shm"))
    rays = rl.ray_processes()
    got = rl.learners_run(2, 40, filled=400, cfg=make_config("dqn", "CartPole-v1", batch_size=32))
    assert 0 <= got["settle_s"] <= rl.SETTLE_S + 1 and not rl.ray_processes() - rays      # waited for them
    assert got["updates"] >= 40 and got["updates_per_s"] > 0 and got["machine_cores"] > 0
    assert got["own_us"] > 0 and got["remote_us"] >= 0 and got["cpu_us"] >= got["remote_cpu_us"]
    deadline = time.monotonic() + 30
    while rl.ray_processes() - rays and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not rl.ray_processes() - rays and set(os.listdir("/dev/shm")) == shm


def _stored(tmp_path, rows):
    from pal_bench.paths import RESULTS

    shutil.copy(RESULTS / "simulation_inputs.csv", tmp_path / "simulation_inputs.csv")
    pd.DataFrame(rows).to_csv(tmp_path / rl.FILE, index=False)


def test_the_model_is_fitted_to_each_rounds_own_one_learner_rate(tmp_path):
    _stored(tmp_path, [{"round": 0, "learners": 1, "updates_per_s": 100.0},
                       {"round": 0, "learners": 2, "updates_per_s": 150.0},
                       {"round": 1, "learners": 1, "updates_per_s": 180.0},
                       {"round": 1, "learners": 2, "updates_per_s": 250.0},
                       {"round": 1, "learners": 3, "error": "RuntimeError: died"},
                       {"round": 2, "learners": 2, "updates_per_s": 150.0}])       # no one-learner run
    df, left_out = rl.against_the_model(tmp_path)
    assert [(r.round, r.learners) for r in df.itertuples()] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert df.predicted_stored.nunique() == 2                         # the stored inputs: one per count
    one = df[df.learners == 1]
    assert one.error_fitted.abs().max() < 0.02                        # fitted to it: right by construction
    two = df[df.learners == 2]
    assert two.predicted_fitted.iloc[1] > two.predicted_fitted.iloc[0]     # a faster sitting, a faster prediction
    assert df.error_fitted.tolist() == pytest.approx(((df.predicted_fitted - df.measured) / df.measured).tolist())
    assert [(r.round, r.learners) for r in left_out.itertuples()] == [(1, 3), (2, 2)]


def test_bad_arguments_and_bad_stored_rows_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rl, "measure", lambda *a, **k: pytest.fail("measured"))
    for bad in (["--updates", "5"], ["--learners", "0,2"], ["--learners", "1,99"], ["--learners", "2"],
                ["--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            rl.main(bad)
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err
    assert rl.main(["--model", "--out", str(tmp_path)]) == 2 and rl.FILE in capsys.readouterr().err
    _stored(tmp_path, [{"round": 0, "learners": 1, "updates_per_s": -5.0}])
    assert rl.main(["--model", "--out", str(tmp_path)]) == 2 and "updates_per_s" in capsys.readouterr().err
    twice = {"round": 0, "learners": 1, "updates_per_s": 100.0}
    _stored(tmp_path, [twice, twice])
    assert rl.main(["--model", "--out", str(tmp_path)]) == 2 and "more than once" in capsys.readouterr().err
    _stored(tmp_path, [{"round": 0, "learners": 2, "updates_per_s": 100.0}])
    assert rl.main(["--model", "--out", str(tmp_path)]) == 2
    got = capsys.readouterr()
    assert "no run" in got.err and "left out: round 0, 2 learner(s): no one-learner updates/s" in got.out


def test_the_docs_quote_the_stored_measurement():
    """docs/simulation.md quotes, per learner count over the stored rounds, the updates/s, the machine's busy cores,
    the machine CPU per update and a learner's wait beyond its own work; the model's errors it quotes come from
    ``--model`` (seconds)."""
    from pal_bench.paths import RESULTS, ROOT

    df = pd.read_csv(RESULTS / rl.FILE)
    docs = " ".join((ROOT / "docs" / "simulation.md").read_text().split())

    def span(v, fmt="{:,.0f}"):
        return f"{fmt.format(v.min())}-{fmt.format(v.max())}"

    for n, g in df.groupby("learners"):
        row = (f"| {n} | {span(g.updates_per_s)} | {span(g.machine_cores, '{:.2f}')} | {span(g.cpu_us)} | "
               f"{span(g.remote_us)} |")
        assert row in docs, row
    assert f"{df['round'].nunique()} rounds" in docs and rl.FILE in docs
