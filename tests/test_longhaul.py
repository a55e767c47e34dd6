"""The long-haul link model on loopback (delay, throttle, FIFO, byte counts), inside a Ray actor, and
the two replay topologies running a short CartPole DQN.

Timing asserts use medians and generous bounds (a shared, loaded 2-core machine): a packet is never
delivered before its modelled time, and not much after it.
"""

import pickle
import socket
import statistics
import struct
import threading
import time

import numpy as np
import pytest

from pal_bench.studies.longhaul.link import PRESETS, TO_BUFFER, TO_LEARNER, Link, Receiver, merge_stats, spec_from


def _frames(sock):
    """Length-prefixed pickled packets read from ``sock`` until it closes."""
    f = sock.makefile("rb")
    while head := f.read(4):
        yield pickle.loads(f.read(struct.unpack("!I", head)[0]))


def _ship(sock, packet) -> None:
    data = pickle.dumps(packet, protocol=5)
    sock.sendall(struct.pack("!I", len(data)) + data)


@pytest.fixture
def loopback():
    """A connected TCP pair on 127.0.0.1: (sender socket, receiver socket)."""
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    yield a, b
    a.close()
    b.close()


def _receive_all(sock, rx: Receiver, out: list) -> threading.Thread:
    """Deliver every packet arriving on ``sock``; append (seq, nbytes, delivered time.time(), sent_at)."""
    def body():
        for p in _frames(sock):
            obj = rx.recv(p, timeout=30)
            out.append((p.seq, p.nbytes, time.time(), p.sent_at, obj))
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def test_presets():
    assert PRESETS["fibre-10km"].transfer_s(1_000_000) == pytest.approx(50e-6 + 8e6 / 25e9)
    assert PRESETS["wan"].transfer_s(125_000) == pytest.approx(0.02 + 0.01)
    assert Link.preset("none").is_null
    assert spec_from("wan", byte_budget_per_s=1e6).byte_budget_per_s == 1e6
    with pytest.raises(ValueError, match="unknown preset"):
        spec_from("carrier-pigeon")
    link = pickle.loads(pickle.dumps(Link.preset("wan")))
    assert link.spec == PRESETS["wan"]


def test_arecv_backlog_is_delivered_in_order_without_polling():
    """300 packets of 5 kB behind a 1 MB/s budget (1.5 s of backlog), handed to ``arecv`` newest
    first on one event loop: they come out in the order sent, none before its modelled time, and
    the waiting ones sleep (a 0.2 ms poll per waiting packet used 1.4 s of CPU in 1.5 s here;
    woken in turn, 0.12 s)."""
    import asyncio

    link, rx = Link(latency_s=0.001, bandwidth_bps=1e9, byte_budget_per_s=1e6, burst_bytes=5_000), Receiver(TO_BUFFER)
    packets = [link.send(bytes(5_000), TO_BUFFER) for _ in range(300)]
    out: list[tuple[int, float]] = []

    async def take(p):
        await rx.arecv(p, timeout=30)
        out.append((p.seq, time.time() - p.deliver_at))

    async def main():
        await asyncio.gather(*(take(p) for p in reversed(packets)))

    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(main())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert [seq for seq, _ in out] == list(range(300))
    assert min(early for _, early in out) >= 0
    assert wall > 1.4 and cpu < 0.4 * wall, (cpu, wall)     # only the head packet's last 2 ms spin


def test_delay_matches_latency_plus_size_over_bandwidth(loopback):
    """Messages of 1 kB .. 400 kB, one at a time on an idle link: delivery time ~ latency + 8 n / bw."""
    link, rx, got = Link(latency_s=0.010, bandwidth_bps=50e6), Receiver(TO_LEARNER), []
    t = _receive_all(loopback[1], rx, got)
    sizes = [1_000, 100_000, 400_000]
    for _ in range(5):
        for n in sizes:
            k = len(got)
            _ship(loopback[0], link.send(np.ones(n, np.uint8), TO_LEARNER))
            while len(got) == k:
                time.sleep(0.001)
    loopback[0].close()
    t.join(10)
    for n in sizes:
        rows = [r for r in got if abs(r[1] - n) < 500]
        measured = statistics.median(r[2] - r[3] for r in rows)
        expected = link.spec.transfer_s(rows[0][1])
        assert min(r[2] - r[3] for r in rows) >= expected - 1e-4      # never early
        assert measured <= expected * 1.3 + 0.003, (n, measured, expected)
    assert rx.messages == 15


