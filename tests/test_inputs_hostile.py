"""Hostile inputs of `pal-bench simulate`, `pal-bench dse` and `pal-bench race-profile` (issue 48, items 11, 12, 15):
every stored file they read is checked (present, numeric, finite, in range) and read as untrusted data (no link,
FIFO, device, directory, non-UTF-8 or oversized file) before anything is simulated or measured: one line naming
the file, the column and the value, exit status 2; their core counts, ratios and durations are bounded by argparse;
and a simulated point does not depend on which other points were asked for. Hangs run in a subprocess with a
timeout."""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import pal_bench
from pal_bench.cli import main
from pal_bench.studies.simulate.model import Inputs

ROOT = Path(pal_bench.__file__).resolve().parents[1]

# one measured round, as inputs.measure writes it (made up; the columns later rounds added left out)
ROUND = {"cores": 2, "weight_bytes": 40_000, "publish_us": 20.0, "pull_us": 30.0, "mem_bw_core": 5e9,
         "mem_bw_total": 8e9, "gil_handoff.act": 5.0, "ray_call_us": 300.0, "insert_lock_us": 2.0,
         "sample_lock_us": 60.0, "prio_lock_us": 30.0, "sample_us": 150.0, "grad_us": 600.0, "prio_us": 60.0,
         "apply_us": 150.0, "threads.act_us": 60.0, "threads.env_us": 40.0, "threads.insert_us": 20.0,
         "processes.act_us": 62.0, "processes.env_us": 41.0, "processes.insert_us": 12.0,
         "gil.act": 0.6, "gil.env": 1.0, "gil.sample": 0.5, "gil.grad": 0.4, "gil.apply": 0.5}
INP = Inputs(act_us=60.0, env_us=40.0, insert_us=20.0, insert_lock_us=2.0, sample_us=150.0, sample_lock_us=60.0,
             grad_us=600.0, prio_us=60.0, prio_lock_us=30.0, apply_us=150.0, weight_bytes=40_000, publish_us=20.0,
             pull_us=30.0, mem_bw_total=8e9, gil_handoff={"act": 5.0})
CURVES = "curve,threads,throughput\nf_a,1,100\nf_a,2,180\nf_l,1,50\nf_l,2,90\n"
SIMULATE = ["simulate", "--cores", "2", "--samples", "1", "--no-figure"]


def _tripwire(*_a, **_k):
    raise AssertionError("a bad input reached the simulation or a measurement")


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """No simulation (SimPy's environment), measurement, split search or race run can start: a test whose input
    gets past the checks fails at once. The working directory is an empty temporary one."""
    import simpy

    monkeypatch.setattr(simpy.Environment, "__init__", _tripwire)
    monkeypatch.setattr("pal_bench.conditions.refuse_if_busy", _tripwire)
    for module in ("concurrency", "shared_buffer", "scaling.two_nodes"):
        monkeypatch.setattr(f"pal_bench.studies.{module}.refuse_if_busy", _tripwire)
    monkeypatch.setattr("pal_bench.studies.dse.solve", _tripwire)
    for name in ("run_one", "profile_framework"):
        monkeypatch.setattr(f"pal_bench.studies.race_profile.{name}", _tripwire)
    monkeypatch.chdir(tmp_path)


def one_line(capsys, argv: list[str]) -> str:
    """``pal-bench ARGV`` exits 2 with no traceback; its last stderr line."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and err and "Traceback" not in err, err
    return err.splitlines()[-1]


def write_inputs(out: Path, column: str | None = None, value: str | None = None, drop: str | None = None) -> Path:
    """Two measured rounds in ``out/simulation_inputs.csv``, the second's ``column`` set to the text ``value``."""
    df = pd.DataFrame([ROUND | {"round": 0}, ROUND | {"round": 1, "grad_us": 660.0}]).astype(object)
    if column is not None:
        df.loc[1, column] = value
    if drop is not None:
        df = df.drop(columns=drop)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "simulation_inputs.csv", index=False)
    return out / "simulation_inputs.csv"


def files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---- simulate: the stored inputs' values

