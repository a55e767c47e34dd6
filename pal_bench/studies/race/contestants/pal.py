"""PAL-Bench's own trainer in the race: ``pal`` (actor and learner threads), ``pal-processes`` (an actor process on
the shared-memory buffer) and ``pal-apex`` (the Ape-X preset on actor processes). The tuned track runs
``pal-processes`` (PAL's own preset for this task is the matched learner) and ``pal-apex``.

Matched track: one actor with one environment and one learner (the matched data rhythm), Double DQN
(``algo="ddqn"``) with ``task.MATCHED``'s network, loss, clipping, optimizer, replay and schedule, beta held
constant. ``pal-apex``: ``--preset apex`` (Double DQN, dueling head, 3-step returns, actor-side
priorities over a local buffer of 50 steps, per-actor epsilon, one learner) with the actors of the core-split
solver's choice for this machine, the matched learner settings otherwise.

PAL's driver evaluates with its actors and learners paused (``eval_pauses_training``), so evaluation is outside
its training clock as it is for the sequential loops of the other frameworks.
"""

from __future__ import annotations

import tempfile

import torch

from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.contestants import Contestant
from pal_bench.studies.race.task import MATCHED, Task

BACKENDS = {"pal": "threads", "pal-processes": "processes", "pal-apex": "processes"}


def apex_actors(task: Task, cpus: int) -> int:
    """The actors of ``pal-apex``: the core-split solver's choice for the process backend on the run's ``cpus``
    (from ``results/scaling_processes.csv``; 1 without stored curves)."""
    from pal_bench.studies.dse import split_from_curves

    return split_from_curves(MATCHED.updates_per_step, "processes", cores=cpus)[0]


