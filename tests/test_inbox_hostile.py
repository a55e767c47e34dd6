"""The socket inbox (Ray's one-node placement) against what another local process can put in its way: names in the
temporary directory it did not make, other users' and live drivers' directories, a $TMPDIR too long for a socket,
and peers that send garbage, nest deep, never end a line or connect by the dozen. The driver never gets an
exception from ``get``/``get_nowait``, its memory and work per read stay bounded, a good writer's messages all
arrive in order, and nothing is left behind."""

import errno
import fcntl
import json
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pal_bench.train.backends.processes import inbox as inbox_mod
from pal_bench.train.backends.processes.inbox import SocketInbox

KINDS = ["ready", "episodes", "timers", "error", "training_error"]
PEERS_AT_MOST = 8                  # inbox.MAX_PEERS
LINE_AT_MOST = 1 << 20             # inbox.MAX_LINE


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """The inbox's temporary directory and its fallback, both under ``tmp_path``."""
    (tmp_path / "t").mkdir()
    (tmp_path / "f").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    monkeypatch.setattr(inbox_mod, "TMP_FALLBACK", str(tmp_path / "f"), raising=False)
    return tmp_path / "t"


def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


# 4: names the sweep did not make
def test_the_sweep_skips_names_it_did_not_make(tmp):
    dead = _dead_pid()
    names = ["pal-inbox-" + "9" * 30 + "-x", "pal-inbox-²³-x", "pal-inbox-٣-x", "pal-inbox-0-x", "pal-inbox--x",
             "pal-inbox-12a-x", "pal-inbox-123", "pal-inbox-99999999-x", f"pal-inbox-{dead}-", f"pal-inbox-{dead}-A",
             f"pal-inbox-{dead}-abc.x", f"pal-inbox- {dead}-abc", f"pal-inbox-{dead}-abc\n"]
    for name in names:
        (tmp / name).mkdir(exist_ok=True)
    (tmp / f"pal-inbox-{dead}-file").write_text("not a directory")
    inbox = SocketInbox()
    inbox.kill()
    assert sorted(os.listdir(tmp)) == sorted(names + [f"pal-inbox-{dead}-file"])


def test_what_the_sweep_cannot_remove_is_skipped(tmp, monkeypatch):
    dead = _dead_pid()
    stuck, gone = tmp / f"pal-inbox-{dead}-stuck", tmp / f"pal-inbox-{dead}-gone"
    for d in (stuck, gone):
        d.mkdir()
        (d / "s").touch()
    real = os.rmdir

    def rmdir(path, *a, **kw):
        if os.path.basename(path) == stuck.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(inbox_mod.os, "rmdir", rmdir)
    inbox = SocketInbox()
    inbox.kill()
    assert stuck.exists() and not gone.exists()


# 5: only what is provably dead, ours, and a real directory
def test_the_sweep_leaves_other_users_directories_and_links(tmp, monkeypatch):
    dead = _dead_pid()
    theirs, target, link = tmp / f"pal-inbox-{dead}-theirs", tmp / "target", tmp / f"pal-inbox-{dead}-link"
    for d in (theirs, target):
        d.mkdir()
        (d / "s").touch()
    link.symlink_to(target)
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)                       # nobody's
    else:
        uid = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: uid + 1)   # the sweep's view: every directory is another user's
    inbox = SocketInbox()
    inbox.kill()
    assert (theirs / "s").exists() and link.is_symlink() and (target / "s").exists()


