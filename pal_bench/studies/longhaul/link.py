"""A long-haul link model applied to real messages: one-way latency, serialization at a bandwidth,
an optional byte budget per second (token bucket), first-in first-out per direction.

Each message is pickled (protocol 5; numpy arrays travel in-band, so its size is what a socket
would carry) into a :class:`Packet` stamped, by the sender's :class:`Link`, with the wall-clock
time at which it arrives at the far end::

    start      = max(now, transmitter free, byte budget allows)      (s)
    free       = start + 8 * nbytes / bandwidth_bps                  (s, serialization done)
    deliver_at = free + latency_s                                    (s)

The packet then travels by whatever transport connects the two ends (a Ray call, a socket, a
queue) and the :class:`Receiver` of that direction hands it over no earlier than ``deliver_at``
and only after every earlier packet of that direction (sequence numbers), so a message can never
overtake an earlier one, even if the transport reorders calls. When the real transport is slower
than the model (e.g. a Ray call, ~0.3-1 ms, against the 50 us of the fibre preset), delivery is
as soon as the packet arrives; the receiver counts these packets and their excess (``late``).

The byte budget is a token bucket in its GCRA form: a message may start once the bucket holds its
size, refilled at ``byte_budget_per_s`` bytes/s, holding at most ``burst_bytes``.

The sender keeps the state of its direction (transmitter, bucket), so each direction must have one
sending process. Stamps are ``time.time()``: the same clock for every process of one machine; on a
cluster the nodes' clocks must agree to well under the modelled latency (or use preset ``none``).
"""

from __future__ import annotations

import asyncio
import math
import pickle
import threading
import time
from dataclasses import dataclass, field

TO_LEARNER = "to_learner"     # buffer node -> learner
TO_BUFFER = "to_buffer"       # learner -> buffer node
DIRECTIONS = (TO_LEARNER, TO_BUFFER)
SPIN_S = 200e-6               # the last this many seconds of a wait are spent yielding, not sleeping


@dataclass(frozen=True)
class LinkSpec:
    """One-way latency (s), bandwidth (bit/s), optional byte budget (bytes/s) and bucket size (bytes)."""

    latency_s: float = 0.0
    bandwidth_bps: float = math.inf
    byte_budget_per_s: float | None = None
    burst_bytes: float | None = None      # default: 10 ms of budget, at least 64 KiB

    def __post_init__(self):
        if self.latency_s < 0 or not self.bandwidth_bps > 0:
            raise ValueError(f"link: latency_s must be >= 0 and bandwidth_bps > 0, got {self}")
        if self.byte_budget_per_s is not None and not self.byte_budget_per_s > 0:
            raise ValueError(f"link: byte_budget_per_s must be > 0 or None, got {self.byte_budget_per_s}")

    def transfer_s(self, nbytes: int) -> float:
        """Modelled one-way time of one message of ``nbytes`` on an idle link (s)."""
        return self.latency_s + 8.0 * nbytes / self.bandwidth_bps


PRESETS: dict[str, LinkSpec] = {
    "none": LinkSpec(),
    "fibre-10km": LinkSpec(latency_s=50e-6, bandwidth_bps=25e9),     # 10 km of fibre (~5 us/km), 25 GbE
    "wan": LinkSpec(latency_s=20e-3, bandwidth_bps=100e6),           # 20 ms one way, 100 Mbit/s
    "wan-1MBps": LinkSpec(latency_s=20e-3, bandwidth_bps=100e6, byte_budget_per_s=1e6),   # WAN, 1 MB/s budget
}


def spec_from(name_or_spec: str | LinkSpec | dict, **overrides) -> LinkSpec:
    """A preset name (of ``PRESETS``), a spec, or a dict of its fields; then overrides."""
    if isinstance(name_or_spec, str):
        if name_or_spec not in PRESETS:
            raise ValueError(f"link: unknown preset {name_or_spec!r}; choose one of {', '.join(PRESETS)}")
        base = PRESETS[name_or_spec]
    elif isinstance(name_or_spec, dict):
        base = LinkSpec(**name_or_spec)
    else:
        base = name_or_spec
    fields_ = {k: getattr(base, k) for k in ("latency_s", "bandwidth_bps", "byte_budget_per_s", "burst_bytes")}
    return LinkSpec(**(fields_ | {k: v for k, v in overrides.items() if v is not None}))