def test_byte_budget_caps_throughput(loopback):
    """40 messages of 50 kB back to back under a 2 MB/s budget: throughput ~ the budget, never above."""
    budget = 2e6
    link, rx, got = Link(byte_budget_per_s=budget), Receiver(TO_LEARNER), []
    t = _receive_all(loopback[1], rx, got)
    t0 = time.time()
    for _ in range(40):
        _ship(loopback[0], link.send(np.zeros(50_000, np.uint8), TO_LEARNER))
    loopback[0].close()
    t.join(30)
    total = sum(r[1] for r in got)
    elapsed = got[-1][2] - t0
    floor = (total - link.burst_bytes - got[-1][1]) / budget      # the bucket's burst, then the rate
    assert elapsed >= floor * 0.98
    assert total / elapsed == pytest.approx(budget, rel=0.3)
    # unthrottled, the same messages take a fraction of that
    assert Link().schedule(total, TO_LEARNER)[1] - time.time() < 0.01


def test_fifo_holds_when_the_transport_reorders():
    """A small message sent after a large one is delivered after it, even when it reaches the
    receiver first."""
    link, rx, order = Link(latency_s=0.005, bandwidth_bps=10e6), Receiver(TO_BUFFER), []
    big = link.send(np.zeros(200_000, np.uint8), TO_BUFFER)     # 160 ms of serialization
    small = link.send("ack", TO_BUFFER)
    assert small.deliver_at > big.deliver_at
    threads = [threading.Thread(target=lambda p=p: order.append((rx.recv(p, timeout=10), time.time())))
               for p in (small, big)]
    threads[0].start()
    time.sleep(0.02)
    threads[1].start()
    for th in threads:
        th.join(10)
    assert isinstance(order[0][0], np.ndarray) and order[1][0] == "ack"
    assert order[1][1] >= small.deliver_at


def test_bytes_counted_each_way():
    link, down, up = Link(latency_s=0.001), Receiver(TO_LEARNER), Receiver(TO_BUFFER)
    a = link.send({"obs": np.zeros((256, 8), np.float32)}, TO_LEARNER)
    b = link.send(np.zeros(256, np.float64), TO_BUFFER)
    down.recv(a)
    up.recv(b)
    s = link.stats()
    assert s[TO_LEARNER]["bytes"] == a.nbytes == down.bytes and a.nbytes >= 256 * 8 * 4
    assert s[TO_BUFFER]["bytes"] == b.nbytes == up.bytes and b.nbytes >= 256 * 8
    assert s[TO_LEARNER]["messages"] == s[TO_BUFFER]["messages"] == 1
    assert merge_stats(s, s)[TO_LEARNER]["bytes"] == 2 * a.nbytes
    with pytest.raises(ValueError, match="receiver of"):
        up.recv(link.send(1, TO_LEARNER))


# ---------------------------------------------------------------- Ray


def test_link_inside_a_ray_actor(ray_session):
    """Packets sent to an async Ray actor are delivered there at the modelled time (the Ray call's
    own cost, ~1 ms, is covered by the modelled 20 ms) and in order."""
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Sink:
        def __init__(self):
            self.rx = Receiver(TO_LEARNER)

        async def take(self, packet):
            obj = await self.rx.arecv(packet, timeout=30)
            return packet.seq, time.time() - packet.sent_at, len(obj), time.time()

    sink = Sink.remote()
    ray.get(sink.take.remote(Link().send(b"", TO_LEARNER)))      # warm up (seq 0)
    link = Link(latency_s=0.020, bandwidth_bps=100e6)
    link._tx[TO_LEARNER].seq = 1
    rows = []
    for _ in range(3):
        for n in (1_000, 250_000):
            rows.append((n, ray.get(sink.take.remote(link.send(bytes(n), TO_LEARNER)))))
    for n in (1_000, 250_000):
        expected = link.spec.transfer_s(n)
        measured = statistics.median(r[1] for m, r in rows if m == n)
        assert expected - 1e-4 <= measured <= expected * 1.3 + 0.005, (n, measured, expected)
    # pipelined: several in flight at once arrive in order
    refs = [sink.take.remote(link.send(bytes(n), TO_LEARNER)) for n in (200_000, 10, 10, 100_000, 10)]
    got = ray.get(refs)
    assert [r[3] for r in got] == sorted(r[3] for r in got)     # delivered in the order sent
    assert [r[2] for r in got] == [200_000, 10, 10, 100_000, 10]