def test_a_held_lock_keeps_a_directory_whatever_its_pid(tmp):
    """A pid that is not alive here may be a live driver in another container sharing the temporary directory:
    only a free flock on its lock file proves it ended. A directory of the locked kind with no lock file yet is
    being created: kept too."""
    dead = _dead_pid()
    locked, legacy_locked = tmp / f"pal-inbox-{dead}-abcdefgh.l", tmp / f"pal-inbox-{dead}-abcdefgh"
    creating = tmp / f"pal-inbox-{dead}-ijklmnop.l"
    fds = []
    for d in (locked, legacy_locked):
        d.mkdir()
        (d / "s").touch()
        fds.append(os.open(d / "lock", os.O_RDWR | os.O_CREAT, 0o600))
        fcntl.flock(fds[-1], fcntl.LOCK_EX)                 # the other container's driver, alive
    creating.mkdir()
    inbox = SocketInbox()
    inbox.kill()
    try:
        assert locked.exists() and legacy_locked.exists() and creating.exists()
    finally:
        for fd in fds:
            os.close(fd)                                     # that driver ends
    inbox = SocketInbox()
    inbox.kill()
    assert not locked.exists() and not legacy_locked.exists() and creating.exists()


KILLED_DRIVER = """
import os, signal, sys
from pal_bench.train.backends.processes.inbox import SocketInbox
inboxes = [SocketInbox(), SocketInbox()]
print(*(os.path.dirname(q.path) for q in inboxes), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
for q in inboxes:
    q.kill()
"""


def test_a_sigkilled_drivers_directories_go_and_a_live_ones_stay(tmp):
    env = dict(os.environ, TMPDIR=str(tmp))
    live = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, "live"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        live_dirs = live.stdout.readline().split()              # made before the other driver's sweep
        killed = subprocess.run([sys.executable, "-c", KILLED_DRIVER, "kill"], capture_output=True, text=True,
                                env=env, timeout=60)
        assert killed.returncode == -signal.SIGKILL
        dead_dirs = killed.stdout.split()
        assert len(dead_dirs) == 2 and all(os.path.exists(d) for d in dead_dirs + live_dirs)
        inbox = SocketInbox()
        inbox.kill()
        assert not any(os.path.exists(d) for d in dead_dirs) and all(os.path.exists(d) for d in live_dirs)
    finally:
        live.communicate("", timeout=60)
    assert os.listdir(tmp) == []


# 14: a $TMPDIR too long for a socket's path
def test_a_long_tmpdir_falls_back_to_a_short_directory(tmp):
    long = tmp / ("d" * 100)
    long.mkdir()
    with mock.patch.object(tempfile, "tempdir", str(long)):
        inbox = SocketInbox()
    try:
        assert inbox.path.startswith(inbox_mod.TMP_FALLBACK + "/pal-inbox-")
        w = pickle.loads(pickle.dumps(inbox))
        w.put(("ready", 0, 3))
        assert inbox.get(timeout=5) == ["ready", 0, 3]
        w.close()
    finally:
        inbox.kill()
    assert os.listdir(long) == [] and os.listdir(inbox_mod.TMP_FALLBACK) == []


def test_no_short_directory_is_one_clear_error_and_leaves_nothing(tmp, monkeypatch):
    long = tmp / ("d" * 100)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.setattr(inbox_mod, "TMP_FALLBACK", str(long))
    with pytest.raises(OSError, match=r"path would be 1\d\d bytes in .*over the 107 bytes .*by \d+ in .*TMPDIR"):
        SocketInbox()
    assert os.listdir(long) == []


def test_a_failed_bind_leaves_nothing(tmp, monkeypatch):
    def bind(self, address):
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(socket.socket, "bind", bind)
    with pytest.raises(OSError, match="Address already in use"):
        SocketInbox()
    assert os.listdir(tmp) == []


# 7: hostile peers
BAD_LINES = [b"[" * 100_000 + b"\n", b"{\"a\":" * 50_000 + b"\n", b"\xff\xfe[1]\n", '["ready",1,2]\n'.encode("utf-16"),
             b"1" + b"0" * 5000 + b"\n", b'["ready", 1.5, 2]\n', b'["bogus", 1, 2]\n', b'{"kind": "ready"}\n',
             b'["episodes", 1, 5]\n', b'["episodes", 1, [[1.0]]]\n', b'["ready", true, 1]\n', b'["ready", -1, 1]\n',
             b'["ready", 1, 2, 3]\n', b'["timers", 1, {"env": "x"}]\n', b'["training_error", 1, ["a"]]\n',
             b'["error", 1, 7]\n', b"\n", b"null\n"]


