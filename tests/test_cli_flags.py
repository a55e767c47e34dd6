"""Every subcommand's numeric and list flags are checked by argparse before anything is measured or written
(issue 35, item 14): a bad value ends in argparse's usage and one error line naming the flag, exit status 2."""

from __future__ import annotations

import importlib

import pytest

from pal_bench.cli import main

STUDIES = ("scaling.measure", "concurrency", "fanout", "shared_buffer", "race", "plugin.measure", "aggregation.measure",
           "longhaul.experiment", "dse", "memory", "atari_run")


def _tripwire(*_a, **_k):
    raise AssertionError("a bad flag reached the measurement")


@pytest.fixture
def no_measuring(monkeypatch, tmp_path):
    """Any study, dse or race-profile that gets past its argument checks fails the test at once (instead of
    measuring), and the working directory is an empty temporary one."""
    for name in STUDIES:
        monkeypatch.setattr(importlib.import_module(f"pal_bench.studies.{name}"), "refuse_if_busy", _tripwire)
    monkeypatch.setattr("pal_bench.conditions.refuse_if_busy", _tripwire)
    monkeypatch.setattr("pal_bench.studies.dse.solve", _tripwire)
    for name in ("run_one", "profile_framework"):
        monkeypatch.setattr(f"pal_bench.studies.race_profile.{name}", _tripwire)
    monkeypatch.chdir(tmp_path)


def exit_status(call) -> int:
    try:
        return call()
    except SystemExit as e:
        return e.code


def refused(capsys, argv: list[str]) -> str:
    """``pal-bench ARGV`` exits 2 without a traceback; returns the error line (stderr's last)."""
    assert exit_status(lambda: main(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err, err
    return err.splitlines()[-1]


CURVES = "curve,threads,throughput\nf_a,1,100\nf_a,2,180\nf_l,1,50\nf_l,2,90\n"

# (argv, the flag the error names); every case here ran (or crashed) before these checks
CASES = [
    (["race", "--seeds", "0"], "--seeds"),
    (["race", "--seeds", "-2"], "--seeds"),
    (["race", "--max-minutes", "-1"], "--max-minutes"),
    (["race", "--max-minutes", "nan"], "--max-minutes"),
    (["race", "--seed", str(2**70)], "--seed"),
    (["race", "--cpus", "0"], "--cpus"),
    (["race", "--cpus", "-1"], "--cpus"),
    (["race", "--cpus", "4096"], "--cpus"),
    (["race", "--tune"], "--tune"),
    (["aggregation", "--learners", "0"], "--learners"),
    (["aggregation", "--iters", "-1"], "--iters"),
    (["aggregation", "--warmup", "-1"], "--warmup"),
    (["aggregation", "--group-size", "0"], "--group-size"),
    (["longhaul", "--steps", "-1"], "--steps"),
    (["longhaul", "--actors", "0"], "--actors"),
    (["longhaul", "--actor-rate", "-5"], "--actor-rate"),
    (["longhaul", "--actor-rate", "inf"], "--actor-rate"),
    (["longhaul", "--prefetch", "-1"], "--prefetch"),
    (["longhaul", "--seed", "-1"], "--seed"),
    (["concurrency", "--seconds", "-1"], "--seconds"),
    (["concurrency", "--seconds", "nan"], "--seconds"),
    (["concurrency", "--impls", "bogus"], "--impls"),
    (["concurrency", "--impls", "pal,,tianshou"], "--impls"),
    (["shared-buffer", "--seconds", "0"], "--seconds"),
    (["shared-buffer", "--seconds", "inf"], "--seconds"),
    (["fanout", "--fanouts", "abc"], "--fanouts"),
    (["fanout", "--fanouts", "2,5000"], "--fanouts"),
    (["fanout", "--capacity", "nan"], "--capacity"),
    (["fanout", "--capacity", "1e13"], "--capacity"),
    (["scaling", "--algo", "bogus"], "--algo"),
    (["plugin-bench", "--seed", "-1"], "--seed"),
    (["race-profile", "pal", "--top", "-3"], "--top"),
    (["race-profile", "pal", "--seconds", "inf"], "--seconds"),
    (["race-profile", "pal", "--seed", "-1"], "--seed"),
    (["atari-run", "--actors", "0"], "--actors"),
    (["atari-run", "--steps", "-5"], "--steps"),
    (["memory", "--capacity", "0"], "--capacity"),
    (["memory", "--capacity", "1e5,x"], "--capacity"),
    (["memory", "--impl", "pal,bogus"], "--impl"),
    (["memory", "--mode", "zip"], "--mode"),
    (["memory", "--workload", "pong"], "--workload"),
    (["latency", "--impl", "pal", "--capacity", "0"], "--capacity"),
    (["latency", "--impl", "pal", "--capacity", "1e3,nan"], "--capacity"),
    (["latency", "--impl", "pal,,x"], "--impl"),
    (["latency", "--impl", "pal", "--workload", "pong"], "--workload"),
    (["check-buffer", "pal", "--timeout", "-1"], "--timeout"),
    (["check-buffer", "pal", "--timeout", "inf"], "--timeout"),
    (["check-buffer", "pal", "--seed", "-1"], "--seed"),
    (["dse", "--curves", "c.csv", "--validate", "-5"], "--validate"),
    (["dse", "--curves", "c.csv", "--ratio", "inf"], "--ratio"),
    (["dse", "--curves", "c.csv", "--steps", "0"], "--steps"),
    (["dse", "--curves", "c.csv", "--updates", "-1"], "--updates"),
]


@pytest.mark.parametrize("argv, flag", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_flag_is_refused_before_anything_runs(no_measuring, tmp_path, capsys, argv, flag):
    (tmp_path / "c.csv").write_text(CURVES)
    out = tmp_path / "out"
    if argv[0] not in ("race-profile",):
        argv = [*argv, "--out", str(out)]
    line = refused(capsys, argv)
    assert f"error: argument {flag}: " in line, line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv"]


def test_report_without_results_exits_2(tmp_path, capsys):
    line = refused(capsys, ["report", "--results", str(tmp_path / "missing"), "--no-docs", "--no-figures"])
    assert "error: argument --results: " in line and "missing" in line
    assert list(tmp_path.iterdir()) == []


GOOD = [
    ["race", "--seeds", "2", "--max-minutes", "0.5", "--seed", str(2**32 - 1)],
    ["fanout", "--capacity", "1e6", "--fanouts", "4,16", "--rounds", "2"],
    ["concurrency", "--impls", "pal,cpprb", "--seconds", "0.5"],
    ["shared-buffer", "--impls", "pal", "--seconds", "0.5"],
    ["aggregation", "--schemes", "ps-sync,hierarchical", "--group-size", "1", "--warmup", "0", "--learners", "2"],
    ["longhaul", "--actor-rate", "0", "--prefetch", "0", "--links", "wan", "--steps", "100", "--actors", "1"],
    ["scaling", "--algo", "ddqn", "--end-to-end", "0", "--max-threads", "2"],
    ["plugin-bench", "--runners", "0", "--iterations", "2"],
    ["dse", "--curves", "c.csv", "--ratio", "0.25", "--validate", "0", "--max-cores", "2"],
    ["race-profile", "pal", "--top", "3", "--seconds", "1.5"],
]


@pytest.mark.parametrize("argv", GOOD, ids=[" ".join(a) for a in GOOD])
def test_good_flags_pass_their_checks(no_measuring, tmp_path, argv):
    """In-range values get through to the measurement (the tripwire)."""
    (tmp_path / "c.csv").write_text(CURVES)
    with pytest.raises(AssertionError, match="reached the measurement"):
        main(argv)
