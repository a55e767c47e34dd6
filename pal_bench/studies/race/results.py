"""The race's tables, from stored run files only.

Machine-independent: **env steps to target** per contestant over seeds (median, its exact order-statistic
interval, the fraction of seeds reaching the target). Machine-dependent: **env steps per second** from the
interleaved speed rounds of one sitting, and **wall time to target** (set-up plus training, evaluation excluded;
with evaluation as well) of runs whose speed probes agree. A run that never reached the target counts at the
steps and time it ran: a lower bound, marked ``>=``; a ratio is a lower bound where the peer has such runs, an
upper bound where PAL has, unknown (``?``) where both have.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pal_bench.bench.stats import median_order_ci, pairing_range, ratio_ci
from pal_bench.studies.race.pin import over_budget
from pal_bench.studies.race.runfiles import finite_number, run_key, superseded, whole_count
from pal_bench.studies.race.task import ENV_DIMS, EPS_SEEN_EVERY, TASKS, SettingsMismatch, check_counted, check_matched

PAL_MATCHED = ("pal", "pal-processes")      # PAL's matched contestants; the best of them is compared with the peers
MIN_SEEDS_FOR_BOOTSTRAP = 10

# the run-time counters of a run (``counters.RunCounters``: hooks on the framework's own objects), as race.csv columns:
# optimizer steps, target-network copies, the env step of the first update, the batch the loss saw, optimizer steps
# per env step after learning starts, and epsilon as the contestant used it at the task's learning start, half way
# through its decay and at its end (the last value seen at or before that env step, within ``EPS_SEEN_EVERY``)
COUNTER_COLUMNS = ["optimizer_steps", "target_copies", "first_update_env_step", "batch_size_seen",
                   "counted_updates_per_env_step", "eps_learning_start", "eps_mid_decay", "eps_decay_end"]
RUN_COLUMNS = ["track", "cpus", "contestant", "config", "seed", "run_id", "reached", "steps_to_target",
               "wall_to_target_s", "wall_with_eval_to_target_s", "train_to_target_s", "wall_s", "train_s", "eval_s",
               "setup_s", "env_steps", "env_steps_per_s", "rate_after_start", "updates_per_env_step",
               *COUNTER_COLUMNS, "matched_check", "own_cores", "over_budget", "n_params", "torch_threads", "probe_s",
               "best_return", "noisy", "superseded_by", "rerun_of", "rerun_reason", "commit", "settings_hash",
               "started", "finished", "load_before"]


def run_row(run: dict) -> dict:
    """One run as a row of ``race.csv``. A run that never reached the target gets its steps and times at the stop
    in the *_to_target columns, with ``reached`` False (a lower bound)."""
    task = TASKS[run["task"]]
    hit = next((e for e in run["curve"] if e["mean_return"] >= task.target), None)
    returns = [e["mean_return"] for e in run["curve"]]
    if hit is not None:
        steps, train, evals = hit["env_steps"], hit["train_s"], hit["eval_s"]
    else:
        steps, train, evals = run["env_steps"], run["train_s"], run["eval_s"]
    own = run.get("own_cores")          # (runs stored before the core budgets: their detector counted some twice)
    rate = run_rate(run)
    return {"track": run["track"], "cpus": run.get("cpus"), "contestant": run["contestant"],
            "config": int(run.get("config", 0)), "seed": run["seed"],
            "run_id": run.get("run_id"), "reached": hit is not None,
            "steps_to_target": int(steps), "wall_to_target_s": round(run["setup_s"] + train, 2),
            "wall_with_eval_to_target_s": round(run["setup_s"] + train + evals, 2),
            "train_to_target_s": round(train, 2), "wall_s": run["wall_s"], "train_s": run["train_s"],
            "eval_s": run["eval_s"], "setup_s": run["setup_s"], "env_steps": run["env_steps"],
            "env_steps_per_s": run["env_steps_per_s"], "rate_after_start": None if rate is None else round(rate, 1),
            "updates_per_env_step": run["updates_per_env_step"], **counted_columns(run),
            "matched_check": matched_check(run), "own_cores": own,
            "over_budget": over_budget(own, run.get("cpus")),
            "n_params": run.get("n_params"), "torch_threads": run.get("torch_threads"), "probe_s": run.get("probe_s"),
            "best_return": max(returns) if returns else None, "noisy": bool(run.get("noisy")),
            "superseded_by": run.get("superseded_by"), "rerun_of": run.get("rerun_of"),
            "rerun_reason": run.get("rerun_reason"), "commit": run.get("commit"),
            "settings_hash": run.get("settings_hash"), **_when(run.get("conditions"))}


COUNTER_FIELDS = ("env_steps", "optimizer_steps", "target_copies", "first_update_env_step", "batch_size")


def _counters(run: dict) -> dict | None:
    """The run's stored run-time counters with every value of its type and range (a run file is data: a count that
    is not a whole number >= 0, a rate or an epsilon that is not a finite number, an ``eps_seen`` entry that is not
    an (env step, epsilon) pair is left out, and named in ``"invalid"``); None when the run stored none."""
    c = run.get("counters")
    if not isinstance(c, dict):
        return None
    out = {k: c[k] for k in COUNTER_FIELDS if whole_count(c.get(k))}
    invalid = [k for k in COUNTER_FIELDS if k not in out and not (k == "first_update_env_step" and c.get(k) is None)]
    if finite_number(c.get("updates_per_env_step"), 0.0, math.inf):
        out["updates_per_env_step"] = c["updates_per_env_step"]
    else:
        invalid.append("updates_per_env_step")
    sizes = c.get("batch_sizes")
    if isinstance(sizes, dict) and all(isinstance(k, str) and whole_count(v) for k, v in sizes.items()):
        out["batch_sizes"] = sizes
    else:
        invalid.append("batch_sizes")
    seen = c.get("eps_seen")
    if isinstance(seen, list):
        out["eps_seen"] = [(int(e[0]), float(e[1])) for e in seen if isinstance(e, (list, tuple)) and len(e) == 2
                           and whole_count(e[0]) and finite_number(e[1], -math.inf, math.inf)]
    if not isinstance(seen, list) or len(out["eps_seen"]) != len(seen):
        invalid.append("eps_seen")
    out["invalid"] = invalid
    return out


def learning_starts(run: dict) -> int:
    """The env step the run's learner started at: its ``facts``' own where that is a whole number, else its task's."""
    facts = run.get("facts") if isinstance(run.get("facts"), dict) else {}
    starts = facts.get("learning_starts")
    return starts if whole_count(starts) else TASKS[run["task"]].learning_starts


