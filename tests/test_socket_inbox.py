"""The message queue of actor processes that share no parent with the driver (Ray's one-node placement):
messages arrive in order across processes, numpy scalars become plain numbers, a writer's garbage or a line cut
short by a killed writer is dropped without losing what came before, and ``kill`` leaves nothing behind."""

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time

import numpy as np
import pytest

from pal_bench.train.backends.processes.inbox import SocketInbox
from pal_bench.train.backends.processes.shared import read_messages


def _writer(inbox, n):
    for i in range(n):
        inbox.put(("episodes", 0, [(np.float32(i + 0.5), np.int64(i))]))
    inbox.put(("timers", 0, {"env": 1.5}))
    inbox.close()


def test_messages_cross_processes_in_order():
    """Episodes go together (at most ``BATCH_S`` apart), in order, and before the next message of another kind."""
    inbox = SocketInbox()
    try:
        p = mp.get_context("spawn").Process(target=_writer, args=(pickle.loads(pickle.dumps(inbox)), 5_000))
        p.start()
        got, deadline = [], time.monotonic() + 60
        while not got or got[-1][0] != "timers":        # the driver reads while the actor writes
            got += list(read_messages(inbox, timeout=0.05))
            assert time.monotonic() < deadline and len(got) < 6_000
        p.join(60)
        assert p.exitcode == 0
        kinds = [k for k, _ in got]
        assert kinds[-1] == "timers" and set(kinds[:-1]) == {"episodes"} and len(kinds) < 1_000
        episodes = [e for k, payload in got[:-1] for e in payload]
        assert episodes == [[i + 0.5, i] for i in range(5_000)] and isinstance(episodes[7][1], int)
        assert got[-1][1] == {"env": 1.5}
        with pytest.raises(queue.Empty):
            inbox.get(timeout=0.02)
    finally:
        inbox.kill()


def test_garbage_and_cut_lines_are_dropped_and_kill_cleans_up():
    inbox = SocketInbox()
    directory = os.path.dirname(inbox.path)
    assert os.stat(directory).st_mode & 0o777 == 0o700
    w = pickle.loads(pickle.dumps(inbox))
    w.put(("ready", 0, 1))
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(inbox.path)
    bad.sendall(b'["ready", 1, 2]\nnot json\n["ready", 1, 3]\n')     # a peer that is not ours: cut off
    cut = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cut.connect(inbox.path)
    cut.sendall(b'["ready", 2, 1]\n["episo')                         # a writer killed mid-line
    cut.close()
    w.put(("ready", 0, 2))
    got = [inbox.get(timeout=5) for _ in range(4)]
    assert sorted(map(tuple, got)) == [("ready", 0, 1), ("ready", 0, 2), ("ready", 1, 2), ("ready", 2, 1)]
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)
    with pytest.raises(TypeError, match="not JSON data"):
        w.put(("error", 0, object()))
    inbox.kill()
    assert not os.path.exists(directory)
    bad.close()
    w.close()


def test_a_writer_whose_driver_is_gone_drops_its_messages_quietly():
    inbox = SocketInbox()
    w = pickle.loads(pickle.dumps(inbox))
    inbox.kill()                                   # the driver ended: nobody listens
    w.put(("timers", 0, {"env": 1.0}))             # no exception, as mp.Queue.put
    w.put(("timers", 0, {"env": 2.0}))
    w.close()


def test_a_killed_drivers_sockets_go_with_the_next_inbox(tmp_path, monkeypatch):
    """SIGKILL leaves a driver's socket directories behind; the next inbox made on the machine removes those whose
    driver is gone, and leaves a live driver's alone."""
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"pal-inbox-{int(dead.stdout)}-abc"
    alive = tmp_path / f"pal-inbox-{os.getppid()}-def"
    for d in (gone, alive):
        d.mkdir()
        (d / "s").touch()
    inbox = SocketInbox()
    try:
        assert not gone.exists() and alive.exists()
        assert os.path.dirname(inbox.path).startswith(str(tmp_path / f"pal-inbox-{os.getpid()}-"))
    finally:
        inbox.kill()
