"""Design-space exploration: how many cores go to actors and how many to learners.

The PAL paper's allocation problem. Given the data-collection throughput f_a(x) (transitions/s
with x actor cores) and the data-consumption throughput f_l(x) (learner updates/s with x learner
cores), and the configured ratio r of updates per collected transition, a split (x_a, x_l) with
x_a + x_l <= M trains at

    T(x_a, x_l) = min(f_a(x_a), f_l(x_l) / r)   transitions/s   (and r * T updates/s),

because rate control holds the ratio by slowing whichever side is ahead. ``solve`` searches all
O(M^2) pairs exhaustively and returns the split with the highest T (ties: fewer cores, then more
balanced f_l / (r f_a)), the full table, and the frontier (the best split for each core budget).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Allocation:
    actors: int
    learners: int
    transitions_per_s: float
    updates_per_s: float
    bottleneck: str          # "actors" or "learners" (the side that sets the pace)

    def command(self, algo: str, env: str, ratio: float) -> str:
        return (f"pal-bench train --algo {algo} --env {env} --actors {self.actors} --learners {self.learners} "
                f"--set updates_per_step={ratio:g}")


def _curve(f: Mapping[int, float] | list[float], name: str) -> dict[int, float]:
    curve = dict(enumerate(f, start=1)) if isinstance(f, (list, tuple)) else dict(f)
    if not curve:
        raise ValueError(f"{name} is empty")
    for x, v in curve.items():
        if int(x) != x or x < 1:
            raise ValueError(f"{name}: core counts must be integers >= 1, got {x!r}")
        if not v >= 0:
            raise ValueError(f"{name}({x}) = {v!r}: throughputs must be finite and >= 0")
    return {int(x): float(v) for x, v in curve.items()}


def table(f_a, f_l, ratio: float, max_cores: int) -> pd.DataFrame:
    """Every split (x_a, x_l) with x_a + x_l <= max_cores that both curves cover."""
    if not ratio > 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    if max_cores < 2:
        raise ValueError(f"max_cores must be >= 2 (one actor and one learner core), got {max_cores}")
    fa, fl = _curve(f_a, "f_a"), _curve(f_l, "f_l")
    rows = []
    for xa, va in fa.items():
        for xl, vl in fl.items():
            if xa + xl > max_cores:
                continue
            t = min(va, vl / ratio)
            rows.append({"actors": xa, "learners": xl, "cores": xa + xl, "f_a": va, "f_l": vl,
                         "transitions_per_s": t, "updates_per_s": ratio * t,
                         "balance": (vl / ratio) / va if va > 0 else float("inf"),
                         "bottleneck": "actors" if va <= vl / ratio else "learners"})
    if not rows:
        raise ValueError(f"no split with at most {max_cores} cores is covered by both curves")
    return pd.DataFrame(rows)


def solve(f_a, f_l, ratio: float, max_cores: int) -> tuple[Allocation, pd.DataFrame, pd.DataFrame]:
    """(best split, all splits, frontier: best split per total core count)."""
    t = table(f_a, f_l, ratio, max_cores)
    t["imbalance"] = (t.balance.clip(lower=1e-12).apply(lambda b: max(b, 1 / b)))
    ranked = t.sort_values(["transitions_per_s", "cores", "imbalance"], ascending=[False, True, True])
    best = ranked.iloc[0]
    frontier = (t.sort_values(["cores", "transitions_per_s", "imbalance"], ascending=[True, False, True])
                .groupby("cores", as_index=False).first())
    alloc = Allocation(int(best.actors), int(best.learners), float(best.transitions_per_s),
                       float(best.updates_per_s), str(best.bottleneck))
    return alloc, t.drop(columns="imbalance"), frontier.drop(columns="imbalance")


def validate(cfg, splits: list[tuple[int, int]], steps: int, progress=print, repeats: int = 1) -> pd.DataFrame:
    """Run the trainer (``cfg.backend``) at each (actors, learners) split for ``steps`` transitions (after
    ``learning_starts``) and measure its end-to-end throughput (transitions/s, updates/s): ``repeats``
    rounds, each running every split once, so that the splits share the machine's drift; per split the
    median over rounds, and every round's transitions/s in ``measured_transitions_per_s_reps``."""
    import dataclasses
    import statistics
    import tempfile

    from pal_bench.train import make_trainer

    got: dict[tuple[int, int], list[dict]] = {split: [] for split in splits}
    for r in range(repeats):
        for i, (xa, xl) in enumerate(splits, 1):
            where = f"[validate {i}/{len(splits)}" + (f" round {r + 1}/{repeats}]" if repeats > 1 else "]")
            progress(f"{where} {xa} actor(s) + {xl} learner(s) ...")
            with tempfile.TemporaryDirectory(prefix="pal-dse-") as out:
                c = dataclasses.replace(cfg, actors=xa, learners=xl, steps=cfg.learning_starts + steps,
                                        progress=False, eval_episodes=0, eval_interval=0, deterministic=False,
                                        out_dir=out)
                with make_trainer(c) as tr:
                    s = tr.run()
            got[(xa, xl)].append(s)
            progress(f"{where} {s['env_steps_per_s']:.0f} transitions/s, {s['updates_per_s']:.0f} updates/s")
    rows = []
    for (xa, xl), runs in got.items():
        rows.append({"actors": xa, "learners": xl,
                     "measured_transitions_per_s": statistics.median(s["env_steps_per_s"] for s in runs),
                     "measured_updates_per_s": statistics.median(s["updates_per_s"] for s in runs),
                     "wall_s": statistics.median(s["wall_s"] for s in runs),
                     "measured_transitions_per_s_reps": " ".join(f"{s['env_steps_per_s']:.1f}" for s in runs)})
    return pd.DataFrame(rows)


