"""tianshou 2.0.1's DQN in the race, driven step by step with tianshou's own calls (``Collector.collect``,
``DQN.update``) so that the race's ``Clock`` evaluates and stops it.

Matched track: ``task.MATCHED``. tianshou's ``DQN(is_double=True)`` on ``Net(hidden_sizes=[256, 256])``, with two
changes made in a subclass (``WeightedHuberDQN``), since tianshou's own Huber option (``huber_loss_delta``) drops the
prioritized-replay weights and its DQN has no gradient clipping argument:

    G_i  = sum_{k<n} gamma^k r_{i+k} + gamma^n (1 - terminated) Q_target(s_{i+n}, argmax_a Q(s_{i+n}, a))
    loss = mean_i w_i * huber(Q(s_i, a_i) - G_i, delta=1),     new priority_i = |G_i - Q(s_i, a_i)|
    ||grad|| clipped at 10 (tianshou's ``Algorithm.Optimizer(max_grad_norm=10)``)

with ``PrioritizedVectorReplayBuffer(200_000, 1, alpha=0.6, beta=0.4)`` (beta constant), one environment,
4 env steps collected then 1 update (0.25 per step) once ``task.learning_starts`` steps are in, epsilon 1 -> 0.05
linearly over ``task.eps_decay_steps`` env steps.

Tuned track: tianshou's own LunarLander DQN example as published in 2.0.1, ``examples/box2d/lunarlander_dqn.py`` of
thu-ml/tianshou at tag v2.0.1 (commit 1d579674a9eea34d707c35c12f0ff7c077c3f800): 16 training envs
(``DummyVectorEnv``), 16 env steps per collect and 0.0625 updates per env step (1 update per collect), lr 0.013,
4-step returns, dueling ``Net([128, 128])`` with Q and V streams ``[128, 128]``, target copy every 500 updates,
plain ``VectorReplayBuffer(100_000, 16)``, batch 128, DQN's defaults (Double DQN, squared TD error, no clipping);
before training it collects ``batch_size * 16 = 2048`` steps outside a training step (so at ``eps_test`` = 0.01,
as the example does), then resets the envs (the trainer's ``reset()``), and trains with
``eps = max(0.73 * (1 - 5e-6) ** t, 0.01)``, ``t`` the env steps since training began (the trainer's counter).
The race's own evaluation (``Clock``) replaces the example's test collector, stop rule and epoch budget; torch runs
on one CPU thread as every contestant does.
"""

from __future__ import annotations

import functools

from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.contestants import Contestant
from pal_bench.studies.race.task import MATCHED, Task

VERSION = "2.0.1"
EXAMPLE = {"repo": "thu-ml/tianshou", "file": "examples/box2d/lunarlander_dqn.py", "tag": "v2.0.1",
           "commit": "1d579674a9eea34d707c35c12f0ff7c077c3f800"}
# the example's arguments (its get_args() defaults), as its code uses them
TUNED = {"num_training_envs": 16, "collection_step_num_env_steps": 16, "update_per_step": 0.0625, "lr": 0.013,
         "gamma": 0.99, "n_step": 4, "target_update_freq": 500, "buffer_size": 100_000, "batch_size": 128,
         "hidden_sizes": [128, 128], "dueling_q_hidden_sizes": [128, 128], "dueling_v_hidden_sizes": [128, 128],
         "eps_train": 0.73, "eps_decay": 5e-6, "eps_test": 0.01}
COLLECT_STEPS = 4                  # matched: env steps per collect (then 4 x 0.25 = 1 update)


def vector_env(track: str, cpus: int) -> str:
    """tianshou's environment placement: with two or more CPUs on the matched track its subprocess vector env (the
    environment steps in a process of its own; tianshou's collector still waits for each step), else its in-process
    ``DummyVectorEnv`` (the tuned track keeps its example's)."""
    return "SubprocVectorEnv" if cpus >= 2 and track == "matched" else "DummyVectorEnv"


def matched_eps(steps: int, task: Task) -> float:
    """Matched epsilon: 1 -> eps_end linearly over ``task.eps_decay_steps`` env steps, then eps_end."""
    return MATCHED.epsilon(steps, task.eps_decay_steps)


def tuned_eps(t: int, s: dict | None = None) -> float:
    """The example's ``train_fn``: eps = max(eps_train * (1 - 5e-6)^t, eps_test), t = the trainer's env steps
    (``s``: a tuned configuration's settings; default the example's)."""
    s = s or {"eps_train": TUNED["eps_train"], "eps_decay": TUNED["eps_decay"], "eps_test": TUNED["eps_test"]}
    return max(s["eps_train"] * (1 - s["eps_decay"]) ** t, s["eps_test"])


