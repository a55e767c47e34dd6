"""``pal-bench``: the command line. ``pal-bench train --algo dqn --env CartPole-v1 --actors 2 ...``"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _train(args) -> int:
    import signal

    from pal_bench.train import ConfigError, make_config, make_trainer
    from pal_bench.train.config import load_file, parse_overrides, resume_config
    from pal_bench.train.core import TrainingError

    flags = {"actors": args.actors, "learners": args.learners, "steps": args.steps, "seed": args.seed,
             "envs_per_actor": args.envs_per_actor, "aggregation": args.aggregation, "name": args.name,
             "env_backend": args.env_backend, "out_dir": args.out_dir, "backend": args.backend,
             "ray_address": args.ray_address, "topology": args.topology, "link": args.link,
             "actor_rate": args.actor_rate}
    overrides = parse_overrides(args.set or []) | {k: v for k, v in flags.items() if v is not None}
    cfg = make_config(args.algo, args.env, args.config, preset=args.preset, **overrides)
    if args.resume:    # the run's own config; the flags given may change only what a run can change mid-way
        given = (load_file(args.config) if args.config else {}) | overrides | {
            k: v for k, v in (("algo", args.algo), ("env", args.env)) if v is not None}
        cfg = resume_config(cfg.run_dir(), given)
    if cfg.topology == "local" and cfg.steps <= cfg.learning_starts:
        raise ConfigError(f"steps ({cfg.steps}) must exceed learning_starts ({cfg.learning_starts}): no learner "
                          f"update would run; raise --steps or lower --set learning_starts=N")
    trainer = make_trainer(cfg, resume=args.resume, overwrite=args.overwrite)
    try:
        with trainer:
            summary = trainer.run()
    except KeyboardInterrupt as e:       # Ctrl-C, or SIGTERM / SIGHUP (Interrupted): the same clean stop
        signum = getattr(e, "signum", None)
        how = "interrupted" if signum is None else f"stopped by {signal.Signals(signum).name}"
        try:                             # stopped during start-up, a run may have none to show
            where = f"last checkpoint {trainer.recorder.checkpoint_files()[0].parent}"
        except (OSError, ValueError):
            where = f"no checkpoint written in {cfg.run_dir()}"
        print(f"\n{how}: {where}", file=sys.stderr)
        return 130 if signum is None else 128 + signum
    except TrainingError as e:           # divergence, an actor past its restarts: the line says what failed
        print(f"pal-bench train: {e}", file=sys.stderr)
        return 2
    keys = ("env_steps", "updates", "episodes", "wall_s", "env_steps_per_s", "updates_per_s",
            "mean_return_last20", "final_eval_return", "run_dir")
    print(json.dumps({k: summary[k] for k in keys}, indent=1))
    if cfg.topology != "local":
        print(f"link {cfg.link}, {cfg.topology}: final loss {summary['loss_final']:.4g}, average priority of "
              f"crossed experiences {summary['crossed_priority']:.4g}, {summary['bytes_to_learner'] / 1e6:.2f} MB to "
              f"the learner, {summary['bytes_to_buffer'] / 1e6:.2f} MB back, learner idle "
              f"{summary['learner_idle_frac']:.0%}")
        return 0
    from pal_bench.train import profile

    profile.main(summary["run_dir"])
    return 0


# the backend whose curves `pal-bench dse` measures and uses unless told otherwise: actor processes collect
# in parallel where actor threads lose to the GIL (docs/backends.md, "Actor processes against threads")
DSE_BACKEND = "processes"
DSE_OUT = "pal-bench-out"       # dse's default --out: never the tracked results/ unless asked


def _dse(args) -> int:
    import pandas as pd

    from pal_bench.studies import dse, scaling
    from pal_bench.train import make_config

    if args.measured and not Path(args.measured).is_file():
        raise UsageError(f"--measured {args.measured}: no such file")
    m = args.max_cores or scaling.usable_cores()
    if args.curves:
        if not Path(args.curves).is_file():
            raise UsageError(f"--curves {args.curves}: no such file (make one with `python -m "
                             "pal_bench.studies.scaling`)")
        try:
            curves = pd.read_csv(args.curves)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise UsageError(f"--curves {args.curves}: not a curves CSV ({str(e).splitlines()[0]})") from None
        missing = {"curve", "threads", "throughput"} - set(curves.columns)
        if missing:
            raise UsageError(f"--curves {args.curves}: missing column(s) {', '.join(sorted(missing))} "
                             "(expected the CSV that `python -m pal_bench.studies.scaling` writes)")
        for flag, col in (("algo", "algo"), ("env", "env")):   # the curves say what they were measured on
            found = sorted(curves[col].dropna().unique()) if col in curves else []
            given = getattr(args, flag)
            if given is not None and found and found != [given]:
                raise UsageError(f"--{flag} {given}: the curves in {args.curves} were measured with "
                                 f"{col} {', '.join(found)}; measure {given}'s curves (python -m "
                                 f"pal_bench.studies.scaling --{flag} {given}) or drop --{flag}")
            if given is None and len(found) == 1:
                setattr(args, flag, found[0])
        # curves written before the backend column are the thread backend's
        found = sorted(curves.backend.dropna().unique()) if "backend" in curves else ["threads"]
        if args.backend:
            if "backend" in curves:
                curves = curves[curves.backend == args.backend]
            if args.backend not in found:
                print(f"pal-bench dse: {args.curves} holds curves of backend {', '.join(found)}, "
                      f"not {args.backend}", file=sys.stderr)
                return 2
            backend = args.backend
        elif len(found) == 1:
            backend = found[0]
        elif DSE_BACKEND in found:
            backend = DSE_BACKEND
            curves = curves[curves.backend == backend]
        else:
            print(f"pal-bench dse: {args.curves} holds curves of backends {', '.join(found)}: choose one with "
                  "--backend", file=sys.stderr)
            return 2
        print(f"curves: {args.curves} (backend {backend})")
        cfg = make_config(args.algo, args.env)
    else:
        backend = args.backend or DSE_BACKEND
        from pal_bench.bench.conditions import refuse_if_busy

        if refuse_if_busy("pal-bench dse (measuring the curves)", args.force):
            return 2
        cfg = make_config(args.algo or "dqn", args.env or "CartPole-v1", backend=backend)
        curves = scaling.sweep(cfg, m, args.steps, args.updates, progress=lambda msg: print(msg, file=sys.stderr))
        print(f"curves: measured now (backend {backend})")
    args.algo, args.env = cfg.algo, cfg.env
    ratio = args.ratio or cfg.updates_per_step
    if backend != cfg.backend:       # --validate runs the backend the curves came from
        cfg = make_config(args.algo, args.env, backend=backend)
    f_a = dict(zip(curves[curves.curve == "f_a"].threads, curves[curves.curve == "f_a"].throughput))
    f_l = dict(zip(curves[curves.curve == "f_l"].threads, curves[curves.curve == "f_l"].throughput))
    try:
        best, table, frontier = dse.solve(f_a, f_l, ratio, m)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ranked = table.sort_values("transitions_per_s", ascending=False)
    print(ranked.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"\nchosen split for M={m}, {ratio:g} updates per transition: {best.actors} actor(s) + {best.learners} "
          f"learner(s): {best.transitions_per_s:.0f} transitions/s, {best.updates_per_s:.0f} updates/s "
          f"(limited by the {best.bottleneck})")
    print(best.command(args.algo, args.env, ratio) + (f" --backend {backend}" if backend != "threads" else ""))
    fig_path = args.out / "figures" / "dse.png"
    fig_path.parent.mkdir(parents=True, exist_ok=True)
    measured = pd.read_csv(args.measured) if args.measured else None
    if args.validate:
        from pal_bench.bench.conditions import Conditions, refuse_if_busy

        if refuse_if_busy("pal-bench dse --validate", args.force):
            return 2
        validated = Conditions("core-split validation")
        splits = list(zip(table.actors, table.learners))
        with scaling.ray_session(cfg):      # Ray: one session for every split
            measured = dse.validate(cfg, splits, args.validate, progress=lambda msg: print(msg, file=sys.stderr),
                                    repeats=args.repeats)
        v = table.merge(measured, on=["actors", "learners"])
        v["predicted_rank"] = v.transitions_per_s.rank(ascending=False, method="min").astype(int)
        v["chosen"] = (v.actors == best.actors) & (v.learners == best.learners)
        args.out.mkdir(parents=True, exist_ok=True)
        v.to_csv(args.out / "dse_validation.csv", index=False, float_format="%.2f")
        validated.write(args.out / "dse_validation.csv")
        print(dse.validation_text(v))
    print(f"figure: {dse.draw(table, frontier, best, fig_path, measured)}")
    return 0


# sub-commands with their own argument parsers: name -> (module with main(argv), help)
FORWARDED = {
    "scaling": ("pal_bench.studies.scaling", "actor and learner throughput against workers, per backend"),
    "concurrency": ("pal_bench.studies.concurrency", "the buffer under concurrent writers and samplers"),
    "fanout": ("pal_bench.studies.fanout", "sample + update latency against the sum tree's fan-out K"),
    "shared-buffer": ("pal_bench.studies.shared_buffer",
                      "the shared-memory buffer across processes against a private one"),
    "race": ("pal_bench.studies.race", "time to a target return: PAL's trainer vs RLlib and tianshou DQN"),
    "race-profile": ("pal_bench.studies.race_profile",
                     "where one race contestant's time goes (cProfile areas, or PAL's per-phase times)"),
    "plugin-bench": ("pal_bench.studies.plugin",
                     "training-iteration time with each framework's buffer vs PAL's drop-in"),
    "aggregation": ("pal_bench.studies.aggregation",
                    "share of a training iteration spent aggregating gradients, per scheme"),
    "longhaul": ("pal_bench.studies.longhaul.experiment",
                 "replay at the learner or at the buffer node, over a long-haul link"),
    "shm": ("pal_bench.shm", "PAL-Bench's shared-memory segments, their creators, and --clean for the dead ones"),
}


class UsageError(Exception):
    """A user error found by the command line itself (a missing file, a bad column); one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    """``pal-bench``: a user error (bad config, unreadable file, bad argument) ends in one line on stderr and
    exit status 2; ``--debug`` (anywhere on the line) shows the traceback instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return _main(argv)
    except Exception as e:                      # noqa: BLE001 - sorted below: user errors get one line
        from pal_bench.train.config import ConfigError

        if debug or not isinstance(e, (ConfigError, UsageError, OSError)):
            raise
        command = argv[0] if argv and not argv[0].startswith("-") else ""
        print(f"pal-bench {command}: {e}".replace(" :", ":"), file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "report":
        from pal_bench import report

        return report.main(["--html", *argv[1:]])
    if argv and argv[0] in FORWARDED:
        import importlib

        return importlib.import_module(FORWARDED[argv[0]][0]).main(argv[1:])
    ap = argparse.ArgumentParser(prog="pal-bench", description="PAL-Bench: replay buffers and parallel RL, measured. "
                                 "Add --debug anywhere to see a traceback instead of a one-line error.")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (_, helptext) in FORWARDED.items():
        sub.add_parser(name, help=helptext + f" (see `pal-bench {name} --help`)", add_help=False)
    from pal_bench.train.config import ALGOS

    t = sub.add_parser("train", help="train with parallel actors, learners and a parameter server")
    t.add_argument("--algo", choices=list(ALGOS))
    t.add_argument("--env", help="gymnasium id (default: the algorithm's; LunarLander-v3 continuous for DDPG/TD3/SAC "
                                 "via --set env_kwargs='{continuous: true}')")
    t.add_argument("--config", help="TOML or YAML file of config fields")
    t.add_argument("--preset", choices=["apex"],
                   help="named settings under --config and flags: apex = Ape-X (Double DQN, dueling head, 3-step "
                        "returns, actor-side priorities over a local buffer of 50 steps, per-actor epsilon, one "
                        "learner)")
    t.add_argument("--actors", type=int)
    t.add_argument("--learners", type=int)
    t.add_argument("--envs-per-actor", type=int)
    t.add_argument("--steps", type=int, help="total env transitions")
    t.add_argument("--aggregation", choices=["sync", "async", "allreduce"])
    t.add_argument("--env-backend", choices=["sync", "async"])
    t.add_argument("--backend", choices=["threads", "processes", "ray"],
                   help="threads in this process (default), actor processes on a shared-memory buffer, or Ray")
    t.add_argument("--ray-address", help="with --backend ray: join this Ray cluster (default: start a local Ray)")
    t.add_argument("--topology", choices=["local", "learner-replay", "buffer-replay"],
                   help="with --backend ray and dqn/ddqn: edge actors, a buffer node and one learner behind --link; "
                        "replay at the learner or at the buffer node (default: local, the usual layout)")
    t.add_argument("--link", help="with --topology: link preset between buffer node and learner (none, fibre-10km, "
                                  "wan, wan-1MBps)")
    t.add_argument("--actor-rate", type=float, help="with --topology: edge env steps/s, all actors (0: unpaced)")
    t.add_argument("--seed", type=int)
    t.add_argument("--name", help="run directory name under --out-dir")
    t.add_argument("--out-dir", "--out", dest="out_dir",
                   help="where run directories go (default: results/runs); the run writes only into "
                        "<out-dir>/<name>")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in <out-dir>/<name> from its checkpoint, with its own config.yaml; flags "
                        "may change only steps, eval_interval, eval_episodes, checkpoint_interval, stop_return, "
                        "progress")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run already in <out-dir>/<name> (its files and checkpoints); without it such a "
                        "run is refused (continue it with --resume)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config field (repeatable)")
    from pal_bench.argtypes import WORKERS, Range, nonneg_int, number, positive_int
    from pal_bench.train.config import FIELD_RANGES

    d = sub.add_parser("dse", help="choose how many cores go to actors and to learners")
    d.add_argument("--algo", help="algorithm of the curves and of the suggested command (default: the curves' "
                                  "algo column, else dqn)")
    d.add_argument("--env", help="environment (default: the curves' env column, else CartPole-v1)")
    d.add_argument("--out", type=Path, default=Path(DSE_OUT),
                   help=f"where the figure (figures/dse.png) and --validate's dse_validation.csv go (default: "
                        f"{DSE_OUT}/ in the current directory; the Makefile passes --out results)")
    d.add_argument("--ratio", type=number(FIELD_RANGES["updates_per_step"], float),
                   help="updates per transition (default: the algorithm's config)")
    d.add_argument("--max-cores", type=number(Range(2, WORKERS.hi)),
                   help="core budget M, at least 2: one actor and one learner (default: usable cores)")
    d.add_argument("--curves", help="stored f_a/f_l curves (results/scaling.csv, scaling_processes.csv, "
                                    "scaling_ray.csv); default: measure them now")
    d.add_argument("--backend", choices=["threads", "processes", "ray"],
                   help="the backend whose curves to use (a CSV holding both), to measure, and to --validate "
                        "(default: the one in --curves, else processes)")
    d.add_argument("--steps", type=positive_int, default=20_000, help="transitions per f_a point when measuring")
    d.add_argument("--updates", type=positive_int, default=1_000, help="updates per f_l point when measuring")
    d.add_argument("--measured", help="stored validation (results/dse_validation.csv) to draw on the figure")
    d.add_argument("--validate", type=nonneg_int, metavar="STEPS", default=0,
                   help="also run the trainer at every split for STEPS transitions and compare "
                        "(results/dse_validation.csv)")
    d.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="--validate in R rounds (every split once per round), medians per split (default 1)")
    from pal_bench.bench.conditions import add_force_flag

    add_force_flag(d)
    sub.add_parser("report", help="rebuild every table and figure from stored results and write "
                                  "results/report/index.html (see `pal-bench report --help`)", add_help=False)
    p = sub.add_parser("profile", help="where a run's time went: per-phase table and stacked-bar figure")
    p.add_argument("run", help="a run directory, e.g. results/runs/<name>")
    p.add_argument("--out", help="where profile.png goes (default: the run directory)")
    args = ap.parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "dse":
        return _dse(args)
    if args.command == "profile":
        from pal_bench.train import profile

        try:
            return profile.main(args.run, args.out)
        except (FileNotFoundError, ValueError) as e:
            print(f"pal-bench profile: {e}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