def _cut_off(p: socket.socket) -> bool:
    """Whether the inbox closed its end of ``p`` (the peer reads the end of the stream, or a reset)."""
    try:
        return p.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _send_all(p: socket.socket, data: bytes) -> None:
    try:
        p.sendall(data)
    except OSError:                             # cut off before the end
        pass


def test_a_peer_that_sends_anything_but_messages_is_cut_and_the_driver_goes_on(tmp):
    """Deep nesting (RecursionError), bytes that are not UTF-8, huge integers, and JSON of another shape: each
    peer's earlier messages stay, the bad line and what follows it are dropped, the peer is cut off; the good
    writer's messages all arrive."""
    inbox = SocketInbox()
    good = pickle.loads(pickle.dumps(inbox))
    got = []
    try:
        for i, bad in enumerate(BAD_LINES):
            good.put(("ready", 0, i))
            with _connect(inbox.path) as p:
                send = threading.Thread(target=_send_all, args=(p, json.dumps(["ready", 100 + i, 0]).encode() + b"\n"
                                                                + bad + b'["ready", 999, 0]\n'))
                send.start()
                deadline = time.monotonic() + 30
                while not _cut_off(p) and time.monotonic() < deadline:
                    try:
                        got.append(inbox.get(timeout=0.01))
                    except queue.Empty:
                        pass
                assert _cut_off(p), bad[:40]
                send.join(30)
        while True:
            try:
                got.append(inbox.get(timeout=0.2))
            except queue.Empty:
                break
        assert sorted(got) == sorted(m for i in range(len(BAD_LINES)) for m in (["ready", 0, i], ["ready", 100 + i, 0]))
    finally:
        inbox.kill()
        good.close()


STALLED = """
import queue, subprocess, sys, time
from pal_bench.train.backends.processes.inbox import SocketInbox
inbox = SocketInbox()
writer = subprocess.Popen([sys.executable, "-c", '''
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
mib, n = b"x" * (1 << 20), 0
try:
    for n in range(50):
        s.sendall(mib)
    print("sent all 50 MiB")
except OSError:
    print("cut after", n, "MiB")
''', inbox.path], stdout=subprocess.PIPE, text=True)
calls = 0
while writer.poll() is None:
    try:
        inbox.get_nowait()
    except queue.Empty:
        pass
    calls += 1
    time.sleep(0.05)
print(writer.stdout.read().strip(), "in", calls, "reads", flush=True)
inbox.kill()
"""


def test_a_writer_that_never_ends_its_line_is_cut_after_a_bounded_read(tmp):
    """50 MiB without a newline, as fast as it can: each ``get_nowait`` reads a bounded number of bytes of it
    (it used to read until the writer paused: all 50 MiB, concatenated quadratically, for many seconds), and the
    writer is cut off once its line passes ``MAX_LINE``, after a few MiB at most (the socket's buffers)."""
    out = subprocess.run([sys.executable, "-c", STALLED], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TMPDIR=str(tmp)))
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    assert words[:2] == ["cut", "after"], out.stdout
    assert int(words[2]) < 8 and int(words[5]) >= 3, out.stdout     # a few bounded reads, then cut
    assert os.listdir(tmp) == []


class _EndlessPeer:
    """A connection whose writer never pauses and never ends its line: every recv() has more (counted)."""

    def __init__(self, per_read_limit: int):
        self.limit, self.calls, self.total, self.closed = per_read_limit, 0, 0, False

    def recv(self, n: int) -> bytes:
        self.calls += 1
        assert self.calls <= self.limit, "one get_nowait read on and on from a peer that never pauses"
        self.total += n
        return b"x" * n

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:          # what the inbox's epoll watches: a real descriptor (never readable)
        if not hasattr(self, "_pair"):
            self._pair = socket.socketpair()
        return self._pair[0].fileno()

    def close(self) -> None:
        self.closed = True
        for s in getattr(self, "_pair", ()):
            s.close()