BAD_INPUTS = [("grad_us", "inf"), ("grad_us", "1e300"), ("grad_us", "nan"), ("grad_us", ""),
              ("processes.act_us", "-5"), ("sample_lock_us", "-1"), ("apply_us", "0"), ("gil.act", "1.5"),
              ("cores", "0"), ("cores", "2.5"), ("weight_bytes", "abc"), ("mem_bw_total", "0"),
              ("ray_call_us", "inf"), ("gil_handoff.act", "-3"), ("publish_us", "1" * 5000)]


@pytest.mark.parametrize("column, value", BAD_INPUTS, ids=[f"{c}={v[:8]}" for c, v in BAD_INPUTS])
def test_a_bad_stored_input_is_one_line_before_anything_is_simulated(nothing_runs, tmp_path, capsys, column, value):
    out = tmp_path / "out"
    write_inputs(out, column, value)
    before = files(out)
    line = one_line(capsys, [*SIMULATE, "--out", str(out)])
    assert "simulation_inputs.csv" in line and f"column {column}, row 2" in line, line
    assert ((repr(value) if len(value) <= 40 else value[:40]) in line if value else "empty" in line), line
    assert files(out) == before


def test_a_missing_input_column_is_named(nothing_runs, tmp_path, capsys):
    out = tmp_path / "out"
    write_inputs(out, drop="grad_us")
    line = one_line(capsys, [*SIMULATE, "--out", str(out)])
    assert "simulation_inputs.csv" in line and "missing column(s) grad_us" in line, line


@pytest.mark.parametrize("value", ["1e300", "inf"])
def test_a_huge_stored_cost_does_not_hang_the_event_loop(tmp_path, value):
    """It used to run for minutes at 100% CPU (the event loop cut 1e300 µs into 2 ms slices)."""
    out = tmp_path / "out"
    write_inputs(out, "grad_us", value)
    r = run_cli(tmp_path, [*SIMULATE, "--out", str(out)])
    assert r.returncode == 2 and "column grad_us, row 2" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_model_cuts_a_long_phase_into_a_bounded_number_of_slices():
    """A phase's events are bounded whatever its cost (the measured ones, under 10 ms, are cut as before)."""
    import simpy

    from pal_bench.studies.simulate.model import MAX_SLICES, _Node

    env = simpy.Environment()
    node = _Node(env, 2, 0.0, 2_000.0)
    slices = []
    timeout = env.timeout
    env.timeout = lambda d: (slices.append(d), timeout(d))[1]
    env.process(node.cpu(1e7))
    env.run()
    assert env.now == pytest.approx(1e7) and len(slices) <= MAX_SLICES + 1
    slices.clear()
    env.process(node.cpu(5_000.0))                       # 2 ms quanta, as before
    env.run()
    assert slices == [2_000.0, 2_000.0, pytest.approx(1_000.0)]


# ---- simulate: the other stored tables it reads

def test_bad_one_worker_points_are_refused(nothing_runs, tmp_path, capsys):
    out = tmp_path / "out"
    write_inputs(out)
    (out / "scaling_processes.csv").write_text("curve,threads,throughput,oversubscribed,env_backend\n"
                                               "f_a,1,5000,False,sync\nf_l,1,-inf,False,sync\n")
    line = one_line(capsys, [*SIMULATE, "--out", str(out)])
    assert "scaling_processes.csv: column throughput, row 2: '-inf'" in line, line


def test_bad_end_to_end_points_are_refused_before_validating(nothing_runs, tmp_path, capsys):
    out = tmp_path / "out"
    write_inputs(out)
    (out / "end_to_end_processes.csv").write_text(
        "actors,learners,aggregation,env_backend,measured_transitions_per_s,wall_s,oversubscribed\n"
        "1,1,ring,sync,3000,3,False\n")
    line = one_line(capsys, ["simulate", "--validate", "--out", str(out)])
    assert "end_to_end_processes.csv: column aggregation, row 1: 'ring' is not one of sync" in line, line


