"""RLlib's DQN (ray[rllib] 2.60, new API stack) in the race: contestants ``rllib`` (RLlib's own
``PrioritizedEpisodeReplayBuffer``) and ``rllib-pal`` (PAL's drop-in
``pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer``, matched track only).

Both run one local ``SingleAgentEnvRunner`` with one environment (``num_env_runners=0``) and the local Learner
(``num_learners=0``) in this process, with one torch thread. The race's own greedy evaluation runs between
``algo.train()`` calls (RLlib's evaluation is off); each ``algo.train()`` samples at most
``min(1000, task.eval_interval)`` env steps, so evaluations fall on the scheduled steps.

How RLlib 2.60 counts (read in its source, ``ray/rllib/algorithms/dqn/``):

- **Update rhythm** (``dqn.py``: ``calculate_rr_weights`` and ``DQN._training_step_new_api_stack``): each
  ``training_step`` samples ``store_weight`` fragments of ``rollout_fragment_length`` env steps (per env), then,
  once ``num_steps_sampled_before_learning_starts`` is reached, makes ``sample_and_train_weight`` learner updates
  of ``train_batch_size_per_learner``; the weights come from ``training_intensity`` (replayed / sampled
  transitions) over the native ratio ``batch / (fragment x envs x (env_runners + 1))``. With
  ``rollout_fragment_length="auto"`` the fragment is ``n_step`` (or its upper bound): n-step 3 gave one update per
  3 env steps, the old race's fault. Matched: fragment 4, training intensity 128 x 0.25 = 32: native ratio
  128 / 4 = 32, weights [1, 1]: one update of 128 per 4 env steps, exactly 0.25 updates per env step.
- **Target period** (``dqn_learner.py``: ``DQNLearner.after_gradient_based_update``): ``target_network_update_freq``
  is in **sampled env steps** (``NUM_ENV_STEPS_SAMPLED_LIFETIME`` passed to the learner) and ``tau=1.0`` makes
  it a hard copy. Matched: 250 updates / 0.25 = 1000 env steps; updates fall on env steps ``learning_starts +
  4k``, so the copies fall every 250 updates exactly (the first at the first update where ``learning_starts``
  >= 1000, as in the full and quick tasks; at update 126 in the smoke task's 500). ``facts()`` reports the
  period in updates (env steps x configured updates per env step).
- **Loss** (``torch/dqn_torch_learner.py``: ``DQNTorchLearner.compute_loss_for_module``): with
  ``td_error_loss_fn="huber"`` and ``num_atoms=1`` the loss is
  ``mean(batch["weights"] * nn.HuberLoss(reduction="none")(q_selected, target))``: Huber with torch's default
  delta 1, times the prioritized-replay importance weights, averaged over the batch; the Double-DQN target
  (``double_q=True``) takes the argmax of the online network at the next observation and evaluates it with the
  target network. Gradients are clipped by global norm (``grad_clip_by="global_norm"``,
  ``ray/rllib/utils/torch_utils.py: clip_gradients``).
- **Epsilon** (``torch/default_dqn_torch_rl_module.py``): the schedule is piecewise linear in the env runner's
  lifetime sampled env steps.
- **Counters** (``train()``): env steps are ``env_runners/num_env_steps_sampled_lifetime``; updates are
  ``learners/<module>/num_module_steps_trained_lifetime`` divided by the train batch (each DQN update is one
  gradient step on one batch: ``num_epochs=1``, no minibatches); ``optimizer_steps()`` reads the same count from
  Adam's own step counter, and the test checks that they agree.

**Matched track**: ``task.MATCHED`` exactly: Double DQN, not dueling, 8-256-256-4 ReLU on LunarLander-v3
(``DefaultModelConfig(fcnet_hiddens=[256], head_fcnet_hiddens=[256])``: the encoder's one hidden layer and the
Q head's one hidden layer; the old race's ``fcnet_hiddens=[256]`` with RLlib's default empty head built
8-256-4, and its ``hiddens`` key is read only by the old API stack), Huber x importance weights, global-norm
clip 10, Adam lr 5e-4, batch 128, gamma 0.99, 3-step returns, buffer 200,000 with alpha 0.6 and constant beta
0.4, hard target copy every 250 updates, epsilon 1 -> 0.05 over ``task.eps_decay_steps`` env steps (from env
step 0), learning from ``task.learning_starts`` env steps, one environment, 0.25 updates per env step.

**What RLlib's buffer does not match**: its ``PrioritizedEpisodeReplayBuffer`` draws again any step whose n-step
window would pass its episode's end, so it never trains on an episode's last ``n_step - 1`` transitions (PAL and
tianshou train on them with the shorter window left); on a fixed batch of the same windows its loss equals PAL's.
With two CPUs (``cpus``) the matched contestant samples in one remote env runner and halves its training intensity
(RLlib's update ratio counts the local runner beside the remote one, though only the remote one samples).

**Tuned track** (``rllib`` only): RLlib's own DQN example for the one single-agent, fully observed
vector-observation task among its DQN examples (the others: Atari pixels, multi-agent CartPole, TicTacToe, stateless
CartPole with an LSTM), ``rllib/examples/algorithms/dqn/cartpole_dqn.py`` (ray-project/ray, the version stored at commit
7156122e30689af8425becc3923be7484d594853). At 2.60.0 (``ray.__commit__``
b7f4259e944bf6959f721b106adc366ddfa0c356) there is no ``rllib/tuned_examples/``: ray PR #58893 (merged 2025-11,
after ray-2.52.1) moved the tuned examples into ``rllib/examples/algorithms/`` (the file before the move,
``rllib/tuned_examples/dqn/cartpole_dqn.py`` at 6d0bbd667d2626d4c18809e8bc4a8300bf75b7f1, has the same settings).
The wheel does not ship the examples and the ray repository is too large to fetch here, so the file's blob at
b7f4259e itself was not read: one other stored version of the moved file (5d6ba4e2af08a868508c05f260352fd200c410a9)
decays epsilon over 25,000 steps instead of 10,000 (its docstring still says 10,000); ``EXAMPLE`` names the
version followed. Its settings: ``double_q=True``, ``dueling=True``, ``n_step=(2, 5)`` (drawn per sampled
transition), ``fcnet_hiddens=[256]`` tanh with zero bias init, ``head_fcnet_hiddens=[256]`` (RLlib's default
ReLU) with zero bias init, lr 5e-4 (x sqrt(learners) = 1), ``train_batch_size_per_learner=32``, prioritized
episode replay of 50,000 with alpha 0.6, beta 0.4, epsilon 1 -> 0.02; everything else DQNConfig's defaults
(``rollout_fragment_length="auto"``: the n-step bound 5; ``training_intensity=None``: one update per fragment,
0.2 updates per env step; ``target_network_update_freq=500`` env steps = 100 updates, ``tau=1``;
``num_steps_sampled_before_learning_starts=1000``; gamma 0.99; Huber loss; global-norm clip 40); the example
script's default ``--num-env-runners`` leaves ``num_env_runners=0``, one environment.

Scaling to LunarLander: RLlib's DQN examples state no scaling rule. Its vector-observation examples keep most of
the CartPole learner (lr 5e-4, batch 32, prioritized buffer 50,000, n-step (2, 5), double and dueling; the
multi-agent CartPole example moves to lr 6.5e-4, batch 48 and two 256 encoder layers) and set the exploration
schedule per task: CartPole decays epsilon over 10,000 of its 200,000 default timesteps (5%), multi-agent CartPole
over 20,000 of 500,000 (4%), TicTacToe over 10,000 of 1,000,000. We take the single-agent CartPole example as it
is and scale only its epsilon decay with the run length:
``EXAMPLE["eps_decay_steps"] x task.max_steps / EXAMPLE["timesteps"]`` (LunarLander-v3, 500,000 steps: 25,000).
The learning start stays RLlib's default 1,000 (no vector-observation example changes it), so a tuned run's
updates per env step is measured from 1,000 env steps (``facts()["learning_starts"]``), not from
``task.learning_starts``.
"""

