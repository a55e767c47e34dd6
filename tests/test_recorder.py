"""The run recorder every backend writes through, and the atomic file writes under it."""

import csv
import os
import subprocess
import sys

import pytest

from pal_bench.atomic import atomic_open
from pal_bench.train.recorder import EVENT_FIELDS, RunRecorder


def test_atomic_open_keeps_the_old_file_when_the_block_fails(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"good")
    with pytest.raises(RuntimeError), atomic_open(path, "wb") as f:
        f.write(b"half")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"good" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    with atomic_open(path, "wb") as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(ValueError, match="whole files"):
        with atomic_open(path, "a"):
            pass


def test_recorder_writes_events_evaluations_logs_and_a_checkpoint_it_restores(tmp_path, capsys):
    rec = RunRecorder(tmp_path / "run", "dqn-CartPole-v1-s0")
    rec.write_config({"algo": "dqn"})
    rec.evaluation({"env_steps": 100, "updates": 10, "version": 3, "wall_s": 1.5, "mean_return": 20.0,
                    "std_return": 1.0})
    rec.event(2.0, 150, "actor1", "restart", 8, "process 1 died")
    rec.episodes.append((120, 18.0, 18, 1.7))
    assert "actor1 restart: process 1 died" in capsys.readouterr().err
    events = list(csv.DictReader(open(tmp_path / "run" / "events.csv")))
    assert list(events[0]) == EVENT_FIELDS and events[0]["transitions_lost"] == "8"
    rec.write_logs({"env_steps": 150})
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"config.yaml", "eval.csv", "events.csv", "episodes.csv", "summary.json"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    rec.save_checkpoint({"steps": 150})
    again = RunRecorder(tmp_path / "run", "dqn-CartPole-v1-s0")
    state = again.load_checkpoint()
    assert state["steps"] == 150 and again.evals == rec.evals and again.events == rec.events
    assert again.episodes == rec.episodes
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        RunRecorder(tmp_path / "other", "x").load_checkpoint()


def test_train_does_not_import_the_long_haul_study():
    """The trainer knows topologies only through the registry (``pal_bench.train.topology``)."""
    code = ("import sys, pal_bench.train, pal_bench.train.backends.threads, pal_bench.train.backends.processes, "
            "pal_bench.train.backends.ray; print(sorted(m for m in sys.modules if 'longhaul' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ))
    assert out.stdout.strip() == "[]"


def test_topologies_register_through_the_entry_point_and_unknown_ones_are_rejected():
    from pal_bench.train import ConfigError, make_config, topology, validate

    assert topology.names() == ["local", "learner-replay", "buffer-replay"]
    from pal_bench.studies.longhaul.trainer import LonghaulTrainer

    assert topology.get("buffer-replay").trainer is LonghaulTrainer
    with pytest.raises(ConfigError, match="topology must be one of local, learner-replay, buffer-replay"):
        topology.get("ring")
    with pytest.raises(ConfigError, match="link: 'wan' needs a long-haul topology"):
        validate(make_config("dqn", "CartPole-v1", link="wan"))