def test_bad_design_inputs_are_refused_before_fitting(nothing_runs, tmp_path, capsys):
    out = tmp_path / "out"
    write_inputs(out)
    (out / "aggregation.csv").write_text("scheme,learners,params,communicate_s\nallreduce,2,10000,0.002\n"
                                         "allreduce,2,1010000,nan\n")
    line = one_line(capsys, ["simulate", "--design", "--out", str(out)])
    assert "aggregation.csv: column communicate_s, row 2: 'nan' must be a finite number" in line, line


@pytest.mark.parametrize("argv, flag", [
    (["--sensitivity", "100000"], "--sensitivity"), (["--sensitivity", "0"], "--sensitivity"),
    (["--cores", "2000"], "--cores"), (["--cores", "0-4"], "--cores"), (["--cores", "1-x"], "--cores"),
    (["--cores", "4-2"], "--cores"),
])
def test_cores_and_sensitivity_are_bounded_by_argparse(nothing_runs, tmp_path, capsys, argv, flag):
    out = tmp_path / "out"
    write_inputs(out)
    line = one_line(capsys, ["simulate", *argv, "--out", str(out)])
    assert f"error: argument {flag}: " in line and ("1024" in line or "must be >= 1" in line), line


def test_a_point_s_split_does_not_depend_on_the_other_points_asked_for():
    """`--cores 64` alone gave another best split (1 + 1, 4,031 env steps/s) than 64 in a list (1 + 63, 4,560):
    the split search interpolated the curves between the points asked for only."""
    from pal_bench.studies.simulate.predict import curves

    def e2e(cores: list[int]) -> dict:
        d = curves(INP, "processes", cores, progress=lambda m: None)
        return d[(d.curve == "end_to_end") & (d.cores == 4)].iloc[0][["actors", "learners", "predicted"]].to_dict()

    alone, listed = e2e([4]), e2e([1, 2, 4])
    assert alone == listed
    assert alone["learners"] > 1                          # not the first split of flat curves (1 + 1)


def test_cores_parse_ranges():
    from pal_bench.argtypes import CORES, int_ranges

    parse = int_ranges(CORES)
    assert parse("1-4,8") == [1, 2, 3, 4, 8] and parse(" 3 , 1-2") == [1, 2, 3] and parse("1024") == [1024]
    for bad in ("", "1,,2", "-3", "1-", "1e3", "1025", "٣"):
        with pytest.raises(Exception, match="expected integers"):
            parse(bad)


# ---- hostile files, for each command that reads one

def _inputs(d: Path) -> Path:
    return d / "out" / "simulation_inputs.csv"


def _scaling(d: Path) -> Path:
    write_inputs(d / "out")
    return d / "out" / "scaling_processes.csv"


def _curves(d: Path) -> Path:
    return d / "c.csv"


def _measured(d: Path) -> Path:
    (d / "c.csv").write_text(CURVES)
    return d / "m.csv"


TARGETS = {   # name: (where the hostile file goes, the command that reads it)
    "simulate inputs": (_inputs, lambda d: [*SIMULATE, "--out", str(d / "out")]),
    "simulate one-worker points": (_scaling, lambda d: [*SIMULATE, "--out", str(d / "out")]),
    "dse --curves": (_curves, lambda d: ["dse", "--curves", "c.csv", "--max-cores", "2", "--out", "o"]),
    "dse --measured": (_measured, lambda d: ["dse", "--curves", "c.csv", "--measured", "m.csv", "--max-cores", "2",
                                             "--out", "o"]),
}


def make_hostile(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero link":
        path.symlink_to("/dev/zero")
    elif kind == "dangling link":
        path.symlink_to(path.parent / "nowhere.csv")
    elif kind == "link to a good file":
        (path.parent / "real.csv").write_text(CURVES)
        path.symlink_to(path.parent / "real.csv")
    elif kind == "directory":
        path.mkdir()
    elif kind == "not UTF-8":
        path.write_bytes(b"curve,threads,throughput\nf_a,1,\xff\xfe100\n")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(17 << 20)                 # sparse: past the 16 MiB bound without writing it
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)


IN_PROCESS = ("dangling link", "link to a good file", "directory", "not UTF-8", "huge", "binary")
CASES = [(t, k) for t in TARGETS for k in IN_PROCESS]