def eps_at(seen: list[tuple[int, float]], env_step: int) -> float | None:
    """Epsilon as last seen at or before ``env_step``, if seen within ``EPS_SEEN_EVERY`` env steps of it."""
    before = [(t, e) for t, e in seen if env_step - EPS_SEEN_EVERY < t <= env_step]
    return round(max(before)[1], 4) if before else None


def counted_columns(run: dict) -> dict:
    """``COUNTER_COLUMNS`` of one run (None where the run stored no such count)."""
    c = _counters(run) or {}
    task = TASKS[run["task"]]
    seen = c.get("eps_seen", [])
    return {"optimizer_steps": c.get("optimizer_steps"), "target_copies": c.get("target_copies"),
            "first_update_env_step": c.get("first_update_env_step"), "batch_size_seen": c.get("batch_size"),
            "counted_updates_per_env_step": c.get("updates_per_env_step"),
            "eps_learning_start": eps_at(seen, task.learning_starts),
            "eps_mid_decay": eps_at(seen, task.eps_decay_steps // 2),
            "eps_decay_end": eps_at(seen, task.eps_decay_steps)}


MAX_CHECK_TEXT = 300        # characters of a matched check's reason kept in race.csv (the facts' values are data)


def matched_check(run: dict) -> str | None:
    """A matched run's settings checked again from its file: "passed" when what it built (``facts``, with its
    measured updates per env step) passes ``check_matched`` and its run-time counters pass ``check_counted``, as
    they did when it ran; else why not. None on the tuned track (nothing to match)."""
    if run.get("track") != "matched":
        return None
    counted = _counters(run)
    if counted is None:
        return "no run-time counters stored"
    if counted["invalid"]:
        return f"run-time counters missing or not of their type: {', '.join(counted['invalid'])}"
    task = TASKS[run["task"]]
    starts = learning_starts(run)
    if starts != task.learning_starts:
        return f"learning starts at env step {starts} (matched: {task.learning_starts})"
    if counted["env_steps"] != run["env_steps"]:
        return f"counted {counted['env_steps']} env steps, the run says {run['env_steps']}"
    if abs(counted["optimizer_steps"] / max(1, counted["env_steps"] - starts) - counted["updates_per_env_step"]) > 1e-4:
        return (f"counted {counted['optimizer_steps']} optimizer steps in {counted['env_steps'] - starts} env steps "
                f"after learning starts, but {counted['updates_per_env_step']} updates per env step")
    facts = run["facts"] if isinstance(run.get("facts"), dict) else {}
    try:
        check_matched(run["contestant"], facts | {"updates_per_step": run["updates_per_env_step"]},
                      *ENV_DIMS[task.env], measured=True, exact_types=True)
        check_counted(run["contestant"], counted, task, starts)
    except SettingsMismatch as e:
        text = str(e)
        return text if len(text) <= MAX_CHECK_TEXT else text[:MAX_CHECK_TEXT - 1] + "\u2026"
    return "passed"


def _when(conditions) -> dict:
    """The run's own start and finish (UTC, ISO 8601) and the load average before it, from its conditions."""
    c = conditions if isinstance(conditions, dict) else {}
    load = c.get("load_before")
    return {"started": c.get("started") if isinstance(c.get("started"), str) else None,
            "finished": c.get("finished") if isinstance(c.get("finished"), str) else None,
            "load_before": load if finite_number(load, 0.0, 1e6) else None}


def sitting(df: pd.DataFrame) -> str:
    """One line on when the rows ``df`` ran: first start to last finish (UTC), the commits, the load average
    before the runs; '' when the rows do not say (runs stored before race.csv carried their times)."""
    if "started" not in df or df.started.isna().all():
        return ""
    start = pd.to_datetime(df.started, utc=True, errors="coerce").dropna()
    end = pd.to_datetime(df.get("finished", df.started), utc=True, errors="coerce").dropna()
    if start.empty:
        return ""
    fmt = "%Y-%m-%d %H:%M"
    span = f"{start.min().strftime(fmt)} to {(end.max() if len(end) else start.max()).strftime(fmt)} UTC"
    commits = sorted({str(c) for c in df.commit.dropna()}) if "commit" in df else []
    load = pd.to_numeric(df.get("load_before"), errors="coerce").dropna() if "load_before" in df else []
    return (f"Runs: {len(df)}, {span}" + (f"; commit {', '.join(commits)}" if commits else "")
            + (f"; load before each run {load.min():.2f}-{load.max():.2f}" if len(load) else "") + ".")


def run_rate(run: dict) -> float | None:
    """The run's own env steps per training second after learning starts: from its first evaluation at or past
    learning start to its last one (None with fewer than two such evaluations)."""
    starts = learning_starts(run)
    pts = [e for e in run.get("curve", []) if e["env_steps"] >= starts]
    if len(pts) < 2 or pts[-1]["train_s"] <= pts[0]["train_s"]:
        return None
    return (pts[-1]["env_steps"] - pts[0]["env_steps"]) / (pts[-1]["train_s"] - pts[0]["train_s"])


def runs_frame(runs: list[dict]) -> pd.DataFrame:
    """``race.csv``: every run, ``superseded_by`` from the runs themselves (the run that names it in ``rerun_of``),
    ``over_budget`` from its CPU time and budget (not from what the file says)."""
    gone = superseded([r for r in runs if r.get("run_id")])
    return pd.DataFrame([run_row(r) | {"superseded_by": gone.get(run_key(r))} for r in runs],
                        columns=RUN_COLUMNS)


def track_runs(df: pd.DataFrame, track: str, cpus: int | None, every_draw: bool = False) -> pd.DataFrame:
    """The rows of one track on a budget of ``cpus`` CPUs (None: the runs stored before the budgets), over budget
    left out; by default the current runs only (``every_draw``: the superseded ones too, every draw kept)."""
    c = df.cpus if "cpus" in df else pd.Series(float("nan"), index=df.index)
    same = c.isna() if cpus is None else (pd.to_numeric(c, errors="coerce") == cpus)
    out = df[(df.track == track) & same]
    if "over_budget" in out:
        out = out[~out.over_budget.fillna(False).astype(bool)]
    if not every_draw and "superseded_by" in out:
        out = out[out.superseded_by.isna() | (out.superseded_by.astype(str) == "")]
    return out


CURVE_KEYS = ("env_steps", "train_s", "eval_s", "setup_s", "mean_return")     # an evaluation (runfiles checks them)


def curves_frame(runs: list[dict]) -> pd.DataFrame:
    """Every evaluation of every current run (a run another superseded is left out), with its track and CPUs; only
    an evaluation's own checked fields (``CURVE_KEYS``) are read from it, so none can stand for the run's."""
    gone = superseded([r for r in runs if r.get("run_id")])
    return pd.DataFrame([{k: e[k] for k in CURVE_KEYS} | {"track": r["track"], "cpus": r.get("cpus"),
                                                         "contestant": r["contestant"], "seed": r["seed"]}
                         for r in runs if run_key(r) not in gone
                         and not over_budget(r.get("own_cores"), r.get("cpus")) for e in r["curve"]],
                        columns=["track", "cpus", "contestant", "seed", *CURVE_KEYS])


def figure_name(task_sfx: str, track: str, cpus) -> str:
    """``race[_quick]_<track>[_<N>cpu].png`` (no CPU part for the runs stored before the core budgets)."""
    c = pd.to_numeric(pd.Series([cpus]), errors="coerce").iloc[0]
    return f"race{task_sfx}_{track}" + ("" if pd.isna(c) else f"_{int(c)}cpu") + ".png"


def tuning_frame(runs: list[dict]) -> pd.DataFrame:
    """``race_tuning.csv``: one row per tuning run (its configuration's number and name, and the race.csv columns),
    with ``best`` marking every run of each contestant's best configuration (``tuning.best_configs``) once its
    search is complete (before, a configuration not yet run on both seeds could still beat it)."""
    from pal_bench.studies.race.tuning import best_configs, config_name, search_left

    gone = superseded([r for r in runs if r.get("run_id")])
    df = pd.DataFrame([{"config_name": config_name(r["contestant"], int(r.get("config", 0))), **run_row(r),
                        "superseded_by": gone.get(run_key(r))}
                       for r in runs], columns=["config", "config_name", *(c for c in RUN_COLUMNS if c != "config")])
    best = {n: c for n, c in best_configs(df).items() if not search_left(df, [n])}
    df.insert(2, "best", [best.get(n) == c for n, c in zip(df.contestant, df.config)])
    return df


def over_budget_runs(df: pd.DataFrame, track: str, cpus: int | None) -> pd.DataFrame:
    """The runs of one track and budget that used more CPU than the budget (left out of every table)."""
    if "over_budget" not in df or cpus is None:
        return df.iloc[:0]
    c = pd.to_numeric(df.cpus, errors="coerce")
    return df[(df.track == track) & (c == cpus) & df.over_budget.fillna(False).astype(bool)]


def speed_frame(runs: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"track": r["track"], "cpus": r.get("cpus"), "round": r["round"],
                          "contestant": r["contestant"],
                          "env_steps_per_s": round(r["env_steps_per_s"], 1),
                          "updates_per_s": round(r["updates_per_s"], 1),
                          "updates_per_env_step": r["updates_per_env_step"],
                          "noisy": bool(r.get("noisy")), "commit": r.get("commit")} for r in runs],
                        columns=["track", "cpus", "round", "contestant", "env_steps_per_s", "updates_per_s",
                                 "updates_per_env_step", "noisy", "commit"])


