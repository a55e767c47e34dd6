"""A run directory's files under faults: checkpoints that would run code, damaged or mismatched run files, a kill
between the buffer and the checkpoint, two writers of one file, a full disk at the final checkpoint, a reused run
name, SIGTERM/SIGHUP, and an actor that keeps dying. Each ends in one line (exit status 2 from the command line)
or a consistent run directory, never a traceback, executed code or a half-written pair."""

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pal_bench.atomic import atomic_write_text
from pal_bench.cli import main
from pal_bench.train import ConfigError, Trainer, make_config

TESTS = Path(__file__).resolve().parent
BASE = dict(steps=1000, learning_starts=200, batch_size=32, eval_episodes=0, progress=False)
TINY = ["--set", "learning_starts=200", "--set", "batch_size=32", "--set", "eval_episodes=0",
        "--set", "progress=false"]


def ckpt_files(run: Path) -> tuple[Path, Path]:
    """(checkpoint.pt, buffer.pal) of a run's last complete checkpoint, in either layout."""
    latest = run / "checkpoints" / "latest.json"
    if latest.exists():
        d = run / "checkpoints" / json.loads(latest.read_text())["checkpoint"]
        return d / "checkpoint.pt", d / "buffer.pal"
    return run / "checkpoint.pt", run / "buffer.pal"


def has_checkpoint(run: Path) -> bool:
    return (run / "checkpoints" / "latest.json").exists() or (run / "checkpoint.pt").exists()