class PALContestant(Contestant):
    @classmethod
    def settings(cls, name: str, track: str, task: Task, cpus: int = 1, config: int = 0) -> dict:
        from pal_bench.studies.race.tuning import overrides

        tune = overrides(name, config) if track == "tuned" else {}
        m = MATCHED
        out = {"framework": "pal-bench", "backend": BACKENDS[name], "algo": "ddqn", "hidden": list(m.hidden),
               "lr": m.lr, "batch_size": m.batch_size, "gamma": m.gamma, "n_step": m.n_step,
               "buffer_capacity": m.buffer_capacity, "alpha": m.alpha, "beta": m.beta, "beta_final": m.beta,
               "target_update": m.target_update, "grad_clip": m.grad_clip, "eps_end": m.eps_end,
               "eps_decay_steps": task.eps_decay_steps, "updates_per_step": m.updates_per_step,
               "learning_starts": task.learning_starts, "actors": 1, "envs_per_actor": 1, "learners": 1,
               "deterministic": False, "eval_pauses_training": True}
        if name == "pal-apex" or tune.get("preset") == "apex":
            from pal_bench.train.config import PRESETS

            out |= {"preset": "apex", "preset_fields": PRESETS["apex"], "actors": apex_actors(task, cpus)}
        return out | {k: v for k, v in tune.items() if k != "preset"}

    def config(self, mode: str = "race"):
        """The trainer's config for this run (``mode`` "speed": no target, an evaluation of one episode at
        learning start marks the span's start, and the run ends after the span)."""
        from pal_bench.train import make_config

        s, task = self.settings(self.name, self.track, self.task, self.cpus, self.tuning), self.task
        speed = mode == "speed"
        # (speed mode too: the run's length sets epsilon's decay, eps_fraction x steps; a speed round is stopped
        # after its span by ``train``)
        steps = task.max_steps
        return make_config(s["algo"], task.env, preset=s.get("preset"), out_dir=self._out.name, name="run",
                           seed=self.seed, backend=s["backend"], actors=s["actors"], envs_per_actor=1,
                           learners=s["learners"], steps=steps, hidden=tuple(s["hidden"]), lr=s["lr"],
                           batch_size=s["batch_size"], gamma=s["gamma"], n_step=s["n_step"],
                           buffer_capacity=s["buffer_capacity"], alpha=s["alpha"], beta=s["beta"],
                           beta_final=s["beta_final"], target_update=s["target_update"], grad_clip=s["grad_clip"],
                           eps_end=s["eps_end"], eps_fraction=task.eps_decay_steps / task.max_steps,
                           updates_per_step=s["updates_per_step"], learning_starts=s["learning_starts"],
                           eval_interval=task.learning_starts if speed else task.eval_interval,
                           eval_episodes=1 if speed else task.eval_episodes,
                           stop_return=None if speed else task.target, deterministic=False,
                           eval_pauses_training=True, progress=False)

    def build(self) -> None:
        from pal_bench.train import make_trainer

        torch.set_num_threads(MATCHED.torch_threads)
        self._out = tempfile.TemporaryDirectory(prefix="pal-race-")
        self.cfg = self.config(getattr(self, "mode", "race"))
        self.tr = make_trainer(self.cfg, overwrite=True)

    def facts(self) -> dict:
        cfg, tr = self.cfg, self.tr
        q = tr.ps.nets["q"]
        opt = tr.ps.optimizers["q"]
        return {"n_params": sum(p.numel() for p in q.parameters()), "torch_threads": torch.get_num_threads(),
                "n_envs": cfg.actors * cfg.envs_per_actor, "batch_size": cfg.batch_size, "n_step": cfg.n_step,
                "target_update": cfg.target_update if cfg.learners == 1 else None, "double_q": cfg.algo == "ddqn",
                "dueling": bool(cfg.dueling), "gamma": cfg.gamma, "lr": opt.param_groups[0]["lr"],
                "grad_clip": cfg.grad_clip, "buffer_capacity": tr.buffer.capacity, "alpha": tr.buffer.alpha,
                "beta": cfg.beta if cfg.beta_final == cfg.beta else f"{cfg.beta} -> {cfg.beta_final}",
                "updates_per_step": cfg.updates_per_step,
                "loss": "huber(delta=1) x importance weights, batch mean", "optimizer": type(opt).__name__,
                "hidden": [m.out_features for m in q.modules() if isinstance(m, torch.nn.Linear)][:-1],
                "actors": cfg.actors, "learners": cfg.learners, "backend": cfg.backend,
                "exploration": cfg.exploration, "learning_starts": cfg.learning_starts}

    def attach(self, counters) -> None:
        """The parameter server's optimizer, target network and online network (the sole sync learner computes its
        loss on them), the trainer's env-step counter; epsilon from the trainer's own exploration schedule
        (``RunCore.explore``, what every actor calls), read after the run at every 1,000 env steps it ran."""
        ps, tr = self.tr.ps, self.tr
        counters.env_steps = lambda: tr.rate.steps
        counters.watch_optimizer(ps.optimizers["q"])
        counters.watch_target(ps.targets["q"].parameters())
        counters.watch_loss_rows(ps.nets["q"])
        self._counters = counters

    def train(self, clock: Clock) -> dict:
        """Run the trainer (its own driver evaluates, paused, with the race's episodes and seeds); its evaluations
        become the clock's curve. A wall-clock budget stops it through its stop event."""
        import threading

        span_end = self.task.learning_starts + self.task.speed_span if clock.mode == "speed" else None
        poll_s = 1.0 if span_end is None else 0.02

        def budget() -> None:               # the training budget: wall time less evaluations (a speed round: its span)
            while not self.tr.stop.wait(poll_s):
                if clock.train_s() - self.tr.eval_seconds >= self.task.max_wall_s or (
                        span_end is not None and self.tr.rate.steps >= span_end):
                    self.tr.stop.set()
                    return

        watcher = threading.Thread(target=budget, daemon=True, name="race-budget")
        watcher.start()
        try:
            s = self.tr.run()
        finally:
            self.tr.stop.set()
            watcher.join()
        clock.phase_seconds = s.get("phase_seconds", {})
        startup = s.get("startup_s", 0.0)           # worker processes' start-up, before the trainer's clock
        clock.setup_s = (clock.setup_s or 0.0) + startup
        for e in s["eval"]:
            clock.record(e["env_steps"], e["train_s"], e["eval_s"], e["mean_return"])
        train_s = s["wall_s"] - s["eval_s"]
        if clock.mode == "speed" and len(s["eval"]):
            first = s["eval"][0]
            clock.span = {"start_steps": first["env_steps"], "start_s": first["train_s"],
                          "end_steps": s["env_steps"], "end_s": train_s}
        clock.eval_s = s["eval_s"]
        self.train_s = train_s
        counters = getattr(self, "_counters", None)
        if counters is not None:
            for t in range(0, int(s["env_steps"]) + 1, 1_000):
                counters.epsilon(t, self.tr.explore(t))
        return {"env_steps": s["env_steps"], "updates": s["updates"], "train_s": train_s}

    def close(self) -> None:
        tr = getattr(self, "tr", None)
        if tr is not None:
            tr.close()
        out = getattr(self, "_out", None)
        if out is not None:
            out.cleanup()