@dataclass
class Packet:
    """One message on the link: its pickled bytes and the sender's stamps (``time.time()`` seconds)."""

    direction: str
    seq: int
    payload: bytes
    sent_at: float           # when ``Link.send`` was called
    deliver_at: float        # when the last bit reaches the far end

    @property
    def nbytes(self) -> int:
        return len(self.payload)


@dataclass
class _Tx:
    """Sender state of one direction."""

    seq: int = 0
    free_at: float = 0.0     # transmitter busy until (s)
    tat: float = 0.0         # token bucket: theoretical arrival time (GCRA)
    messages: int = 0
    bytes: int = 0
    queued_s: float = 0.0    # waiting for the transmitter or the budget, summed over messages
    modelled_s: float = 0.0  # deliver_at - sent_at, summed


class Link:
    """The sending side of a full-duplex link; ``send`` stamps a message for one direction.

    Thread-safe (one lock); picklable as its spec (a copy in another process starts idle).
    """

    def __init__(self, latency_s: float = 0.0, bandwidth_bps: float = math.inf,
                 byte_budget_per_s: float | None = None, burst_bytes: float | None = None):
        self.spec = LinkSpec(latency_s, bandwidth_bps, byte_budget_per_s, burst_bytes)
        budget = self.spec.byte_budget_per_s
        self.burst_bytes = None if budget is None else (burst_bytes or max(64 * 1024, 0.01 * budget))
        self._tx = {d: _Tx() for d in DIRECTIONS}
        self._lock = threading.Lock()

    @classmethod
    def preset(cls, name: str | LinkSpec | dict, **overrides) -> Link:
        """``Link.preset("wan")``, ``Link.preset("fibre-10km", byte_budget_per_s=1e6)``."""
        s = spec_from(name, **overrides)
        return cls(s.latency_s, s.bandwidth_bps, s.byte_budget_per_s, s.burst_bytes)

    def __reduce__(self):
        s = self.spec
        return (Link, (s.latency_s, s.bandwidth_bps, s.byte_budget_per_s, s.burst_bytes))

    @property
    def is_null(self) -> bool:
        """No latency, infinite bandwidth, no budget: packets are delivered at once."""
        s = self.spec
        return s.latency_s == 0 and math.isinf(s.bandwidth_bps) and s.byte_budget_per_s is None

    def schedule(self, nbytes: int, direction: str, now: float | None = None) -> tuple[int, float]:
        """Reserve the link for ``nbytes`` in ``direction``: returns ``(seq, deliver_at)`` (s)."""
        now = time.time() if now is None else now
        s = self.spec
        with self._lock:
            tx = self._tx[direction]
            start = max(now, tx.free_at)
            if s.byte_budget_per_s is not None:
                tau = self.burst_bytes / s.byte_budget_per_s
                start = max(start, tx.tat - tau)
                tx.tat = max(tx.tat, start) + nbytes / s.byte_budget_per_s
            tx.free_at = start + 8.0 * nbytes / s.bandwidth_bps
            deliver_at = tx.free_at + s.latency_s
            seq = tx.seq
            tx.seq += 1
            tx.messages += 1
            tx.bytes += nbytes
            tx.queued_s += start - now
            tx.modelled_s += deliver_at - now
        return seq, deliver_at

    def send(self, obj, direction: str) -> Packet:
        """Pickle ``obj`` and stamp it; the caller ships the packet to the far end's ``Receiver``."""
        if direction not in self._tx:
            raise ValueError(f"link: direction must be one of {DIRECTIONS}, got {direction!r}")
        now = time.time()
        payload = pickle.dumps(obj, protocol=5)
        seq, deliver_at = self.schedule(len(payload), direction, now)
        return Packet(direction, seq, payload, now, deliver_at)

    def free_at(self, direction: str) -> float:
        """When the transmitter of ``direction`` has serialized everything sent so far (``time.time()`` s)."""
        with self._lock:
            return self._tx[direction].free_at

    def ready_in(self, direction: str) -> float:
        """Seconds until a message sent in ``direction`` would start at once (transmitter free and the
        byte budget allowing); a sender that waits this long keeps its backlog to itself."""
        with self._lock:
            tx, now = self._tx[direction], time.time()
            budget = self.spec.byte_budget_per_s
            bucket = tx.tat - self.burst_bytes / budget - now if budget is not None else 0.0
            return max(0.0, tx.free_at - now, bucket)

    def stats(self) -> dict:
        """Per direction: messages, bytes, queued_s, modelled_s (what this process sent)."""
        with self._lock:
            return {d: {"messages": t.messages, "bytes": t.bytes, "queued_s": t.queued_s,
                        "modelled_s": t.modelled_s} for d, t in self._tx.items()}