def one_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, (rc, err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    return err


def resume_argv(out: Path, name: str = "r", steps: int = 1500) -> list[str]:
    return ["train", "--name", name, "--out-dir", str(out), "--resume", "--steps", str(steps)]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A finished 1000-step DQN CartPole run (thread backend)."""
    out = tmp_path_factory.mktemp("base")
    with Trainer(make_config("dqn", "CartPole-v1", out_dir=str(out), name="base", **BASE)) as tr:
        tr.run()
    return out / "base"


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    """A copy of the base run in ``tmp_path / "r"``."""
    shutil.copytree(base_run, tmp_path / "r")
    return tmp_path / "r"


# ---------------------------------------------------------------------- item 1: a checkpoint is data, never code

class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_a_checkpoint_whose_pickle_would_run_code_is_refused_without_running_it(run, tmp_path, capsys):
    marker = tmp_path / "pwned"
    ckpt, _ = ckpt_files(run)
    state = torch.load(ckpt, weights_only=False)
    torch.save(state | {"payload": _RunsCode(marker)}, ckpt)
    err = one_line(capsys, resume_argv(tmp_path))
    assert not marker.exists(), "loading the checkpoint ran code from it"
    assert str(ckpt) in err


# ---------------------------------------------------------------------- item 12: damaged run files

def _truncate(frac):
    def damage(path: Path):
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * frac)])
    return damage


@pytest.mark.parametrize("which, damage", [
    ("checkpoint", _truncate(0.5)),
    ("checkpoint", _truncate(0.99)),
    ("checkpoint", _truncate(0.0)),
    ("checkpoint", lambda p: p.write_bytes(random.Random(0).randbytes(50_000))),
    ("checkpoint", lambda p: torch.save({"steps": 500, "ps": {}}, p)),
    ("buffer", _truncate(0.5)),
    ("buffer", lambda p: p.write_bytes(b"")),
], ids=["ckpt-50%", "ckpt-99%", "ckpt-empty", "ckpt-random", "ckpt-missing-keys", "buffer-50%", "buffer-empty"])
def test_a_damaged_run_file_ends_resume_in_one_line_naming_it(run, tmp_path, capsys, which, damage):
    ckpt, buf = ckpt_files(run)
    target = ckpt if which == "checkpoint" else buf
    damage(target)
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(target) in err


def test_a_buffer_with_another_runs_fields_is_refused(run, tmp_path, capsys):
    from conftest import lunar_batch

    from pal_bench import PrioritizedReplayBuffer

    _, buf_path = ckpt_files(run)
    other = PrioritizedReplayBuffer(100_000, {"obs": ((8,), np.float32), "act": ((), np.int64),
                                              "rew": ((), np.float32), "next_obs": ((8,), np.float32),
                                              "done": ((), np.bool_)})
    other.add_batch(**lunar_batch(1000))
    other.save(buf_path)
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(buf_path) in err and "fields" in err


def test_a_config_yaml_that_is_not_utf8_is_one_line(run, tmp_path, capsys):
    (run / "config.yaml").write_bytes(b"algo: dqn\nenv: \xff\xfe\x00CartPole\n")
    err = one_line(capsys, resume_argv(tmp_path))
    assert "config.yaml" in err


# ---------------------------------------------------------------------- item 13: the checkpoint/buffer pair

def test_a_checkpoint_and_a_buffer_from_different_moments_are_refused(run, tmp_path, capsys):
    _, buf = ckpt_files(run)
    early = buf.read_bytes()                                    # the buffer at 1000 steps
    with Trainer(make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), name="r", **(BASE | {"steps": 1500})),
                 resume=True) as tr:
        tr.run()
    _, buf = ckpt_files(run)
    buf.write_bytes(early)                                      # the 1500-step checkpoint with the 1000-step buffer
    err = one_line(capsys, resume_argv(tmp_path, steps=2000))
    assert str(buf) in err


KILLED_AT_CHECKPOINT = """
import os, sys
import torch
from pal_bench.train import make_config, make_trainer
cfg = make_config("dqn", "CartPole-v1", out_dir=sys.argv[1], name="r", steps=1500, learning_starts=200,
                  batch_size=32, eval_episodes=0, progress=False)
torch.save = lambda *a, **k: os._exit(9)     # killed after the buffer is written, before the checkpoint is
with make_trainer(cfg, resume=True) as tr:
    tr.run()
"""


def test_a_kill_between_the_buffer_and_the_checkpoint_leaves_a_consistent_pair(run, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AT_CHECKPOINT)
    p = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 9, p.stderr[-3000:]
    cfg = make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), name="r", **(BASE | {"steps": 2000}))
    with Trainer(cfg, resume=True) as tr:
        # the last complete checkpoint (the base run's end, 1000 steps) with its own buffer
        assert tr.rate.steps == 1000 and tr.buffer.total_added == tr.rate.steps
        s = tr.run()
    assert s["env_steps"] == 2000
    if (run / "checkpoints").exists():                         # the killed write's leftovers are gone
        assert len([d for d in (run / "checkpoints").iterdir() if d.is_dir()]) == 1


def test_a_run_in_the_old_layout_is_refused_in_one_line(run, tmp_path, capsys):
    ckpt, buf = ckpt_files(run)
    if ckpt.parent != run:                      # rebuild the earlier layout: checkpoint.pt and buffer.pal beside
        state = torch.load(ckpt, weights_only=True)           # config.yaml, RNG states as numpy objects
        state["numpy_rng"] = np.random.get_state()
        torch.save(state, run / "checkpoint.pt")
        shutil.copy(buf, run / "buffer.pal")
        shutil.rmtree(run / "checkpoints")
    else:
        pytest.fail("today's layout is the old one: nothing to check")
    err = one_line(capsys, resume_argv(tmp_path))
    assert "checkpoint.pt" in err and "--overwrite" in err


# ---------------------------------------------------------------------- item 9: two writers of one path

def test_two_threads_writing_one_path_do_not_collide(tmp_path):
    path = tmp_path / "shared.txt"
    errors = []

    def writer(tag: str):
        for i in range(60):
            try:
                atomic_write_text(path, f"{tag}{i:03d}" * 20_000)
            except Exception as e:          # noqa: BLE001 - counted
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} of 120 writes failed: {errors[0]!r}"
    text = path.read_text()
    assert len(text) == 4 * 20_000 and text == text[:4] * 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


# ---------------------------------------------------------------------- the final checkpoint and the logs

def test_a_full_disk_at_the_final_checkpoint_still_leaves_the_summary(tmp_path, capsys, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    argv = ["train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "600", "--name", "full",
            "--out-dir", str(tmp_path), *TINY]
    err = one_line(capsys, argv)
    assert "No space left" in err
    run = tmp_path / "full"
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 600
    assert not has_checkpoint(run)
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert not (run / "checkpoints").exists() or not [p for p in (run / "checkpoints").iterdir() if p.is_dir()]


# ---------------------------------------------------------------------- a reused run name

def test_a_finished_runs_name_is_not_reused_without_overwrite(run, tmp_path, capsys):
    before = (run / "summary.json").read_bytes()
    argv = ["train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "600", "--name", "r",
            "--out-dir", str(tmp_path), *TINY]
    err = one_line(capsys, argv)
    assert str(run) in err and "--resume" in err and "--overwrite" in err
    assert (run / "summary.json").read_bytes() == before
    with pytest.raises(ConfigError, match="--overwrite"):
        Trainer(make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), name="r", **BASE))
    err = one_line(capsys, ["train", "--name", "r", "--out-dir", str(tmp_path), "--resume", "--overwrite",
                            "--steps", "2000"])
    assert "--resume" in err and "--overwrite" in err
    assert main(argv + ["--overwrite"]) == 0
    capsys.readouterr()
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 600
    ckpt, buf = ckpt_files(run)
    assert torch.load(ckpt, weights_only=True)["steps"] == 600


# ---------------------------------------------------------------------- SIGTERM / SIGHUP: Ctrl-C's clean stop

def _shm(run: Path) -> set[str]:
    """The shared segments of the run in ``run`` (the process backend names them after its directory; other
    people's tests may create and remove segments of their own meanwhile)."""
    from pal_bench.train.backends.processes.shared import segment_name as _segment_name

    digest = _segment_name(run, "buf").rsplit("_", 1)[1]
    return {n for n in os.listdir("/dev/shm") if n.startswith(("pal_", "pal-")) and digest in n}


@pytest.mark.parametrize("backend, sig", [("processes", signal.SIGTERM), ("threads", signal.SIGHUP)])
def test_sigterm_and_sighup_stop_the_run_cleanly_with_a_checkpoint(tmp_path, backend, sig):
    argv = [sys.executable, "-m", "pal_bench.cli", "train", "--algo", "dqn", "--env", "CartPole-v1",
            "--steps", "1000000", "--backend", backend, "--actors", "1", "--name", "s", "--out-dir", str(tmp_path),
            *TINY]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "s" / "config.yaml").exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(2)                                           # actors stepping, the learner updating
        os.kill(p.pid, sig)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for name in _shm(tmp_path / "s"):                       # what a failed stop leaked: not for the next test
            (Path("/dev/shm") / name).unlink(missing_ok=True)
            pytest.fail(f"/dev/shm/{name} left behind")
    assert p.returncode == 128 + sig, (p.returncode, err[-3000:])
    assert took < 15, f"{took:.1f} s to stop"
    assert "Traceback" not in err, err[-3000:]
    assert has_checkpoint(tmp_path / "s")


def test_the_signal_handlers_are_restored_and_an_ignored_hangup_stays_ignored(tmp_path):
    from pal_bench.train.driver import stop_on_signals

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGTERM) is not mine
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN          # nohup: the run survives a hang-up
        cfg = make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), name="h", **(BASE | {"steps": 300}))
        with Trainer(cfg) as tr:
            tr.run()
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGHUP, previous[1])


# ---------------------------------------------------------------------- an actor process that keeps dying

def test_an_actor_dying_past_the_restart_limit_checkpoints_and_says_so_in_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "pal_bench.cli", "train", "--algo", "dqn", "--env",
            "faulty_envs:PalTest/CrashingCartPole-v0", "--steps", "100000", "--backend", "processes",
            "--actors", "1", "--name", "c", "--out-dir", str(tmp_path), *TINY]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2, p.stderr[-3000:]
    assert last.startswith("pal-bench train: actor0 died 6 times") and "crashed on purpose" in last, last
    assert has_checkpoint(tmp_path / "c")
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["restarts"][-1]["worker"] == "actor0"
    assert _shm(tmp_path / "c") == set()
