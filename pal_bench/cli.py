"""``pal-bench``: the command line. ``pal-bench train --algo dqn --env CartPole-v1 --actors 2 ...``"""

from __future__ import annotations

import argparse
import json
import sys


def _train(args) -> int:
    from pal_bench.train import ConfigError, Trainer, make_config
    from pal_bench.train.config import parse_overrides

    flags = {"actors": args.actors, "learners": args.learners, "steps": args.steps, "seed": args.seed,
             "envs_per_actor": args.envs_per_actor, "aggregation": args.aggregation, "name": args.name,
             "env_backend": args.env_backend, "out_dir": args.out_dir}
    try:
        overrides = parse_overrides(args.set or []) | {k: v for k, v in flags.items() if v is not None}
        cfg = make_config(args.algo, args.env, args.config, **overrides)
        trainer = Trainer(cfg, resume=args.resume)
    except (ConfigError, FileNotFoundError) as e:
        print(f"pal-bench train: {e}", file=sys.stderr)
        return 2
    try:
        with trainer:
            summary = trainer.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: final checkpoint in {cfg.run_dir()}", file=sys.stderr)
        return 130
    keys = ("env_steps", "updates", "episodes", "wall_s", "env_steps_per_s", "updates_per_s",
            "mean_return_last20", "final_eval_return", "run_dir")
    print(json.dumps({k: summary[k] for k in keys}, indent=1))
    from pal_bench import profile

    profile.main(summary["run_dir"])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench", description="PAL-Bench: replay buffers and parallel RL, measured.")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train with parallel actors, learners and a parameter server")
    t.add_argument("--algo", choices=["dqn", "ddqn", "ddpg", "td3", "sac"])
    t.add_argument("--env", help="gymnasium id (default: the algorithm's; LunarLander-v3 continuous for DDPG/TD3/SAC "
                                 "via --set env_kwargs='{continuous: true}')")
    t.add_argument("--config", help="TOML or YAML file of config fields")
    t.add_argument("--actors", type=int)
    t.add_argument("--learners", type=int)
    t.add_argument("--envs-per-actor", type=int)
    t.add_argument("--steps", type=int, help="total env transitions")
    t.add_argument("--aggregation", choices=["sync", "async"])
    t.add_argument("--env-backend", choices=["sync", "async"])
    t.add_argument("--seed", type=int)
    t.add_argument("--name", help="run directory name under --out-dir")
    t.add_argument("--out-dir")
    t.add_argument("--resume", action="store_true", help="continue the run in <out-dir>/<name> from its checkpoint")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config field (repeatable)")
    p = sub.add_parser("profile", help="where a run's time went: per-phase table and stacked-bar figure")
    p.add_argument("run", help="a run directory, e.g. results/runs/<name>")
    args = ap.parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "profile":
        from pal_bench import profile

        try:
            return profile.main(args.run)
        except (FileNotFoundError, ValueError) as e:
            print(f"pal-bench profile: {e}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