class _AcceptOnce:
    """The listening socket's seam: ``accept`` gives ``conn`` once, then nobody is waiting."""

    def __init__(self, conn):
        self.conn = conn

    def accept(self):
        if self.conn is None:
            raise BlockingIOError(errno.EAGAIN, "nobody waiting")
        conn, self.conn = self.conn, None
        return conn, ""

    def close(self) -> None:
        pass


def test_each_read_of_a_peer_that_never_pauses_is_bounded(tmp):
    """The work of one ``get_nowait`` is bounded whatever a peer sends (it used to read until the peer paused), and
    a line that never ends is cut once it passes ``MAX_LINE``, having buffered at most about that much."""
    inbox = SocketInbox()
    server, peer = inbox._server, _EndlessPeer(per_read_limit=64)
    inbox._server = _AcceptOnce(peer)
    try:
        for _ in range(1_000):
            peer.calls = 0
            with pytest.raises(queue.Empty):
                inbox.get_nowait()
            assert sum(len(b) for b in inbox._peers.values()) <= LINE_AT_MOST
            if peer.closed:
                break
        assert peer.closed and LINE_AT_MOST < peer.total <= 2 * LINE_AT_MOST
    finally:
        inbox._server = server
        inbox.kill()


def test_a_flood_of_peers_is_held_to_a_bound(tmp):
    """At most MAX_PEERS connections are read at once; the rest wait in the backlog (or are refused by the kernel
    when it is full), and once the flood has gone a writer gets through."""
    inbox = SocketInbox()
    flood = []
    try:
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            flood.append(s)
            try:
                s.connect(inbox.path)
            except BlockingIOError:                                  # the listen backlog is full
                pass
            with pytest.raises(queue.Empty):
                inbox.get_nowait()
            assert len(inbox._peers) <= PEERS_AT_MOST
        for s in flood:
            s.close()
        flood.clear()
        for _ in range(10):              # the driver's polls: the closed connections leave the places and the backlog
            with pytest.raises(queue.Empty):
                inbox.get_nowait()
        good = pickle.loads(pickle.dumps(inbox))
        good.put(("ready", 0, 1))                                    # the flood gone, a writer gets through
        assert inbox.get(timeout=10) == ["ready", 0, 1]
        good.close()
    finally:
        inbox.kill()
        for s in flood:
            s.close()


# the property: hostile peers and a good writer at once
GOOD_ACTOR = 424242
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                     max_leaves=12)
_line = st.one_of(
    st.binary(max_size=300),                                                       # anything, maybe no newline
    _json.map(lambda v: json.dumps(v).encode() + b"\n"),
    st.tuples(st.sampled_from(KINDS + ["bogus"]), st.integers(-3, 50) | st.booleans(), _json).map(
        lambda m: json.dumps(m).encode() + b"\n"),                                 # messages, good and bad
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"\n"),                      # nesting
    st.integers(1, 3 << 20).map(lambda n: b"7" * n),                              # a line that never ends
)
_peer = st.tuples(st.lists(_line, max_size=6), st.lists(st.integers(1, 70_000), min_size=1, max_size=8))


def _good_payload(kind: str, i: int):
    return {"ready": i, "episodes": [[i + 0.5, i]], "timers": {"t": float(i)}}[kind]


def _flat(messages) -> list:
    out = []
    for kind, _, payload in messages:
        out += [("episode", e) for e in payload] if kind == "episodes" else [(kind, payload)]
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(peers=st.lists(_peer, min_size=1, max_size=4),
       good=st.lists(st.sampled_from(["ready", "episodes", "timers"]), max_size=40))
