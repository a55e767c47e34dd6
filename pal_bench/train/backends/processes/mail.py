"""The driver's view of its actors' message queues: one epoll over all of them, so that a poll of the queues costs
O(queues with something in them), not O(actors) (the pump polls every ``POLL_S``; at 64 actors, 64 empty
``get_nowait`` calls a poll held the driver's GIL beside its learner threads)."""

from __future__ import annotations

import selectors


def fileno_of(q) -> int:
    """The descriptor that is readable while ``q`` holds a message: its own ``fileno()`` (``SocketInbox``: the
    epoll over its listening socket and writers), or a ``multiprocessing.Queue``'s reading pipe."""
    if hasattr(q, "fileno"):
        return q.fileno()
    return q._reader.fileno()


class Mailboxes:
    """Queue ``i`` -> its descriptor under one selector; ``ready()`` the indices of the queues with something to
    read. Level-triggered: a queue drained only in part is named again on the next call."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._fds: dict[int, int] = {}

    def watch(self, i: int, q) -> None:
        """Watch ``q`` as queue ``i`` (in place of the one ``i`` had: a restarted actor's new queue)."""
        self.forget(i)
        fd = fileno_of(q)
        self._sel.register(fd, selectors.EVENT_READ, i)
        self._fds[i] = fd

    def forget(self, i: int) -> None:
        fd = self._fds.pop(i, None)
        if fd is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass

    def ready(self, timeout: float = 0.0) -> list[int]:
        """The queues with something to read, waiting at most ``timeout`` seconds for one."""
        return sorted(key.data for key, _ in self._sel.select(timeout))

    def close(self) -> None:
        self._fds.clear()
        self._sel.close()