from __future__ import annotations

import importlib.metadata
import math

import numpy as np

from pal_bench.studies.race.clock import Clock
from pal_bench.studies.race.contestants import Contestant
from pal_bench.studies.race.task import EPS_TOLERANCE, MATCHED, Task

BUFFERS = {"rllib": "PrioritizedEpisodeReplayBuffer",
           "rllib-pal": "pal_bench.integrations.rllib.PALPrioritizedEpisodeReplayBuffer"}
TRACKS = {"rllib": ("matched", "tuned"), "rllib-pal": ("matched",)}

# RLlib's DQN example followed in the tuned track (see the module docstring)
EXAMPLE = {
    "file": "rllib/examples/algorithms/dqn/cartpole_dqn.py",
    "repo": "ray-project/ray",
    "commit": "7156122e30689af8425becc3923be7484d594853",
    "before_move": "rllib/tuned_examples/dqn/cartpole_dqn.py@6d0bbd667d2626d4c18809e8bc4a8300bf75b7f1",
    "ray_release": "2.60.0 (b7f4259e944bf6959f721b106adc366ddfa0c356)",
    "env": "CartPole-v1",
    "timesteps": 200_000,              # the example's default_timesteps
    "eps_decay_steps": 10_000,         # epsilon=[(0, 1.0), (10_000, 0.02)]
    "eps_end": 0.02,
    "lr": 5e-4,
    "batch_size": 32,
    "buffer": "PrioritizedEpisodeReplayBuffer",
    "buffer_capacity": 50_000,
    "alpha": 0.6,
    "beta": 0.4,
    "n_step": [2, 5],
    "double_q": True,
    "dueling": True,
    "fcnet_hiddens": [256],
    "fcnet_activation": "tanh",
    "fcnet_bias_initializer": "zeros_",
    "head_fcnet_hiddens": [256],
    "head_fcnet_bias_initializer": "zeros_",
}
# DQNConfig's defaults (ray 2.60, ray/rllib/algorithms/dqn/dqn.py) that the example leaves alone
RLLIB_DEFAULTS = {"rollout_fragment_length": "auto", "training_intensity": None, "target_network_update_freq": 500,
                  "tau": 1.0, "learning_starts": 1_000, "gamma": 0.99, "td_error_loss_fn": "huber",
                  "grad_clip": 40.0, "grad_clip_by": "global_norm", "adam_epsilon": 1e-8,
                  "head_fcnet_activation": "relu"}
