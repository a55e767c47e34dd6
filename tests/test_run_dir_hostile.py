"""A run directory others have touched: a user's own files in ``checkpoints/``, a symlinked ``checkpoints/``, two
runs of one directory at once (the run lock), a hostile ``latest.json`` (a FIFO, a link to /dev/zero, deep
nesting, a huge number, fields out of range), and a learner process killed with SIGKILL. Each ends in one line
(exit status 2 from the command line) or a consistent run, never a traceback, a hang, or a deleted file that the
run did not make."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pal_bench
from pal_bench.cli import main
from pal_bench.train import Trainer, make_config, make_trainer

BASE = dict(steps=1000, learning_starts=200, batch_size=32, eval_episodes=0, progress=False)
TINY = ["--set", "learning_starts=200", "--set", "batch_size=32", "--set", "eval_episodes=0",
        "--set", "progress=false"]
CLI = [sys.executable, "-m", "pal_bench.cli"]
# a script run in a subprocess imports the pal_bench under test (not whichever one is installed)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(pal_bench.__file__).parents[1]),
                                                   os.environ.get("PYTHONPATH", "")]))


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
    shutil.copytree(base_run, tmp_path / "r", symlinks=True)
    return tmp_path / "r"


def resume_argv(out: Path, steps: int = 1500) -> list[str]:
    return ["train", "--name", "r", "--out-dir", str(out), "--resume", "--steps", str(steps)]


def overwrite_argv(out: Path) -> list[str]:
    return ["train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "600", "--name", "r", "--out-dir", str(out),
            "--overwrite", *TINY]


def one_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, (rc, err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    return err


def pointer(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "latest.json").read_text())


def snapshot(root: Path) -> dict:
    """Every entry under ``root`` (links not followed): its kind and its bytes or link target."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", p.read_bytes())
        else:
            out[rel] = ("dir", None)
    return out


# ---------------------------------------------------------------------- item 2: delete only what the run made

def test_resume_removes_only_its_own_leftovers_in_checkpoints(run, tmp_path, capsys):
    ck = run / "checkpoints"
    (ck / "my-notes").mkdir()
    (ck / "my-notes" / "notes.txt").write_text("mine")
    (ck / "notes.txt").write_text("mine too")
    ours = [ck / "step-000000000500-0123abcd", ck / ".latest.json.12345.678.0123abcd.tmp"]   # a killed write's
    ours[0].mkdir()
    (ours[0] / "buffer.pal").write_bytes(b"half")
    ours[1].write_text("{")
    look_alikes = ["step-0000000000500-0123abcd", "step-000000000500-0123ABCD", "step-000000000500-0123abcd.bak",
                   "step-00000000500-0123abcd"]
    for name in look_alikes:
        (ck / name).mkdir()
        (ck / name / "keep.txt").write_text(name)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.txt").write_text("not the run's")
    (ck / "step-000000000400-0123abcd").symlink_to(outside)      # the run's pattern, but a link
    assert main(resume_argv(tmp_path)) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    assert (ck / "my-notes" / "notes.txt").read_text() == "mine"
    assert (ck / "notes.txt").read_text() == "mine too"
    for name in look_alikes:
        assert (ck / name / "keep.txt").read_text() == name
    assert (ck / "step-000000000400-0123abcd").is_symlink() and (outside / "data.txt").read_text() == "not the run's"
    assert not any(os.path.lexists(p) for p in ours)
    name = pointer(run)["checkpoint"]
    assert name.startswith("step-000000001500-")
    ckpts = [p.name for p in ck.iterdir() if p.name.startswith("step-000000001")]
    assert ckpts == [name]


def test_overwrite_removes_only_what_a_run_writes(run, tmp_path, capsys):
    ck = run / "checkpoints"
    (ck / "my-notes").mkdir()
    (ck / "my-notes" / "notes.txt").write_text("mine")
    (run / "my-plot.png").write_bytes(b"mine")
    assert main(overwrite_argv(tmp_path)) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    assert (ck / "my-notes" / "notes.txt").read_text() == "mine"
    assert (run / "my-plot.png").read_bytes() == b"mine"
    assert pointer(run)["steps"] == 600
    assert [p.name for p in ck.iterdir() if p.name.startswith("step-")] == [pointer(run)["checkpoint"]]


