"""Shared weights and `pal-bench shm` under hostile conditions (issue 48): a reader or writer stopped
(SIGSTOP, a debugger) for longer than the read deadline, a writer killed mid-publish, a segment `--clean` may not
remove, a segment name holding terminal escape sequences. Stops and kills happen to real processes; every wait
has a timeout, so a hang fails the test instead of pytest."""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pal_bench import _segment
from pal_bench.train.shared_weights import MAGIC, SharedWeights, spec_of

SHM = Path("/dev/shm")
needs_shm = pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory (/dev/shm)")
TAG = f"pal-test-{os.getpid()}-hostile"
DEADLINE_S = 0.3              # the read deadline the processes below use
STOPPED_S = 1.5               # how long a process stays stopped: well past DEADLINE_S
N = 1000                      # elements of the one tensor published


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm():
    yield
    assert not [n for n in os.listdir(SHM) if n.startswith(TAG)], "a test left a segment in /dev/shm"


def spawn(code: str, *args: str) -> subprocess.Popen:
    """``code`` in a fresh interpreter that imports the same ``pal_bench`` as this test."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=Path(__file__).parent,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_stopped(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until ``proc`` has stopped itself (SIGSTOP); fails if it exits or takes longer than ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            return
        assert not pid, f"process ended (wait status {status}) before it stopped: {proc.stderr.read()}"
        time.sleep(0.01)
    raise AssertionError(f"process did not stop within {timeout} s")


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"process hung: {out} {err}") from None
    return proc.returncode, out, err


def spec() -> list:
    return spec_of({"w": torch.zeros(N)})


# ------------------------------------------------------------------------------------------- SharedWeights.read

READER = f"""
    import os, signal, sys, torch
    from pal_bench.train.shared_weights import SharedWeights, spec_of
    w = SharedWeights.attach(sys.argv[1], spec_of({{"w": torch.zeros({N})}}))
    print("reading", flush=True)
    try:
        version, got = w.read(timeout_s={DEADLINE_S})
    except RuntimeError as e:
        print("error:", e, flush=True)
        sys.exit(1)
    print(version, float(got["w"][0]), flush=True)
    """

WRITER = f"""
    import os, signal, sys, torch
    from pal_bench.train.shared_weights import SharedWeights, spec_of
    w = SharedWeights.create(spec_of({{"w": torch.zeros({N})}}), name=sys.argv[1])
    w.publish({{"w": torch.full(({N},), 1.0)}})

    class StopsInTheCopy:                    # a tensor whose copy stops this process: stopped mid-publish
        shape, dtype = ({N},), torch.float32

        def detach(self):
            os.kill(os.getpid(), signal.SIGSTOP)
            return torch.full(({N},), 2.0)

    w.publish({{"w": StopsInTheCopy()}})
    print("published", flush=True)
    sys.stdin.readline()
    w.close()
    """


def test_a_reader_stopped_mid_read_for_longer_than_its_deadline_reads_when_it_resumes():
    """The reader stops between its two looks at the counter; the writer publishes meanwhile, so its copy is
    torn and it must retry, long past its deadline by the clock. Only time it was running counts: it retries
    and reads the new version (it used to raise RuntimeError: an actor restarted, a learner ending the run)."""
    with SharedWeights.create(spec()) as w:
        w.publish({"w": torch.full((N,), 1.0)})
        reader = spawn(f"""
            import os, signal, sys, torch
            from pal_bench.train.shared_weights import SharedWeights, spec_of
            w = SharedWeights.attach(sys.argv[1], spec_of({{"w": torch.zeros({N})}}))

            class StopsOnce(dict):           # the reader's own process is stopped in the middle of its read
                stopped = False

                def items(self):
                    if not self.stopped:
                        self.stopped = True
                        os.kill(os.getpid(), signal.SIGSTOP)
                    return super().items()

            version, got = w.read(StopsOnce(w=torch.zeros({N})), timeout_s={DEADLINE_S})
            print(version, float(got["w"][0]), flush=True)
            w.close()
            """, w.name)
        try:
            wait_stopped(reader)
            w.publish({"w": torch.full((N,), 2.0)})
            time.sleep(STOPPED_S)
            os.kill(reader.pid, signal.SIGCONT)
            rc, out, err = finish(reader)
        finally:
            reader.kill()
            reader.wait()
    assert rc == 0 and out.split() == ["2", "2.0"], (rc, out, err)


@needs_shm
def test_a_reader_waits_for_a_writer_stopped_mid_publish_and_reads_when_it_resumes():
    """The writer stops with the counter odd (half a version written) for longer than the readers' deadline:
    a stopped writer is not a dead one, so the reader waits and reads the version once it is complete."""
    name = f"{TAG}-wstop"
    writer = spawn(WRITER, name)
    reader = None
    try:
        wait_stopped(writer)
        reader = spawn(READER, name)
        assert reader.stdout.readline().strip() == "reading"
        time.sleep(STOPPED_S)
        os.kill(writer.pid, signal.SIGCONT)
        rc, out, err = finish(reader)
        assert rc == 0 and out.split() == ["2", "2.0"], (rc, out, err)
        assert writer.stdout.readline().strip() == "published"
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert finish(writer)[0] == 0
    finally:
        for p in (writer, reader):
            if p is not None:
                p.kill()
                p.wait()
        (SHM / name).unlink(missing_ok=True)


@needs_shm
def test_a_writer_killed_mid_publish_still_ends_the_read_with_an_error():
    """A writer that died with the counter odd never completes the version: the reader's deadline still ends
    the wait with a RuntimeError naming the block (no hang)."""
    name = f"{TAG}-wdead"
    writer = spawn(WRITER, name)
    try:
        wait_stopped(writer)
        writer.kill()
        writer.wait()
        rc, out, err = finish(spawn(READER, name))
        assert rc == 1 and "error:" in out and "no consistent read" in out and name in out, (rc, out, err)
    finally:
        writer.kill()
        writer.wait()
        (SHM / name).unlink(missing_ok=True)


@pytest.mark.parametrize("timeout_s", [0, -1.0, math.nan, math.inf, "1"])
def test_a_read_deadline_that_is_not_a_finite_positive_number_is_refused(timeout_s):
    with SharedWeights.create(spec()) as w:
        w.publish({"w": torch.zeros(N)})
        with pytest.raises(ValueError, match="timeout_s"):
            w.read(timeout_s=timeout_s)
        assert w.read()[0] == 1


# ------------------------------------------------------------------------------------------------ pal-bench shm

def dead_weights_segment(name: str) -> None:
    """A weights block's header whose creator is gone (a pid no process here can have, no flock held)."""
    header = np.zeros(8, dtype=np.int64)
    header[1], header[2] = MAGIC, 2**31 - 7
    (SHM / name).write_bytes(header.tobytes())