@functools.cache
def weighted_huber_dqn() -> type:
    """tianshou's ``DQN`` with the matched loss (Huber, delta 1, times the importance weights, averaged) and its
    optimizer's gradient norm clipped at ``max_grad_norm`` (the class is made on first use: tianshou is imported
    lazily)."""
    import numpy as np
    import torch.nn.functional as F
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.reinforce import SimpleLossTrainingStats
    from tianshou.data import to_torch_as

    class WeightedHuberDQN(DQN):
        def __init__(self, *, max_grad_norm: float, **kwargs):
            self.max_grad_norm = max_grad_norm      # read by _create_policy_optimizer, called in DQN.__init__
            super().__init__(**kwargs)

        def _create_policy_optimizer(self, optim):
            return self._create_optimizer(self.policy, optim, max_grad_norm=self.max_grad_norm)

        def _update_with_batch(self, batch):
            # DQN._update_with_batch with its loss line replaced (tianshou's Huber branch ignores ``weight``)
            self._periodically_update_lagged_network_weights()
            weight = batch.pop("weight", 1.0)                    # importance weights (normalised by the batch max)
            q = self.policy(batch).logits
            q = q[np.arange(len(q)), batch.act]                  # Q(s_i, a_i)
            returns = to_torch_as(batch.returns.flatten(), q)    # G_i, n-step (Double DQN) targets
            td_error = returns - q
            loss = (weight * F.huber_loss(q, returns, delta=1.0, reduction="none")).mean()
            batch.weight = td_error                              # new priorities: (|td| + eps)^alpha
            self.optim.step(loss)                                # backward, clip grad norm, Adam step
            return SimpleLossTrainingStats(loss=loss.item())

    return WeightedHuberDQN


