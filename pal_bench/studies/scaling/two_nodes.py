"""Ray across two nodes on this machine: the buffer, the learner and the inserter on one node, the actors on the
other, so that every transition crosses Ray's object store to the inserter; the same split on one node in the same
sitting; and the inserter's ceiling.

``python -m pal_bench.studies.scaling.two_nodes [--steps 20000] [--actors 1] [--repeats 3] [--out results]``
starts two Ray nodes here (``ray start --head`` and ``ray start --address``, ``--num-cpus 1`` each, resources
``node_a`` / ``node_b``), runs every measurement from a fresh interpreter (a process that once started a local Ray
cannot join a cluster without token authentication: see tests/test_ray_backend.py), rounds alternating the
placements, and stops the nodes. It writes ``results/end_to_end_ray_two_nodes.csv``: one row per run with the
placement (``one node``: actor processes on the driver's node writing the segment; ``two nodes``: actors on the
other node through the inserter), env steps/s, updates/s, megabytes into the inserter per second and the
inserter's busy share; and one ``ceiling`` row per round: rows/s (and MB/s) the inserter takes when a task on the
other node does nothing but send chunks of ``ray_chunk`` rows (1 and 4 calls in flight).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from pal_bench.argtypes import duration
from pal_bench.bench.publishing import store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import ROOT

CSV = "end_to_end_ray_two_nodes.csv"

DRIVER = r"""
import json, sys, time
import ray
from pal_bench.train import make_config, make_trainer

address, mode, out_dir, actors, steps, seconds = sys.argv[1:7]
actors, steps, seconds = int(actors), int(steps), float(seconds)
ray.init(address=address, logging_level="warning")
deadline = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2 or ray.cluster_resources().get("CPU") != 2:
    if time.monotonic() > deadline:
        sys.exit(f"the two nodes never showed up: {ray.nodes()}")
    time.sleep(0.5)
ray.shutdown()
kw = dict(backend="ray", ray_placement="node", ray_address=address, progress=False, out_dir=out_dir,
          eval_interval=0, eval_episodes=0, actors=actors, learners=1, steps=steps)
if mode == "ceiling":
    from pal_bench.studies.scaling.measure import transitions
    cfg = make_config("dqn", "CartPole-v1", ray_remote_actors=True, **kw)
    with make_trainer(cfg, overwrite=True) as tr:
        inserter = tr.inserter()
        chunk = cfg.ray_chunk
        batch = transitions(tr, chunk)
        nbytes = sum(v.nbytes for v in batch.values())

        @ray.remote(num_cpus=0, resources={"node_b": 0.01})
        def hammer(inserter, batch, seconds, inflight):
            refs, sent, t0 = [], 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                refs.append(inserter.add_batch.remote(0, batch, 0, [], 0))
                if len(refs) >= inflight:
                    ray.get(refs.pop(0))
                    sent += 1
            ray.get(refs)
            return sent + len(refs), time.perf_counter() - t0

        out = {}
        for inflight in (1, 4):
            calls, wall = ray.get(hammer.remote(inserter, batch, seconds, inflight))
            out[inflight] = {"rows_per_s": calls * chunk / wall, "mb_per_s": calls * nbytes / wall / 1e6}
    print("RESULT " + json.dumps(out))