def only_these(monkeypatch, names: set[str], refuse: str | None = None) -> None:
    """``pal-bench shm --clean`` acts on ``names`` only (other tests' segments are left alone: reported alive),
    and its unlink of ``refuse`` fails as for another user's segment in a sticky /dev/shm (EPERM)."""
    real = _segment.remove_if_dead

    def remove_if_dead(name, *how):
        if name == refuse:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(SHM / name))
        return real(name, *how) if name in names else "alive"

    monkeypatch.setattr(_segment, "remove_if_dead", remove_if_dead)


@needs_shm
def test_shm_clean_reports_a_segment_it_may_not_remove_and_removes_the_others(monkeypatch, capsys):
    from pal_bench.cli import main

    refused, other = f"{TAG}-a-theirs", f"{TAG}-b-ours"
    try:
        dead_weights_segment(refused)
        dead_weights_segment(other)
        only_these(monkeypatch, {refused, other}, refuse=refused)
        assert main(["shm", "--clean"]) == 1
        out, err = capsys.readouterr()
        assert err.splitlines() == [f"could not remove {refused}: permission denied"], err
        assert f"removed {other}" in out and "1 could not be removed" in out, out
        assert not (SHM / other).exists() and (SHM / refused).exists()
        monkeypatch.undo()
        only_these(monkeypatch, {refused})
        assert main(["shm", "--clean"]) == 0                   # nothing refused: status 0
        assert f"removed {refused}" in capsys.readouterr().out
    finally:
        for name in (refused, other):
            (SHM / name).unlink(missing_ok=True)


@needs_shm
def test_shm_prints_a_segment_name_with_escape_sequences_escaped(monkeypatch, capsys):
    """A file in /dev/shm with PAL-Bench's magic and a name that would retitle (or worse) the terminal: `shm`
    and `shm --clean` print it escaped, and never a raw control character."""
    from pal_bench.cli import main

    name = f"{TAG}-\x1b]0;pwned\x07\r\n"
    shown = f"{TAG}-\\x1b]0;pwned\\x07\\r\\n"
    try:
        dead_weights_segment(name)
        only_these(monkeypatch, {name})
        assert main(["shm"]) == 0
        listing = capsys.readouterr().out
        assert main(["shm", "--clean"]) == 0
        cleaning = capsys.readouterr().out
        for out in (listing, cleaning):
            assert shown in out, out
            assert not any(c in out.replace("\n", "") for c in "\x1b\x07\r"), repr(out)
        assert f"removed {shown}" in cleaning and not (SHM / name).exists()
    finally:
        (SHM / name).unlink(missing_ok=True)
