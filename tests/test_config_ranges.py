"""``pal-bench train``'s config is checked field by field before anything starts (issue 35, items 2 and 14): a
run name is one path component inside ``--out``; every number is finite and in its declared range; a config
file that is binary or nested too deep is one error line naming the file. Each case goes through the real
entry point and must end in one line naming the field, exit status 2, with nothing written."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pal_bench.cli import main
from pal_bench.train import TrainConfig


@pytest.fixture
def no_training(monkeypatch):
    """A config that passes every check reaches the trainer: fail the test there instead of training."""
    from pal_bench.train import validate

    def tripwire(cfg, *args, **kwargs):
        validate(cfg)
        raise AssertionError(f"a bad config reached the trainer: {cfg}")

    monkeypatch.setattr("pal_bench.train.make_trainer", tripwire)


def refused(capsys, argv: list[str]) -> str:
    """``pal-bench train ARGV`` exits 2 with one line on stderr and no traceback; returns that line."""
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- item 2: the run name stays inside --out ----

NAMES = ["../../escaped", "..", ".", "a/b", "a\\b", "x\x00y", "../escaped"]


@pytest.mark.parametrize("name", NAMES, ids=repr)
@pytest.mark.parametrize("how", ["flag", "set", "file", "resume"])
def test_a_run_name_is_one_path_component(no_training, tmp_path, capsys, name, how):
    out = tmp_path / "D" / "a" / "b"
    argv = ["--out", str(out)]
    if how in ("flag", "resume"):
        argv += ["--name", name] + (["--resume"] if how == "resume" else [])
    elif how == "set":
        argv += ["--set", f"name={name}"]
    else:
        (tmp_path / "run.yaml").write_text(f"name: {json.dumps(name)}\n")
        argv += ["--config", str(tmp_path / "run.yaml")]
    before = tree(tmp_path)
    assert refused(capsys, argv).startswith("pal-bench train: name: a run name is one directory name")
    assert tree(tmp_path) == before


def test_an_absolute_name_writes_nowhere(no_training, tmp_path, capsys):
    target = tmp_path / "elsewhere"
    line = refused(capsys, ["--out", str(tmp_path / "out"), "--name", str(target)])
    assert line.startswith("pal-bench train: name:")
    assert tree(tmp_path) == []


def test_a_default_name_with_a_namespaced_env_is_one_component():
    cfg = TrainConfig(env="pal_bench/CartPoleNoVel-v0", out_dir="o")
    assert cfg.run_dir().parent.name == "o" and "/" not in cfg.run_name()


# ---- item 14: numbers finite and in range ----

CASES = [
    ("lr=inf", "lr"), ("updates_per_step=inf", "updates_per_step"),
    (f"seed={2**70}", "seed"), (f"seed={2**32}", "seed"), ("buffer_capacity=10000000000000", "buffer_capacity"),
    ("hidden=[-4]", "hidden"), ("hidden=[64,-1]", "hidden"), ("hidden=[0]", "hidden"),
    ("hidden=[100000000]", "hidden"), ("hidden=[1.5]", "hidden"), ("hidden=[]", "hidden"),
    ("grad_clip=-1", "grad_clip"), ("grad_clip=nan", "grad_clip"), ("grad_clip=inf", "grad_clip"),
    ("sac_alpha=0", "sac_alpha"), ("exploration_noise=-1", "exploration_noise"),
    ("policy_noise=nan", "policy_noise"), ("noise_clip=-0.5", "noise_clip"),
    ("learner_timeout_s=inf", "learner_timeout_s"),
    ("lr=2", "lr"),
    ("steps=10000000000000000000", "steps"), ("actors=100000", "actors"),
    ("env_kwargs=" + "{a: " * 3000 + "1" + "}" * 3000, "env_kwargs"), ("seed=" + "9" * 5000, "seed"),
]


@pytest.mark.parametrize("setting, field", CASES, ids=[c[0][:40] for c in CASES])
def test_an_absurd_value_is_refused_naming_the_field(no_training, tmp_path, capsys, setting, field):
    line = refused(capsys, ["--out", str(tmp_path), "--set", setting])
    assert line.startswith(f"pal-bench train: {field}"), line
    assert tree(tmp_path) == []


def test_a_huge_seed_flag_is_refused(no_training, tmp_path, capsys):
    assert refused(capsys, ["--out", str(tmp_path), "--seed", str(2**70)]).startswith("pal-bench train: seed ")
    assert tree(tmp_path) == []


FLOATS = [f.name for f in dataclasses.fields(TrainConfig) if isinstance(getattr(TrainConfig(), f.name), float)]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", FLOATS)
def test_every_float_field_is_finite(no_training, tmp_path, capsys, field, value):
    line = refused(capsys, ["--out", str(tmp_path), "--set", f"{field}={value}"])
    assert line.startswith(f"pal-bench train: {field} must be a finite number"), line
    assert tree(tmp_path) == []


INTS = [f.name for f in dataclasses.fields(TrainConfig)
        if type(getattr(TrainConfig(), f.name)) is int]


@pytest.mark.parametrize("field", INTS)
def test_every_int_field_has_an_upper_bound(no_training, tmp_path, capsys, field):
    line = refused(capsys, ["--out", str(tmp_path), "--set", f"{field}={2**70}"])
    assert line.startswith(f"pal-bench train: {field} must be <= "), line
    assert tree(tmp_path) == []


# ---- config files that are not text, or nest too deep ----

@pytest.mark.parametrize("name, data", [
    ("bin.yaml", b"\xff\xfe\x00\x81binary\x00"),
    ("bin.toml", bytes(range(256))),
    ("deep.yaml", b"env_kwargs: " + b"[" * 20000 + b"]" * 20000 + b"\n"),
    ("deep.toml", b"env_kwargs = " + b"[" * 20000 + b"]" * 20000 + b"\n"),
    ("huge.yaml", b"seed: " + b"9" * 5000 + b"\n"),
    ("huge.toml", b"seed = " + b"9" * 5000 + b"\n"),
])
def test_a_config_file_that_is_binary_or_too_deep_is_one_line(no_training, tmp_path, capsys, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    line = refused(capsys, ["--out", str(tmp_path / "out"), "--config", str(path)])
    assert line.startswith(f"pal-bench train: config file {path}: "), line
    assert tree(tmp_path) == [name]


def test_a_buffer_larger_than_memory_is_refused(no_training, tmp_path, capsys):
    line = refused(capsys, ["--out", str(tmp_path), "--set", f"buffer_capacity={2**39}"])
    assert line.startswith("pal-bench train: buffer_capacity:") and "GiB of memory" in line
    assert tree(tmp_path) == []


def test_every_number_has_a_declared_range():
    from pal_bench.train.config import FIELD_RANGES

    numbers = {f.name for f in dataclasses.fields(TrainConfig)
               if type(getattr(TrainConfig(), f.name)) in (int, float)} | {"hidden", "stop_return"}
    assert numbers == set(FIELD_RANGES)


@pytest.mark.parametrize("name", ["my-run_1", "run.2", "...", " x", "ä"])
def test_a_plain_name_is_a_run_directory_in_out(name):
    from pal_bench.train import make_config

    cfg = make_config("dqn", "CartPole-v1", name=name, out_dir="o")
    assert cfg.run_dir().parent.name == "o" and cfg.run_dir().name == name
