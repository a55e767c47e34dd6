"""The tuned track's equal tuning budget: every framework gets the same number of configurations on the task, each
run on ``TUNING_SEEDS`` seeds, starting from its own published example (configuration 0); the tuned track then runs
each framework's best configuration (the smallest median wall time to target over its seeds, a run that never
reached counted at its stop) on its full seeds.

``SEARCH[contestant]`` lists ``(name, overrides)``: the overrides apply to that contestant's tuned settings (its
``settings(..., config=k)``). PAL starts from its preset for the task (the matched learner) and has its Ape-X preset
among its configurations; tianshou from its LunarLander example; RLlib from its CartPole DQN example (it has no
LunarLander one) with epsilon's decay scaled to the run length. Each list moves the knobs its framework's own
example exposes: the learning rate, the update rhythm, the batch, the target period, exploration, the replay.
"""

from __future__ import annotations

CONFIGS_PER_FRAMEWORK = 6
TUNING_SEEDS = 2

SEARCH: dict[str, tuple[tuple[str, dict], ...]] = {
    "pal-processes": (
        ("its preset (the matched learner)", {}),
        ("Ape-X preset", {"preset": "apex"}),
        ("lr 1e-3", {"lr": 1e-3}),
        ("0.5 updates per env step", {"updates_per_step": 0.5}),
        ("batch 64", {"batch_size": 64}),
        ("target copy every 500 updates", {"target_update": 500}),
    ),
    "tianshou": (
        ("its LunarLander example", {}),
        ("lr 1e-3", {"lr": 1e-3}),
        ("0.25 updates per env step", {"update_per_step": 0.25}),
        ("prioritized replay (alpha 0.6, beta 0.4)", {"prioritized": True}),
        ("4 training envs, 0.25 updates per env step", {"num_training_envs": 4, "collection_step_num_env_steps": 4,
                                                        "update_per_step": 0.25}),
        ("lr 3e-3, target copy every 250 updates", {"lr": 3e-3, "target_update_freq": 250}),
    ),
    "rllib": (
        ("its CartPole example, epsilon scaled", {}),
        ("lr 1e-3", {"lr": 1e-3}),
        ("batch 64", {"batch_size": 64}),
        # (its fragment is its n-step bound, 5 env steps: 2 updates a fragment; RLlib refuses a set fragment
        # beside a ranged n-step)
        ("0.4 updates per env step", {"updates_per_step": 0.4}),
        ("epsilon decay over 75,000 env steps", {"eps_decay_steps": 75_000}),
        ("target copy every 2,000 env steps", {"target_network_update_freq": 2_000}),
    ),
}


def overrides(name: str, config: int) -> dict:
    """The tuned-settings overrides of configuration ``config`` of ``name`` (0: its starting point, none)."""
    if config == 0:
        return {}
    if name not in SEARCH:
        raise ValueError(f"{name} has no tuning configurations (only {', '.join(SEARCH)})")
    if not 0 <= config < len(SEARCH[name]):
        raise ValueError(f"{name} has configurations 0-{len(SEARCH[name]) - 1}, not {config}")
    return dict(SEARCH[name][config][1])


def config_name(name: str, config: float) -> str:
    """The name of configuration ``config`` of ``name``'s search; "not in the tuning search" for a number the search
    does not have (read from a stored file: never an index from the end, never an error)."""
    if name not in SEARCH:
        return "its settings"
    known = float(config).is_integer() and 0 <= config < len(SEARCH[name])
    return SEARCH[name][int(config)][0] if known else "not in the tuning search"


def search_left(rows, names) -> int:
    """How many runs of the search of ``names`` (those with configurations) are not stored, when some are (0 when
    the search is complete or not begun): ``rows`` as for ``best_configs``, superseded runs not counted."""
    names = [n for n in names if n in SEARCH]
    want = {(n, c, s) for n in names for c in range(len(SEARCH[n])) for s in range(TUNING_SEEDS)}
    if rows is None or len(rows) == 0:
        return 0
    rows = rows[rows.superseded_by.isna()] if "superseded_by" in rows else rows
    have = {(r.contestant, int(r.config), int(r.seed)) for r in rows.itertuples()} & want
    return len(want - have) if have else 0


def best_configs(rows) -> dict[str, int]:
    """{contestant: its best configuration} over the tuning runs' rows (a DataFrame with ``contestant``, ``config``,
    ``wall_to_target_s`` and, where present, ``superseded_by`` and ``over_budget``): the smallest median wall time
    to target (set-up plus training; a run that never reached counted at its stop), ties to the lower number; only
    configurations with every tuning seed stored compete."""
    if rows is None or len(rows) == 0:
        return {}
    rows = rows[rows.superseded_by.isna()] if "superseded_by" in rows else rows
    if "over_budget" in rows:
        rows = rows[~rows.over_budget.fillna(False).astype(bool)]
    best: dict[str, tuple[float, int]] = {}
    for (name, config), g in sorted(rows.groupby(["contestant", "config"]), key=lambda kv: kv[0]):
        if len(g) < TUNING_SEEDS:
            continue
        m = float(g.wall_to_target_s.median())
        if name not in best or m < best[name][0]:
            best[name] = (m, int(config))
    return {name: c for name, (_, c) in best.items()}
