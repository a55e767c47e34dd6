"""An actor's message queue between processes that share no parent: a Unix socket in a private directory.

The process backend's actors are the driver's children and get an ``mp.Queue`` at start; processes another launcher
starts on the node (Ray's one-node placement) cannot inherit one. ``SocketInbox`` gives them the same queue
(``put`` / ``close`` / ``join_thread`` in the writer, ``get`` / ``get_nowait`` in the driver) over a socket the
driver listens on, with no remote call and no process of its own. Messages are the small (kind, actor, payload)
tuples of ``processes.shared`` as JSON lines: data, never code (a peer that writes a line that does not parse is cut
off, and what it sent before stays). The socket's directory is the driver's alone (mode 0700) and goes at ``kill``.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections import deque

PREFIX = "pal-inbox-"        # a socket's directory: <tmp>/pal-inbox-<driver pid>-<random>
BATCH_S = 0.05              # episodes wait at most this long (s) to go together
MAX_LINE = 1 << 20          # longest message line (bytes): a larger one is a broken writer, cut off
POLL_S = 0.005              # ``get``'s wait between reads


def _sweep_stale() -> None:
    """Remove the socket directories of drivers that were killed (SIGKILL leaves them; their pid is gone): the
    next run on the machine cleans up after them, as it replaces a killed run's shared segments."""
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-*")):
        pid = os.path.basename(d)[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:              # alive, another user's
            pass


def _plain(value):
    """A numpy scalar (an episode's return, a length) as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a message holds a {type(value).__name__}, not JSON data")


class SocketInbox:
    """One actor's messages: the driver listens (``get_nowait``), the actor's process connects on its first ``put``.
    Picklable (the writer gets the socket's path only)."""

    def __init__(self):
        _sweep_stale()
        self._dir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")   # 0700: only this user's processes connect
        self.path = os.path.join(self._dir, "s")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(8)
        self._server.setblocking(False)
        self._peers: dict[socket.socket, bytes] = {}          # connection -> bytes of an unfinished line
        self._held: deque = deque()
        self._writer: socket.socket | None = None
        self._broken = False
        self._episodes: list = []           # (writer) episodes not sent yet
        self._sent, self._actor = 0.0, None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.path, self._dir, self._server = state["path"], None, None
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
    def _read(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except (BlockingIOError, OSError):
                break
            conn.setblocking(False)
            self._peers[conn] = b""
        for conn in list(self._peers):
            data, closed = b"", False
            while True:
                try:
                    chunk = conn.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                data += chunk
            lines = (self._peers[conn] + data).split(b"\n")
            self._peers[conn] = lines.pop()          # an unfinished line (or b"")
            for line in lines:
                try:
                    self._held.append(json.loads(line))
                except ValueError:
                    closed = True                    # not ours: cut it off
                    break
            if closed or len(self._peers[conn]) > MAX_LINE:
                del self._peers[conn]                # a line cut short by a killed writer is dropped
                conn.close()

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
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
