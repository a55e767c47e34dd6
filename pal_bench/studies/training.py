"""The trainer's reference runs: ``python -m pal_bench.studies.training [--only NAME ...]`` (``make train-results``).

Each preset is one ``pal-bench train`` run (printed as its command line) writing into
``results/runs/<name>/``; afterwards ``results/training.md`` and ``results/training.csv`` summarise
every run found there (final and best evaluation return, env steps/s, updates/s, wall time), read
from the runs' own ``summary.json`` files, never re-measured. Each run is its own ``pal-bench train`` process.
docs/trainer.md's blocks: the reference runs (``training``) and the learning tests' seed sweeps
(``learning-sweeps``, written by ``tests/learning_runs.py``).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

from pal_bench.bench.publishing import Markup, Publication, md, missing, source
from pal_bench.conditions import Conditions, add_force_flag, atomic_write_text, refuse_if_busy
from pal_bench.paths import RESULTS
from pal_bench.stored_tables import read_csv, read_json

RUNS = RESULTS / "runs"

# name -> (algo, env, extra `pal-bench train` arguments); targets from the issue: LunarLander-v3
# solved at 200, Pendulum-v1 at -250
PRESETS: dict[str, tuple[str, str, list[str]]] = {}
for _algo in ("ddpg", "td3", "sac"):
    for _a, _l in ((1, 1), (2, 2)):
        PRESETS[f"{_algo}-pendulum-a{_a}l{_l}"] = (_algo, "Pendulum-v1", ["--actors", str(_a), "--learners", str(_l),
                                                                           "--steps", "15000"])
for _algo in ("dqn", "ddqn"):
    for _a, _l in ((1, 1), (2, 2)):
        PRESETS[f"{_algo}-lunarlander-a{_a}l{_l}"] = (_algo, "LunarLander-v3",
                                                       ["--actors", str(_a), "--learners", str(_l)])
# continuous LunarLander (the algorithms' LunarLander-v3 defaults set env_kwargs continuous=true)
for _a, _l in ((1, 1), (2, 2)):
    PRESETS[f"td3-lunarlander-continuous-a{_a}l{_l}"] = ("td3", "LunarLander-v3",
                                                          ["--actors", str(_a), "--learners", str(_l)])
# sync aggregation averages the two learners' gradients into one optimizer step, so 2/2 sync takes
# half the optimizer steps of 1/1 at the same updates_per_step; async applies every gradient
PRESETS["td3-lunarlander-continuous-a2l2-async"] = ("td3", "LunarLander-v3",
                                                    ["--actors", "2", "--learners", "2", "--aggregation", "async"])
PRESETS["td3-lunarlander-continuous-a2l2-async-seed1"] = ("td3", "LunarLander-v3",
                                                          ["--actors", "2", "--learners", "2", "--aggregation",
                                                           "async", "--seed", "1"])
# Ape-X (the apex preset) on the process backend at the core split the DSE picks from the stored process curves
PRESETS["apex-lunarlander-processes"] = ("ddqn", "LunarLander-v3", ["--preset", "apex", "--backend", "processes",
                                                                     "--set", "split=dse"])
# R2D2 against feed-forward Double DQN on the partially observable CartPole (velocities hidden), same budget
NO_VEL_STEPS = 60_000
for _algo in ("r2d2", "ddqn"):
    for _seed in range(3):
        PRESETS[f"{_algo}-cartpole-novel-s{_seed}"] = (_algo, "pal_bench/CartPoleNoVel-v0",
                                                       ["--steps", str(NO_VEL_STEPS), "--set", f"seed={_seed}"])
TARGETS = {"Pendulum-v1": -250.0, "LunarLander-v3": 200.0, "pal_bench/CartPoleNoVel-v0": 400.0}


def command(name: str) -> list[str]:
    algo, env, extra = PRESETS[name]
    if "split=dse" in extra:            # the split the DSE picks for this backend from its stored curves
        from pal_bench.studies.dse import split_from_curves
        from pal_bench.train import make_config

        backend = extra[extra.index("--backend") + 1]
        preset = extra[extra.index("--preset") + 1] if "--preset" in extra else None
        ratio = make_config(algo, env, preset=preset, backend=backend).updates_per_step
        actors, learners = split_from_curves(ratio, backend)
        extra = [x for x in extra if x not in ("--set", "split=dse")] + ["--actors", str(actors)]
        if "apex" not in extra:
            extra += ["--learners", str(learners)]
    return ["pal-bench", "train", "--algo", algo, "--env", env, *extra, "--name", name,
            "--set", "deterministic=false", "--set", "progress=false"]


def summarise(runs: Path = RUNS) -> pd.DataFrame:
    rows = []
    for f in sorted(runs.glob("*/summary.json")):
        s = read_json(f)
        evals = [e["mean_return"] for e in s.get("eval", [])]
        target = TARGETS.get(s["env"])
        best = max(evals) if evals else None
        rows.append({
            "run": f.parent.name, "algo": s["algo"], "env": s["env"], "actors": s["actors"], "learners": s["learners"],
            "env_steps": s["env_steps"], "updates": s["updates"], "wall_s": s["wall_s"],
            "env_steps_per_s": s["env_steps_per_s"], "updates_per_s": s["updates_per_s"],
            "final_eval_return": s.get("final_eval_return"), "best_eval_return": best, "target": target,
            "reached": None if target is None or best is None else bool(best >= target),
        })
    return pd.DataFrame(rows)


def write_tables(df: pd.DataFrame, out: Path = RESULTS) -> str:
    atomic_write_text(out / "training.csv", df.to_csv(index=False))
    cmds = "\n".join(f"    {shlex.join(command(r))}" for r in df.run if r in PRESETS)
    text = ("Evaluation return (mean of `eval_episodes` greedy episodes) of the trainer's reference runs, "
            "from `results/runs/<run>/summary.json`; made by `python -m pal_bench.studies.training`:\n\n" + cmds
            + "\n\n" + df.drop(columns=["target"]).to_markdown(index=False, floatfmt=".1f") + "\n")
    atomic_write_text(out / "training.md", text)
    return text


def training_block(results: Path) -> str:
    path = results / "training.csv"
    if not path.exists():
        return missing("training.csv", "make train-results")
    df = read_csv(path)
    t = pd.DataFrame({
        "run": df.run, "algorithm": df.algo, "env": df.env, "actors / learners": df.actors.astype(str) + " / "
        + df.learners.astype(str), "env steps": df.env_steps, "updates": df.updates,
        "final eval return": df.final_eval_return, "best eval return": df.best_eval_return,
        "target": df.target.map(lambda v: f">= {v:g}"),
        "reached": df.reached.map({True: "yes", False: Markup("**no**")}),
    })
    return ("Evaluation return (mean of the run's greedy evaluation episodes) of the reference runs; each run's "
            "command is in `results/training.md`, its curve in `results/runs/<run>/learning_curve.png`.\n\n"
            + md(t) + "\n\n" + source(results, "training.csv") + "\n")


def learning_sweeps_block(results: Path) -> str:
    path = results / "learning_sweeps.csv"
    if not path.exists():
        return missing("learning_sweeps.csv", "python tests/learning_runs.py RUN --seeds 0-9")
    df = read_csv(path)
    rows = []
    for run, g in df.groupby("run", sort=False):
        row = {"run": run, "seeds": len(g), "best: min": g.best.min(), "best: median": g.best.median(),
               "best: max": g.best.max()}
        if "final" in g and g.final.notna().any():
            row |= {"final: min": g.final.min(), "final: median": g.final.median()}
        row |= {"CPU": ", ".join(sorted(set(g.cpu.astype(str)))), "noisy seeds": int(g.noisy.sum()),
                "dates": f"{str(g.date.min())[:10]}"}
        rows.append(row)
    return ("Seed sweeps of the learning tests (`python tests/learning_runs.py RUN --seeds ...`): the asserted "
            "quantity over seeds; each test's threshold sits below the minimum with a margin (its docstring says "
            "which).\n\n" + md(pd.DataFrame(rows)) + "\n\nSource: `results/learning_sweeps.csv` (one row per seed, "
            "with load before/after, CPU and commit).\n")


PUBLICATION = Publication("training", {"training": training_block, "learning-sweeps": learning_sweeps_block})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(PRESETS), help="presets to run (default: all)")
    ap.add_argument("--rebuild", action="store_true", help="only rebuild the tables from stored runs")
    add_force_flag(ap)
    args = ap.parse_args(argv)
    measured = None
    if not args.rebuild:
        if refuse_if_busy("pal_bench.studies.training", args.force):
            return 2
        measured = Conditions("trainer reference runs")
        for name in args.only or PRESETS:
            print("$", shlex.join(command(name)), flush=True)
            # a reference run is made again on purpose: it replaces the stored one
            rc = subprocess.call([sys.executable, "-m", "pal_bench.cli", *command(name)[1:], "--out-dir", str(RUNS),
                                  "--overwrite"])
            if rc:
                return rc
    print(write_tables(summarise()))
    if measured is not None:
        measured.write(RESULTS / "training.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
