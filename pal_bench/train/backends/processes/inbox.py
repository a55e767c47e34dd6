"""An actor's message queue between processes that share no parent: a Unix socket in a private directory.

The process backend's actors are the driver's children and get an ``mp.Queue`` at start; processes another launcher
starts on the node (Ray's one-node placement) cannot inherit one. ``SocketInbox`` gives them the same queue
(``put`` / ``close`` / ``join_thread`` in the writer, ``get`` / ``get_nowait`` in the driver) over a socket the
driver listens on, with no remote call and no process of its own. Messages are the small (kind, actor, payload)
tuples of ``processes.shared`` as JSON lines: data, never code. A peer that writes anything else (a line that does
not parse, nests too deep, has another shape or is longer than ``MAX_LINE``) is cut off, and what it sent before
stays; the driver's work and memory per read are bounded whatever its peers send.

The socket's directory is the driver's alone (mode 0700) and goes at ``kill``. The driver holds an exclusive flock
on the ``lock`` file inside it for its life, so a directory a SIGKILLed driver left is recognised as dead by the next
inbox made on the machine (in any pid namespace sharing the temporary directory) and removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import queue
import re
import select
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections import deque

PREFIX = "pal-inbox-"       # a socket's directory: <tmp>/pal-inbox-<driver pid>-<random>.l
SUFFIX = ".l"               # marks a directory made with a lock file (older ones had none)
LOCK = "lock"               # the file the driver flocks (LOCK_EX) for its life
# what mkdtemp makes from PREFIX: a pid (ASCII digits, at most 2**22 on Linux) and its random letters
_NAME = re.compile(r"pal-inbox-([1-9][0-9]{0,6})-[a-z0-9_]{1,32}(\.l)?", re.ASCII)
MAX_PID = 1 << 22
MAX_SOCKET_PATH = 107       # bytes of a Unix socket's path (Linux's sun_path holds 108, with the NUL)
TMP_FALLBACK = "/tmp"       # where the socket goes when $TMPDIR is too long for it
BATCH_S = 0.05              # episodes wait at most this long (s) to go together
MAX_LINE = 1 << 20          # longest message line (bytes): a larger one is a broken writer, cut off
CHUNK = 1 << 16             # bytes per recv()
READS_PER_PEER = 4          # recv()s of one peer per read: a writer that never stops cannot hold the driver
MAX_PEERS = 8               # connected writers at once (an actor's process and the inserter's copy: 1-3); more
                            # are refused
MAX_ACTOR = 1 << 31
POLL_S = 0.005              # ``get``'s wait between reads


def _number(x) -> bool:
    return type(x) in (int, float)        # not bool


# the messages' kinds (processes.shared, processes.actor, ray.inserter) and the payload each carries
_PAYLOADS = {
    "ready": lambda p: p is None or type(p) is int,                               # incarnation
    "episodes": lambda p: type(p) is list and all(
        type(e) is list and len(e) == 2 and _number(e[0]) and _number(e[1]) for e in p),   # [(return, length)]
    "timers": lambda p: type(p) is dict and all(map(_number, p.values())),      # phase -> seconds
    "error": lambda p: type(p) is str,                                            # a traceback
    "training_error": lambda p: type(p) is list and len(p) == 2 and all(type(s) is str for s in p),
}


def _message(line: bytes) -> list | None:
    """The [kind, actor, payload] message a line holds, or None if it holds anything else (not UTF-8, not JSON,
    nested too deep, an integer of more than 4300 digits, another shape)."""
    try:
        msg = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):                # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if (type(msg) is list and len(msg) == 3 and type(msg[0]) is str and msg[0] in _PAYLOADS
            and type(msg[1]) is int and 0 <= msg[1] < MAX_ACTOR and _PAYLOADS[msg[0]](msg[2])):
        return msg
    return None


def _tmp_dirs() -> list[str]:
    """Where sockets go: ``tempfile.gettempdir()`` ($TMPDIR), and ``TMP_FALLBACK`` for a $TMPDIR too long."""
    first = tempfile.gettempdir()
    return [first] if first == TMP_FALLBACK else [first, TMP_FALLBACK]


def _socket_path_bytes(tmp: str) -> int:
    """Bytes of the socket's path in a directory made in ``tmp`` (mkdtemp's random part has 8 letters)."""
    return len(os.fsencode(os.path.join(tmp, f"{PREFIX}{os.getpid()}-{'x' * 8}{SUFFIX}", "s")))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # alive, another user's
        return True
    return True


def _remove_if_dead(path: str, pid: int, locked_kind: bool) -> None:
    """Remove the socket directory ``path`` if its driver provably ended: the directory is this user's, a real
    directory (not a link), and its ``lock`` file's flock is free. A directory without a lock file is kept if it
    is of the kind made with one (it is being created), else (made by an older PAL-Bench) removed only if its pid
    is not a live process here. Raises ``OSError`` for what cannot be checked or removed."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(dfd).st_ino != st.st_ino:
            return                                           # replaced since
        try:
            lock = os.open(LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            if not locked_kind and pid != os.getpid() and not _pid_alive(pid):
                _remove_ours(dfd, path)                      # an older PAL-Bench's, its driver gone
            return
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                return
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return                                       # its driver lives (here or in another container)
            _remove_ours(dfd, path)
        finally:
            os.close(lock)
    finally:
        os.close(dfd)


def _remove_ours(dfd: int, path: str) -> None:
    """Remove the socket directory ``path`` (open as ``dfd``) if it holds only what ``_listen`` puts there (the
    socket, the lock file under either name); anything else in it is not ours, and the directory is left as it is
    (no recursion into what someone else made: a tree 3,000 deep overflowed ``shutil.rmtree``)."""
    names = os.listdir(dfd)
    if not set(names) <= {"s", LOCK, f".{LOCK}"}:
        return
    for name in names:
        os.unlink(name, dir_fd=dfd)
    os.rmdir(path)


def _sweep_stale(tmp: str) -> None:
    """Remove the socket directories in ``tmp`` of drivers that were killed (SIGKILL leaves them): the next run on
    the machine cleans up after them, as it replaces a killed run's shared segments. Only names exactly as this
    module makes them are looked at; what cannot be read or removed is skipped (the sweep never fails a run)."""
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or int(m[1]) > MAX_PID:
            continue
        try:
            _remove_if_dead(os.path.join(tmp, name), int(m[1]), m[2] is not None)
        except Exception:                # OSError, and whatever else a hostile directory finds: skipped
            continue


def _listen(tmp: str) -> tuple[str, int, socket.socket]:
    """A new socket directory in ``tmp`` (0700), its flocked lock file and the listening socket in it. On any
    failure nothing is left behind."""
    d = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", suffix=SUFFIX, dir=tmp)
    lock, server = -1, None
    try:
        # the lock file gets its name only once flocked: a sweep never finds it free while this driver lives
        lock = os.open(os.path.join(d, f".{LOCK}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(os.path.join(d, f".{LOCK}"), os.path.join(d, LOCK))
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(os.path.join(d, "s"))
        server.listen(8)
        server.setblocking(False)
    except BaseException:
        if server is not None:
            server.close()
        shutil.rmtree(d, ignore_errors=True)
        if lock >= 0:
            os.close(lock)
        raise
    return d, lock, server


def _plain(value):
    """A numpy scalar (an episode's return, a length) as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a message holds a {type(value).__name__}, not JSON data")


class SocketInbox:
    """One actor's messages: the driver listens (``get_nowait``), the actor's process connects on its first ``put``.
    Picklable (the writer gets the socket's path only)."""

    def __init__(self):
        dirs = _tmp_dirs()
        for tmp in dirs:
            _sweep_stale(tmp)
        fits = [tmp for tmp in dirs if _socket_path_bytes(tmp) <= MAX_SOCKET_PATH]
        if not fits:
            sizes = " and ".join(f"{_socket_path_bytes(tmp)} bytes in {tmp}" for tmp in dirs)
            raise OSError(errno.ENAMETOOLONG, f"the message socket's path would be {sizes}, over the "
                          f"{MAX_SOCKET_PATH} bytes a Unix socket's path may have (by "
                          f"{_socket_path_bytes(dirs[0]) - MAX_SOCKET_PATH} in {dirs[0]}): set TMPDIR to a "
                          f"shorter directory")
        # 0700: only this user's processes connect
        self._dir, self._lock_fd, self._server = _listen(fits[0])
        self.path = os.path.join(self._dir, "s")
        self._poll = select.epoll()                         # the server and its writers: readable = mail
        self._poll.register(self._server.fileno(), select.EPOLLIN)
        self._peers: dict[socket.socket, bytearray] = {}      # connection -> bytes of an unfinished line
        self._held: deque = deque()
        self._writer: socket.socket | None = None
        self._broken = False
        self._episodes: list = []           # (writer) episodes not sent yet
        self._sent, self._actor = 0.0, None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.path, self._dir, self._server, self._lock_fd, self._poll = state["path"], None, None, -1, None
        self._peers, self._held, self._writer, self._broken = {}, deque(), None, False
        self._episodes, self._sent, self._actor = [], 0.0, None
        self._lock = threading.Lock()

    # writer (the actor's process, or a thread of the inserter: one line at a time)
    def put(self, item) -> None:
        """Send one message (a JSON-able (kind, actor, payload) tuple). Episodes wait up to ``BATCH_S`` to go as
        one message (a socket's buffer holds a few hundred small messages, not thousands); anything else goes at
        once, after them. As ``mp.Queue.put``, it never raises once the driver is gone: with nobody listening
        there is nobody to tell, and the process's own checks (``driver_alive``) end it."""
        with self._lock:
            now, self._actor = time.monotonic(), item[1]
            if item[0] == "episodes":
                self._episodes += item[2]
                if now - self._sent < BATCH_S:
                    return
            self._flush(item[1])
            if item[0] != "episodes":
                self._send(item)
            self._sent = now

    def _flush(self, actor) -> None:
        if self._episodes:
            self._send(("episodes", actor, self._episodes))
            self._episodes = []

    def _send(self, item) -> None:
        line = json.dumps(item, default=_plain, separators=(",", ":")).encode() + b"\n"
        if self._broken:
            return
        try:
            if self._writer is None:
                self._writer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._writer.connect(self.path)
            self._writer.sendall(line)
        except OSError:                      # the driver stopped listening (ended, or killed)
            self._broken = True

    def close(self) -> None:
        with self._lock:
            self._flush(self._actor)
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def join_thread(self) -> None:
        """Send the episodes still waiting (every other ``put`` is on the socket when it returns)."""
        with self._lock:
            self._flush(self._actor)

    # reader (the driver)
    def fileno(self) -> int:
        """A descriptor readable while a writer is waiting to connect or has sent something (an epoll over the
        listening socket and the writers): the driver's ``Mailboxes`` watches it."""
        return self._poll.fileno()

    def _read(self) -> None:
        """Read what each writer sent (at most ``READS_PER_PEER`` recv()s of each), then accept new writers (those
        that ended first: their places are free) and read them."""
        self._read_peers(list(self._peers))
        new = []
        # only while there is room: a connection past MAX_PEERS waits in the kernel's backlog until a place frees
        # (accepted and closed, it would lose what its writer had already sent, and the writer would not know)
        for _ in range(MAX_PEERS - len(self._peers)):
            try:
                conn, _ = self._server.accept()
            except OSError:                          # BlockingIOError: nobody waiting
                break
            conn.setblocking(False)
            self._peers[conn] = bytearray()
            self._poll.register(conn.fileno(), select.EPOLLIN)
            new.append(conn)
        self._read_peers(new)

    def _read_peers(self, conns: list) -> None:
        for conn in conns:
            if not self._read_peer(conn, self._peers[conn]):
                del self._peers[conn]                # a line cut short by a killed writer is dropped
                self._poll.unregister(conn.fileno())
                conn.close()

    def _read_peer(self, conn: socket.socket, buf: bytearray) -> bool:
        """Move ``conn``'s complete messages to ``_held``, its unfinished line into ``buf`` (at most ``MAX_LINE``
        bytes). False: the peer closed, or sent something that is not a message (cut it off)."""
        for _ in range(READS_PER_PEER):
            try:
                chunk = conn.recv(CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            seen = len(buf)
            buf += chunk
            end = buf.rfind(b"\n", seen)             # only the new bytes can hold a new line's end
            if end >= 0:
                lines = buf[:end].split(b"\n")
                del buf[:end + 1]
                for line in lines:
                    msg = _message(line) if len(line) <= MAX_LINE else None
                    if msg is None:
                        return False
                    self._held.append(msg)
            if len(buf) > MAX_LINE:
                return False
        return True

    def get_nowait(self):
        if not self._held and self._server is not None:
            self._read()
        if not self._held:
            raise queue.Empty
        return self._held.popleft()

    def get(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_S)

    def kill(self) -> None:
        """(driver) Stop listening and remove the socket's directory."""
        for conn in self._peers:
            conn.close()
        self._peers = {}
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._poll is not None:
            self._poll.close()
            self._poll = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._lock_fd >= 0:                       # after the removal: no sweep finds it free before
            os.close(self._lock_fd)
            self._lock_fd = -1