@dataclass
class Receiver:
    """The receiving side of one direction: ``recv`` (threads) or ``arecv`` (asyncio; one event
    loop) returns the unpickled message no earlier than its ``deliver_at`` and in sequence order.
    A receiver serves one kind of caller: ``recv`` or ``arecv``, not both."""

    direction: str
    next_seq: int = 0
    messages: int = 0
    bytes: int = 0
    late: int = 0            # packets that reached the receiver after their deliver_at (+1 ms)
    late_s: float = 0.0      # by how much, summed (s)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _turns: dict = field(default_factory=dict, repr=False)   # seq -> asyncio.Event of an arecv awaiting its turn

    def __reduce__(self):
        return (Receiver, (self.direction,))

    def recv(self, packet: Packet, timeout: float | None = None):
        """Block until every earlier packet was delivered and ``deliver_at`` has passed; returns the object."""
        self._check(packet)
        with self._cond:
            if not self._cond.wait_for(lambda: self.next_seq == packet.seq, timeout):
                raise TimeoutError(f"link: packet {packet.seq} waited for packet {self.next_seq} over {timeout} s")
        self._note_arrival(packet)
        _sleep_until(packet.deliver_at)
        return self._done(packet)

    async def arecv(self, packet: Packet, timeout: float | None = None):
        """``recv`` for an event loop (e.g. an async Ray actor): waits without blocking the loop."""
        self._check(packet)
        if self.next_seq != packet.seq:         # earlier packets are on their way: wait to be woken
            turn = self._turns.setdefault(packet.seq, asyncio.Event())
            try:
                await asyncio.wait_for(turn.wait(), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"link: packet {packet.seq} waited for packet {self.next_seq} over {timeout} s") \
                    from None
            finally:
                self._turns.pop(packet.seq, None)
        self._note_arrival(packet)
        while (left := packet.deliver_at - time.time()) > 0:
            await asyncio.sleep(left - SPIN_S if left > 2e-3 else 0)
        message = self._done(packet)
        if (turn := self._turns.get(self.next_seq)) is not None:
            turn.set()
        return message

    def _check(self, packet: Packet) -> None:
        if packet.direction != self.direction:
            raise ValueError(f"link: receiver of {self.direction} got a packet for {packet.direction}")
        if packet.seq < self.next_seq:
            raise ValueError(f"link: packet {packet.seq} of {self.direction} delivered twice")

    def _note_arrival(self, packet: Packet) -> None:
        excess = time.time() - packet.deliver_at
        if excess > 1e-3:
            self.late += 1
            self.late_s += excess

    def _done(self, packet: Packet):
        with self._cond:
            self.next_seq += 1
            self.messages += 1
            self.bytes += packet.nbytes
            self._cond.notify_all()
        return pickle.loads(packet.payload)

    def stats(self) -> dict:
        return {"messages": self.messages, "bytes": self.bytes, "late": self.late, "late_s": self.late_s}


def _sleep_until(t: float) -> None:
    """Sleep until ``time.time() >= t``; the last ``SPIN_S`` seconds yield the CPU in a loop."""
    while (left := t - time.time()) > 0:
        time.sleep(left - SPIN_S if left > SPIN_S else 0)


def merge_stats(*stats: dict) -> dict:
    """Add ``Link.stats()`` of several senders (each counts only what it sent) per direction."""
    out: dict = {}
    for s in stats:
        for d, v in s.items():
            acc = out.setdefault(d, {})
            for k, x in v.items():
                acc[k] = acc.get(k, 0) + x
    return out