TORCH_THREADS = 1


def _ray_version() -> str | None:
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


def iteration_steps(task: Task) -> int:
    """Env steps per ``algo.train()`` call: a multiple of 20 (whole fragments of 4 and of 5 env steps) that divides
    the evaluation interval (evaluations fall on their steps), at most 1,000, and short enough that epsilon stays
    within ``task.EPS_TOLERANCE`` of its schedule: RLlib's env runner reads its sampled-steps count, which its epsilon
    schedule follows, only once per ``train()`` call, so epsilon is a staircase lagging up to one call's steps
    (1,000 steps on LunarLander's 75,000-step decay: 0.013)."""
    cap = min(1_000, int(EPS_TOLERANCE * task.eps_decay_steps / (1 - MATCHED.eps_end)))
    fits = [n for n in range(20, cap + 1, 20) if task.eval_interval % n == 0]
    return max(fits, default=20)


def env_runners(track: str, cpus: int) -> int:
    """RLlib's remote env runners: one with two or more CPUs on the matched track (sampling in a process of its
    own), none otherwise (the local env runner in the learner's process; the tuned track keeps its example's)."""
    return 1 if cpus >= 2 and track == "matched" else 0


def _whole(x: float) -> int | float:
    """``x`` as an int when it is one (facts compare with ints), else as it is."""
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x