class TianshouContestant(Contestant):
    @classmethod
    def settings(cls, name: str, track: str, task: Task, cpus: int = 1, config: int = 0) -> dict:
        common = {"framework": "tianshou", "version": VERSION, "torch_threads": MATCHED.torch_threads,
                  "evaluation": "the race's (Clock: greedy, fixed seeds), training paused",
                  "vector_env": vector_env(track, cpus)}
        if track == "matched":
            m = MATCHED
            return common | {
                "algorithm": "WeightedHuberDQN(DQN(is_double=True)): huber x weights, grad norm clip",
                "double_q": m.double_q, "dueling": m.dueling, "hidden": list(m.hidden), "activation": m.activation,
                "loss": m.loss, "grad_clip": m.grad_clip, "optimizer": "Adam", "lr": m.lr,
                "batch_size": m.batch_size, "gamma": m.gamma, "n_step": m.n_step,
                "buffer": "PrioritizedVectorReplayBuffer", "buffer_capacity": m.buffer_capacity, "alpha": m.alpha,
                "beta": m.beta, "beta_final": m.beta, "target_update": m.target_update, "eps_start": 1.0,
                "eps_end": m.eps_end, "eps_decay_steps": task.eps_decay_steps, "n_envs": m.n_envs,
                "collect_steps": COLLECT_STEPS, "updates_per_step": m.updates_per_step,
                "learning_starts": task.learning_starts}
        if track == "tuned":
            from pal_bench.studies.race.tuning import overrides

            t = TUNED | overrides(name, config)
            prioritized = bool(t.get("prioritized"))
            return common | {
                "example": f"{EXAMPLE['repo']} {EXAMPLE['file']} @ {EXAMPLE['tag']} ({EXAMPLE['commit']})",
                "algorithm": "DQN (its defaults: is_double=True, huber_loss_delta=None)",
                "double_q": True, "dueling": True, "hidden": t["hidden_sizes"],
                "dueling_q_hidden": t["dueling_q_hidden_sizes"], "dueling_v_hidden": t["dueling_v_hidden_sizes"],
                "activation": "relu", "loss": "squared TD error, batch mean", "grad_clip": 0, "optimizer": "Adam",
                "lr": t["lr"], "batch_size": t["batch_size"], "gamma": t["gamma"], "n_step": t["n_step"],
                "buffer": "PrioritizedVectorReplayBuffer" if prioritized else "VectorReplayBuffer",
                "buffer_capacity": t["buffer_size"], "alpha": MATCHED.alpha if prioritized else None,
                "beta": MATCHED.beta if prioritized else None, "eps_train": t["eps_train"],
                "eps_decay": t["eps_decay"], "eps_test": t["eps_test"],
                "target_update": t["target_update_freq"], "n_envs": t["num_training_envs"],
                "collect_steps": t["collection_step_num_env_steps"], "updates_per_step": t["update_per_step"],
                "learning_starts": t["batch_size"] * t["num_training_envs"], "warmup_eps": t["eps_test"],
                "tuning": config,
                "eps": f"max({t['eps_train']} * (1 - {t['eps_decay']})^t, {t['eps_test']}), t: steps after warm-up",
                "not_taken": "its test collector (10 envs, eps_test), stop_fn, test_in_training and 10 x 80k-step "
                             "epochs: the race's evaluation, target and budget instead; env LunarLander-v3 "
                             "(the example names v2); CPU, one torch thread"}
        raise ValueError(f"unknown track {track!r}")

    def build(self) -> None:
        import gymnasium as gym
        import numpy as np
        import torch
        from tianshou.algorithm import DQN
        from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        from tianshou.algorithm.optim import AdamOptimizerFactory
        from tianshou.data import Collector, PrioritizedVectorReplayBuffer, VectorReplayBuffer
        from tianshou.env import DummyVectorEnv, SubprocVectorEnv
        from tianshou.utils.net.common import Net

        torch.set_num_threads(MATCHED.torch_threads)
        np.random.seed(self.seed)                     # tianshou's exploration and replay sampling use numpy's global
        torch.manual_seed(self.seed)
        s = self.settings(self.name, self.track, self.task, self.cpus, self.tuning)
        self.s = s
        probe = gym.make(self.task.env)
        obs_dim, space = int(np.prod(probe.observation_space.shape)), probe.action_space
        probe.close()
        make_envs = SubprocVectorEnv if s["vector_env"] == "SubprocVectorEnv" else DummyVectorEnv
        self.envs = make_envs([functools.partial(gym.make, self.task.env) for _ in range(s["n_envs"])])
        self.envs.seed(self.seed)
        optim = AdamOptimizerFactory(lr=s["lr"])
        if self.track == "matched":
            net = Net(state_shape=obs_dim, action_shape=int(space.n), hidden_sizes=s["hidden"])
            self.policy = DiscreteQLearningPolicy(model=net, action_space=space, eps_training=1.0, eps_inference=0.0)
            self.algo = weighted_huber_dqn()(policy=self.policy, optim=optim, gamma=s["gamma"],
                                             n_step_return_horizon=s["n_step"], target_update_freq=s["target_update"],
                                             is_double=True, max_grad_norm=s["grad_clip"])
            self.buffer = PrioritizedVectorReplayBuffer(s["buffer_capacity"], 1, alpha=s["alpha"], beta=s["beta"])
        else:
            net = Net(state_shape=obs_dim, action_shape=int(space.n), hidden_sizes=s["hidden"],
                      dueling_param=({"hidden_sizes": s["dueling_q_hidden"]}, {"hidden_sizes": s["dueling_v_hidden"]}))
            self.policy = DiscreteQLearningPolicy(model=net, action_space=space, eps_training=s["eps_train"],
                                                  eps_inference=s["eps_test"])
            self.algo = DQN(policy=self.policy, optim=optim, gamma=s["gamma"], n_step_return_horizon=s["n_step"],
                            target_update_freq=s["target_update"])
            if s["alpha"] is not None:
                self.buffer = PrioritizedVectorReplayBuffer(s["buffer_capacity"], len(self.envs), alpha=s["alpha"],
                                                            beta=s["beta"])
            else:
                self.buffer = VectorReplayBuffer(s["buffer_capacity"], len(self.envs))
        self.batch_size, self.collect_steps = s["batch_size"], s["collect_steps"]
        self.updates_per_step, self.learning_starts = s["updates_per_step"], s["learning_starts"]
        self.collector = Collector(self.algo, self.envs, self.buffer, exploration_noise=True)
        self.collector.reset()
        self.env_steps = 0                             # the env steps tianshou's collector reported, in all

    def facts(self) -> dict:
        """Read back from tianshou's objects (the loop's rhythm, batch size and learning start from this module)."""
        import tianshou
        import torch

        algo, net, buf = self.algo, self.policy.model, self.buffer
        opt = algo.optim

        def widths(module) -> list[int]:
            return [m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear)]

        prioritized = hasattr(buf, "update_weight")
        huber = isinstance(algo, weighted_huber_dqn())
        out = {"n_params": sum(p.numel() for p in net.parameters()), "torch_threads": torch.get_num_threads(),
               "n_envs": self.envs.env_num, "batch_size": self.batch_size, "n_step": algo.n_step,
               "target_update": algo.target_update_freq, "double_q": bool(algo.is_double),
               "dueling": bool(net.use_dueling), "gamma": algo.gamma, "lr": opt._optim.param_groups[0]["lr"],
               "grad_clip": opt._max_grad_norm or 0, "buffer_capacity": buf.maxsize,
               "alpha": buf.options["alpha"] if prioritized else None,
               "beta": buf.options["beta"] if prioritized else None,
               "updates_per_step": self.updates_per_step,
               "loss": ("huber(delta=1) x importance weights, batch mean" if huber else
                        f"huber(delta={algo.huber_loss_delta}), batch mean" if algo.huber_loss_delta is not None
                        else "squared TD error x weights, batch mean" if prioritized
                        else "squared TD error, batch mean"),
               "optimizer": type(opt._optim).__name__, "algorithm": type(algo).__name__,
               "buffer": type(buf).__name__, "collect_steps": self.collect_steps,
               "vector_env": type(self.envs).__name__,
               "learning_starts": self.learning_starts, "eps_inference": self.policy.eps_inference,
               "version": tianshou.__version__}
        if net.use_dueling:
            out |= {"hidden": widths(net.model), "dueling_q_hidden": widths(net.Q)[:-1],
                    "dueling_v_hidden": widths(net.V)[:-1]}
        else:
            out["hidden"] = widths(net.model)[:-1]
        return out

    def attach(self, counters) -> None:
        """tianshou's optimizer (the torch one inside its ``Algorithm.Optimizer``), its lagged target network, the
        batch its update step computes the loss on (``_update_with_batch``), the env steps its collector reported,
        and epsilon as set on its policy before each collect."""
        counters.env_steps = lambda: self.env_steps
        counters.watch_optimizer(self.algo.optim._optim)
        if self.algo.model_old is not None:
            counters.watch_target(self.algo.model_old.parameters())
        update = self.algo._update_with_batch

        def counted_update(batch, *args, **kwargs):       # the batch the loss is computed on
            counters.priorities(len(batch))
            return update(batch, *args, **kwargs)

        self.algo._update_with_batch = counted_update
        set_eps = self.policy.set_eps_training

        def recorded(eps: float) -> None:
            set_eps(eps)
            counters.epsilon(self.env_steps, self.policy.eps_training)

        self.policy.set_eps_training = recorded

    def act(self, obs):
        """Greedy action for one observation (the race's evaluation)."""
        import torch

        with torch.no_grad():
            q, _ = self.policy.model(torch.as_tensor(obs[None], dtype=torch.float32))
        return int(q.argmax(-1)[0])

    def collect(self, n: int, eps: float) -> int:
        """Collect ``n`` env steps (summed over envs) at epsilon ``eps``; returns the steps tianshou counted."""
        from tianshou.utils.torch_utils import policy_within_training_step

        self.policy.set_eps_training(eps)
        with policy_within_training_step(self.policy):
            got = self.collector.collect(n_step=n).n_collected_steps
        self.env_steps += got
        return got

    def learn(self, n: int) -> None:
        """``n`` gradient steps, each on a batch sampled from the buffer (priorities updated by tianshou)."""
        from tianshou.utils.torch_utils import policy_within_training_step

        with policy_within_training_step(self.policy):
            for _ in range(n):
                self.algo.update(buffer=self.buffer, sample_size=self.batch_size)

    def train(self, clock: Clock) -> dict:
        return self.train_matched(clock) if self.track == "matched" else self.train_tuned(clock)

    def train_matched(self, clock: Clock) -> dict:
        """Collect 4 steps, then the updates owed: floor((steps - learning_starts) x 0.25) in all."""
        steps = updates = 0
        while True:
            steps += self.collect(self.collect_steps, matched_eps(steps, self.task))
            due = int((steps - self.learning_starts) * self.updates_per_step) if steps > self.learning_starts else 0
            self.learn(due - updates)
            updates = due
            if clock.tick(steps, self.act):
                return {"env_steps": steps, "updates": updates}

    def train_tuned(self, clock: Clock) -> dict:
        """The example's rhythm: warm-up collect (outside a training step: eps_test), the trainer's collector reset,
        then per training step: eps from the trainer's env steps, collect 16, round(0.0625 x 16) = 1 update."""
        steps = self.collector.collect(n_step=self.learning_starts).n_collected_steps
        self.env_steps += steps
        self.collector.reset(reset_buffer=False)
        t = updates = 0
        while not clock.tick(steps + t, self.act):
            n = self.collect(self.collect_steps, tuned_eps(t, self.s))
            t += n
            k = round(self.updates_per_step * n)
            self.learn(k)
            updates += k
        return {"env_steps": steps + t, "updates": updates}

    def close(self) -> None:
        collector = getattr(self, "collector", None)
        if collector is not None:
            collector.close()