@pytest.mark.parametrize("how", ["resume", "overwrite"])
def test_a_symlinked_checkpoints_dir_is_refused_and_its_target_untouched(run, tmp_path, capsys, how):
    elsewhere = tmp_path / "elsewhere"
    (run / "checkpoints").rename(elsewhere)
    (run / "checkpoints").symlink_to(elsewhere)
    (elsewhere / "keep").mkdir()
    (elsewhere / "keep" / "data.txt").write_text("keep")
    before, run_before = snapshot(elsewhere), snapshot(run)
    err = one_line(capsys, resume_argv(tmp_path) if how == "resume" else overwrite_argv(tmp_path))
    assert str(run / "checkpoints") in err and "symbolic link" in err
    assert snapshot(elsewhere) == before
    assert snapshot(run) == run_before


def test_a_checkpoints_entry_that_is_not_a_directory_is_refused_before_anything_changes(run, tmp_path, capsys):
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("a file of the user's")
    before = snapshot(run)
    err = one_line(capsys, overwrite_argv(tmp_path))
    assert str(run / "checkpoints") in err and "not a directory" in err
    assert snapshot(run) == before


# ---------------------------------------------------------------------- item 3: one run per directory

HOLDER = """
import sys
from pal_bench.train import Trainer, make_config
cfg = make_config("dqn", "CartPole-v1", out_dir=sys.argv[1], name="r", steps=1500, learning_starts=200,
                  batch_size=32, eval_episodes=0, progress=False)
tr = Trainer(cfg, resume=True)
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_second_run_of_a_run_directory_is_refused_naming_the_holder_and_changes_nothing(run, tmp_path, capsys):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert p.stdout.readline().strip() == "holding", p.stderr.read()[-3000:]
        before = snapshot(run)
        for argv in (resume_argv(tmp_path), overwrite_argv(tmp_path)):
            err = one_line(capsys, argv)
            assert str(run) in err and f"pid {p.pid}" in err and "in use" in err, err
            assert snapshot(run) == before
    finally:
        p.kill()                          # SIGKILL: the kernel releases the lock
        p.wait(30)
        p.stdout.close()
        p.stderr.close()
    assert main(resume_argv(tmp_path)) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    assert pointer(run)["steps"] == 1500


def _shm(run: Path) -> set[str]:
    from pal_bench.train.backends.processes.shared import segment_name

    digest = segment_name(run, "buf").rsplit("_", 1)[1]
    return {n for n in os.listdir("/dev/shm") if n.startswith(("pal_", "pal-")) and digest in n}


def test_the_process_backend_refuses_a_held_run_directory_in_the_run_locks_words(tmp_path):
    from pal_bench.train import ConfigError

    cfg = make_config("dqn", "CartPole-v1", backend="processes", actors=1, out_dir=str(tmp_path), name="p", **BASE)
    with make_trainer(cfg) as first:
        segments = _shm(first.run_dir)
        assert segments
        with pytest.raises(ConfigError) as refused:
            make_trainer(cfg, overwrite=True)
        text = str(refused.value)
        assert "in use by another run" in text and str(first.run_dir) in text and f"pid {os.getpid()}" in text, text
        assert _shm(first.run_dir) == segments                    # the first run's segments are untouched
    assert _shm(tmp_path / "p") == set()


def test_a_lock_file_alone_is_not_a_run_and_survives_overwrite(run, tmp_path, capsys):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".lock").write_text("999999\n")                      # left by a killed run
    with Trainer(make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), name="fresh", **BASE)) as tr:
        assert tr.run_dir == fresh
    assert main(overwrite_argv(tmp_path)) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    assert (run / ".lock").is_file()


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(run, tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("not a lock")
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(target)
    before = snapshot(run)
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(run / ".lock") in err and "symbolic link" in err
    assert target.read_text() == "not a lock" and snapshot(run) == before


# ---------------------------------------------------------------------- item 6: a hostile latest.json

def _good_pointer(run: Path) -> dict:
    return pointer(run)


HOSTILE = {
    "deep-nesting": lambda run: ("[" * 2000 + "]" * 2000).encode(),
    "huge-int": lambda run: (json.dumps(_good_pointer(run))[:-1] + ', "x": 1' + "0" * 4400 + "}").encode(),
    "steps-huge": lambda run: json.dumps(_good_pointer(run) | {"steps": 10**30}).encode(),
    "steps-negative": lambda run: json.dumps(_good_pointer(run) | {"steps": -1}).encode(),
    "name-escapes": lambda run: json.dumps(_good_pointer(run) | {"checkpoint": "../../r/checkpoints"}).encode(),
    "name-not-ours": lambda run: json.dumps(_good_pointer(run) | {"checkpoint": "step-0000000001000-0123abcd"}
                                            ).encode(),
    "not-utf8": lambda run: b"\xff\xfe{}",
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_pointer_is_one_line_naming_it(run, tmp_path, capsys, case):
    latest = run / "checkpoints" / "latest.json"
    latest.write_bytes(HOSTILE[case](run))
    before = snapshot(run)
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(latest) in err
    assert snapshot(run) == before


def test_a_pointer_that_is_a_link_or_names_a_linked_directory_is_refused(run, tmp_path, capsys):
    latest = run / "checkpoints" / "latest.json"
    copy = tmp_path / "latest-copy.json"
    shutil.copy(latest, copy)
    latest.unlink()
    latest.symlink_to(copy)                                    # a valid pointer, through a link
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(latest) in err and "symbolic link" in err
    latest.unlink()
    shutil.copy(copy, latest)
    d = run / "checkpoints" / pointer(run)["checkpoint"]
    moved = tmp_path / "moved"
    d.rename(moved)
    d.symlink_to(moved)                                        # the named checkpoint, through a link
    err = one_line(capsys, resume_argv(tmp_path))
    assert str(latest) in err and "symbolic link" in err
    assert (moved / "checkpoint.pt").is_file()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))     # /dev/zero read whole: MemoryError, not OOM


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_pointer_that_is_a_fifo_or_a_device_neither_hangs_nor_exhausts_memory(run, tmp_path, kind):
    latest = run / "checkpoints" / "latest.json"
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest)
    else:
        latest.symlink_to("/dev/zero")
    try:
        p = subprocess.run(CLI + resume_argv(tmp_path), capture_output=True, text=True, timeout=60,
                           preexec_fn=_limit_memory, env=ENV)
    except subprocess.TimeoutExpired:
        pytest.fail(f"resume hung on a latest.json that is a {kind}")
    err = p.stderr.strip()
    assert p.returncode == 2, (p.returncode, err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1 and str(latest) in err, err[-3000:]


# ---------------------------------------------------------------------- item 9: a learner process killed

KILLED_LEARNER = """
import os, signal, sys
from pal_bench.train.faults import Faults