def _num(v: float, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def median_cell(values: pd.Series, censored: bool, digits: int = 0) -> str:
    """``median [low, high]`` of the order-statistic interval (its exact coverage when below 95%), ``>=`` before a
    value that is a lower bound."""
    med, lo, hi, cover = median_order_ci(values.astype(float))
    mark = ">= " if censored else ""
    note = "" if cover >= 0.95 else f" ({cover:.0%} range of {len(values)})"
    return f"{mark}{_num(med, digits)} [{_num(lo, digits)}, {_num(hi, digits)}]{note}"


def peers(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the contestants that are not PAL's (every contestant whose name does not start with "pal")."""
    return df[~df.contestant.astype(str).str.startswith("pal")]


def best_pal(df: pd.DataFrame) -> str | None:
    """PAL's matched contestant with the smallest median wall time to target (runs that never reached counted at
    their stop)."""
    pal = df[df.contestant.isin(PAL_MATCHED)]
    if pal.empty:
        return None
    return pal.groupby("contestant").wall_to_target_s.median().idxmin()


def ratio_cell(peer: pd.Series, pal: pd.Series, peer_censored: bool, pal_censored: bool) -> str:
    """Ratio of medians peer / PAL, the range over every seed pairing, and a bootstrap 95% interval only where both
    sides have at least ``MIN_SEEDS_FOR_BOOTSTRAP`` seeds."""
    if peer.empty or pal.empty:
        return ""
    point = float(np.median(peer) / np.median(pal))
    lo, hi = pairing_range(peer, pal)
    mark = {(True, False): ">= ", (False, True): "<= ", (True, True): "? "}.get((peer_censored, pal_censored), "")
    cell = f"{mark}{point:.2f}x (pairings {lo:.2f}-{hi:.2f})"
    if len(peer) >= MIN_SEEDS_FOR_BOOTSTRAP and len(pal) >= MIN_SEEDS_FOR_BOOTSTRAP:
        _, blo, bhi = ratio_ci(peer, pal)
        cell += f" [{blo:.2f}, {bhi:.2f}]"
    return cell


def target_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per contestant: seeds, fraction reaching the target, env steps to target and wall time to target (medians
    with order-statistic intervals), and the peer / PAL ratios of both."""
    ref = best_pal(df)
    ref_runs = df[df.contestant == ref] if ref else df.iloc[:0]
    rows = []
    for name, g in df.groupby("contestant", sort=False):
        # a median is a lower bound only where a run that stopped before the target could move it
        steps_moved = censoring_moves_median(g.steps_to_target, g.reached)
        wall_moved = censoring_moves_median(g.wall_to_target_s, g.reached)
        row = {"contestant": name, "seeds": len(g), "reached": f"{int(g.reached.sum())}/{len(g)}",
               "env steps to target": median_cell(g.steps_to_target, steps_moved),
               "wall to target, s (eval excluded)": median_cell(g.wall_to_target_s, wall_moved, 1),
               "with eval, s": _num(float(g.wall_with_eval_to_target_s.median()), 1)}
        if ref and name != ref:
            row[f"steps / {ref}'s"] = ratio_cell(g.steps_to_target, ref_runs.steps_to_target, steps_moved,
                                                 censoring_moves_median(ref_runs.steps_to_target, ref_runs.reached))
            row[f"wall / {ref}'s"] = ratio_cell(g.wall_to_target_s, ref_runs.wall_to_target_s, wall_moved,
                                                censoring_moves_median(ref_runs.wall_to_target_s, ref_runs.reached))
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def speed_table(sp: pd.DataFrame) -> pd.DataFrame:
    """Per contestant over the interleaved rounds: median env steps/s with the range, median updates/s, and each
    peer's speed as a fraction of PAL's best (ratio of medians, range over round pairings)."""
    if sp.empty:
        return pd.DataFrame()
    med = sp.groupby("contestant").env_steps_per_s.median()
    pal = [c for c in PAL_MATCHED if c in med.index]
    ref = max(pal, key=lambda c: med[c]) if pal else None
    rows = []
    for name, g in sp.groupby("contestant", sort=False):
        v = g.env_steps_per_s.astype(float)
        row = {"contestant": name, "rounds": len(g),
               "env steps/s": f"{v.median():,.0f} [{v.min():,.0f}, {v.max():,.0f}]",
               "updates/s": f"{g.updates_per_s.median():,.1f}",
               "updates per env step": f"{g.updates_per_env_step.median():.3f}"}
        if ref and name != ref:
            r = sp[sp.contestant == ref].env_steps_per_s.astype(float)
            lo, hi = pairing_range(r, v)
            row[f"{ref} / this"] = f"{r.median() / v.median():.2f}x (pairings {lo:.2f}-{hi:.2f})"
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


SETTINGS_ROWS = ("n_params", "hidden", "double_q", "dueling", "loss", "grad_clip", "lr", "batch_size", "gamma",
                 "n_step", "buffer_capacity", "alpha", "beta", "target_update", "n_envs", "updates_per_step",
                 "torch_threads")


def settings_table(runs: list[dict]) -> pd.DataFrame:
    """The settings side by side, read from the run files (each contestant's ``facts``: what its framework built),
    plus the measured updates per env step (median over its runs)."""
    by: dict[str, dict] = {}
    measured: dict[str, list] = {}
    for r in runs:
        by.setdefault(r["contestant"], r["facts"])
        measured.setdefault(r["contestant"], []).append(r["updates_per_env_step"])
    keys = [k for k in SETTINGS_ROWS if any(k in f for f in by.values())]
    extra = sorted({k for f in by.values() for k in f} - set(SETTINGS_ROWS))
    table = {name: {k: _plain(f.get(k, "")) for k in keys + extra} for name, f in by.items()}
    for name in table:
        table[name]["measured updates per env step"] = f"{np.median(measured[name]):.3f}"
    return pd.DataFrame(table).rename_axis("setting").reset_index()


def _plain(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "-".join(str(x) for x in v) if all(isinstance(x, int) for x in v) else str(list(v))
    return str(v)


PHASE_NAMES = {"rate_wait": "rate wait", "sample": "sample", "forward_backward": "forward/backward",
               "priority_update": "priority update", "apply": "apply its gradient", "weights_pull": "weight pull",
               "inference": "policy forward", "env_step": "env step", "buffer_insert": "buffer insert",
               "aggregation_wait": "aggregation wait", "grant_wait": "grant wait",
               "gradient_publish": "gradient publish"}


def phase_table(runs: list[dict]) -> pd.DataFrame:
    """PAL contestants' per-phase time (``phase_seconds`` of their run files), summed over every run of a
    contestant per worker role (actor, learner), as shares of that role's recorded time, largest first."""
    rows = []
    by: dict[tuple[str, str], dict[str, float]] = {}
    for r in runs:
        for worker, phases in (r.get("phase_seconds") or {}).items():
            role = worker.rstrip("0123456789")
            if role not in ("actor", "learner"):
                continue
            acc = by.setdefault((r["contestant"], role), {})
            for phase, s in phases.items():
                if phase != "setup":
                    acc[phase] = acc.get(phase, 0.0) + float(s)
    for (contestant, role), acc in sorted(by.items()):
        total = sum(acc.values())
        if total <= 0:
            continue
        shares = sorted(acc.items(), key=lambda kv: -kv[1])
        rows.append({"contestant": contestant, "worker": role, "seconds": f"{total:.0f}",
                     "phases (share of the worker's time)": ", ".join(
                         f"{PHASE_NAMES.get(p, p)} {s / total:.1%}" for p, s in shares if s / total >= 0.005)})
    return pd.DataFrame(rows)


def censoring_moves_median(values: pd.Series, reached: pd.Series) -> bool:
    """Whether a run stopped before the target (its value a lower bound) sits at or below the median's order
    statistics, so that its true value could move the median: only then is a median a lower bound ("at least")."""
    order = np.argsort(np.asarray(values, float), kind="stable")
    n = len(order)
    if n == 0:
        return False
    upper = n // 2                                   # 0-based rank of the upper of the middle values (or the middle)
    censored = ~np.asarray(reached, bool)[order]
    return bool(censored[:upper + 1].any())


def bound_word(peer_moved: bool, pal_moved: bool) -> str:
    """What censoring makes of a ratio of medians peer / PAL: "at least " (the peer's median is a lower bound),
    "at most " (PAL's is), "" (neither), or None where both are (the ratio is unknown)."""
    return {(True, False): "at least ", (False, True): "at most ", (False, False): ""}.get((peer_moved, pal_moved))


def interval_text(r: dict) -> str:
    """The two 95% intervals of ``ratio_intervals`` as words: where too few seeds make the order-statistic one cover
    less, its true coverage; where the bootstrap cannot be made (fewer than two seeds a side), said so."""
    boot = (f"bootstrap n/a (fewer than {MIN_SEEDS_FOR_BOOTSTRAP} seeds a side)" if not np.isfinite(r["boot_low"])
            else f"bootstrap {r['boot_low']:.1f}-{r['boot_high']:.1f}")
    order = f"order statistics {r['order_low']:.1f}-{r['order_high']:.1f}"
    if r["order_coverage"] < 0.95:
        order += f" (covers {r['order_coverage']:.0%}: too few seeds for 95%)"
    return f"{boot}, {order}"


def ratio_intervals(peer: pd.Series, pal: pd.Series, level: float = 0.95) -> dict:
    """The median ratio peer / PAL with two 95% intervals: a bootstrap one (both samples resampled) and a
    distribution-free one from the medians' exact order-statistic intervals (each at ``sqrt(level)``, so that both
    hold together with probability at least ``level``: [peer low / PAL high, peer high / PAL low]). The bootstrap
    one only where both have ``MIN_SEEDS_FOR_BOOTSTRAP`` seeds (NaN otherwise)."""
    point, blo, bhi = ratio_ci(peer, pal, level=level)
    if min(len(peer), len(pal)) < MIN_SEEDS_FOR_BOOTSTRAP:      # (as the tables: no bootstrap on fewer seeds)
        blo = bhi = float("nan")
    each = math.sqrt(level)
    _, plo, phi, pc = median_order_ci(peer.astype(float), each)
    _, qlo, qhi, qc = median_order_ci(pal.astype(float), each)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = np.float64(plo) / np.float64(qhi), np.float64(phi) / np.float64(qlo)
    return {"ratio": point, "boot_low": blo, "boot_high": bhi, "order_low": float(lo), "order_high": float(hi),
            "order_coverage": pc * qc}
