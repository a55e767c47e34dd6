"""The trainer on Ray: learning, an actor and a learner killed mid-run, the sync learner timeout,
all-reduce among learner processes, buffer checkpoints, clean shutdown, and two Ray nodes on this
machine.

The local-Ray tests share one Ray session (class-scoped fixture: Ray takes seconds to start);
the last of them shuts it down and checks that no Ray process is left. The multi-node test
(``-m "not ray_multinode"`` deselects it) starts and stops its own two nodes, and drives them from
a fresh interpreter (see ``MULTINODE_DRIVER``).
"""

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pal_bench.train import ConfigError, make_config, make_trainer, validate
from pal_bench.train.recorder import RunRecorder

ray = pytest.importorskip("ray")

# "pack": the tests of Ray's own actors (buffer actor, parameter server, learner actors); the node placement's
# tests ask for it ("auto", the default, or "node")
FAST = dict(backend="ray", ray_placement="pack", hidden=(64, 64), eval_interval=0, eval_episodes=2, progress=False)
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
    """Descendants of ``pid``, except multiprocessing's resource tracker: a test process that once used a
    spawn context (the process backend's tests, earlier in the run) keeps one until it exits; it is not Ray's."""
    procs = _processes()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, (pp, cmd) in procs.items()
                if pp == p and c not in found and "multiprocessing.resource_tracker" not in cmd]
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
    with pytest.raises(ConfigError, match="allreduce"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", ray_placement="node", aggregation="allreduce"))
    with pytest.raises(ConfigError, match="ray_chunk"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", ray_chunk=0))
    with pytest.raises(ConfigError, match="learner_timeout_s"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", learner_timeout_s=0))
    with pytest.raises(ConfigError, match="buffer_checkpoint_interval"):
        validate(make_config("dqn", "CartPole-v1", backend="ray", ray_placement="node",
                             buffer_checkpoint_interval=1000))


@pytest.mark.parametrize("kw, placement", [
    ({}, "node"),                                             # the default: the node's shared-memory pieces
    ({"aggregation": "allreduce", "learners": 2}, "pack"),    # learners in Ray actors, all-reducing
    ({"env_backend": "async"}, "pack"),
    ({"buffer_checkpoint_interval": 1000}, "pack"),           # the buffer actor's own checkpoints
    ({"ray_placement": "spread"}, "spread"),
    ({"ray_placement": "node", "ray_remote_actors": True}, "node"),
])
def test_default_ray_placement_is_the_node_unless_the_run_needs_ray_actors(kw, placement):
    cfg = make_config("dqn", "CartPole-v1", backend="ray", **kw)
    validate(cfg)
    assert cfg.ray_placement == kw.get("ray_placement", "auto") and cfg.placement == placement


def test_train_command_passes_the_ray_placement(tmp_path, monkeypatch):
    from pal_bench.cli import main

    seen = []

    def recorded(cfg, *args, **kwargs):
        seen.append(cfg)
        raise ConfigError("recorded")

    monkeypatch.setattr("pal_bench.train.make_trainer", recorded)
    for extra in (["--ray-placement", "pack"], []):
        assert main(["train", "--backend", "ray", "--out-dir", str(tmp_path), *extra]) == 2
    assert [(c.ray_placement, c.placement) for c in seen] == [("pack", "pack"), ("auto", "node")]


def test_remote_actor_training_error_ends_the_run_other_errors_restart_it():
    """A remote actor's error reaches the driver with Ray's exception (``RayProcess``), not as a message: a
    ``Diverged`` it raised is kept as the actor's training error (the supervisor then ends the run with it, as from
    an actor process); any other error is recorded as the restart's cause."""
    from pal_bench.train.backends.processes.shared import training_error
    from pal_bench.train.backends.ray.node import RayNodeTrainer
    from pal_bench.train.errors import Diverged

    tr = object.__new__(RayNodeTrainer)         # only the supervisor's records, no run
    tr._training_errors, tr._last_error = {}, {}
    synced = []
    tr._sync = lambda: synced.append(1)         # (no message arrived from the actors themselves)
    diverged = type("P", (), {"error": "Traceback ...\nDiverged: loss is nan", "training_error": (
        "Diverged", "loss is nan at update 12 (learner0, td)")})()
    crashed = type("P", (), {"error": "Traceback ...\nRayActorError: the actor died", "training_error": None})()
    tr._process_ended(0, diverged)
    tr._process_ended(1, crashed)
    assert isinstance(training_error(tr._training_errors[0]), Diverged)
    assert 1 not in tr._training_errors and tr._last_error[1].endswith("the actor died")
    assert 0 not in tr._last_error and len(synced) == 2                         # inboxes read first


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
        """DQN on CartPole-v1, 2 actor processes + 1 learner, 20k steps, seed 1, Ray actors (``ray_placement =
        "pack"``; ``tests/learning_runs.py``).

        Asserted: the best of 4 greedy evaluations (3 episodes each) >= 60; a random policy scores about
        20. Seed sweep (`python tests/learning_runs.py ray --seeds 0-9`, AMD EPYC, 2026-12-01): min 90.0,
        median 109.0, max 464.3 (Ray's actors are not lockstepped, so a seed's run also varies with timing).
        """
        from learning_runs import ray_dqn_cartpole

        r = ray_dqn_cartpole(seed=1, out_dir=str(tmp_path))
        s, cfg = r["summary"], r["cfg"]
        assert r["best"] >= 60, s["eval"]            # a random policy scores about 20
        assert s["backend"] == "ray" and s["env_steps"] == 20_000 and s["restarts"] == []
        assert s["updates"] >= 0.95 * (20_000 - cfg.learning_starts) * cfg.updates_per_step
        for phase in ("transport", "serialize", "env_step"):
            assert phase in s["phase_seconds"]["actor0"]
        run_dir = tmp_path / cfg.run_name()
        for f in ("config.yaml", "eval.csv", "episodes.csv", "summary.json", "learning_curve.png",
                  "checkpoints/latest.json"):
            assert (run_dir / f).exists(), f
        assert all(f.exists() for f in RunRecorder(run_dir, "").checkpoint_files())

    def test_dqn_cartpole_one_node_placement_learns(self, tmp_path):
        """The same run on the default one-node placement (``ray_placement = "node"``: actor processes started by
        Ray, the process backend's shared-memory buffer, weights and counters; ``tests/learning_runs.py``).

        Asserted: the best of 4 greedy evaluations (3 episodes each) >= 60; a random policy scores about 20.
        Seed sweep (`python tests/learning_runs.py ray-node --seeds 0-9`, AMD EPYC, 2026-12-05): min 125.3,
        median 198.2, max 379.7; every seed made exactly 4,750 updates ((20,000 - 1,000) x 0.25).
        """
        from learning_runs import ray_dqn_cartpole

        r = ray_dqn_cartpole(seed=1, out_dir=str(tmp_path), placement="node")
        s, cfg = r["summary"], r["cfg"]
        assert r["best"] >= 60, s["eval"]            # a random policy scores about 20
        assert s["backend"] == "ray" and s["ray_placement"] == "node" and s["env_steps"] == 20_000
        assert s["restarts"] == [] and {p["node_id"] for p in s["placement"].values()} == {
            ray.get_runtime_context().get_node_id()}
        assert s["updates"] >= 0.95 * (20_000 - cfg.learning_starts) * cfg.updates_per_step
        assert s["episodes"] > 0 and "env_step" in s["phase_seconds"]["actor0"]   # messages and timers arrived
        assert _wait_gone(_worker_pids(s)) == set()   # every Ray actor of the run was killed

    def test_node_placement_runs_the_process_backend_pieces_under_ray(self, tmp_path):
        """``ray_placement = "auto"`` (the default) is "node": Ray starts the actor processes on this node; they
        insert straight into the shared segment, which the driver's learner samples in this process (every sample
        takes the segment's lock here: no buffer actor, no remote sample call), the sole learner applies its own
        gradient and the actors read the published weights; the budget and the update rate hold; nothing is left
        in /dev/shm."""
        before = {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("pal")}
        cfg = cfg_for(tmp_path, ray_placement="auto", actors=2, learners=1, steps=3_000, learning_starts=500,
                      batch_size=32)
        tr = make_trainer(cfg)
        try:
            assert type(tr).__name__ == "RayNodeTrainer"
            s = tr.run()
            samples = tr.buffer.lock_stats()["acquisitions"]
            version = tr.ps.version
        finally:
            tr.close()
        assert s["backend"] == "ray" and s["ray_placement"] == "node" and s["env_steps"] == 3_000
        assert s["restarts"] == [] and s["transitions_lost"] == 0
        expected = (3_000 - cfg.learning_starts) * cfg.updates_per_step
        assert 0.95 * expected <= s["updates"] <= expected + 1
        assert samples >= s["updates"]                 # each update sampled the segment here
        assert version == s["updates"]                 # the sole learner applied every gradient itself
        for actor in ("actor0", "actor1"):
            phases = s["phase_seconds"][actor]
            assert phases["env_step"] > 0 and "weights_pull" in phases
            assert s["placement"][actor]["pid"] != os.getpid()
        assert "transport" not in s["phase_seconds"]["learner0"]
        assert _wait_gone(_worker_pids(s)) == set()
        after = {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("pal")}
        assert after <= before

    def test_a_ray_started_process_keeps_the_training_error_it_raised(self):
        """``RayProcess`` (the node placement's actor handle): a body that raises ``Diverged`` ends with exit code
        1 and the error's class and message, which the supervisor turns back into ``Diverged``."""
        from pal_bench.train.backends.ray.node import RayProcess
        from pal_bench.train.errors import Diverged

        class Diverging:                 # defined here: Ray ships it by value
            def pid(self):
                return os.getpid()

            def run(self, args):
                raise Diverged("loss is nan at update 3 (learner0, td)")

        p = RayProcess(Diverging, (), ray.get_runtime_context().get_node_id(), 0)
        p.join(60)
        assert p.exitcode == 1 and p.training_error == ("Diverged", "loss is nan at update 3 (learner0, td)")
        assert "Diverged" in p.error
        p.kill()

    def test_node_placement_actor_killed_is_restarted_with_its_loss_recorded(self, tmp_path):
        cfg = cfg_for(tmp_path, ray_placement="node", actors=2, learners=1, steps=6_000, learning_starts=500,
                      batch_size=32)
        with make_trainer(cfg) as tr:
            t, out = _run_in_thread(tr)
            _kill_when(tr, "actor1", 1_500)
            t.join(300)
            assert not t.is_alive(), "the run stalled"
        assert "error" not in out, out.get("error")
        s = out["summary"]
        assert s["env_steps"] == 6_000
        assert len(s["restarts"]) == 1 and s["restarts"][0]["worker"] == "actor1"
        assert 0 <= s["transitions_lost"] <= cfg.envs_per_actor

    def test_r2d2_trains_on_sequences(self, tmp_path):
        """R2D2 on Ray: recurrent actor processes send whole sequences, the learner writes per-sequence
        priorities into the buffer actor; the saved buffer holds sequences with their start states."""
        from pal_bench import PrioritizedReplayBuffer

        cfg = make_config("r2d2", out_dir=str(tmp_path), backend="ray", ray_placement="pack", actors=2, steps=1_500,
                          learning_starts=300, seq_len=10, seq_overlap=5, burn_in=2, n_step=2, batch_size=8,
                          hidden=(16,), lstm_size=8,
                          updates_per_step=0.05, eval_interval=0, eval_episodes=1, progress=False, ray_chunk=100)
        with make_trainer(cfg) as tr:
            s = tr.run()
        assert s["env_steps"] == cfg.steps and s["updates"] > 0 and s["final_eval_return"] is not None
        buf = PrioritizedReplayBuffer.load(RunRecorder(tmp_path / cfg.run_name(), "").checkpoint_files()[1])
        assert buf.fields["obs"][0] == (10, 2) and cfg.steps / 10 <= len(buf) <= cfg.steps / 5 * 1.5
        got = buf.sample(len(buf))
        assert got["mask"][:, 0].all() and np.abs(got["h0"]).sum() > 0
        assert len(np.unique(buf.get_priorities(got["indices"]))) > 1

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

    def test_allreduce_learners_apply_identical_averaged_gradients(self, tmp_path):
        import torch

        cfg = cfg_for(tmp_path, actors=1, learners=2, steps=3_000, aggregation="allreduce", eval_episodes=1)
        with make_trainer(cfg) as tr:
            s = tr.run()
        assert s["env_steps"] == 3_000 and s["restarts"] == []
        final = s["learners_final"]
        assert set(final) == {"learner0", "learner1"}, final
        steps = final["learner0"]["version"]
        # every all-reduce step is taken by both learners, on the same averaged gradients
        assert steps > 0 and final["learner1"]["version"] == steps
        assert final["learner0"]["updates"] == final["learner1"]["updates"] == steps
        assert final["learner0"]["weights_sha1"] == final["learner1"]["weights_sha1"]
        assert s["updates"] == 2 * steps            # one sampled batch per learner per step
        assert s["updates"] >= 0.9 * (3_000 - cfg.learning_starts) * cfg.updates_per_step
        # learner 0 published its last weights: the parameter server and the checkpoint are at that step
        assert s["ps_steps"] == steps
        ckpt = RunRecorder(tmp_path / cfg.run_name(), "").checkpoint_files()[0]
        assert torch.load(ckpt, weights_only=True)["ps"]["version"] == steps

    def test_buffer_actor_reloads_its_checkpoint_after_a_crash(self, tmp_path):
        from pal_bench.train.backends.ray.buffer_actor import BufferActor

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

    def test_checkpoint_and_resume_continue_the_run(self, tmp_path):
        import torch

        cfg = cfg_for(tmp_path, steps=2_000, learning_starts=500, batch_size=32, name="r")
        with make_trainer(cfg) as tr:
            first = tr.run()
        saved = torch.load(RunRecorder(tmp_path / "r", "r").checkpoint_files()[0], weights_only=True)
        assert saved["steps"] == 2_000 and saved["ps"]["version"] == first["ps_steps"] > 0
        cfg2 = cfg_for(tmp_path, steps=3_000, learning_starts=500, batch_size=32, name="r")
        with make_trainer(cfg2, resume=True) as tr:
            assert (tr.rate.steps, tr.rate.done) == (2_000, first["updates"])
            s = tr.run()
        assert s["env_steps"] == 3_000 and s["restarts"] == []
        # the 1 000 new transitions at 0.25 updates each; the weights went on from the saved version
        assert s["updates"] == pytest.approx(0.25 * 2_500, abs=4)
        assert s["ps_steps"] == pytest.approx(first["ps_steps"] + 250, abs=4)
        assert s["buffer_size"] == 3_000            # the restored 2 000 rows plus the new ones

    def test_learners_alone_make_their_updates_on_a_filled_buffer(self, tmp_path):
        """The public learners-only mode the scaling study measures f_l with: a buffer actor filled with real
        transitions, no actor workers, exactly the updates asked for; nothing of the run's actors left."""
        from pal_bench.studies.scaling.measure import transitions
        from pal_bench.train import make_trainer

        cfg = make_config("dqn", "CartPole-v1", backend="ray", ray_placement="pack", actors=1, learners=1,
                          batch_size=32,
                          out_dir=str(tmp_path), progress=False, eval_episodes=0, eval_interval=0,
                          deterministic=False)
        with make_trainer(cfg) as tr:
            got = tr.run_learners(transitions(tr, 500), 40)
            assert tr._handles == {}
        assert got["updates"] == 40 and got["wall_s"] > 0 and got["cpu_s"] is None
        # the machine's busy CPU meanwhile (every process: the simulation's Ray costs) and the learner's phases
        assert got["machine_cpu_s"] is not None and got["machine_cpu_s"] >= 0
        assert got["phase_seconds"]["learner0"]["forward_backward"] > 0

    def test_zz_shutdown_leaves_no_ray_process(self):
        ray_procs = _descendants(os.getpid())
        assert ray_procs, "the local Ray session should have child processes"
        ray.shutdown()
        assert not ray.is_initialized()
        assert _wait_gone(ray_procs) == set()


@pytest.mark.parametrize("placement", ["pack", "auto"])
def test_ray_started_by_the_trainer_is_shut_down(tmp_path, placement):
    assert not ray.is_initialized()
    cfg = cfg_for(tmp_path, steps=1_500, learning_starts=1_000, eval_episodes=1, ray_placement=placement)
    with make_trainer(cfg) as tr:
        s = tr.run()
    assert s["env_steps"] == 1_500
    assert not ray.is_initialized()
    assert _wait_gone(_descendants(os.getpid())) == set()


RAY_NODE_DRIVER = """
import sys
import tempfile
from pal_bench.train import make_config, make_trainer
if __name__ == "__main__":
    cfg = make_config("dqn", "CartPole-v1", steps=10**6, actors=2, learners=1, backend="ray", out_dir=sys.argv[1],
                      name="n", progress=False, eval_episodes=0, learning_starts=500, batch_size=32, hidden=(32, 32))
    with make_trainer(cfg) as tr:
        tr.run()
"""


def _pal_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("pal")}


def test_node_placement_killed_driver_leaves_nothing_after_the_next_run(tmp_path):
    """A driver on the default placement SIGKILLed mid-run (its own local Ray, its actor processes started by
    Ray): its actor processes and the Ray processes it started go with it (Ray's dashboard and runtime-env agents
    only once they notice their raylet is gone, about 60 s on: Ray's own timeout), its shared segments stay until
    the next run in the same run directory, which replaces them and leaves /dev/shm as it found it; its actors'
    message sockets (``SocketInbox``) stay until the next run on the machine removes them. The agents are stopped
    at the end rather than waited for."""
    assert not ray.is_initialized()
    before = _pal_shm()
    script = tmp_path / "driver.py"
    script.write_text(RAY_NODE_DRIVER)
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while p.poll() is None and time.monotonic() < deadline and not (
                (tmp_path / "n" / "config.yaml").exists() and _pal_shm() - before):
            time.sleep(0.2)
        assert p.poll() is None, f"the driver ended early: {p.stderr.read()[-3000:]}"
        time.sleep(3)                                            # actors stepping, the learner updating
        started = _descendants(p.pid)
        assert started, "the driver started no process"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    procs = _processes()
    agents = {q for q in started if re.search(r"ray::(DashboardAgent|RuntimeEnvAgent)", procs.get(q, (0, ""))[1])}
    assert _wait_gone(started - agents, 20) == set(), "processes of the killed run are still running"
    assert _pal_shm() - before                                   # the killed run's segments are still there
    inboxes = set(glob.glob(f"{tempfile.gettempdir()}/pal-inbox-{p.pid}-*"))
    assert inboxes                                               # and its actors' message sockets
    cfg = make_config("dqn", "CartPole-v1", steps=1_000, actors=2, learners=1, backend="ray", out_dir=str(tmp_path),
                      name="n", progress=False, eval_episodes=0, learning_starts=500, batch_size=32, hidden=(32, 32))
    with make_trainer(cfg, overwrite=True) as tr:
        assert tr.run()["env_steps"] == 1_000
    assert _pal_shm() <= before
    assert not any(os.path.exists(d) for d in inboxes)           # the next run removed the dead driver's sockets
    assert not ray.is_initialized()
    # Ray's dashboard and runtime-env agents fate-share with their raylet, which is gone (checked above with the rest
    # of the run); they exit once a call of theirs to the dead GCS times out, about 60 s on (Ray's own timeout:
    # 55-75 s when this test waited for it, a minute of CI spent on Ray's behaviour, not PAL's). Stopped here.
    for q in agents:
        try:
            os.kill(q, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert _wait_gone(agents, 10) == set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_cluster(port: int) -> None:
    """Stop only this test's Ray nodes: every process whose command line names its GCS port
    (``ray stop`` would stop every Ray instance on the machine)."""
    own = re.compile(rf"(:|port=){port}(?!\d)")
    mine = {pid for pid, (_, cmd) in _processes().items() if own.search(cmd)}
    mine -= {os.getpid()}
    for pid in mine | {d for p in mine for d in _descendants(p)}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# The driver of the two-node test, run in a fresh interpreter. In this process an earlier local
# `ray.init()` has switched Ray to token authentication for good (Ray sets RAY_AUTH_MODE=token in
# os.environ and caches it in its C++ config; a later RAY_AUTH_MODE=disabled is not re-read): a
# driver here would demand tokens that the throwaway cluster's GCS does not send, the GCS would
# fail to reach the actors' owner and cancel them ("Failed to register actor ... SchedulingCancelled",
# ActorDiedError "cancelled before it started running"). A fresh process sees only the environment
# it is given, and no Ray state of the other tests.
MULTINODE_DRIVER = r"""
import json, os, signal, sys, threading, time
import ray
from pal_bench.train import make_config, make_trainer
from pal_bench.train.recorder import RunRecorder

address, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
# wait until both nodes are alive with their resources, so that the placement sees 4 CPUs on 2 nodes
ray.init(address=address, logging_level="warning")
deadline, seen = time.monotonic() + 120, None
while time.monotonic() < deadline:
    alive = [n for n in ray.nodes() if n["Alive"]]
    seen = {k for n in alive for k in n["Resources"]}
    if len(alive) == 2 and {"node_a", "node_b"} <= seen and ray.cluster_resources().get("CPU") == 4:
        break
    time.sleep(0.5)
else:
    sys.exit(f"the two nodes never showed up: {ray.nodes()}")
ray.shutdown()
placement = (dict(ray_placement="spread") if mode == "spread" else
             dict(ray_placement="node", ray_remote_actors=True, learning_starts=500, batch_size=32))
steps = 6_000 if mode == "node-remote-kill-inserter" else 3_000
cfg = make_config("dqn", "CartPole-v1", backend="ray", hidden=(64, 64), eval_interval=0, eval_episodes=2,
                  progress=False, out_dir=out_dir, actors=2, learners=1, steps=steps, ray_address=address,
                  **placement)


def kill_when(tr, steps, target):
    # SIGKILL a remote actor's process (same machine, other Ray node) or the inserter once the run has `steps`
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if target == "inserter" and tr._inserter is not None:
            pid = ray.get(tr._inserter.pid.remote()) if tr.rate.steps >= steps else None
        else:
            pid = tr.placement.get(target, {}).get("pid") if tr.rate.steps >= steps else None
        if pid:
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.05)
    sys.exit(f"{target} never reached {steps} steps")


error = None
with make_trainer(cfg) as tr:
    killer = None
    if mode.startswith("node-remote-kill"):
        target = "inserter" if mode == "node-remote-kill-inserter" else "actor1"
        killer = threading.Thread(target=kill_when, args=(tr, 1_200, target), daemon=True)
        killer.start()
    try:
        s = tr.run()
    except Exception as e:
        error, s = f"{type(e).__name__}: {e}", tr.summary()
    if killer is not None:
        killer.join(10)
    # (RayNodeTrainer is still connected here; RayTrainer disconnected at the end of run)
    driver_node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
connected_after_run = ray.is_initialized()     # the driver must disconnect ...
ray.init(address=address, logging_level="warning")   # ... and leave the cluster running
alive_after = len([n for n in ray.nodes() if n["Alive"]])
ray.shutdown()
ckpt = RunRecorder(cfg.run_dir(), "").checkpoint_files()[0]
print("RESULT " + json.dumps({"env_steps": s["env_steps"], "placement": s["placement"], "updates": s["updates"],
                              "inserter": s.get("inserter"), "driver_node": driver_node, "error": error,
                              "restarts": s.get("restarts"), "transitions_lost": s.get("transitions_lost"),
                              "checkpoint": ckpt.exists(), "connected_after_run": connected_after_run,
                              "alive_after": alive_after}))
"""


def _run_on_two_nodes(tmp_path, mode: str) -> dict:
    """Start two Ray nodes on this machine (2 CPUs each), run ``MULTINODE_DRIVER`` in ``mode`` against them from a
    fresh interpreter, stop the nodes; returns the driver's RESULT."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # a throwaway cluster on this machine: no token authentication between its nodes and the driver
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env["RAY_AUTH_MODE"] = "disabled"
    start = [RAY_BIN, "start", "--num-cpus", "2", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    try:
        for args in (["--head", "--port", str(port), "--include-dashboard", "false", "--ray-client-server-port",
                      str(_free_port()), "--resources", '{"node_a": 1}'],
                     ["--address", address, "--resources", '{"node_b": 1}']):
            r = subprocess.run(start + args + ["--dashboard-agent-listen-port", str(_free_port())], env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"ray start {args[0]} failed:\n{r.stdout}\n{r.stderr}"
        r = subprocess.run([sys.executable, "-c", MULTINODE_DRIVER, address, str(tmp_path), mode], env=env,
                           cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300)
        result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
        assert r.returncode == 0 and result, f"driver failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        return json.loads(result[0][len("RESULT "):])
    finally:
        _kill_cluster(port)


@pytest.mark.ray_multinode
def test_two_ray_nodes_spread_placement(tmp_path):
    s = _run_on_two_nodes(tmp_path, "spread")
    assert s["env_steps"] == 3_000
    nodes = {w: p["node_id"] for w, p in s["placement"].items() if "node_id" in p}
    assert len(set(nodes.values())) == 2, nodes
    assert not s["connected_after_run"]
    assert s["alive_after"] == 2


@pytest.mark.ray_multinode
def test_two_ray_nodes_remote_actors_insert_through_the_inserter(tmp_path):
    """``ray_placement = "node"`` with ``ray_remote_actors``: the buffer, the learner and the inserter on the
    driver's node, both actors on the other node; every transition crosses the object store to the inserter,
    which writes it into the segment; the run ends with its budget and its updates."""
    s = _run_on_two_nodes(tmp_path, "node-remote")
    assert s["error"] is None and s["env_steps"] == 3_000
    actor_nodes = {p["node_id"] for w, p in s["placement"].items() if w.startswith("actor")}
    assert actor_nodes and s["driver_node"] not in actor_nodes
    assert s["inserter"]["rows"] >= 3_000 - 2 * 3      # every actor's rows but its last n-step windows
    # the rate rule held across the nodes: the updates the inserted steps allow, no more
    assert 0.95 * (3_000 - 500) * 0.25 <= s["updates"] <= (3_000 - 500) * 0.25 + 1
    assert not s["connected_after_run"] and s["alive_after"] == 2


@pytest.mark.ray_multinode
def test_two_ray_nodes_remote_actor_killed_is_restarted_with_its_loss_recorded(tmp_path):
    """A remote actor's process SIGKILLed mid-run (1,200 env steps in): Ray reports it dead, the driver gives back
    what it had reserved and not inserted (its loss, recorded), restarts it on the other node against the same
    inserter, and the run ends with its whole budget."""
    s = _run_on_two_nodes(tmp_path, "node-remote-kill")
    assert s["error"] is None and s["env_steps"] == 3_000
    assert [r["worker"] for r in s["restarts"]] == ["actor1"]
    assert 0 <= s["transitions_lost"] <= 2 * 256       # at most the chunk it was filling and the one in flight
    assert s["placement"]["actor1"]["node_id"] != s["driver_node"]
    assert s["inserter"]["rows"] >= 3_000 - 3 * 3 - s["transitions_lost"]
    assert s["alive_after"] == 2


@pytest.mark.ray_multinode
def test_two_ray_nodes_inserter_killed_ends_the_run_with_a_checkpoint(tmp_path):
    """The inserter (remote actors' only contact on the learner's node) SIGKILLed mid-run: the remote actors'
    calls fail, and the restart finds no inserter, so the run ends with one line (``InserterLost``) after a final
    checkpoint of the sound state on the learner's node; the cluster is left running."""
    s = _run_on_two_nodes(tmp_path, "node-remote-kill-inserter")
    assert s["error"] is not None and s["error"].startswith("InserterLost: the inserter on the driver's node")
    assert "\n" not in s["error"] and "final checkpoint" in s["error"]
    assert 1_200 <= s["env_steps"] < 6_000 and s["checkpoint"]
    assert not s["connected_after_run"] and s["alive_after"] == 2