class KillLearner(Faults):
    \"\"\"Learner process 1 SIGKILLs itself before its update 20: a learner killed mid-run.\"\"\"

    def before_update(self, learner, updates):
        if learner == 1 and updates == 20:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    from pal_bench.cli import main
    from pal_bench.train.backends.processes import ProcessTrainer

    ProcessTrainer.faults = KillLearner()
    sys.exit(main(sys.argv[1:]))
"""


def test_a_learner_process_killed_with_sigkill_checkpoints_and_says_so_in_one_line(tmp_path):
    script = tmp_path / "killed_learner.py"
    script.write_text(KILLED_LEARNER)
    argv = [sys.executable, str(script), "train", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "100000",
            "--backend", "processes", "--actors", "1", "--learners", "2", "--set", "learner_processes=true",
            "--name", "k", "--out-dir", str(tmp_path), *TINY]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=ENV)
    err = p.stderr.strip()
    assert p.returncode == 2, (p.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    last = err.splitlines()[-1]
    assert last.startswith("pal-bench train: learner1 process died") and "killed by SIGKILL" in last, last
    assert "pid " in last and str(tmp_path / "k") in last, last
    run = tmp_path / "k"
    assert (run / "summary.json").is_file()
    d = run / "checkpoints" / pointer(run)["checkpoint"]
    assert (d / "checkpoint.pt").is_file() and (d / "buffer.pal").is_file()
    assert _shm(run) == set()


def test_a_hard_linked_lock_file_is_refused_and_never_truncated(tmp_path):
    """A ``.lock`` that is another name of a user's file (or of another run's lock: a ``cp -al`` copy) is refused
    in one line and left as it was (the lock used to write its pid over the file)."""
    from pal_bench.train.recorder import RunFileError, RunLock

    run = tmp_path / "h"
    run.mkdir()
    (run / "notes.txt").write_text("precious\n")
    os.link(run / "notes.txt", run / ".lock")
    with pytest.raises(RunFileError, match="hard link"):
        RunLock(run, create=False)
    assert (run / "notes.txt").read_text() == "precious\n"
    first = RunLock(tmp_path / "run1")
    try:
        (tmp_path / "run2").mkdir()
        os.link(tmp_path / "run1" / ".lock", tmp_path / "run2" / ".lock")
        with pytest.raises(RunFileError, match="cp -al"):
            RunLock(tmp_path / "run2")
    finally:
        first.release()
