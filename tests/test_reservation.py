"""The process and ray-node backends' step reservation (``processes.shared.reserve_steps``): the rule of
``RatePolicy`` over running totals kept beside the per-actor counters, so that one reservation reads and writes
the same few words whatever the number of actors (issue 49: it summed every actor's counter under the lock, 10.8 µs
per reservation at 64 actors). Counted in words touched, not in time: the timing is ``pal-bench scaling
--reservation-cost``'s."""

import threading

import numpy as np
import pytest

from pal_bench.train.backends.processes.shared import (
    HEADER,
    HOLDER,
    PAUSED,
    STARTED,
    TOTAL_INSERTED,
    TOTAL_RESERVED,
    count_inserted,
    count_under_lock,
    give_back,
    inserted_slot,
    reserve_steps,
    reserved_slot,
)
from pal_bench.train.rate_policy import RatePolicy

ACTORS = 256


class Recording:
    """A counter block that records the words read and written (a slice counts every word in it)."""

    def __init__(self, n_actors: int):
        self.words = np.zeros(HEADER + 2 * n_actors, dtype=np.int64)
        self.touched: set[int] = set()

    def __len__(self) -> int:
        return len(self.words)

    def _note(self, i) -> None:
        self.touched.update(range(*i.indices(len(self.words))) if isinstance(i, slice) else [int(i)])

    def __getitem__(self, i):
        self._note(i)
        return self.words[i]

    def __setitem__(self, i, v) -> None:
        self._note(i)
        self.words[i] = v


def _policy(total: int = 10**9, slack: int = 10**9) -> RatePolicy:
    return RatePolicy(updates_per_step=0.25, learning_starts=0, total_steps=total, slack=slack)


def _sums_hold(c) -> None:
    w = c.words if isinstance(c, Recording) else c
    assert w[TOTAL_RESERVED] == sum(w[reserved_slot(a)] for a in range(ACTORS))
    assert w[TOTAL_INSERTED] == sum(w[inserted_slot(a)] for a in range(ACTORS))


def test_a_reservation_with_256_actors_touches_the_same_words_as_with_one():
    """With 256 actors registered, a grant reads and writes the holder mark, the flags, the running total and the
    actor's own counter: five words, none of another actor's (the old loop read all 256)."""
    c, lock = Recording(ACTORS), threading.Lock()
    for a in range(0, ACTORS, 37):                   # other actors' reservations in the block
        reserve_steps(c.words, lock, a, _policy(), 4)
    c.touched.clear()
    granted, before, spent = reserve_steps(c, lock, 200, _policy(), 8)
    assert (granted, spent) == (8, False)
    assert before == 4 * len(range(0, ACTORS, 37))
    assert c.touched == {HOLDER, PAUSED, STARTED, TOTAL_RESERVED, reserved_slot(200)}
    c.touched.clear()
    count_inserted(c, lock, 200, 8)
    assert c.touched == {HOLDER, TOTAL_INSERTED, inserted_slot(200)}
    _sums_hold(c)


def test_the_rate_rule_is_held_on_the_running_total():
    """Actors may hold ``learning_starts + started / r + slack`` steps between them, wherever they are; the budget
    ends at ``total_steps`` exactly; a pause grants nothing."""
    c, lock = np.zeros(HEADER + 2 * ACTORS, dtype=np.int64), threading.Lock()
    policy = RatePolicy(updates_per_step=0.5, learning_starts=100, total_steps=1_000, slack=20)
    rng = np.random.default_rng(0)
    granted_total = 0
    while True:
        a = int(rng.integers(ACTORS))
        granted, before, spent = reserve_steps(c, lock, a, policy, 4)
        assert before == granted_total
        if granted == 0 and not spent:               # the rule says wait: the learners start an update
            assert not policy.actor_may_step(before, int(c[STARTED]))
            c[STARTED] += 1
            continue
        if spent:
            break
        granted_total += granted
        assert granted_total <= 100 + c[STARTED] / 0.5 + 20 + 4
    assert granted_total == 1_000 and c[TOTAL_RESERVED] == 1_000
    _sums_hold(c)
    c[PAUSED] = 1
    assert reserve_steps(c, lock, 0, _policy(), 4)[0] == 0


