"""Where should replay live when the learner is far away?

For each link and each topology (``learner-replay``, ``buffer-replay``; see ``nodes``) one DQN run:
edge actors (the Ray backend's ``ActorWorker``) paced to ``actor_rate`` env steps/s in total feed
the buffer node; the learner sits behind the modelled link (``link``). A run lasts until the actors
have collected ``steps`` transitions (so ``steps / actor_rate`` seconds for every topology and
link); the learner trains as fast as its data allows meanwhile.

Measured per run: training loss over wall time, the average priority (|TD| under the learner's
weights on arrival) of the experiences that crossed the link, bytes and messages each way, the
learner's idle time (waiting for data), and the greedy evaluation return (weights as the edge has
them) against wall time. ``results/longhaul.csv`` (one row per run), ``results/longhaul_timeline.csv``
(binned curves) and ``results/figures/longhaul.png``, ``results/figures/longhaul_traffic.png``.

``pal-bench longhaul --quick``: CartPole-v1, 8k steps at 500 steps/s, links fibre-10km and wan
(about 2 minutes). Full profile (no ``--quick``): LunarLander-v3, 300k steps at 2000 steps/s with 2
actors, links fibre-10km, wan and wan with a 1 MB/s byte budget (150 s per run, about 15 minutes).
``--ray-address`` runs it on a cluster (then place the buffer node and the learner on different
nodes and use ``--links none`` to measure the real link instead of the model).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pal_bench.argtypes import choice_list, nonneg_float, number, positive_int, rng_seed, workers
from pal_bench.bench.publishing import store
from pal_bench.conditions import Conditions, add_force_flag, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.studies.longhaul import TOPOLOGIES
from pal_bench.studies.longhaul.link import PRESETS, TO_BUFFER, TO_LEARNER, LinkSpec, merge_stats, spec_from
from pal_bench.studies.longhaul.nodes import BufferNode, CloudLearner, Evaluator
from pal_bench.studies.longhaul.publish import draw
from pal_bench.train.backends.ray.session import session
from pal_bench.train.config import FIELD_RANGES

PROGRESS_S = 2.0
PROFILES = {
    "quick": dict(env="CartPole-v1", steps=8_000, actor_rate=500.0, actors=1, links=("fibre-10km", "wan"),
                  eval_interval_s=4.0, eval_episodes=3),
    "full": dict(env="LunarLander-v3", steps=300_000, actor_rate=2000.0, actors=2,
                 links=("fibre-10km", "wan", "wan-1MBps"), eval_interval_s=30.0, eval_episodes=5),
}


def make_cfg(env: str, steps: int, seed: int = 0, **overrides):
    """The DQN config of a run (the algorithm's defaults for ``env``; chunks of 64 transitions)."""
    from pal_bench.train import make_config

    kw = dict(steps=steps, seed=seed, backend="ray", progress=False, ray_chunk=64, eval_episodes=0) | overrides
    return make_config("dqn", env, **kw)


def run_one(cfg, topology: str, link: str | LinkSpec, actors: int, actor_rate: float,
            eval_interval_s: float, eval_episodes: int, progress: Callable[[int], None] | None = None) -> dict:
    """One run in the current Ray session; returns the raw results of every part (times: ``time.time()``).
    ``progress`` is called with the env steps handed out so far, every ``PROGRESS_S`` while the actors run."""
    import ray

    from pal_bench.train.backends.ray.workers import ActorWorker

    spec = spec_from(link)
    remote = ray.remote(num_cpus=0)
    node = remote(BufferNode).remote(cfg, topology, spec, actor_rate)
    learner = remote(CloudLearner).options(max_concurrency=64).remote(cfg, topology, spec)
    evaluator = remote(Evaluator).options(max_concurrency=2).remote(cfg, node, eval_interval_s, eval_episodes)
    workers = [remote(ActorWorker).remote(cfg, i, node, node) for i in range(actors)]
    handles = [node, learner, evaluator, *workers]
    try:
        ray.get(learner.connect.remote(node))
        ray.get(node.start.remote(learner))
        ray.get([learner.prepare.remote()] + [w.info.remote() for w in workers])   # all up before the clock
        t0 = time.time()
        learner_ref, eval_ref = learner.run.remote(), evaluator.run.remote()
        actor_refs = [w.run.remote() for w in workers]
        running = list(actor_refs)
        while running:
            _, running = ray.wait(running, num_returns=len(running), timeout=PROGRESS_S)
            if progress is not None:
                progress(ray.get(node.steps.remote()))
        actor_res = ray.get(actor_refs)      # an actor's error surfaces here
        ray.get(node.stop.remote())
        ray.get(learner.stop.remote())
        learner_res = ray.get(learner_ref)
        ray.get(evaluator.stop.remote())
        eval_res = ray.get(eval_ref)
        node_res = ray.get(node.stats.remote())
    finally:
        for h in handles:
            ray.kill(h)
    return {"topology": topology, "link": link if isinstance(link, str) else "custom", "t0": t0,
            "wall_s": time.time() - t0, "learner": learner_res, "node": node_res, "eval": eval_res,
            "actors": actor_res, "env": cfg.env}


def summarize(res: dict) -> tuple[dict, list[dict]]:
    """(summary row, timeline rows) of one ``run_one`` result."""
    lr, nd, t0 = res["learner"], res["node"], res["t0"]
    log = lr["log"]
    traffic = merge_stats(lr["link"], nd["link"])
    loss = np.asarray(log["loss"])
    if res["topology"] == "buffer-replay":
        pri, weights, pri_t = np.asarray(log["priority"]), None, np.asarray(log["t"])
    else:
        pri, weights, pri_t = (np.asarray(lr["arrivals"]["priority"]), np.asarray(lr["arrivals"]["n"]),
                               np.asarray(lr["arrivals"]["t"]))
    tail = loss[-max(1, len(loss) // 5):] if len(loss) else loss
    wall = res["wall_s"]
    row = {"topology": res["topology"], "link": res["link"], "env": res["env"], "wall_s": wall,
           "env_steps": nd["inserted"], "updates": lr["updates"], "updates_per_s": lr["updates"] / wall,
           "loss_mean": float(loss.mean()) if len(loss) else np.nan,
           "loss_final": float(tail.mean()) if len(tail) else np.nan,
           "crossed_priority": float(np.average(pri, weights=weights)) if len(pri) else np.nan,
           "bytes_to_learner": traffic[TO_LEARNER]["bytes"], "bytes_to_buffer": traffic[TO_BUFFER]["bytes"],
           "messages_to_learner": traffic[TO_LEARNER]["messages"],
           "messages_to_buffer": traffic[TO_BUFFER]["messages"],
           "learner_idle_s": lr["idle_s"], "learner_idle_frac": lr["idle_s"] / max(lr["wall_s"], 1e-9),
           "transitions_forwarded": nd["forwarded"], "transitions_dropped": nd["dropped"],
           "backlog_left": nd["backlog_left"],
           "final_eval_return": res["eval"][-1][2] if res["eval"] else np.nan,
           "late_packets": lr["rx"]["late"] + nd["rx"]["late"]}
    key = {"topology": res["topology"], "link": res["link"]}
    rows = []
    edges = np.linspace(0, wall, 41)
    for metric, t, v, w in (("loss", np.asarray(log["t"]), loss, None), ("crossed_priority", pri_t, pri, weights)):
        if not len(v):
            continue
        b = np.digitize(t - t0, edges)
        for i in np.unique(b):
            m = b == i
            rows.append(key | {"t_s": float(edges[min(i, len(edges) - 1)]), "metric": metric,
                               "value": float(np.average(v[m], weights=None if w is None else w[m]))})
    rows += [key | {"t_s": t - t0, "metric": "eval_return", "value": r} for t, _, r in res["eval"]]
    rows += [key | {"t_s": t - t0, "metric": "train_return", "value": r} for t, r in nd["episodes"]]
    return row, rows


def compare(summary) -> str:
    """The paper's terms: buffer-replay's final loss and crossed priority relative to learner-replay's."""
    lines = []
    for link, d in summary.groupby("link", sort=False):
        by = d.set_index("topology")
        if set(TOPOLOGIES) <= set(by.index):
            b, lr = by.loc["buffer-replay"], by.loc["learner-replay"]
            lines.append(f"{link}: buffer-replay reaches {b.loss_final / lr.loss_final:.0%} of learner-replay's "
                         f"final training loss and {b.crossed_priority / lr.crossed_priority:.2f}x the average "
                         f"priority of transferred experiences ({b.updates} vs {lr.updates} updates, "
                         f"{b.bytes_to_learner / 1e6:.1f} vs {lr.bytes_to_learner / 1e6:.1f} MB to the learner)")
    return "\n".join(lines)


def _write(rows: list[dict], timeline: list[dict], out: Path):
    """``longhaul.csv`` and ``longhaul_timeline.csv`` in ``out``; returns both frames."""
    import pandas as pd

    summary, tl = pd.DataFrame(rows), pd.DataFrame(timeline)
    store(summary, out / "longhaul.csv", float_format="%.6g")
    store(tl, out / "longhaul_timeline.csv", float_format="%.6g")
    return summary, tl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench longhaul", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CartPole-v1, 8k steps, fibre-10km and wan (~2 min)")
    ap.add_argument("--env")
    ap.add_argument("--steps", type=positive_int)
    ap.add_argument("--actors", type=workers)
    ap.add_argument("--actor-rate", type=nonneg_float, help="env steps per second the edge produces, all actors")
    ap.add_argument("--links", type=choice_list(PRESETS), help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--topologies", type=choice_list(TOPOLOGIES), default=list(TOPOLOGIES),
                    help=f"comma-separated, of {', '.join(TOPOLOGIES)} (default: both)")
    ap.add_argument("--prefetch", type=number(FIELD_RANGES["ray_prefetch"]), default=1,
                    help="buffer-replay: batch requests in flight beyond the one in use (ray_prefetch)")
    ap.add_argument("--seed", type=rng_seed, default=0)
    ap.add_argument("--ray-address", help="join this Ray cluster (default: a local Ray of this machine's cores)")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="where the CSV and figure go (default: the project's results/)")
    add_force_flag(ap)
    args = ap.parse_args(argv)
    prof = dict(PROFILES["quick" if args.quick else "full"])
    for k in ("env", "steps", "actors", "actor_rate"):
        if getattr(args, k) is not None:
            prof[k] = getattr(args, k)
    links, topologies = args.links or list(prof["links"]), args.topologies
    cfg = make_cfg(prof["env"], prof["steps"], args.seed, ray_prefetch=args.prefetch)  # config errors first
    if refuse_if_busy("pal-bench longhaul", args.force):
        return 2
    measured = Conditions("long-haul replay")
    rows, timeline = [], []
    out = Path(args.out)
    with session(args.ray_address, log_to_driver=False):
        for link in links:
            for topo in topologies:
                res = run_one(cfg, topo, link, prof["actors"], prof["actor_rate"], prof["eval_interval_s"],
                              prof["eval_episodes"])
                row, tl = summarize(res)
                rows.append(row)
                timeline += tl
                print(f"[longhaul] {link:>10} {topo:>14}: {row['updates']} updates in {row['wall_s']:.1f} s, "
                      f"final loss {row['loss_final']:.4f}, crossed priority {row['crossed_priority']:.3f}, "
                      f"{row['bytes_to_learner'] / 1e6:.2f} MB to learner, {row['bytes_to_buffer'] / 1e6:.2f} MB "
                      f"back, learner idle {row['learner_idle_frac']:.0%}, eval {row['final_eval_return']:.1f}",
                      file=sys.stderr, flush=True)
                summary, curves = _write(rows, timeline, out)      # after every run: a long profile keeps its part
                measured.write(out / "longhaul.csv")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(compare(summary))
    for p in draw(summary, curves, out / "figures"):
        print(f"figure: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
