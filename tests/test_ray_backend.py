"""The trainer on Ray: learning, an actor and a learner killed mid-run, the sync learner timeout,
buffer checkpoints, clean shutdown, and two Ray nodes on this machine.

The local-Ray tests share one Ray session (class-scoped fixture: Ray takes seconds to start);
the last of them shuts it down and checks that no Ray process is left. The multi-node test
(``-m "not ray_multinode"`` deselects it) starts and stops its own two nodes.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pal_bench.train import ConfigError, make_config, make_trainer, validate

ray = pytest.importorskip("ray")

FAST = dict(backend="ray", hidden=(64, 64), eval_interval=0, eval_episodes=2, progress=False)
RAY_BIN = str(Path(sys.executable).with_name("ray"))


def cfg_for(tmp_path, **kw):
    return make_config("dqn", "CartPole-v1", out_dir=str(tmp_path), **(FAST | kw))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (Linux /proc)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out[int(d)] = (ppid, cmd)
            except (OSError, IndexError, ValueError):
                pass
    return out


def _descendants(pid: int) -> set[int]:
    procs = _processes()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, (pp, _) in procs.items() if pp == p and c not in found]
        found.update(kids)
        todo += kids
    return found


def _wait_gone(pids, timeout: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)}
        time.sleep(0.2)
    return alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _worker_pids(summary) -> set[int]:
    return {p["pid"] for p in summary["placement"].values() if p.get("pid")}


def test_bad_backend_configs_rejected():
    with pytest.raises(ConfigError, match="allreduce"):
        validate(make_config("dqn", "CartPole-v1", aggregation="allreduce"))
    with pytest.raises(ConfigError, match="backend"):
        validate(make_config("dqn", "CartPole-v1", backend="mpi"))
    with pytest.raises(ConfigError, match="ray_placement"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", ray_placement="everywhere"))
    with pytest.raises(ConfigError, match="ray_chunk"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", ray_chunk=0))
    with pytest.raises(ConfigError, match="learner_timeout_s"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", learner_timeout_s=0))


@pytest.fixture(scope="class")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    if ray.is_initialized():
        ray.shutdown()


def _run_in_thread(trainer):
    out: dict = {}

    def body():
        try:
            out["summary"] = trainer.run()
        except BaseException as e:   # noqa: BLE001 - re-raised by the test
            out["error"] = e

    t = threading.Thread(target=body, name="test-ray-run")
    t.start()
    return t, out


def _kill_when(trainer, worker: str, steps: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = trainer.placement.get(worker, {}).get("pid")
        if pid and trainer.rate.steps >= steps:
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.1)
    raise AssertionError(f"{worker} never reached {steps} steps")


@pytest.mark.usefixtures("local_ray")
class TestLocalRay:
    def test_dqn_cartpole_2_actor_processes_1_learner_learns(self, tmp_path):
        cfg = cfg_for(tmp_path, actors=2, learners=1, steps=20_000, eval_interval=5_000, eval_episodes=3,
                      seed=1)
        with make_trainer(cfg) as tr:
            s = tr.run()
        best = max(e["mean_return"] for e in s["eval"])
        assert best >= 60, s["eval"]            # a random policy scores about 20
        assert s["backend"] == "ray" and s["env_steps"] == 20_000 and s["restarts"] == []
        assert s["updates"] >= 0.95 * (20_000 - cfg.learning_starts) * cfg.updates_per_step
        for phase in ("transport", "serialize", "env_step"):
            assert phase in s["phase_seconds"]["actor0"]
        run_dir = tmp_path / cfg.run_name()
        for f in ("config.yaml", "eval.csv", "episodes.csv", "summary.json", "learning_curve.png", "checkpoint.pt",
                  "buffer.pal"):
            assert (run_dir / f).exists(), f
        assert _wait_gone(_worker_pids(s)) == set()   # every Ray actor of the run was killed

    def test_actor_killed_mid_run_is_restarted(self, tmp_path):
        cfg = cfg_for(tmp_path, actors=2, learners=1, steps=6_000, ray_chunk=128)
        with make_trainer(cfg) as tr:
            t, out = _run_in_thread(tr)
            pid = _kill_when(tr, "actor0", 2_000)
            t.join(300)
        assert "error" not in out, out.get("error")
        s = out["summary"]
        assert s["env_steps"] == 6_000
        assert [(r["worker"], r["event"]) for r in s["restarts"]] == [("actor0", "restart")]
        assert 0 <= s["transitions_lost"] <= 128
        assert s["placement"]["actor0"]["pid"] != pid
        assert "actor0,restart" in (tmp_path / cfg.run_name() / "events.csv").read_text()

    def test_sync_learner_killed_times_out_then_rejoins(self, tmp_path):
        cfg = cfg_for(tmp_path, actors=1, learners=2, steps=6_000, aggregation="sync", learner_timeout_s=1.0)
        with make_trainer(cfg) as tr:
            t, out = _run_in_thread(tr)
            _kill_when(tr, "learner1", 2_500)
            t.join(300)
        assert "error" not in out, out.get("error")
        s = out["summary"]
        assert s["env_steps"] == 6_000
        assert [r["worker"] for r in s["restarts"]] == ["learner1"]
        assert s["learner_timeouts"] >= 1
        assert "learner_timeout" in (tmp_path / cfg.run_name() / "events.csv").read_text()

    def test_buffer_actor_reloads_its_checkpoint_after_a_crash(self, tmp_path):
        from pal_bench.train.ray_backend.buffer_actor import BufferActor

        cfg = cfg_for(tmp_path, buffer_checkpoint_interval=200)
        path = str(tmp_path / "buffer_actor.pal")
        buf = ray.remote(BufferActor).options(max_restarts=1, max_task_retries=-1).remote(cfg, 1000, path)
        rng = np.random.default_rng(0)

        def chunk(n):
            return {"obs": rng.random((n, 4), dtype=np.float32), "act": rng.integers(0, 2, n),
                    "rew": np.ones(n, np.float32), "next_obs": rng.random((n, 4), dtype=np.float32),
                    "done": np.zeros(n, np.float32), "disc": np.full(n, 0.99, np.float32)}

        for _ in range(3):
            ray.get(buf.add_batch.remote(0, chunk(100), 100, [], 0))
        st = ray.get(buf.status.remote())
        assert (st["steps"], st["size"], st["restored"]) == (300, 300, None)
        os.kill(st["pid"], signal.SIGKILL)
        st = ray.get(buf.status.remote())       # retried on the restarted actor
        # checkpoints at 200 transitions (interval 200): the 100 inserted since are the loss window
        assert st["restored"]["steps"] == 200 and (st["steps"], st["size"]) == (200, 200)
        assert ray.get(buf.sample.remote(0, 32))["status"] in ("ok", "retry", "end")
        ray.kill(buf, no_restart=True)

    def test_zz_shutdown_leaves_no_ray_process(self):
        ray_procs = _descendants(os.getpid())
        assert ray_procs, "the local Ray session should have child processes"
        ray.shutdown()
        assert not ray.is_initialized()
        assert _wait_gone(ray_procs) == set()


def test_ray_started_by_the_trainer_is_shut_down(tmp_path):
    assert not ray.is_initialized()
    cfg = cfg_for(tmp_path, steps=1_500, learning_starts=1_000, eval_episodes=1)
    with make_trainer(cfg) as tr:
        s = tr.run()
    assert s["env_steps"] == 1_500
    assert not ray.is_initialized()
    assert _wait_gone(_descendants(os.getpid())) == set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_cluster(port: int) -> None:
    """Stop only this test's Ray nodes: every process whose command line names its GCS port
    (``ray stop`` would stop every Ray instance on the machine)."""
    mine = {pid for pid, (_, cmd) in _processes().items() if f":{port}" in cmd or f"port={port}" in cmd}
    mine -= {os.getpid()}
    for pid in mine | {d for p in mine for d in _descendants(p)}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.ray_multinode
def test_two_ray_nodes_spread_placement(tmp_path, monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # a throwaway cluster on this machine: no token authentication between its nodes and the driver
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = dict(os.environ)
    start = [RAY_BIN, "start", "--num-cpus", "2", "--disable-usage-stats"]
    try:
        subprocess.run(start + ["--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                                "--include-dashboard", "false", "--resources", '{"node_a": 1}'],
                       check=True, env=env, capture_output=True, timeout=120)
        subprocess.run(start + ["--address", address, "--node-ip-address", "127.0.0.1",
                                "--resources", '{"node_b": 1}'], check=True, env=env, capture_output=True,
                       timeout=120)
        cfg = cfg_for(tmp_path, actors=2, learners=1, steps=3_000, ray_address=address, ray_placement="spread")
        with make_trainer(cfg) as tr:
            s = tr.run()
        assert s["env_steps"] == 3_000
        nodes = {w: p["node_id"] for w, p in s["placement"].items() if "node_id" in p}
        assert len(set(nodes.values())) == 2, nodes
        assert not ray.is_initialized()        # the driver disconnected ...
        ray.init(address=address, logging_level="warning")   # ... and left the cluster running
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        ray.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _kill_cluster(port)