@pytest.mark.parametrize("topology", ["learner-replay", "buffer-replay"])
def test_topology_runs_a_short_cartpole_dqn(ray_session, topology):
    """A short CartPole-v1 DQN over the WAN preset runs to completion in both topologies, with
    learner updates, traffic each way and the crossing priorities measured."""
    from pal_bench.studies.longhaul import experiment as ex

    cfg = ex.make_cfg("CartPole-v1", 1_500, learning_starts=300, hidden=(32, 32))
    res = ex.run_one(cfg, topology, "wan", actors=1, actor_rate=1_000, eval_interval_s=0.5, eval_episodes=1)
    row, timeline = ex.summarize(res)
    assert row["env_steps"] == 1_500
    assert row["updates"] > 0 and row["loss_mean"] > 0 and row["crossed_priority"] > 0
    assert row["bytes_to_learner"] > 0 and row["bytes_to_buffer"] > 0
    assert 0 <= row["learner_idle_frac"] <= 1
    assert {"loss", "crossed_priority"} <= {r["metric"] for r in timeline}
    if topology == "learner-replay":
        assert row["transitions_forwarded"] > 0 and row["messages_to_buffer"] >= 1     # weights go back
    else:
        assert row["transitions_forwarded"] == 0 and row["messages_to_buffer"] > row["updates"]


def test_train_cli_runs_a_topology_and_writes_its_run_directory(ray_session, tmp_path, capsys):
    """``pal-bench train --backend ray --topology buffer-replay --link wan``: the long-haul run behind
    the trainer's interface, in the caller's Ray session (left running)."""
    import json

    from pal_bench.cli import main

    rc = main(["train", "--algo", "dqn", "--env", "CartPole-v1", "--backend", "ray", "--topology", "buffer-replay",
               "--link", "wan", "--actor-rate", "1000", "--steps", "1500", "--out-dir", str(tmp_path), "--name", "lh",
               "--set", "learning_starts=300", "--set", "hidden=[32, 32]", "--set", "eval_interval=500",
               "--set", "eval_episodes=1", "--set", "progress=false"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "link wan, buffer-replay: final loss" in printed
    run = tmp_path / "lh"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["topology"] == "buffer-replay" and summary["link"] == "wan"
    assert summary["env_steps"] == 1_500 and summary["updates"] > 0 and summary["bytes_to_learner"] > 0
    assert (run / "config.yaml").exists() and (run / "timeline.csv").exists()
    assert (run / "eval.csv").read_text().startswith("wall_s,version,mean_return")
    import ray

    assert ray.is_initialized()                 # the fixture's session, not the run's to shut down


@pytest.mark.parametrize("kw, message", [
    (dict(topology="ring"), "topology must be one of"),
    (dict(topology="buffer-replay"), "runs on backend = 'ray'"),
    (dict(topology="buffer-replay", backend="ray", learners=2), "one learner behind the link"),
    (dict(topology="learner-replay", backend="ray", link="tin-can"), "link: unknown preset"),
    (dict(topology="learner-replay", backend="ray", actor_rate=-1.0), "actor_rate must be >= 0"),
])
def test_bad_topology_configs_are_rejected(kw, message):
    from pal_bench.train import ConfigError, make_config, validate

    with pytest.raises(ConfigError, match=message):
        validate(make_config("dqn", "CartPole-v1", **kw))


def test_topology_needs_the_dqn_family():
    from pal_bench.train import ConfigError, make_config, validate

    with pytest.raises(ConfigError, match="DQN family"):
        validate(make_config("sac", "Pendulum-v1", backend="ray", topology="buffer-replay"))