else:
    cfg = make_config("dqn", "CartPole-v1", ray_remote_actors=mode == "two nodes", learning_starts=1000, **kw)
    with make_trainer(cfg, overwrite=True) as tr:
        s = tr.run()
    print("RESULT " + json.dumps({k: s.get(k) for k in ("env_steps", "updates", "wall_s", "inserter")}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env["RAY_AUTH_MODE"] = "disabled"      # a throwaway cluster on this machine
    return env


@contextlib.contextmanager
def local_cluster() -> Iterator[str]:
    """Two Ray nodes on this machine (1 CPU each, resources ``node_a`` / ``node_b``); yields the head's address and
    stops exactly those nodes at the end (every process naming the head's port; ``ray stop`` would stop every Ray
    on the machine)."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    ray_bin = str(Path(sys.executable).with_name("ray"))
    start = [ray_bin, "start", "--num-cpus", "1", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    try:
        for args in (["--head", "--port", str(port), "--include-dashboard", "false", "--ray-client-server-port",
                      str(_free_port()), "--resources", '{"node_a": 1}'],
                     ["--address", address, "--resources", '{"node_b": 1}']):
            done = subprocess.run(start + args + ["--dashboard-agent-listen-port", str(_free_port())],
                                  env=_ray_env(), capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"ray start {args[0]} failed:\n{done.stdout}\n{done.stderr}")
        yield address
    finally:
        _stop_cluster(port)


def _stop_cluster(port: int) -> None:
    """SIGKILL every process whose command line names the head's port, and their descendants (the nodes' agents
    are renamed ``ray::...`` and outlive their raylet otherwise)."""
    own = re.compile(rf"(:|port=){port}(?!\d)")
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        procs[int(d)] = (ppid, cmd)
    doomed = {pid for pid, (_, cmd) in procs.items() if own.search(cmd)}
    todo = list(doomed)
    while todo:
        parent = todo.pop()
        kids = [pid for pid, (ppid, _) in procs.items() if ppid == parent and pid not in doomed]
        doomed.update(kids)
        todo += kids
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _drive(address: str, mode: str, out_dir: str, actors: int, steps: int, seconds: float = 0.0) -> dict:
    done = subprocess.run([sys.executable, "-c", DRIVER, address, mode, out_dir, str(actors), str(steps),
                           str(seconds)], env=_ray_env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not result:
        raise RuntimeError(f"{mode} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(result[0][len("RESULT "):])


def measure(steps: int, actors: int, repeats: int, ceiling_s: float, out_dir: str, progress=print) -> pd.DataFrame:
    """``repeats`` rounds, each: one run per placement (alternating which goes first) and the inserter's ceiling."""
    rows = []
    with local_cluster() as address:
        for r in range(repeats):
            order = ("one node", "two nodes") if r % 2 == 0 else ("two nodes", "one node")
            for placement in order:
                s = _drive(address, placement, out_dir, actors, steps)
                ins = s.get("inserter") or {}
                secs = ins.get("seconds", {})
                row = {"round": r + 1, "placement": placement, "actors": actors, "learners": 1,
                       "env_steps_per_s": s["env_steps"] / s["wall_s"], "updates_per_s": s["updates"] / s["wall_s"],
                       "mb_in_per_s": ins.get("bytes", 0) / s["wall_s"] / 1e6 if ins else 0.0,
                       "inserter_busy": secs.get("insert", 0.0) / s["wall_s"] if ins else float("nan")}
                rows.append(row)
                progress(f"[round {r + 1}/{repeats}] {placement}: {row['env_steps_per_s']:.0f} env steps/s, "
                         f"{row['updates_per_s']:.0f} updates/s, {row['mb_in_per_s']:.2f} MB/s into the inserter")
            c = _drive(address, "ceiling", out_dir, 1, 1_000, ceiling_s)
            for inflight, v in c.items():
                rows.append({"round": r + 1, "placement": f"ceiling, {inflight} in flight", "actors": 1,
                             "learners": 0, "rows_per_s": v["rows_per_s"], "mb_in_per_s": v["mb_per_s"]})
                progress(f"[round {r + 1}/{repeats}] inserter ceiling, {inflight} in flight: "
                         f"{v['rows_per_s']:.0f} rows/s ({v['mb_per_s']:.1f} MB/s)")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.scaling.two_nodes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    ap.add_argument("--actors", type=int, default=1, help="actors (on the second node in the two-node runs)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each: both placements and the ceiling)")
    ap.add_argument("--ceiling-s", type=duration, default=5.0, help="seconds of each inserter ceiling measurement")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    add_force_flag(ap)
    args = ap.parse_args(argv)
    if refuse_if_busy("pal_bench.studies.scaling.two_nodes", args.force):
        return 2
    measured = Conditions("two_nodes")
    with tempfile.TemporaryDirectory(prefix="pal-two-nodes-") as tmp:
        df = measure(args.steps, args.actors, args.repeats, args.ceiling_s, tmp,
                     progress=lambda m: print(m, file=sys.stderr, flush=True))
    path = store(df, args.out / CSV, measured)
    print(df.to_string(index=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
