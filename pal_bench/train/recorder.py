"""What a run leaves in its directory, written the same way by every backend:

- ``config.yaml``: the run's config (at the start);
- ``eval.csv``: one row per greedy evaluation (rewritten after each, so a long run can be watched);
- ``events.csv``: restarts, timeouts and reloads of workers, with the transitions each one lost;
- ``episodes.csv``, ``summary.json`` and ``learning_curve.png``: at the end;
- ``checkpoint.pt``: counters, logs, RNG states and whatever the backend adds (weights, optimizers).

Every file is written through ``atomic_open``: a crash never leaves one half-written over a good one.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from pal_bench.atomic import atomic_open

EVAL_FIELDS = ["env_steps", "updates", "version", "wall_s", "mean_return", "std_return"]
EVENT_FIELDS = ["wall_s", "env_steps", "worker", "event", "transitions_lost", "detail"]
EPISODE_FIELDS = ["env_steps", "return", "length", "wall_s"]


class RunRecorder:
    """The logs of one run (episodes, evaluations, events) and the files they go to in ``run_dir``."""

    def __init__(self, run_dir: Path, run_name: str, quiet: bool = False):
        self.run_dir = run_dir
        self.run_name = run_name
        self.quiet = quiet                 # a progress bar shows evaluations: no line per evaluation
        self.episodes: list[tuple[int, float, int, float]] = []   # (env steps, return, length, wall s)
        self.evals: list[dict] = []
        self.events: list[dict] = []

    def _say(self, text: str) -> None:
        print(f"[{self.run_name}] {text}", file=sys.stderr, flush=True)

    def _write_csv(self, name: str, fieldnames: list[str], rows: list) -> None:
        """Rows are dicts keyed by ``fieldnames`` or tuples in their order."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.run_dir / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(fieldnames)
            w.writerows([r[k] for k in fieldnames] if isinstance(r, dict) else r for r in rows)

    def write_config(self, config: dict) -> None:
        import yaml

        self.run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.run_dir / "config.yaml", "w") as f:
            f.write(yaml.safe_dump(config, sort_keys=False))

    def evaluation(self, row: dict) -> None:
        """Record one evaluation (keys ``EVAL_FIELDS``) and rewrite eval.csv."""
        self.evals.append(row)
        self._write_csv("eval.csv", EVAL_FIELDS, self.evals)
        if not self.quiet:
            self._say(f"eval at {row['env_steps']} steps, {row['wall_s']:.0f} s: "
                      f"return {row['mean_return']:.1f} ± {row['std_return']:.1f}")

    def event(self, wall_s: float, env_steps: int, worker: str, event: str, lost: int, detail: str) -> None:
        """Record a worker event (a restart, a timeout, a reload) with the transitions it lost; rewrite events.csv."""
        self.events.append({"wall_s": round(wall_s, 3), "env_steps": env_steps, "worker": worker, "event": event,
                            "transitions_lost": lost, "detail": detail})
        self._say(f"{worker} {event}: {detail}")
        self._write_csv("events.csv", EVENT_FIELDS, self.events)

    def write_logs(self, summary: dict) -> None:
        """eval.csv, episodes.csv, events.csv (when there were events), summary.json and the learning curve."""
        self._write_csv("eval.csv", EVAL_FIELDS, self.evals)
        self._write_csv("episodes.csv", EPISODE_FIELDS, self.episodes)
        if self.events:
            self._write_csv("events.csv", EVENT_FIELDS, self.events)
        with atomic_open(self.run_dir / "summary.json", "w") as f:
            f.write(json.dumps(summary, indent=1))
        try:
            from pal_bench.train.plots import learning_curve

            learning_curve(self.run_dir)
        except ImportError:
            pass

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, state: dict) -> Path:
        """checkpoint.pt: ``state`` (the backend's weights and counters) plus the logs."""
        import torch

        path = self.run_dir / "checkpoint.pt"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as f:
            torch.save(state | {"episodes": self.episodes, "evals": self.evals, "events": self.events}, f)
        return path

    def load_checkpoint(self) -> dict:
        """The state saved by ``save_checkpoint``; the logs are restored into this recorder."""
        import torch

        path = self.run_dir / "checkpoint.pt"
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint to resume from at {path}")
        state = torch.load(path, weights_only=False)
        self.episodes[:] = [tuple(e) for e in state["episodes"]]
        self.evals[:] = state["evals"]
        self.events[:] = state.get("events", [])
        return state
