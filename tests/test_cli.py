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


@pytest.mark.parametrize("argv,message", [
    (["dse", "--curves", "missing.csv"], "--curves missing.csv: no such file"),
    (["dse", "--max-cores", "0", "--curves", "x.csv"], "--max-cores 0: a split needs at least 2 cores"),
])
def test_dse_argument_errors(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in one_line_error(capsys, argv)


def test_dse_curves_without_the_curve_columns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    err = one_line_error(capsys, ["dse", "--curves", "other.csv"])
    assert "missing column(s) curve, threads, throughput" in err


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ConfigError, match="hidden"):
        main(["train", "--set", "hidden=[64,", "--debug"])
