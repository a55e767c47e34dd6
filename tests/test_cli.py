"""The command line's user errors: one line naming the argument (and the file and line where there is one),
exit status 2, no traceback; ``--debug`` shows the traceback."""

import pytest

from pal_bench.cli import main
from pal_bench.train import ConfigError


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_a_malformed_set_value_names_the_field(capsys):
    err = one_line_error(capsys, ["train", "--set", "hidden=[64,"])
    assert err.startswith("pal-bench train: hidden: cannot read '[64,'")


@pytest.mark.parametrize("name,text,where", [
    ("bad.toml", "lr = 0.1\nactors = [\n", "not valid TOML"),
    ("bad.yaml", "lr: 0.1\nactors: [1,\n  hidden: x: y\n", "at line 3, column 12"),
])
def test_a_config_file_with_a_syntax_error_names_file_and_line(tmp_path, capsys, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    err = one_line_error(capsys, ["train", "--config", str(path)])
    assert f"config file {path}" in err and where in err


def test_a_run_that_would_never_learn_is_rejected_naming_both_fields(capsys):
    err = one_line_error(capsys, ["train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "500"])
    assert "steps (500) must exceed learning_starts (1000)" in err


def test_dse_argument_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "--curves missing.csv: no such file" in one_line_error(capsys, ["dse", "--curves", "missing.csv"])


@pytest.mark.parametrize("argv,message", [
    (["dse", "--max-cores", "0", "--curves", "x.csv"], "argument --max-cores: must be >= 2, got '0'"),
    (["dse", "--repeats", "0", "--curves", "x.csv"], "argument --repeats: must be >= 1, got '0'"),
])
def test_dse_numbers_are_checked_by_argparse(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_dse_curves_without_the_curve_columns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    err = one_line_error(capsys, ["dse", "--curves", "other.csv"])
    assert "missing column(s) curve, threads, throughput" in err


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ConfigError, match="hidden"):
        main(["train", "--set", "hidden=[64,", "--debug"])


def test_resume_takes_the_runs_own_config_and_changes_only_what_may_change(tmp_path, capsys):
    """README's form: ``--name N --out-dir D --resume --steps S`` on a 2-actor, 2-learner run goes on as that
    run (not as the 1 x 1 defaults), keeps its config.yaml, and says so when it is already past ``--steps``."""
    import json

    import yaml

    base = ["train", "--name", "r", "--out-dir", str(tmp_path)]
    first = base + ["--algo", "dqn", "--env", "CartPole-v1", "--actors", "2", "--learners", "2", "--steps", "1200",
                    "--set", "learning_starts=500", "--set", "batch_size=32", "--set", "eval_episodes=0",
                    "--set", "progress=false"]
    assert main(first) == 0
    capsys.readouterr()
    assert main(base + ["--resume", "--steps", "1600"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[:out.index("\n}") + 2])
    assert summary["env_steps"] == 1600
    saved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert (saved["actors"], saved["learners"], saved["steps"], saved["batch_size"]) == (2, 2, 1600, 32)
    err = one_line_error(capsys, base + ["--resume", "--actors", "1", "--steps", "2000"])
    assert "actors: cannot change when resuming (the run has actors = 2)" in err
    err = one_line_error(capsys, base + ["--resume", "--steps", "1000"])
    assert "has done 1600 steps already" in err and "larger --steps" in err
    err = one_line_error(capsys, ["train", "--name", "none", "--out-dir", str(tmp_path), "--resume"])
    assert "no run to resume" in err


def test_profile_draws_into_out_and_leaves_the_run_alone(tmp_path, capsys):
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / "results" / "runs" / "dqn-lunarlander-a1l1"
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    assert main(["profile", str(run), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "profile.png").stat().st_size > 1000
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before



@pytest.mark.parametrize("argv,message", [
    (["--iterations", "1"], "argument --iterations: must be >= 2"),
    (["--only", "tianshou-dqn", "--runners", "1"], "no configuration matches"),
    (["--batch", "64"], "invalid choice"),
])
def test_plugin_bench_rejects_bad_selections_before_measuring(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plugin-bench", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