def test_a_unit_grant_stops_at_the_budget_in_whole_units():
    """A remote actor's grant (``unit`` = its vector step) is cut to whole units up to the end of the budget."""
    c, lock = np.zeros(HEADER + 2 * ACTORS, dtype=np.int64), threading.Lock()
    policy = _policy(total=100)
    assert reserve_steps(c, lock, 3, policy, 96, unit=8)[0] == 96
    assert reserve_steps(c, lock, 4, policy, 96, unit=8) == (8, 96, False)   # 4 left: one whole unit
    assert reserve_steps(c, lock, 4, policy, 96, unit=8) == (0, 104, True)


@pytest.mark.parametrize("between", ["before_own", "own_before_total"])
def test_a_holder_that_died_inside_leaves_totals_the_next_taker_repairs(between):
    """An actor killed inside the critical section leaves the holder mark set and, if it died between its own
    counter and the total, the two disagreeing: the next taker (another actor) sums the pairs again first, and
    the driver's give-back returns what the dead one reserved and never inserted."""
    c, lock = np.zeros(HEADER + 2 * ACTORS, dtype=np.int64), threading.Lock()
    for a in range(ACTORS):
        reserve_steps(c, lock, a, _policy(), 4)
        count_inserted(c, lock, a, 2)
    c[HOLDER] = 7 + 1                                # actor 7 died holding the lock ...
    if between == "own_before_total":
        c[reserved_slot(7)] += 4                     # ... after its own counter, before the total
    granted, before, _ = reserve_steps(c, lock, 9, _policy(), 4)
    assert granted == 4
    assert before == 4 * ACTORS + (4 if between == "own_before_total" else 0)
    assert c[HOLDER] == 0
    _sums_hold(c)
    lost = give_back(c, lock, 7)
    assert lost == (6 if between == "own_before_total" else 2)
    assert c[reserved_slot(7)] == c[inserted_slot(7)] == 2
    _sums_hold(c)


def test_the_driver_repairs_when_the_dead_holder_was_the_last_to_take_the_lock():
    c, lock = np.zeros(HEADER + 2 * ACTORS, dtype=np.int64), threading.Lock()
    reserve_steps(c, lock, 5, _policy(), 4)
    c[HOLDER] = 5 + 1
    c[inserted_slot(5)] += 4                          # died inside count_inserted, before the total
    assert give_back(c, lock, 5) == 0
    assert c[HOLDER] == 0
    _sums_hold(c)
    count_under_lock(c, lock, 1, 4)                   # READY: the holder mark is cleared again
    assert c[HOLDER] == 0


def _until(cond, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "not within 10 s"


def test_the_pump_reads_only_the_queues_with_mail_and_follows_a_replaced_queue():
    """``Mailboxes`` names the queues with something in them (an empty poll tries none), a queue drained is not
    named again, and a restarted actor's new queue replaces the old one under the same index."""
    import multiprocessing as mp
    import queue as queue_mod

    from pal_bench.train.backends.processes.mail import Mailboxes

    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(64)]
    mail = Mailboxes()
    try:
        for i, q in enumerate(queues):
            mail.watch(i, q)
        assert mail.ready() == []
        queues[5].put(("episodes", 5, [(1.0, 2)]))
        queues[40].put(("ready", 40, None))
        _until(lambda: mail.ready(timeout=0.1) == [5, 40])     # the queues' feeder threads write in a moment
        assert queues[5].get_nowait()[1] == 5
        assert mail.ready() == [40]
        old, queues[40] = queues[40], ctx.Queue()
        mail.forget(40)
        mail.watch(40, queues[40])
        old.close()
        assert mail.ready() == []
        queues[40].put(("ready", 40, None))
        _until(lambda: mail.ready(timeout=0.1) == [40])
        with pytest.raises(queue_mod.Empty):
            queues[5].get_nowait()
    finally:
        mail.close()
        for q in queues:
            q.close()


