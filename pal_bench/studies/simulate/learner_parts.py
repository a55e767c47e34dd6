"""Where the thread backend's learner rate goes with a second learner or the parameter server's thread (issue 50's
probe of the model's miss on f_l at two learner threads and on async splits; docs/simulation.md).

Measures, interleaved in each round (the order rotated round by round), on a buffer filled with real transitions and
no actors (the scaling study's f_l, ``Trainer.run_learners``), DQN on CartPole-v1:

- the trainer's learners: one learner with sync aggregation (it applies its own gradient, no other thread), one
  learner with async aggregation (the parameter server's thread applies each gradient and publishes a snapshot the
  learner loads), two learners sync (a round waits for both; the server's thread averages and applies), two async;
  per condition the updates/s, the CPU cores the process kept busy, every learner phase in µs per update (mean over
  the learners; the phase timers are wall time, so a phase includes its waits for the GIL) and the server's step
  (``aggregate``: average and optimizer step; ``publish``: the snapshot) in µs per server step;
- the plain update of ``gil_wake.learner_update`` (sample, losses and gradients, one optimizer step: no rate rule,
  no snapshot, no priorities) on one thread, and on two threads with their own networks.

``python -m pal_bench.studies.simulate.learner_parts [--updates N] [--seconds S] [--rounds N] [--out DIR] [--force]``
writes ``DIR/simulation_learner_parts.csv`` (one row per condition and round) with its ``.meta.json``; it measures
only on a quiet machine (``--force``: anyway, marked noisy). ``--model`` measures nothing: it sets the stored file's
trainer conditions against the model (``against_the_model``: the stored inputs fitted to each round's one-learner
rate) and prints each error and their median, worst and mean.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from pal_bench.argtypes import Range, number
from pal_bench.paths import RESULTS

FILE = "simulation_learner_parts.csv"
FILLED = 20_000                     # transitions in the buffer (the scaling study's f_l)
TRAINER_CONDITIONS = {"one learner, sync": (1, "sync"), "one learner, async": (1, "async"),
                      "two learners, sync": (2, "sync"), "two learners, async": (2, "async")}
PLAIN_CONDITIONS = ("plain update, one thread", "plain update, two threads")
PHASES = ("rate_wait", "weights_pull", "sample", "forward_backward", "priority_update", "apply", "aggregation_wait")


def trainer_learners(learners: int, aggregation: str, updates: int, filled: int = FILLED, cfg=None) -> dict:
    """The thread trainer's ``learners`` learner threads (``aggregation``) run to ``updates`` updates on a buffer of
    ``filled`` real transitions: updates/s (an update is one learner's gradient: two sync learners make one server
    step of two; an async gradient dropped as stale counts too, ``dropped_stale``), cores busy (process CPU / wall),
    each learner phase in µs per update (``<phase>_us``, mean over the learners) and the server's step in µs per
    server step (``server_steps``; a sole sync learner runs it in its own thread, inside its ``apply_us``)."""
    from pal_bench.studies.scaling.measure import quiet, transitions
    from pal_bench.train import Trainer, make_config

    cfg = cfg or make_config("dqn", "CartPole-v1")
    with tempfile.TemporaryDirectory(prefix="pal-learner-parts-") as out:
        c = quiet(cfg, out, actors=1, learners=learners, aggregation=aggregation,
                  buffer_capacity=max(cfg.buffer_capacity, filled))
        with Trainer(c) as tr:
            got = tr.run_learners(transitions(tr, filled), updates)
            phases = tr.summary()["phase_seconds"]
            server_steps, server, dropped = tr.ps.version, dict(tr.ps.times), tr.ps.dropped_stale
    n = got["updates"]
    row = {"updates": n, "updates_per_s": n / got["wall_s"], "cores": got["cpu_s"] / got["wall_s"],
           "server_steps": server_steps, "dropped_stale": dropped}
    for phase in PHASES:
        seconds = sum(p.get(phase, 0.0) for name, p in phases.items() if name.startswith("learner"))
        row[f"{phase}_us"] = seconds / n * 1e6 if n else float("nan")
    for part in ("aggregate", "publish"):
        row[f"server_{part}_us"] = server[f"{part}_s"] / server_steps * 1e6 if server_steps else float("nan")
    return row


def plain_update(threads: int, seconds: float, updates: list) -> dict:
    """``gil_wake.learner_update`` on one thread, or on two with their own networks (``updates``: one callable per
    thread), for ``seconds``: updates/s of all threads together (``gil_wake.one_condition``)."""
    from pal_bench.studies.simulate.gil_wake import one_condition

    got = one_condition(updates[0], seconds, busy=True, spin_others=False,
                        wake="learner" if threads == 2 else None, second_update=updates[1] if threads == 2 else None)
    second = got["second_learner_updates_per_s"] if threads == 2 else 0.0
    return {"updates_per_s": got["learner_updates_per_s"] + second, "seconds": seconds}


def measure(updates: int = 2_000, seconds: float = 3.0, rounds: int = 5, progress=print, filled: int = FILLED,
            plain=None):
    """Every condition in ``rounds`` rounds, the order rotated each round: one row per condition and round (a pandas
    DataFrame; the plain update's rows leave the phase and cores columns empty). ``plain``: the two plain-update
    callables (default: two ``gil_wake.learner_update``)."""
    import pandas as pd
    import torch

    from pal_bench.studies.simulate.gil_wake import learner_update

    torch.set_num_threads(1)
    plain = plain or [learner_update(), learner_update()]
    names = [*TRAINER_CONDITIONS, *PLAIN_CONDITIONS]
    rows = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k, name in enumerate(order, 1):
            progress(f"[learner parts round {r + 1}/{rounds}, {k}/{len(names)}] {name} ...")
            if name in TRAINER_CONDITIONS:
                learners, aggregation = TRAINER_CONDITIONS[name]
                got = trainer_learners(learners, aggregation, updates, filled)
            else:
                learners, aggregation = (1 if name.endswith("one thread") else 2), ""
                got = plain_update(learners, seconds, plain)
            rows.append({"round": r, "condition": name, "learners": learners, "aggregation": aggregation, **got})
    return pd.DataFrame(rows)


def against_the_model(results: Path = RESULTS):
    """The stored measurement's trainer conditions against the model, round by round: the stored inputs' medians
    (``results/simulation_inputs.csv``) with the learner phases fitted to the round's one-learner sync rate
    (``calibrate.fit``), each condition simulated with its learners and aggregation. One row per condition and
    round: measured and predicted updates/s, each over the round's one-learner rate, and the signed error
    (predicted - measured) / measured (a pandas DataFrame; the fitted condition itself left out)."""
    import pandas as pd

    from pal_bench.argtypes import Range as _Range
    from pal_bench.stored_tables import THROUGHPUT, Column, read_table
    from pal_bench.studies.simulate.calibrate import fit, inputs_for, median_inputs
    from pal_bench.studies.simulate.model import throughput
    from pal_bench.studies.simulate.stored import require_inputs
    from pal_bench.studies.simulate.validate import LEARNING, workload

    columns = {"round": Column(int, _Range(0, 1000)),
               "condition": Column(str, choices=(*TRAINER_CONDITIONS, *PLAIN_CONDITIONS)),
               "updates_per_s": Column(float, THROUGHPUT)}
    df = read_table(results / FILE, columns, what="the learner-parts probe's rows")
    row = median_inputs(require_inputs(results))
    cores = int(row.get("cores", 2))
    base = inputs_for(row, "threads")
    out = []
    for r, g in df.groupby("round"):
        ref = g[g.condition == "one learner, sync"].updates_per_s
        if ref.empty:
            continue
        inp = fit(base, "threads", None, float(ref.iloc[0]), cores, LEARNING)[0]
        for name, (learners, aggregation) in TRAINER_CONDITIONS.items():
            got = g[g.condition == name].updates_per_s
            if name == "one learner, sync" or got.empty:
                continue
            point = SimpleNamespace(backend="threads", curve="f_l", actors=0, learners=learners,
                                    aggregation=aggregation)
            pred = throughput(inp, workload(point, cores))      # as the validation predicts an f_l point
            measured = float(got.iloc[0])
            out.append({"round": r, "condition": name, "measured": measured, "predicted": pred,
                        "measured_ratio": measured / float(ref.iloc[0]), "predicted_ratio": pred / float(ref.iloc[0]),
                        "error": (pred - measured) / measured})
    return pd.DataFrame(out, columns=["round", "condition", "measured", "predicted", "measured_ratio",
                                      "predicted_ratio", "error"])


def main(argv: list[str] | None = None) -> int:
    from pal_bench.studies.simulate.gil_wake import measure_and_write, output_target

    ap = argparse.ArgumentParser(prog="python -m pal_bench.studies.simulate.learner_parts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=number(Range(10, 10**6)), default=2_000,
                    help="updates per trainer condition (default 2000)")
    ap.add_argument("--seconds", type=number(Range(0.1, 600), float), default=3.0,
                    help="seconds per plain-update condition (default 3)")
    ap.add_argument("--rounds", type=number(Range(1, 100)), default=5, help="rounds of every condition (default 5)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for simulation_learner_parts.csv")
    ap.add_argument("--force", action="store_true", help="measure on a busy machine too (marked noisy)")
    ap.add_argument("--model", action="store_true",
                    help="measure nothing: the stored measurement (in --out) against the model, round by round")
    args = ap.parse_args(argv)
    if args.model:
        from pal_bench.argtypes import UsageError

        try:
            df = against_the_model(args.out)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(df.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
        e = df.error
        print(f"{len(df)} points: median |error| {e.abs().median():.1%}, worst {e.abs().max():.1%}, "
              f"mean {e.mean():+.1%}" if len(df) else "no round with its one-learner sync rate")
        return 0
    target = output_target(ap, args.out, FILE)
    return measure_and_write("learner_parts", "learner parts probe", target, args.force, argv,
                             lambda: measure(args.updates, args.seconds, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