@pytest.mark.parametrize("target, kind", CASES, ids=[f"{t}: {k}" for t, k in CASES])
def test_a_hostile_file_is_one_line(nothing_runs, tmp_path, capsys, target, kind):
    where, argv = TARGETS[target]
    path = where(tmp_path)
    make_hostile(path, kind)
    line = one_line(capsys, argv(tmp_path))
    assert path.name in line, line
    if "link" in kind:
        assert "symbolic link" in line, line


def run_cli(cwd: Path, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``pal-bench ARGV`` in a subprocess (memory capped at 4 GiB), killed after ``timeout`` s: a hang fails."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = os.environ | {"PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, "-m", "pal_bench.cli", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pal-bench {' '.join(argv)} still running after {timeout} s")


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("kind", ["fifo", "dev-zero link"])
def test_a_fifo_or_a_link_to_dev_zero_neither_blocks_nor_reads_for_ever(tmp_path, target, kind):
    where, argv = TARGETS[target]
    path = where(tmp_path)
    make_hostile(path, kind)
    r = run_cli(tmp_path, argv(tmp_path))
    err = r.stderr.strip()
    assert r.returncode == 2 and "Traceback" not in err and path.name in err.splitlines()[-1], err
    assert ("FIFO" if kind == "fifo" else "symbolic link") in err, err


# ---- dse: the curves' values and --ratio

BAD_CURVES = [("throughput", "inf"), ("throughput", "abc"), ("throughput", "-3"), ("throughput", "1e300"),
              ("throughput", ""), ("threads", "1.5"), ("threads", "0"), ("threads", "99999"), ("curve", "f_x")]


@pytest.mark.parametrize("column, value", BAD_CURVES, ids=[f"{c}={v}" for c, v in BAD_CURVES])
def test_a_bad_curves_value_is_one_line(nothing_runs, tmp_path, capsys, column, value):
    rows = [dict(zip(("curve", "threads", "throughput"), r.split(","))) for r in CURVES.split()[1:]]
    rows[2][column] = value
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    line = one_line(capsys, ["dse", "--curves", "c.csv", "--max-cores", "2", "--out", "o"])
    assert f"--curves c.csv: column {column}, row 3" in line, line
    assert not (tmp_path / "o").exists()


def test_bad_predicted_curves_are_one_line(nothing_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pal_bench.paths.RESULTS", tmp_path)
    (tmp_path / "simulation_processes.csv").write_text("backend,cores,curve,predicted\nprocesses,1,f_a,5000\n"
                                                       "processes,2,f_a,inf\n")
    line = one_line(capsys, ["dse", "--predict", "--max-cores", "2", "--out", "o"])
    assert "simulation_processes.csv: column predicted, row 2: 'inf'" in line, line


def test_the_split_for_a_training_run_refuses_bad_stored_curves(tmp_path):
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.dse import split_from_curves

    (tmp_path / "scaling_processes.csv").write_text(CURVES.replace("180", "inf"))
    with pytest.raises(UsageError, match="column throughput, row 2"):
        split_from_curves(0.25, "processes", tmp_path)
    (tmp_path / "scaling_processes.csv").write_text("curve,threads,throughput\nf_l,1,50\n")
    with pytest.raises(UsageError, match="f_a is empty"):
        split_from_curves(0.25, "processes", tmp_path)


@pytest.mark.parametrize("ratio", ["1e-300", "1e-7", "1e5", "nan", "-1"])
def test_dse_ratio_is_bounded(nothing_runs, tmp_path, capsys, ratio):
    (tmp_path / "c.csv").write_text(CURVES)
    line = one_line(capsys, ["dse", "--curves", "c.csv", "--ratio", ratio, "--out", "o"])
    assert "error: argument --ratio: " in line and ("1e-06" in line or "10000" in line), line


def test_dse_ratio_at_its_bounds_gets_through(nothing_runs, tmp_path):
    (tmp_path / "c.csv").write_text(CURVES)
    for ratio in ("1e-6", "10000"):
        with pytest.raises(AssertionError, match="reached the simulation"):
            main(["dse", "--curves", "c.csv", "--ratio", ratio, "--max-cores", "2", "--out", "o"])


# ---- durations in seconds

@pytest.mark.parametrize("argv", [
    ["race-profile", "pal", "--seconds", "1e-300"], ["race-profile", "pal", "--seconds", "0.05"],
    ["race-profile", "tianshou", "--seconds", "1e6"], ["race-profile", "pal", "--seconds", "nan"],
    ["concurrency", "--seconds", "1e-300"], ["shared-buffer", "--seconds", "1e9"],
], ids=" ".join)
def test_durations_share_one_bounded_type(nothing_runs, capsys, argv):
    line = one_line(capsys, argv)
    assert "error: argument --seconds: " in line and ("0.1" in line or "86400" in line), line


def test_two_nodes_ceiling_is_a_duration(nothing_runs, capsys):
    from pal_bench.studies.scaling import two_nodes

    with pytest.raises(SystemExit) as e:
        two_nodes.main(["--ceiling-s", "nan"])
    assert e.value.code == 2 and "argument --ceiling-s: " in capsys.readouterr().err


def test_the_shortest_duration_gets_through(nothing_runs):
    with pytest.raises(AssertionError, match="reached the simulation"):
        main(["race-profile", "pal", "--seconds", "0.1", "--out", "o"])


def test_a_race_profile_too_short_to_measure_is_one_line(nothing_runs, capsys, monkeypatch):
    """A run that ends before it gets past learning_starts measures no updates per env step: the matched track's
    check after the run refuses it (it was a traceback)."""
    from pal_bench.studies.race.task import SettingsMismatch

    def short(*_a, **_k):
        raise SettingsMismatch("pal-processes does not do the matched work: updates_per_step = 0.0 (matched: 0.25)")

    monkeypatch.setattr("pal_bench.studies.race_profile.run_one", short)
    line = one_line(capsys, ["race-profile", "pal-processes", "--seconds", "3", "--task", "smoke", "--out", "o"])
    assert "updates_per_step = 0.0" in line and "give it more --seconds" in line, line


# ---- text from a stored file that reaches a terminal or a suggested command

@pytest.mark.parametrize("column, value", [("backend", "threads; touch PWNED #"), ("env", "CartPole-v1$(id)"),
                                           ("backend", "thr\x1b]0;PWNED\x07eads"), ("algo", "dqn`id`")])
def test_curves_text_never_reaches_the_suggested_command_raw(nothing_runs, tmp_path, capsys, column, value):
    """A ``backend``, ``env`` or ``algo`` cell that is not a known backend or a plain name is refused in one line
    (it was pasted unquoted into the ``pal-bench train ...`` line dse suggests, and printed with its escapes)."""
    df = pd.read_csv(io.StringIO(CURVES))
    df[column] = value
    df.to_csv(tmp_path / "c.csv", index=False)
    err = one_line(capsys, ["dse", "--curves", "c.csv", "--max-cores", "2", "--out", "o"])
    assert "\x1b" not in err and "PWNED\x07" not in err
    assert not (tmp_path / "PWNED").exists()


def test_the_suggested_command_quotes_what_it_pastes():
    from pal_bench.studies.dse import Allocation

    line = Allocation(1, 1, 1.0, 1.0, "actors").command("dqn", "ALE/Pong v5", 0.25)
    assert "--env 'ALE/Pong v5'" in line


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link"])
def test_a_run_config_that_is_not_a_small_regular_file_is_one_line(tmp_path, kind):
    """``train --resume`` reads the run's config.yaml first: a FIFO hung it, a link to /dev/zero read until memory
    ran out (a subprocess, killed after 60 s if it hangs)."""
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    make_hostile(run / "config.yaml", kind)
    r = subprocess.run([sys.executable, "-m", "pal_bench.cli", "train", "--algo", "dqn", "--env", "CartPole-v1",
                        "--resume", "--name", "r1", "--out-dir", str(tmp_path / "runs"), "--steps", "2000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "config.yaml" in r.stderr and "regular file" in r.stderr
