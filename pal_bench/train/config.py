"""Training configuration: one dataclass, per-algorithm defaults, TOML/YAML files, CLI overrides.

Resolution order: dataclass defaults < the algorithm's ``DEFAULTS`` (and its per-env table) < a
config file < ``--set key=value`` / explicit CLI flags. ``validate`` checks everything before any
thread starts and names the offending field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from pal_bench.argtypes import (
    CAPACITY,
    COUNT,
    FINITE,
    NONNEG,
    NONNEG_FLOAT,
    POSITIVE,
    SEED,
    WORKERS,
    Range,
    UsageError,
)
from pal_bench.train.errors import ConfigError  # noqa: F401 - re-exported: callers catch it from here
from pal_bench.train.rate_policy import unsent_bound
from pal_bench.untrusted import read_bytes

ALGOS = ("dqn", "ddqn", "ddpg", "td3", "sac", "r2d2")
Q_ALGOS = ("dqn", "ddqn", "r2d2")                      # epsilon-greedy, discrete actions
CONTINUOUS_ALGOS = ("ddpg", "td3", "sac")


@dataclass
class TrainConfig:
    """Everything a run needs. Counts are transitions (env steps summed over all envs) unless noted."""

    algo: str = "dqn"
    env: str = "CartPole-v1"
    env_kwargs: dict = field(default_factory=dict)     # e.g. {"continuous": true} for LunarLander-v3
    name: str = ""                                     # run directory name (default: algo-env-actors-learners)
    out_dir: str = "results/runs"
    seed: int = 0

    # parallelism
    actors: int = 1
    envs_per_actor: int = 1
    learners: int = 1
    aggregation: str = "sync"                          # "sync": average one gradient per learner; "async";
                                                       # "allreduce" (backend ray, or processes with learner
                                                       # processes): gloo all-reduce among the learners
    max_staleness: int = 4                             # async: drop a gradient older than this many versions
    env_backend: str = "sync"                          # "sync" (in-thread) or "async" (subprocesses)
    pin_cores: bool = False                            # pin each worker thread to a core (round robin)
    deterministic: bool | None = None                  # lockstep actor/learner; None: on for 1 actor + 1 learner

    # backend: where the workers run (pal_bench.train.backends: threads, processes, ray)
    backend: str = "threads"                           # "threads", "processes" (actor processes) or "ray"
    learner_processes: bool = False                    # backend "processes": learners as processes on the shared
                                                       # buffer (default: threads beside the parameter server)
    ray_address: str | None = None                     # join this Ray cluster; None: start a local Ray
    ray_placement: str = "auto"                        # "node": the process backend's shared-memory pieces on the
    #                                                    driver's node; "pack" or "spread" Ray actors over the nodes;
    #                                                    "auto": "node" unless the run needs Ray actors (placement)
    ray_remote_actors: bool = False                    # ray_placement "node": the actors on the cluster's other nodes,
    #                                                    sending chunks to an inserter on the driver's node
    ray_chunk: int = 256                               # transitions an actor sends to the buffer per call
    ray_prefetch: int = 1                              # sampled batches a learner has in flight beyond the one used
    learner_timeout_s: float = 30.0                    # sync (ray): apply a round without a learner this late (s)
    buffer_checkpoint_interval: int = 0                # ray: buffer actor checkpoint every N transitions (0: off)
    # long-haul layouts (backend ray, DQN family; pal_bench.studies.longhaul): edge actors feed a buffer node and
    # one learner sits behind `link`; replay at the learner ("learner-replay") or at the node ("buffer-replay")
    topology: str = "local"                            # "local" (the layout above), "learner-replay", "buffer-replay"
    link: str = "none"                                 # link preset: none, fibre-10km, wan, wan-1MBps
    actor_rate: float = 0.0                            # edge env steps/s, all actors together (0: unpaced)

    # budget and rate control
    steps: int = 50_000                                # total env transitions
    learning_starts: int = 1_000
    updates_per_step: float = 0.25                     # learner updates (batches) per collected transition
    rate_slack: int = 0                                # transitions actors may run ahead (0: auto)

    # replay
    buffer_capacity: int = 100_000                     # transitions (r2d2: sequences)
    prioritized: bool = True
    alpha: float = 0.6
    beta: float = 0.4
    beta_final: float = 1.0                            # beta annealed linearly to this over the run
    batch_size: int = 128
    actor_priorities: bool = False                     # Ape-X: actors compute initial priorities
    local_buffer: int = 1                              # env steps an actor gathers per insert (Ape-X: 50), with
                                                       # one pass of actor_priorities over them

    # learning
    gamma: float = 0.99
    n_step: int = 1
    lr: float = 1e-3
    critic_lr: float = 1e-3                            # actor-critic algorithms
    hidden: tuple = (256, 256)
    grad_clip: float = 10.0                            # gradient norm clip (0: off)
    target_update: int = 250                           # DQN family: hard copy every N parameter-server steps
    tau: float = 0.005                                 # actor-critic algorithms: Polyak averaging
    eps_start: float = 1.0                             # DQN family: epsilon-greedy schedule
    eps_end: float = 0.05
    eps_fraction: float = 0.3                          # of `steps` over which epsilon decays
    exploration: str = "decay"                         # DQN family: "decay" (the schedule above, every actor) or
                                                       # "apex": actor i of N fixed at apex_eps^(1 + apex_alpha i/(N-1))
    apex_eps: float = 0.4                              # Ape-X (Horgan et al. 2018): base epsilon
    apex_alpha: float = 7.0                            # Ape-X: exponent spread over the actors
    dueling: bool = False                              # DQN family: value and advantage streams (Wang et al. 2016)
    # R2D2 (Kapturowski et al. 2019; its head is always dueling): replayed sequences and the recurrent state
    seq_len: int = 80                                  # steps per replayed sequence
    seq_overlap: int = 40                              # steps a sequence shares with the next of its episode
    burn_in: int = 40                                  # first steps of a sequence only refresh the LSTM state
    lstm_size: int = 64
    priority_eta: float = 0.9                          # sequence priority: eta max |delta| + (1 - eta) mean |delta|
    exploration_noise: float = 0.1                     # DDPG/TD3 Gaussian noise (action scale)
    policy_noise: float = 0.2                          # TD3 target smoothing
    noise_clip: float = 0.5
    policy_delay: int = 2                              # TD3
    sac_alpha: float = 0.2                             # SAC initial entropy coefficient
    autotune: bool = True                              # SAC: learn the entropy coefficient

    # evaluation, logging, checkpoints
    eval_interval: int = 5_000                         # transitions between evaluations
    eval_episodes: int = 5                             # 0: no evaluation (throughput measurements)
    checkpoint_interval: int = 0                       # transitions between checkpoints (0: only at the end)
    stop_return: float | None = None                   # stop once an evaluation's mean return reaches this
    eval_pauses_training: bool = False                 # actors and learners wait while the driver evaluates (so
                                                       # that evaluation is outside the training clock: the race)
    progress: bool = True

    def run_name(self) -> str:
        """``name``, or one made of algo, env (a namespaced id's ``/`` as ``-``), actors, learners and seed."""
        env = self.env.replace("/", "-").replace("\\", "-")
        return self.name or f"{self.algo}-{env}-a{self.actors}-l{self.learners}-s{self.seed}"

    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.run_name()

    @property
    def placement(self) -> str:
        """``ray_placement`` resolved: "auto" is "node" unless the run needs its learners, buffer or environments
        in Ray actors (``aggregation = "allreduce"``, ``env_backend = "async"``, ``buffer_checkpoint_interval``),
        then "pack"."""
        if self.ray_placement != "auto":
            return self.ray_placement
        needs_actors = self.aggregation == "allreduce" or self.env_backend == "async" or self.buffer_checkpoint_interval
        return "pack" if needs_actors else "node"

    @property
    def lockstep(self) -> bool:
        if self.deterministic is None:
            return self.actors == 1 and self.learners == 1 and self.aggregation == "sync" and self.local_buffer == 1
        return self.deterministic

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d


FIELD_TYPES = {f.name: f.type for f in fields(TrainConfig)}

UNIT = Range(0, 1)
# every number's range, declared once: checked when a value is set (file, --set, flag) and again by validate;
# hidden's range is each layer's width. Cross-field rules (learning_starts <= buffer_capacity, ...) are in validate.
FIELD_RANGES: dict[str, Range] = {
    "seed": SEED,                                           # np.random.seed takes [0, 2**32)
    "actors": WORKERS, "envs_per_actor": WORKERS, "learners": WORKERS,
    "max_staleness": NONNEG, "ray_chunk": Range(1, 2**20), "ray_prefetch": Range(0, 1024),
    "learner_timeout_s": Range(0, 10**6, lo_open=True), "buffer_checkpoint_interval": NONNEG,
    "actor_rate": NONNEG_FLOAT, "steps": COUNT, "learning_starts": NONNEG,
    "updates_per_step": Range(0, 10**4, lo_open=True), "rate_slack": NONNEG,
    "buffer_capacity": CAPACITY,                            # the buffer's own limit; validate checks memory too
    "alpha": UNIT, "beta": UNIT, "beta_final": UNIT, "batch_size": Range(1, 2**20), "local_buffer": Range(1, 10**6),
    "gamma": UNIT, "n_step": Range(1, 10**4), "lr": Range(0, 1, lo_open=True), "critic_lr": Range(0, 1, lo_open=True),
    "hidden": Range(1, 2**16), "grad_clip": NONNEG_FLOAT, "target_update": COUNT, "tau": UNIT,
    "eps_start": UNIT, "eps_end": UNIT, "eps_fraction": UNIT, "apex_eps": Range(0, 1, lo_open=True),
    "apex_alpha": Range(0, 100), "seq_len": Range(2, 10**5), "seq_overlap": Range(0, 10**5),
    "burn_in": Range(0, 10**5), "lstm_size": Range(1, 2**16), "priority_eta": UNIT,
    "exploration_noise": NONNEG_FLOAT, "policy_noise": NONNEG_FLOAT, "noise_clip": NONNEG_FLOAT,
    "policy_delay": Range(1, 10**6), "sac_alpha": POSITIVE, "eval_interval": NONNEG,
    "eval_episodes": Range(0, 10**6), "checkpoint_interval": NONNEG, "stop_return": FINITE,
}
MAX_LAYERS = 64


def _yaml_problem(e: Exception, line: bool) -> str:
    """A YAML error's problem and where it is: "at column C" in a one-line value, "(at line L, column C)"
    in a file."""
    mark = getattr(e, "problem_mark", None)
    where = "" if mark is None else (f" (at line {mark.line + 1}, column {mark.column + 1})" if line
                                     else f" at column {mark.column + 1}")
    return f"{getattr(e, 'problem', None) or e}{where}"


def _coerce(name: str, value: Any) -> Any:
    """Convert a value (from a file or a ``key=value`` string) to the field's type."""
    if name not in FIELD_TYPES:
        raise ConfigError(f"unknown config field {name!r}; known: {', '.join(sorted(FIELD_TYPES))}")
    default = getattr(TrainConfig(), name)
    if isinstance(value, str) and not isinstance(default, str):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"{name}: cannot read {value!r} as a value ({_yaml_problem(e, line=False)})") from None
        except RecursionError:
            raise ConfigError(f"{name}: the value is nested too deeply to read") from None
        except ValueError as e:         # e.g. an integer of more than 4300 digits
            raise ConfigError(f"{name}: cannot read the value ({str(e).split(';')[0]})") from None
    try:
        if name == "hidden":
            value = tuple(_whole(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        elif name == "deterministic":
            value = None if value is None else bool(value)
        elif name == "ray_address":
            value = None if value is None else str(value)
        elif name == "stop_return":
            if isinstance(value, bool):
                raise TypeError
            value = None if value is None else float(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise TypeError
        elif isinstance(default, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError
        elif isinstance(default, float):
            if isinstance(value, bool):
                raise TypeError
            value = float(value)
        elif isinstance(default, (dict, str)):
            if not isinstance(value, type(default)):
                raise TypeError
    except (TypeError, ValueError, OverflowError):
        kind = {"stop_return": "number", "hidden": "a list of layer widths"}.get(name, type(default).__name__)
        raise ConfigError(f"{name}: expected {kind}, got {value!r}") from None
    check_field(name, value)
    return value


def _whole(v: Any) -> int:
    """A layer width: an int, or a float that is a whole number; TypeError otherwise."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError
    return v


def check_field(name: str, value: Any) -> None:
    """``ConfigError`` naming the field when ``value`` is outside the field's declared range (``FIELD_RANGES``),
    or, for ``name``, is more than one path component."""
    if name == "name":
        _check_name(value)
    elif name == "out_dir" and "\x00" in value:
        raise ConfigError(f"out_dir: a path cannot hold a NUL character, got {value!r}")
    elif name == "hidden":
        if not 1 <= len(value) <= MAX_LAYERS:
            raise ConfigError(f"hidden: expected 1 to {MAX_LAYERS} layer widths, got {list(value)}")
        for v in value:
            if (why := FIELD_RANGES["hidden"].problem(v)) is not None:
                raise ConfigError(f"hidden: every layer width {why}, got {list(value)}")
    elif name in FIELD_RANGES and value is not None:
        if (why := FIELD_RANGES[name].problem(value)) is not None:
            raise ConfigError(f"{name} {why}, got {value!r}")


def _check_name(name: str) -> None:
    """A run name is one path component inside ``out_dir`` ("" means the default name)."""
    if name in (".", "..") or any(c in name for c in "/\\\x00") or len(name.encode()) > 255:
        raise ConfigError(f"name: a run name is one directory name inside --out (no '/', '\\', NUL, '.' or "
                          f"'..', at most 255 bytes), got {name!r}")


def _parse(path: Path, text: str) -> Any:
    """The TOML or YAML document ``text`` of ``path``; a syntax error is a ``ConfigError`` naming line and column."""
    if path.suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:         # the message names line and column
            raise ConfigError(f"config file {path}: not valid TOML: {e}") from None
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: not valid YAML: {_yaml_problem(e, line=True)}") from None


MAX_CONFIG_BYTES = 1 << 20       # a config is a few hundred bytes


def load_file(path: str | os.PathLike) -> dict:
    """Read a TOML (.toml) or YAML (.yaml/.yml) file into a dict of fields."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"config file {path}: expected .toml, .yaml or .yml")
    try:
        # a small regular file (a link to one is followed): a FIFO or a link to /dev/zero is one line, not a hang
        raw = read_bytes(path, MAX_CONFIG_BYTES, label=f"config file {path}", follow_links=True)
    except UsageError as e:
        raise ConfigError(str(e)) from None
    try:
        data = _parse(path, raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path}: not a text file (not UTF-8 at byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: nested too deeply to read") from None
    except ConfigError:
        raise
    except ValueError as e:             # e.g. an integer of more than 4300 digits
        raise ConfigError(f"config file {path}: cannot read a value ({str(e).split(';')[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of fields")
    return data


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# what a resumed run may change: how long it runs and how it is watched, not what it trains
RESUMABLE = ("steps", "eval_interval", "eval_episodes", "checkpoint_interval", "stop_return", "progress")
LOCATION = ("name", "out_dir")


def resume_config(run_dir: str | os.PathLike, overrides: dict) -> TrainConfig:
    """The config a run in ``run_dir`` was started with (its ``config.yaml``), with ``overrides`` applied to
    the fields a resumed run may change (``RESUMABLE``). An override of any other field that differs from the
    saved value is a ``ConfigError`` naming the field and the run's value."""
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"resume: no run to resume in {run_dir} (no config.yaml); start it without --resume")
    saved = make_config(file=path)
    for k, v in overrides.items():
        if v is None or k in LOCATION:
            continue
        new = _coerce(k, v)
        if new == getattr(saved, k):
            continue
        if k not in RESUMABLE:
            raise ConfigError(f"{k}: cannot change when resuming (the run has {k} = {getattr(saved, k)!r}); a "
                              f"resumed run may change only {', '.join(RESUMABLE)}")
        setattr(saved, k, new)
    saved.name, saved.out_dir = run_dir.name, str(run_dir.parent)
    return saved


# named sets of fields (``preset = "apex"`` in a file, ``--preset apex``), applied over the algorithm's
# defaults and under the file and overrides
PRESETS = {
    # Ape-X (Horgan et al. 2018): one learner, many actors; Double DQN with a dueling head, 3-step returns,
    # prioritized replay with priorities computed by the actors, each actor at its own fixed epsilon
    "apex": dict(algo="ddqn", dueling=True, n_step=3, prioritized=True, actor_priorities=True,
                 local_buffer=50, exploration="apex", learners=1),
}


def make_config(algo: str | None = None, env: str | None = None, file: str | None = None,
                preset: str | None = None, **overrides) -> TrainConfig:
    """Build a config: defaults, then the algorithm's defaults (per env too), then ``preset`` (``PRESETS``),
    then ``file``, then ``overrides``."""
    layers: list[dict] = []
    data = load_file(file) if file else {}
    preset = preset or data.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    chosen = dict(PRESETS.get(preset, {}))
    preset_algo = chosen.pop("algo", None)
    given = overrides.get("algo") or algo or data.get("algo")
    if preset_algo and given not in (None, preset_algo):
        raise ConfigError(f"algo: preset {preset!r} trains {preset_algo}, not {given}")
    algo = given or preset_algo or "dqn"
    env = overrides.get("env") or env or data.get("env") or None
    if algo not in ALGOS:
        raise ConfigError(f"algo: unknown algorithm {algo!r}; choose one of {', '.join(ALGOS)}")
    from pal_bench.train.algos import module_for

    mod = module_for(algo)
    env = env or mod.DEFAULT_ENV
    layers.append(dict(mod.DEFAULTS))
    layers.append(dict(mod.ENV_DEFAULTS.get(env, {})))
    layers.append(chosen)
    layers.append(data)
    layers.append({k: v for k, v in overrides.items() if v is not None})
    cfg = TrainConfig(algo=algo, env=env)
    for layer in layers:
        for k, v in layer.items():
            setattr(cfg, k, _coerce(k, v))
    cfg.algo, cfg.env = algo, env
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Raise ``ConfigError`` naming the field, before anything is built."""
    if cfg.algo not in ALGOS:
        raise ConfigError(f"algo: unknown algorithm {cfg.algo!r}; choose one of {', '.join(ALGOS)}")
    for f in fields(cfg):        # every number in its declared range, the name one path component
        check_field(f.name, getattr(cfg, f.name))
    if cfg.local_buffer > 1 and cfg.deterministic:
        raise ConfigError(f"local_buffer: lockstep runs (deterministic) insert every vector step; local_buffer "
                          f"{cfg.local_buffer} would hold back the steps the learner waits for")
    if cfg.local_buffer > 1 and cfg.rate_slack and cfg.rate_slack < unsent_bound(cfg):
        raise ConfigError(f"rate_slack ({cfg.rate_slack}) must be >= {unsent_bound(cfg)} with local_buffer "
                          f"{cfg.local_buffer}: actors {cfg.actors} x (local_buffer + envs_per_actor) held back, plus "
                          f"the steps of one update; less would stop actors and learners waiting on each other")
    if cfg.learning_starts > cfg.buffer_capacity and cfg.algo != "r2d2":
        raise ConfigError(f"learning_starts ({cfg.learning_starts}) must be <= buffer_capacity "
                          f"({cfg.buffer_capacity})")
    if cfg.learning_starts < cfg.batch_size and cfg.algo != "r2d2":
        raise ConfigError(f"learning_starts ({cfg.learning_starts}) must be >= batch_size ({cfg.batch_size})")
    if cfg.backend not in ("threads", "processes", "ray"):
        raise ConfigError(f"backend must be 'threads', 'processes' or 'ray', got {cfg.backend!r}")
    if cfg.aggregation not in ("sync", "async", "allreduce"):
        raise ConfigError(f"aggregation must be 'sync', 'async' or 'allreduce', got {cfg.aggregation!r}")
    if cfg.aggregation == "allreduce" and cfg.backend != "ray" and not (cfg.backend == "processes"
                                                                        and cfg.learner_processes):
        raise ConfigError("aggregation: 'allreduce' needs learners in processes of their own: backend = 'ray', or "
                          "backend = 'processes' with learner_processes (learner threads share one parameter server)")
    if cfg.ray_placement not in ("auto", "node", "pack", "spread"):
        raise ConfigError(f"ray_placement must be 'auto', 'node', 'pack' or 'spread', got {cfg.ray_placement!r}")
    if cfg.backend == "ray" and cfg.placement == "node" and cfg.aggregation == "allreduce":
        raise ConfigError("aggregation: 'allreduce' needs learners in Ray actors (ray_placement 'pack' or 'spread'); "
                          "on one node ('node') the learners share the driver's parameter server")
    if cfg.ray_remote_actors and (cfg.backend != "ray" or cfg.placement != "node"):
        raise ConfigError("ray_remote_actors: remote actors and their inserter need backend = 'ray' with "
                          "ray_placement = 'node'")
    if cfg.backend == "ray" and cfg.placement == "node" and cfg.env_backend == "async":
        raise ConfigError("env_backend: 'async' is not built for ray_placement 'node' (its actors run the process "
                          "backend's actor body; use env_backend = 'sync')")
    if cfg.env_backend not in ("sync", "async"):
        raise ConfigError(f"env_backend must be 'sync' or 'async', got {cfg.env_backend!r}")
    if cfg.backend == "ray" and cfg.placement == "node" and cfg.buffer_checkpoint_interval:
        raise ConfigError("buffer_checkpoint_interval: the buffer actor's checkpoints need ray_placement 'pack' or "
                          "'spread' (on one node ('node') the buffer is the node's shared segment, checkpointed with "
                          "the run)")
    if cfg.eval_pauses_training and cfg.backend == "ray" and cfg.placement != "node":
        raise ConfigError("eval_pauses_training: the Ray backend's workers cannot be paused for an evaluation "
                          "(backend threads or processes, or ray_placement 'node')")
    if cfg.stop_return is not None and not (cfg.eval_interval and cfg.eval_episodes):
        raise ConfigError("stop_return needs evaluations (eval_interval > 0 and eval_episodes > 0)")
    if cfg.exploration not in ("decay", "apex"):
        raise ConfigError(f"exploration must be 'decay' or 'apex', got {cfg.exploration!r}")
    if cfg.dueling and cfg.algo not in ("dqn", "ddqn"):
        extra = " (r2d2's head is always dueling)" if cfg.algo == "r2d2" else ""
        raise ConfigError(f"dueling is for the DQN family (dqn, ddqn), not {cfg.algo!r}{extra}")
    if cfg.exploration == "apex" and cfg.algo not in Q_ALGOS:
        raise ConfigError(f"exploration: 'apex' is for the epsilon-greedy algorithms ({', '.join(Q_ALGOS)}), "
                          f"not {cfg.algo!r}")
    if cfg.algo == "r2d2":
        _validate_r2d2(cfg)
    if cfg.topology != "local":
        from pal_bench.train import topology

        topology.get(cfg.topology).validate(cfg)
    elif cfg.link != "none":
        raise ConfigError(f"link: {cfg.link!r} needs a long-haul topology (topology = 'local' has no link)")
    if cfg.backend == "processes" and cfg.env_backend == "async":
        raise ConfigError("env_backend: 'async' steps environments in subprocesses, which the process backend's "
                          "actors cannot start (each actor is already a process; use env_backend = 'sync')")
    if cfg.learner_processes and cfg.backend != "processes":
        raise ConfigError(f"learner_processes: learner processes need backend = 'processes' (got {cfg.backend!r})")
    if cfg.backend in ("ray", "processes") and cfg.deterministic:
        raise ConfigError("deterministic: lockstep runs need backend = 'threads'")
    if cfg.lockstep and (cfg.actors != 1 or cfg.learners != 1):
        raise ConfigError("deterministic: lockstep runs need actors = 1 and learners = 1")
    # the environment exists and suits the algorithm
    import gymnasium as gym

    from pal_bench.train.envs import make_env

    try:
        env = make_env(cfg.env, **cfg.env_kwargs)
    except gym.error.Error as e:
        raise ConfigError(f"env: cannot make {cfg.env!r} ({e})") from None
    except TypeError as e:
        raise ConfigError(f"env_kwargs: {cfg.env!r} rejects {cfg.env_kwargs} ({e})") from None
    try:
        discrete = isinstance(env.action_space, gym.spaces.Discrete)
        if cfg.algo in CONTINUOUS_ALGOS and discrete:
            raise ConfigError(f"algo: {cfg.algo} needs a continuous action space, {cfg.env} has "
                              f"{env.action_space} (LunarLander-v3 takes env_kwargs={{continuous = true}})")
        if cfg.algo not in CONTINUOUS_ALGOS and not discrete:
            raise ConfigError(f"algo: {cfg.algo} needs a discrete action space, {cfg.env} has {env.action_space}")
        shape = tuple(env.observation_space.shape or ())
        image = len(shape) == 3 and env.observation_space.dtype == np.uint8
        if image and (cfg.algo not in Q_ALGOS or cfg.algo == "r2d2"):
            raise ConfigError(f"env: {cfg.env} has image observations {shape}; the convolutional network is the "
                              f"DQN family's ({', '.join(a for a in Q_ALGOS if a != 'r2d2')}), not {cfg.algo}'s")
        if len(shape) != 1 and not image:
            raise ConfigError(f"env: {cfg.env} has observations of shape {shape}; the MLP algorithms take flat "
                              "vectors, the DQN family also uint8 image stacks [C, H, W]")
        _check_memory(cfg, shape if image else shape[0], 1 if discrete else env.action_space.shape[0], not discrete,
                      env.observation_space.dtype)
    finally:
        env.close()


SLOT_OVERHEAD = 32      # bytes per buffer slot beside its record: priority tree levels, minimums, slot id


def _check_memory(cfg: TrainConfig, obs_dim, act_dim: int, continuous: bool, obs_dtype=None) -> None:
    """``buffer_capacity`` records must fit this machine's memory (unless the buffer lives on a Ray cluster)."""
    if cfg.ray_address is not None or not hasattr(os, "sysconf"):
        return
    from pal_bench.train.replay_spec import replay_fields, sequence_fields

    spec = (sequence_fields(obs_dim, cfg) if cfg.algo == "r2d2"
            else replay_fields(obs_dim, act_dim, continuous, obs_dtype or np.float32))
    record = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt in spec.values())
    need = cfg.buffer_capacity * (record + SLOT_OVERHEAD)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ConfigError(f"buffer_capacity: {cfg.buffer_capacity} records of {record} bytes need "
                          f"{need / 2**30:.1f} GiB, more than this machine's {have / 2**30:.1f} GiB of memory")


def _validate_r2d2(cfg: TrainConfig) -> None:
    """Sequence shape and what the recurrent trainer does not do."""
    if not 0 <= cfg.seq_overlap < cfg.seq_len:
        raise ConfigError(f"seq_overlap must be in [0, seq_len) = [0, {cfg.seq_len}), got {cfg.seq_overlap}")
    if not 0 <= cfg.burn_in < cfg.seq_len:
        raise ConfigError(f"burn_in must be in [0, seq_len) = [0, {cfg.seq_len}), got {cfg.burn_in}")
    first = cfg.seq_len * cfg.actors * cfg.envs_per_actor
    if cfg.learning_starts < first:
        raise ConfigError(f"learning_starts ({cfg.learning_starts}) must be >= seq_len * actors * envs_per_actor "
                          f"({first}) for r2d2, so that sequences are stored before the first update")
    if cfg.actor_priorities:
        raise ConfigError("actor_priorities: r2d2 actors insert sequences with the buffer's max priority "
                          "(actor-side sequence priorities are not implemented)")
    if cfg.topology != "local":
        raise ConfigError(f"topology: the long-haul layouts train the DQN family, not r2d2 (got {cfg.topology!r})")