class RLlibContestant(Contestant):
    """RLlib's DQN on the new API stack (see the module docstring)."""

    def __init__(self, name: str, track: str, task: Task, seed: int, cpus: int = 1, config: int = 0):
        if name not in BUFFERS:
            raise ValueError(f"RLlibContestant runs {', '.join(BUFFERS)}, not {name!r}")
        if track not in TRACKS[name]:
            raise ValueError(f"{name} does not race in the {track} track")
        super().__init__(name, track, task, seed, cpus, config)
        self.algo = None
        self._own_ray = False
        self._threads_before: int | None = None

    # ------------------------------------------------------------------ settings

    @classmethod
    def settings(cls, name: str, track: str, task: Task, cpus: int = 1, config: int = 0) -> dict:
        """The declared settings (no ray import): the RLlib config values ``config()`` sets, by track and core
        budget (two or more CPUs on the matched track: one remote env runner, RLlib's own parallel sampling)."""
        if name not in BUFFERS:
            raise ValueError(f"RLlibContestant runs {', '.join(BUFFERS)}, not {name!r}")
        if track not in TRACKS[name]:
            raise ValueError(f"{name} does not race in the {track} track")
        common = {"framework": f"ray[rllib] {_ray_version()}", "api_stack": "new", "algorithm": "DQN",
                  "num_env_runners": env_runners(track, cpus), "num_envs_per_env_runner": 1, "num_learners": 0,
                  "torch_threads": TORCH_THREADS, "evaluation": "the race's (RLlib's evaluation off)",
                  "min_sample_timesteps_per_iteration": iteration_steps(task)}
        if track == "matched":
            m = MATCHED
            fragment = round(1 / m.updates_per_step)           # env steps sampled per training_step: 4
            return common | {
                "buffer": BUFFERS[name], "buffer_capacity": m.buffer_capacity, "alpha": m.alpha, "beta": m.beta,
                "double_q": m.double_q, "dueling": m.dueling,
                "fcnet_hiddens": list(m.hidden[:1]), "fcnet_activation": m.activation,
                "head_fcnet_hiddens": list(m.hidden[1:]), "head_fcnet_activation": m.activation,
                "td_error_loss_fn": "huber", "loss": m.loss, "grad_clip": m.grad_clip, "grad_clip_by": "global_norm",
                "optimizer": "Adam", "lr": m.lr, "train_batch_size_per_learner": m.batch_size, "gamma": m.gamma,
                "n_step": m.n_step, "tau": 1.0,
                "target_network_update_freq": _whole(m.target_update / m.updates_per_step),  # env steps
                "target_update": m.target_update,                                            # updates
                "rollout_fragment_length": fragment,
                # RLlib's native ratio counts the local env runner beside the remote ones (dqn.py
                # calculate_rr_weights: batch / (fragment x envs x (runners + 1))), though only remote ones sample
                # when there are any: with one remote runner the intensity is halved to keep 0.25
                "training_intensity": m.batch_size * m.updates_per_step * max(1, env_runners(track, cpus))
                / (env_runners(track, cpus) + 1),
                "updates_per_step": m.updates_per_step,
                "num_steps_sampled_before_learning_starts": task.learning_starts,
                "epsilon": [[0, 1.0], [task.eps_decay_steps, m.eps_end]],
            }
        from pal_bench.studies.race.tuning import overrides

        tune = overrides(name, config)
        e, d = EXAMPLE | {k: tune[k] for k in ("lr", "batch_size") if k in tune}, RLLIB_DEFAULTS
        intensity = (e["batch_size"] * tune["updates_per_step"] if "updates_per_step" in tune
                     else d["training_intensity"])
        return common | {
            "example": f"{e['repo']}:{e['file']}@{e['commit']} (before the move: {e['before_move']}; "
                       f"ray {e['ray_release']})",
            "scaling": f"epsilon decay x task.max_steps / {e['timesteps']} (the example's default timesteps)",
            "buffer": e["buffer"], "buffer_capacity": e["buffer_capacity"], "alpha": e["alpha"], "beta": e["beta"],
            "double_q": e["double_q"], "dueling": e["dueling"],
            "fcnet_hiddens": list(e["fcnet_hiddens"]), "fcnet_activation": e["fcnet_activation"],
            "fcnet_bias_initializer": e["fcnet_bias_initializer"],
            "head_fcnet_hiddens": list(e["head_fcnet_hiddens"]), "head_fcnet_activation": d["head_fcnet_activation"],
            "head_fcnet_bias_initializer": e["head_fcnet_bias_initializer"],
            "td_error_loss_fn": d["td_error_loss_fn"], "grad_clip": d["grad_clip"], "grad_clip_by": d["grad_clip_by"],
            "optimizer": "Adam", "lr": e["lr"], "train_batch_size_per_learner": e["batch_size"], "gamma": d["gamma"],
            "n_step": list(e["n_step"]), "tau": d["tau"],
            "target_network_update_freq": tune.get("target_network_update_freq", d["target_network_update_freq"]),
            "rollout_fragment_length": d["rollout_fragment_length"], "training_intensity": intensity,
            "updates_per_step": tune.get("updates_per_step", 1 / e["n_step"][1]),
            "num_steps_sampled_before_learning_starts": d["learning_starts"],
            "epsilon": [[0, 1.0], [tune.get("eps_decay_steps", cls.tuned_eps_decay(task)), e["eps_end"]]],
            "tuning": config,
        }

    @staticmethod
    def tuned_eps_decay(task: Task) -> int:
        """The example's epsilon decay, scaled from its default run length to the task's budget."""
        return max(1, round(EXAMPLE["eps_decay_steps"] * task.max_steps / EXAMPLE["timesteps"]))

    def config(self):
        """The ``DQNConfig`` of ``settings()`` (imports ray)."""
        from ray.rllib.algorithms.dqn import DQNConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        s = self.settings(self.name, self.track, self.task, self.cpus, self.tuning)
        replay = {"type": s["buffer"], "capacity": s["buffer_capacity"], "alpha": s["alpha"], "beta": s["beta"]}
        if self.name == "rllib-pal":
            replay["seed"] = self.seed                          # PAL's sampling RNG (RLlib's buffer has none)
        model = {k: s[k] for k in ("fcnet_hiddens", "fcnet_activation", "head_fcnet_hiddens", "head_fcnet_activation",
                                   "fcnet_bias_initializer", "head_fcnet_bias_initializer") if k in s}
        n_step = tuple(s["n_step"]) if isinstance(s["n_step"], list) else s["n_step"]
        return (DQNConfig()
                .environment(self.task.env)
                .env_runners(num_env_runners=s["num_env_runners"], num_envs_per_env_runner=s["num_envs_per_env_runner"],
                             rollout_fragment_length=s["rollout_fragment_length"])
                .learners(num_learners=s["num_learners"])
                .training(lr=s["lr"], gamma=s["gamma"], train_batch_size_per_learner=s["train_batch_size_per_learner"],
                          n_step=n_step, double_q=s["double_q"], dueling=s["dueling"],
                          td_error_loss_fn=s["td_error_loss_fn"], grad_clip=s["grad_clip"],
                          grad_clip_by=s["grad_clip_by"], tau=s["tau"],
                          target_network_update_freq=s["target_network_update_freq"],
                          training_intensity=s["training_intensity"],
                          num_steps_sampled_before_learning_starts=s["num_steps_sampled_before_learning_starts"],
                          epsilon=[tuple(p) for p in s["epsilon"]], replay_buffer_config=replay)
                .rl_module(model_config=DefaultModelConfig(**model))
                .evaluation(evaluation_interval=None)
                .reporting(min_sample_timesteps_per_iteration=s["min_sample_timesteps_per_iteration"],
                           min_time_s_per_iteration=None, min_train_timesteps_per_iteration=0)
                .debugging(seed=self.seed))

    # ------------------------------------------------------------------ build and read back

    def build(self) -> None:
        import ray
        import torch

        from pal_bench.train.backends.ray.session import local_ray

        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(TORCH_THREADS)               # the local Learner and EnvRunner run in this process
        self._own_ray = not ray.is_initialized()
        local_ray()
        self.algo = self.config().build_algo()

    def _learner(self, fn):
        """``fn(learner)`` on the (local) Learner."""
        (result,) = list(self.algo.learner_group.foreach_learner(fn))
        if not result.ok:
            raise result.get()
        return result.get()

    def facts(self) -> dict:
        """Read back from the built algorithm: the learner's module, optimizer and config, the env runner, the
        replay buffer and RLlib's own update-rhythm arithmetic."""
        from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
        from ray.rllib.core import DEFAULT_MODULE_ID

        algo = self.algo
        cfg = algo.config

        def read(learner):
            import torch

            module = learner.module[DEFAULT_MODULE_ID].unwrapped()
            online = {n: p for n, p in module.named_parameters() if not n.startswith("_target_")}
            target = {n: p for n, p in module.named_parameters() if n.startswith("_target_")}
            q_net = [module.encoder, module.af] + ([module.vf] if module.uses_dueling else [])
            linears = [m for net in q_net[:2] for m in net.modules() if isinstance(m, torch.nn.Linear)]
            acts = sorted({type(m).__name__.lower() for net in q_net for m in net.modules()
                           if type(m).__module__ == "torch.nn.modules.activation"})
            optim = learner.get_optimizer(DEFAULT_MODULE_ID)
            mcfg = learner.config.get_config_for_module(DEFAULT_MODULE_ID)
            return {"n_params": sum(p.numel() for p in online.values()),
                    "n_params_target": sum(p.numel() for p in target.values()),
                    "hidden": [m.out_features for m in linears[:-1]],
                    "activation": ",".join(acts),
                    "dueling": bool(module.uses_dueling), "module_double_q": bool(module.uses_double_q),
                    "double_q": bool(mcfg.double_q), "epsilon": [list(p) for p in module.model_config["epsilon"]],
                    "optimizer": type(optim).__name__, "lr": float(optim.param_groups[0]["lr"]),
                    "adam_eps": float(optim.param_groups[0]["eps"]),
                    "gamma": float(mcfg.gamma), "n_step": mcfg.n_step, "tau": float(mcfg.tau),
                    "target_network_update_freq": int(mcfg.target_network_update_freq),
                    "loss_fn": mcfg.td_error_loss_fn, "num_atoms": int(mcfg.num_atoms),
                    "grad_clip": float(mcfg.grad_clip or 0.0), "grad_clip_by": mcfg.grad_clip_by,
                    "torch_threads": torch.get_num_threads()}

        f = self._learner(read)
        # (with remote env runners the local one holds no environment: the configured count per runner)
        n_envs = cfg.num_envs_per_env_runner * max(1, cfg.num_env_runners)
        fragment = cfg.get_rollout_fragment_length()
        store, train = calculate_rr_weights(cfg)
        ups = train / (store * fragment * n_envs)                  # updates per sampled env step, as configured
        buf = algo.local_replay_buffer
        loss = ("huber(delta=1) x importance weights, batch mean" if f["loss_fn"] == "huber" and f["num_atoms"] == 1
                else f"{f['loss_fn']} (num_atoms {f['num_atoms']}) x importance weights, batch mean")
        n_step = list(f["n_step"]) if isinstance(f["n_step"], (list, tuple)) else int(f["n_step"])
        return {
            "n_params": f["n_params"], "n_params_target": f["n_params_target"], "hidden": f["hidden"],
            "activation": f["activation"], "torch_threads": f["torch_threads"], "n_envs": n_envs,
            "batch_size": int(cfg.total_train_batch_size), "n_step": n_step,
            "target_update": _whole(f["target_network_update_freq"] * ups), "target_update_env_steps":
                f["target_network_update_freq"], "tau": f["tau"],
            "double_q": f["double_q"] and f["module_double_q"], "dueling": f["dueling"], "gamma": f["gamma"],
            "lr": f["lr"], "optimizer": f["optimizer"], "adam_eps": f["adam_eps"], "grad_clip": f["grad_clip"],
            "grad_clip_by": f["grad_clip_by"], "loss": loss,
            "buffer": type(buf).__name__, "buffer_capacity": int(buf.capacity), "alpha": float(buf._alpha),
            "beta": float(cfg.replay_buffer_config["beta"]),
            "updates_per_step": ups, "rollout_fragment_length": fragment,
            "training_intensity": cfg.training_intensity, "rr_weights": [store, train],
            "num_env_runners": int(cfg.num_env_runners),
            "learning_starts": int(cfg.num_steps_sampled_before_learning_starts),
            "epsilon": f["epsilon"], "eps_end": float(f["epsilon"][-1][1]),
            "eps_decay_steps": int(f["epsilon"][-1][0]),
        }

    # ------------------------------------------------------------------ training

    def act(self, obs: np.ndarray) -> int:
        """Greedy action of the env runner's module (synced from the learner after every update)."""
        import torch

        with torch.no_grad():
            out = self.algo.get_module().forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
        return int(out["actions"][0])

    @staticmethod
    def counters(result: dict, batch: int) -> dict:
        """RLlib's own counters in one ``algo.train()`` result: env steps sampled, and updates (module steps
        trained / batch: one gradient step per batch)."""
        from ray.rllib.core import DEFAULT_MODULE_ID

        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        trained = result.get("learners", {}).get(DEFAULT_MODULE_ID, {}).get("num_module_steps_trained_lifetime", 0)
        trained = 0 if trained is None or (isinstance(trained, float) and math.isnan(trained)) else trained
        return {"env_steps": steps, "updates": _whole(trained / batch),
                "module_steps_trained": int(trained),
                "target_updates": int(result.get("learners", {}).get(DEFAULT_MODULE_ID, {})
                                      .get("num_target_updates", 0) or 0)}

    def optimizer_steps(self) -> int:
        """Adam's own step count (its ``state["step"]``, the same for every parameter): gradient updates made."""
        from ray.rllib.core import DEFAULT_MODULE_ID

        def steps(learner):
            optim = learner.get_optimizer(DEFAULT_MODULE_ID)
            counts = {int(s["step"]) for s in optim.state.values() if "step" in s}
            return max(counts) if counts else 0

        return self._learner(steps)

    def attach(self, counters) -> None:
        """The local learner's Adam, the module's target networks (``get_target_network_pairs``), the env-step count
        RLlib passes to the learner after each update (``after_gradient_based_update``'s ``timesteps``), the
        priorities the buffer receives per update (the loss's TD errors), and epsilon as the env runner's module
        last used it (read after each ``algo.train()`` call, at the last env step it served)."""
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

        learner = self.algo.learner_group._learner
        counters.watch_optimizer(learner.get_optimizer(DEFAULT_MODULE_ID))
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        counters.watch_target([p for _, target in module.get_target_network_pairs() for p in target.parameters()])
        after = learner.after_gradient_based_update

        def after_update(*, timesteps):
            counters.saw_env_steps(timesteps[NUM_ENV_STEPS_SAMPLED_LIFETIME])
            return after(timesteps=timesteps)

        learner.after_gradient_based_update = after_update
        buf = self.algo.local_replay_buffer
        update = buf.update_priorities

        def priorities(priorities, *args, **kwargs):
            counters.priorities(len(priorities))
            return update(priorities, *args, **kwargs)

        buf.update_priorities = priorities
        self._counters = counters

    def epsilon_now(self) -> float:
        """The epsilon the env runner's module used last (the remote runner's, when there is one)."""
        if self.algo.config.num_env_runners:
            (eps,) = self.algo.env_runner_group.foreach_env_runner(
                lambda r: float(r.module.epsilon_schedule.get_current_value()), local_env_runner=False)
            return eps
        return float(self.algo.env_runner.module.epsilon_schedule.get_current_value())

    def train(self, clock: Clock) -> dict:
        if clock.t_train0 is None:                           # the race normally starts it between build and train
            clock.started()
        batch = int(self.algo.config.total_train_batch_size)
        self.last = {"env_steps": 0, "updates": 0}
        counters = getattr(self, "_counters", None)
        while True:
            self.last = self.counters(self.algo.train(), batch)
            if counters is not None:            # (the epsilon of the call's last env step)
                counters.epsilon(self.last["env_steps"] - 1, self.epsilon_now())
            if clock.tick(self.last["env_steps"], self.act):
                break
        return {"env_steps": self.last["env_steps"], "updates": self.last["updates"]}

    def close(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None
        if self._own_ray:
            import ray

            ray.shutdown()
            self._own_ray = False
        if self._threads_before is not None:
            import torch

            torch.set_num_threads(self._threads_before)
            self._threads_before = None