def test_a_socket_inbox_is_watched_through_its_own_epoll():
    """The ray-node backend's ``SocketInbox`` is readable under ``Mailboxes`` while a writer connects or sends,
    and not once it is read."""
    from pal_bench.train.backends.processes.inbox import SocketInbox
    from pal_bench.train.backends.processes.mail import Mailboxes

    inbox, mail = SocketInbox(), Mailboxes()
    writer = None
    try:
        mail.watch(3, inbox)
        assert mail.ready() == []
        import pickle

        writer = pickle.loads(pickle.dumps(inbox))        # as an actor's process gets it
        writer.put(("ready", 3, None))
        assert mail.ready(timeout=5) == [3]
        assert inbox.get(timeout=5)[0] == "ready"
        assert mail.ready() == []
    finally:
        if writer is not None:
            writer.close()
        mail.close()
        inbox.kill()


def test_reservation_cost_writes_both_tables(tmp_path, capsys):
    """``pal-bench scaling --reservation-cost`` (tiny rounds: a functional check, the figures are the benchmark's)
    writes reservation_cost.csv and pump_cost.csv with their conditions, and leaves no segment behind."""
    import os

    import pandas as pd

    from pal_bench.studies.scaling.measure import main

    assert main(["--reservation-cost", "--actors", "1,4", "--rounds", "50", "--repeats", "1", "--seconds", "0.1",
                 "--out", str(tmp_path), "--force"]) == 0
    res = pd.read_csv(tmp_path / "reservation_cost.csv")
    assert list(res.actors) == [1, 4]
    assert {"us_per_reservation", "us_per_insert", "us_summing_all", "rounds", "contended_per_s"} <= set(res.columns)
    assert (res.us_per_reservation > 0).all() and (res.contended_per_s > 0).all()
    pump = pd.read_csv(tmp_path / "pump_cost.csv")
    assert list(pump.queues) == [1] and (pump.us_per_poll > 0).all()
    assert (tmp_path / "reservation_cost.csv.meta.json").exists() and (tmp_path / "pump_cost.csv.meta.json").exists()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pal_cost_{os.getpid()}_")]


def test_threads_list_must_hold_one(capsys):
    from pal_bench.studies.scaling.measure import main, thread_points

    assert thread_points(3) == [1, 2, 3]
    assert thread_points([8, 1, 2, 4, 2]) == [1, 2, 4, 8]
    with pytest.raises(SystemExit) as e:
        main(["--threads", "2,4"])
    assert e.value.code == 2
    assert "--threads must include 1" in capsys.readouterr().err


def _write_half_a_message(q) -> None:
    """(a spawned child) The length of a 1 MB message and 100 bytes of it, then death, as a kill mid-put leaves it."""
    import os
    import struct

    os.write(q._writer.fileno(), struct.pack("!i", 1_000_000) + b"x" * 100)
    os._exit(0)


def test_a_message_cut_short_by_a_dead_actor_ends_the_read_instead_of_hanging_the_pump():
    """The driver drops its copy of an actor queue's write end once the actor has it (``_drop_write_end``), so a
    message the actor died in the middle of reads as end of file: the pump's drain returns (it waited forever for
    the rest, holding the sync lock)."""
    import multiprocessing as mp
    import threading

    from pal_bench.train.backends.processes.shared import read_messages
    from pal_bench.train.backends.processes.trainer import _drop_write_end

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_write_half_a_message, args=(q,))
    p.start()
    _drop_write_end(q)
    p.join(30)
    got, done = [], threading.Event()

    def drain():
        got.extend(read_messages(q))
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    assert done.wait(10), "the drain waited for the rest of a message nobody will write"
    assert got == []
