"""``pal-bench train --backend ray --topology learner-replay|buffer-replay``: one long-haul run
(``experiment.run_one``) behind the trainer interface (``run``, ``close``, context manager).

Edge actors (``cfg.actors``) feed the buffer node at ``cfg.actor_rate`` env steps/s (0: unpaced);
the learner is behind the ``cfg.link`` preset. Evaluations (greedy, ``cfg.eval_episodes`` episodes
with the weights the edge has) run every ``cfg.eval_interval / cfg.actor_rate`` seconds, or every
``EVAL_INTERVAL_S`` when unpaced. Written to the run directory: config.yaml, summary.json (the
``experiment.summarize`` row), timeline.csv (loss, crossed priority, returns vs wall time) and
eval.csv. No checkpoints: a long-haul run cannot be resumed.
"""

from __future__ import annotations

import csv
import json
import sys

from pal_bench.studies.longhaul import TOPOLOGIES
from pal_bench.train.config import ConfigError, TrainConfig, validate

EVAL_INTERVAL_S = 5.0


def check_config(cfg: TrainConfig) -> None:
    """What a long-haul topology needs of a config (ConfigError otherwise): a known link preset, the Ray
    backend, the DQN family and one learner behind the link."""
    from pal_bench.studies.longhaul.link import PRESETS

    if cfg.link not in PRESETS:
        raise ConfigError(f"link: unknown preset {cfg.link!r}; choose one of {', '.join(PRESETS)}")
    if cfg.backend != "ray":
        raise ConfigError(f"topology: {cfg.topology!r} runs on backend = 'ray'")
    if cfg.algo not in ("dqn", "ddqn"):
        raise ConfigError(f"topology: {cfg.topology!r} runs the DQN family (dqn, ddqn), not {cfg.algo!r}")
    if cfg.learners != 1:
        raise ConfigError(f"learners: topology {cfg.topology!r} has one learner behind the link, got {cfg.learners}")


def register() -> None:
    """Entry point (group ``pal_bench.topologies``): make both topologies known to ``pal_bench.train``."""
    from pal_bench.train.topology import Topology
    from pal_bench.train.topology import register as add

    for name in TOPOLOGIES:
        add(Topology(name, LonghaulTrainer, check_config))


class LonghaulTrainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False):
        validate(cfg)
        if cfg.topology == "local":
            raise ConfigError("topology: LonghaulTrainer runs 'learner-replay' or 'buffer-replay'")
        if resume:
            raise ConfigError(f"resume: topology {cfg.topology!r} runs keep no checkpoint")
        self.cfg, self.run_dir = cfg, cfg.run_dir()
        self._closed = False

    def __enter__(self) -> LonghaulTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True           # run_one kills its Ray actors itself, also on error

    def eval_interval_s(self) -> float:
        return self.cfg.eval_interval / self.cfg.actor_rate if self.cfg.actor_rate > 0 else EVAL_INTERVAL_S

    def run(self) -> dict:
        """The run; returns the trainer's summary keys (env_steps, updates, wall_s, ...) and the
        long-haul measurements (``experiment.summarize``)."""
        import pandas as pd
        import yaml

        from pal_bench.studies.longhaul.experiment import run_one, summarize
        from pal_bench.train.backends.ray.session import session

        if self._closed:
            raise RuntimeError("LonghaulTrainer: run() after close()")
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, unit="step", dynamic_ncols=True, file=sys.stderr,
                       desc=f"{cfg.run_name()} {cfg.topology} over {cfg.link}")

        def progress(steps: int) -> None:
            if bar is not None:
                bar.update(steps - bar.n)

        episodes = cfg.eval_episodes if cfg.eval_interval else 0
        try:
            with session(cfg.ray_address):
                res = run_one(cfg, cfg.topology, cfg.link, cfg.actors, cfg.actor_rate, self.eval_interval_s(),
                              episodes, progress)
        finally:
            if bar is not None:
                bar.close()
        row, timeline = summarize(res)
        pd.DataFrame(timeline).to_csv(self.run_dir / "timeline.csv", index=False, float_format="%.6g")
        evals = [{"wall_s": round(t - res["t0"], 3), "version": v, "mean_return": r} for t, v, r in res["eval"]]
        with open(self.run_dir / "eval.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["wall_s", "version", "mean_return"])
            w.writeheader()
            w.writerows(evals)
        returns = [r for _, r in res["node"]["episodes"]][-20:]
        summary = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} | {
            "algo": cfg.algo, "actors": cfg.actors, "learners": 1, "backend": "ray",
            "episodes": len(res["node"]["episodes"]),
            "env_steps_per_s": round(row["env_steps"] / max(row["wall_s"], 1e-9), 1),
            "mean_return_last20": sum(returns) / len(returns) if returns else None,
            "eval": evals, "run_dir": str(self.run_dir),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
        return summary
