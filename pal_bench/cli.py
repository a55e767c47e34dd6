"""``pal-bench``: the command line. ``pal-bench train --algo dqn --env CartPole-v1 --actors 2 ...``"""

from __future__ import annotations

import argparse
import json
import sys

from pal_bench.argtypes import UsageError
from pal_bench.studies import registry


def _train(args) -> int:
    import signal

    from pal_bench.train import ConfigError, make_config, make_trainer
    from pal_bench.train.config import load_file, parse_overrides, resume_config
    from pal_bench.train.errors import TrainingError

    flags = {"actors": args.actors, "learners": args.learners, "steps": args.steps, "seed": args.seed,
             "envs_per_actor": args.envs_per_actor, "aggregation": args.aggregation, "name": args.name,
             "env_backend": args.env_backend, "out_dir": args.out_dir, "backend": args.backend,
             "ray_address": args.ray_address, "ray_placement": args.ray_placement, "topology": args.topology,
             "link": args.link, "actor_rate": args.actor_rate}
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


def forwarded() -> dict[str, tuple[str, str]]:
    """Sub-commands with their own argument parsers: name -> (module with ``main(argv)``, help); the studies'
    come from their registry."""
    return registry.commands() | {
        "shm": ("pal_bench.shm", "PAL-Bench's shared-memory segments, their creators, and --clean for the dead ones"),
    }


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
    commands = forwarded()
    if argv and argv[0] in commands:
        import importlib

        return importlib.import_module(commands[argv[0]][0]).main(argv[1:])
    ap = argparse.ArgumentParser(prog="pal-bench", description="PAL-Bench: replay buffers and parallel RL, measured. "
                                 "Add --debug anywhere to see a traceback instead of a one-line error.")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (_, helptext) in commands.items():
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
    t.add_argument("--ray-placement", choices=["auto", "node", "pack", "spread"],
                   help="with --backend ray: node = actor processes Ray starts on this node around a shared-memory "
                        "buffer (the process backend's pieces); pack / spread = buffer, learners and actors as Ray "
                        "actors; auto (default) = node unless allreduce, env-backend async or buffer checkpoints "
                        "need Ray actors")
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
    from pal_bench.studies import dse

    dse.add_arguments(sub.add_parser("dse", help="choose how many cores go to actors and to learners"))
    sub.add_parser("report", help="rebuild every table and figure from stored results and write "
                                  "results/report/index.html (see `pal-bench report --help`)", add_help=False)
    p = sub.add_parser("profile", help="where a run's time went: per-phase table and stacked-bar figure")
    p.add_argument("run", help="a run directory, e.g. results/runs/<name>")
    p.add_argument("--out", help="where profile.png goes (default: the run directory)")
    args = ap.parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "dse":
        from pal_bench.studies import dse

        return dse.run(args)
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