def validation_text(v: pd.DataFrame) -> str:
    """The validation table (``results/dse_validation.csv``): predicted and measured throughput per split,
    and whether the chosen split is the best measured (within 10%: the choice holds)."""
    top = v.measured_transitions_per_s.max()
    got = float(v[v.chosen].measured_transitions_per_s.iloc[0])
    chosen = v[v.chosen].iloc[0]
    verdict = "the best measured" if got >= top else f"at {got / top:.0%} of the best measured"
    holds = "holds" if got >= 0.9 * top else "does not hold"
    cols = ["actors", "learners", "transitions_per_s", "measured_transitions_per_s", "measured_updates_per_s",
            "chosen"]
    t = v[cols].rename(columns={"transitions_per_s": "predicted transitions/s",
                                "measured_transitions_per_s": "measured transitions/s",
                                "measured_updates_per_s": "measured updates/s"})
    t["chosen"] = t.chosen.map({True: "**chosen**", False: ""})
    rounds = len(str(v.get("measured_transitions_per_s_reps", pd.Series([""])).iloc[0]).split())
    runs = f"running the trainer at every split ({rounds} rounds, medians)" if rounds > 1 else \
        "running the trainer at every split"
    return (f"The solver chose {int(chosen.actors)} actor(s) + {int(chosen.learners)} learner(s) from the f_a / f_l "
            f"curves ({int(v.cores.max())} cores at most); {runs}, the chosen one is "
            f"{verdict}, so the choice {holds} (threshold: within 10% of the best).\n\n"
            + t.to_markdown(index=False, floatfmt=".0f") + "\n")


def draw(table: pd.DataFrame, frontier: pd.DataFrame, best: Allocation, path, measured: pd.DataFrame | None = None):
    """Predicted throughput of every split against its core count, the frontier, the chosen split
    (star) and, when given, the throughput measured at each split."""
    from pal_bench.bench.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.scatter(table.cores, table.transitions_per_s, s=12, color="gray", alpha=0.5, label="splits (predicted)")
    ax.plot(frontier.cores, frontier.transitions_per_s, color="#1f77b4", label="frontier (best per core budget)")
    ax.scatter([best.actors + best.learners], [best.transitions_per_s], marker="*", s=180, color="#d62728",
               zorder=5, label=f"chosen: {best.actors} actors + {best.learners} learners")
    if measured is not None and len(measured):
        ax.scatter(measured.actors + measured.learners, measured.measured_transitions_per_s, marker="x",
                   color="black", label="measured (trainer)")
    ax.set_xlabel("cores (actors + learners)")
    ax.set_ylabel("training throughput (transitions/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