def test_hostile_peers_never_raise_grow_memory_or_cost_a_good_writer_a_message(peers, good):
    with tempfile.TemporaryDirectory() as d, mock.patch.object(tempfile, "tempdir", d), \
            mock.patch.object(inbox_mod, "TMP_FALLBACK", d, create=True):
        inbox = SocketInbox()
        socks = []
        try:
            writer = pickle.loads(pickle.dumps(inbox))
            for _ in peers:
                socks.append(_connect(inbox.path))
                socks[-1].setblocking(False)
            sent = [(kind, GOOD_ACTOR, _good_payload(kind, i)) for i, kind in enumerate(good)]

            def write():
                for m in sent:
                    writer.put(m)
                writer.close()

            t = threading.Thread(target=write)
            t.start()
            got = []

            def drain():
                while True:
                    try:
                        got.append(inbox.get_nowait())
                    except queue.Empty:
                        return
                    finally:
                        buffered = [len(b) for b in inbox._peers.values()]
                        assert len(buffered) <= PEERS_AT_MOST and max(buffered, default=0) <= LINE_AT_MOST

            streams = [b"".join(lines) for lines, _ in peers]
            pos, live = [0] * len(peers), [True] * len(peers)
            for r in range(2_000):
                todo = [i for i in range(len(peers)) if live[i] and pos[i] < len(streams[i])]
                if not todo:
                    break
                for i in todo:
                    cuts = peers[i][1]
                    try:
                        pos[i] += socks[i].send(streams[i][pos[i]:pos[i] + cuts[r % len(cuts)]])
                    except BlockingIOError:
                        pass
                    except OSError:                      # cut off by the inbox
                        live[i] = False
                drain()
            t.join(30)
            deadline = time.monotonic() + 20
            while _flat(m for m in got if m[1] == GOOD_ACTOR) != _flat(sent) and time.monotonic() < deadline:
                drain()
                time.sleep(0.005)
            for kind, actor, _ in got:
                assert kind in KINDS and type(actor) is int
            assert _flat(m for m in got if m[1] == GOOD_ACTOR) == _flat(sent)
        finally:
            inbox.kill()
            for s in socks:
                s.close()


def test_a_writer_past_the_peer_bound_waits_and_loses_nothing(tmp):
    """Eight idle connections fill the inbox's places: a ninth writer's messages wait in the backlog (they were
    accepted and dropped, the writer none the wiser) and arrive, all of them, once a place frees."""
    inbox = SocketInbox()
    idle = []
    good = None
    try:
        for _ in range(PEERS_AT_MOST):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(inbox.path)
            idle.append(s)
        with pytest.raises(queue.Empty):
            inbox.get_nowait()
        assert len(inbox._peers) == PEERS_AT_MOST
        good = pickle.loads(pickle.dumps(inbox))
        good.put(("ready", 0, 1))
        good.put(("error", 0, "boom"))
        for _ in range(5):
            with pytest.raises(queue.Empty):
                inbox.get_nowait()
        idle.pop().close()                                           # a place frees
        got = [inbox.get(timeout=10), inbox.get(timeout=10)]
        assert got == [["ready", 0, 1], ["error", 0, "boom"]]
        assert not good._broken
    finally:
        if good is not None:
            good.close()
        inbox.kill()
        for s in idle:
            s.close()


def test_the_sweep_leaves_a_directory_holding_what_it_did_not_make(tmp):
    """A stale-looking socket directory (this user's, its lock free) that holds anything besides the socket and the
    lock file is not removed (not recursed into: a tree 3,000 deep overflowed rmtree), and the inbox still starts."""
    d = tmp / "pal-inbox-4000000-abcdefgh.l"
    d.mkdir()
    (d / "lock").write_text("")
    chain = [d / "x"]
    for _ in range(1500):                        # deeper than the recursion limit
        chain.append(chain[-1] / "x")
    for p in chain:                              # (os.makedirs recurses too)
        p.mkdir()
    plain = tmp / "pal-inbox-4000001-abcdefgh.l"
    plain.mkdir()
    (plain / "lock").write_text("")
    inbox = SocketInbox()
    try:
        assert d.is_dir() and not plain.exists()
    finally:
        inbox.kill()
        for p in reversed(chain):                # without recursion
            os.rmdir(p)
