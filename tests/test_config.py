"""Config files, overrides and validation messages."""

import pytest

from pal_bench.train import ConfigError, make_config
from pal_bench.train.config import parse_overrides


def test_toml_and_yaml_files_then_overrides(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('algo = "ddqn"\nenv = "CartPole-v1"\nlr = 0.002\nhidden = [32, 32]\nactors = 3\n')
    cfg = make_config(file=str(toml), **parse_overrides(["lr=5e-4", "n_step=5"]))
    assert (cfg.algo, cfg.env, cfg.hidden, cfg.actors) == ("ddqn", "CartPole-v1", (32, 32), 3)
    assert cfg.lr == 5e-4 and cfg.n_step == 5
    yaml = tmp_path / "run.yaml"
    yaml.write_text("algo: td3\nenv: LunarLander-v3\nbatch_size: 64\n")
    cfg = make_config(file=str(yaml))
    assert cfg.env_kwargs == {"continuous": True} and cfg.batch_size == 64 and cfg.policy_delay == 2


@pytest.mark.parametrize("overrides, field", [
    (["n_step=three"], "n_step"), (["nonsense=1"], "nonsense"), (["prioritized=maybe"], "prioritized")])
def test_bad_overrides_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        make_config("dqn", "CartPole-v1", **parse_overrides(overrides))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        make_config(file=str(tmp_path / "nope.toml"))
