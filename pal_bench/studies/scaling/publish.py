"""The scaling study's publication: f_a / f_l tables (docs/scaling.md), the backends side by side and the
whole trainer per split (docs/backends.md), and every scaling figure redrawn from the stored CSVs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.bench.publishing import Publication, Unusable, esc, md, missing, source
from pal_bench.bench.stats import fmt_ci, median_ci, ratio_ci
from pal_bench.stored_tables import read_csv
from pal_bench.studies.scaling.figures import backends_figure, draw, draw_end_to_end, overhead_table


def _reps(cell) -> list[float]:
    return [float(v) for v in str(cell).split()] if isinstance(cell, str) else []


def _curves(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """f_a / f_l rows (of ``path``); the speedup over 1 worker with a bootstrap interval where the repetitions are
    stored (``Unusable`` where they are but the 1-worker point it is taken over is not)."""
    speedups = []
    for r in df.itertuples():
        base = df[(df.curve == r.curve) & (df.threads == 1)]
        if base.empty:
            raise Unusable(f"{path}: no 1-worker point for {r.curve}: the speedup over 1 worker is taken from it")
        mine, ref = _reps(getattr(r, "throughput_reps", None)), _reps(base.iloc[0].get("throughput_reps"))
        speedups.append(fmt_ci(*ratio_ci(mine, ref)) if r.threads > 1 and mine and ref else f"{r.speedup:.2f}")
    t = pd.DataFrame({"curve": df.curve, "workers": df.threads, "throughput": df.throughput,
                      "speedup [95% CI]": speedups, "efficiency": df.efficiency})
    if "cores_used" in df and df.cores_used.notna().any():
        t["cores used"] = df.cores_used
    t["oversubscribed"] = df.oversubscribed.map({True: "yes", False: ""})
    if "load1" in df:
        t["load"] = df.load1
    return t


def scaling_block(results: Path) -> str:
    parts = []
    for name, what in (("scaling.csv", "environments in the actor threads"),
                       ("scaling_async_env.csv", "environments in subprocesses (`--env-backend async`)")):
        # (speedup intervals: bootstrap over the interleaved rounds of `--repeats`, where stored)
        if (results / name).exists():
            df = read_csv(results / name)
            parts.append(f"Thread backend, {esc(df.algo.iloc[0])} on {esc(df.env.iloc[0])}, {what}: f_a in "
                         f"transitions/s, f_l in updates/s.\n\n" + md(_curves(df, results / name), ".2f") + "\n\n"
                         + source(results, name) + "\n")
    return "\n".join(parts) if parts else missing("scaling.csv", "make scaling")


def end_to_end_block(results: Path, name: str = "end_to_end.csv") -> str:
    path = results / name
    if not path.exists():
        return missing(name, "python -m pal_bench.studies.scaling --end-to-end 5000")
    df = read_csv(path)
    df["split"] = df.actors.astype(str) + " + " + df.learners.astype(str) + df.oversubscribed.map(
        {True: " (oversubscribed)", False: ""})
    df["variant"] = df.aggregation + ", env " + df.env_backend
    t = df.pivot_table(index="split", columns="variant", values="measured_transitions_per_s", aggfunc="first",
                       sort=False)
    u = df.pivot_table(index="split", columns="variant", values="measured_updates_per_s", aggfunc="first", sort=False)
    cell = t.round(0).astype("Int64").astype(str) + " / " + u.round(0).astype("Int64").astype(str)
    backend = df.backend.iloc[0] if "backend" in df else "threads"
    runs = (f"the median of {int(df['rounds'].min())} interleaved rounds per cell" if "rounds" in df
            else "one run per cell")
    return (f"The whole trainer ({esc(backend)} backend) at each split: env steps/s / updates/s, {runs}.\n\n"
            + md(cell.reset_index(), "g") + "\n\n" + source(results, name) + "\n")


def backends_block(results: Path) -> str:
    t_path, r_path = results / "scaling.csv", results / "scaling_ray.csv"
    if not (t_path.exists() and r_path.exists()):
        return missing("scaling_ray.csv", "python -m pal_bench.studies.scaling --backend ray")
    m = overhead_table(read_csv(t_path), read_csv(r_path))
    unit = {"f_a": "transition", "f_l": "update"}
    t = pd.DataFrame({"curve": m.curve, "workers": m.threads, "threads": m.throughput_threads, "Ray": m.throughput_ray,
                      "Ray / threads": m.ray_over_threads,
                      "Ray's extra cost": [f"{v:+.0f} µs per {unit[c]}" for c, v in zip(m.curve, m.overhead_us)]})
    return ("DQN on CartPole-v1: f_a (transitions/s) and f_l (updates/s) on the thread backend and on Ray.\n\n"
            + md(t, ".2f") + "\n\n" + source(results, "scaling.csv", "scaling_ray.csv") + "\n")


def end_to_end_ray_block(results: Path) -> str:
    return end_to_end_block(results, "end_to_end_ray.csv")


def end_to_end_processes_block(results: Path) -> str:
    return end_to_end_block(results, "end_to_end_processes.csv")


def processes_block(results: Path) -> str:
    """f_a and f_l of actor processes against threads, per worker count, with the issue's targets' ratios; and of
    learner processes (``scaling_learner_processes.csv``) where measured."""
    t_path, p_path = results / "scaling.csv", results / "scaling_processes.csv"
    if not (t_path.exists() and p_path.exists()):
        return missing("scaling_processes.csv", "python -m pal_bench.studies.scaling --backend processes")
    t, p = read_csv(t_path), read_csv(p_path)
    cols = ["curve", "threads", "throughput", "throughput_reps"]
    m = t.reindex(columns=cols).merge(p.reindex(columns=cols + ["speedup"]), on=["curve", "threads"],
                                      suffixes=("_threads", "_processes"))
    out = pd.DataFrame({"curve": m.curve, "workers": m.threads, "threads": m.throughput_threads,
                        "processes": m.throughput_processes,
                        "processes / threads [95% CI]": _paired(m.throughput_reps_processes, m.throughput_reps_threads,
                                                                m.throughput_processes / m.throughput_threads),
                        "processes: speedup over 1": m.speedup})
    sources = ["scaling.csv", "scaling_processes.csv"]
    note = "the process backend's learners are driver threads, as the thread backend's"
    lp_path = results / "scaling_learner_processes.csv"
    if lp_path.exists():
        lp = read_csv(lp_path).reindex(columns=cols)
        lp = lp[lp.curve == "f_l"].set_index("threads")
        fl = out.curve == "f_l"
        out["learner processes"] = out.workers.map(lp.throughput).where(fl)
        ratio = _paired(out.workers.map(lp.throughput_reps), m.throughput_reps_threads,
                        out["learner processes"] / out.threads)
        out["learner processes / threads [95% CI]"] = ratio.where(fl, "")
        sources.append("scaling_learner_processes.csv")
        note += "; then f_l with learner processes (`learner_processes = true`)"
    ar_path = results / "scaling_learner_allreduce.csv"
    if ar_path.exists():
        ar = read_csv(ar_path).reindex(columns=cols + ["speedup"])
        ar = ar[ar.curve == "f_l"].set_index("threads")
        fl = out.curve == "f_l"
        out["all-reduce learner processes"] = out.workers.map(ar.throughput).where(fl)
        out["all-reduce: speedup over 1"] = out.workers.map(ar.speedup).where(fl)
        sources.append("scaling_learner_allreduce.csv")
        note += ("; and learner processes that average among themselves (`aggregation = \"allreduce\"`), with "
                 "their speedup over one")
    return ("DQN on CartPole-v1: f_a (transitions/s, actors only) and f_l (updates/s, learners only) with actor "
            f"processes on the shared buffer against actor threads ({note}). Throughputs are medians over the "
            "rounds of `--repeats`; a ratio is the median over rounds of the two measured side by side in that "
            "round (each round measures every backend at that point, one after the other), with a bootstrap "
            "interval over rounds.\n\n" + md(out, ".2f") + "\n\n" + source(results, *sources) + "\n")


def _paired_range(mine, ref) -> str:
    """The median over rounds of mine[i] / ref[i] with the range over rounds (``1.02 (0.95-1.08)``): fewer than
    10 rounds make no interval."""
    a, b = _reps(mine), _reps(ref)
    if not a or len(a) != len(b):
        return ""
    r = sorted(x / y for x, y in zip(a, b))
    return f"{pd.Series(r).median():.2f} ({r[0]:.2f}-{r[-1]:.2f})"


def ray_node_block(results: Path) -> str:
    """Ray's one-node placement (``--backend ray-node``) against the thread and process backends measured in the
    same sweep (``--backend threads,processes,ray-node``): per point the median over rounds, and each ratio as the
    median of the rounds' paired ratios with their range."""
    paths = {b: results / f for b, f in (("threads", "scaling.csv"), ("processes", "scaling_processes.csv"),
                                         ("ray-node", "scaling_ray_node.csv"))}
    if not all(p.exists() for p in paths.values()):
        return missing("scaling_ray_node.csv",
                       "python -m pal_bench.studies.scaling --backend threads,processes,ray-node")
    cols = ["curve", "threads", "throughput", "throughput_reps"]
    t, p, r = (read_csv(paths[b]).reindex(columns=cols) for b in ("threads", "processes", "ray-node"))
    m = t.merge(p, on=["curve", "threads"], suffixes=("_t", "_p")).merge(r, on=["curve", "threads"])
    one = {c: m[(m.curve == c) & (m.threads == 1)] for c in ("f_a", "f_l")}
    out = pd.DataFrame({
        "curve": m.curve, "workers": m.threads, "threads": m.throughput_t, "processes": m.throughput_p,
        "Ray, one node": m.throughput,
        "Ray / threads (range)": [_paired_range(a, b) for a, b in zip(m.throughput_reps, m.throughput_reps_t)],
        "Ray / processes (range)": [_paired_range(a, b) for a, b in zip(m.throughput_reps, m.throughput_reps_p)],
        "Ray: speedup over 1 (range)": [_paired_range(a, one[c].throughput_reps.iloc[0]) if len(one[c]) else ""
                                        for a, c in zip(m.throughput_reps, m.curve)]})
    return ("DQN on CartPole-v1: f_a (transitions/s, actors only) and f_l (updates/s, learners only) with Ray's "
            "one-node placement (`ray_placement = \"node\"`: actor processes Ray starts on the driver's node, "
            "writing the shared segment; learners are the driver's threads) against the thread and process backends, "
            "measured point by point in one sweep. Throughputs are medians over rounds; a ratio is the median of the "
            "rounds' paired ratios with their range (too few rounds for an interval).\n\n" + md(out, ".2f") + "\n\n"
            + source(results, "scaling.csv", "scaling_processes.csv", "scaling_ray_node.csv") + "\n")


def _best_by_round(df: pd.DataFrame) -> tuple[list[float], str]:
    """Per round, the best env steps/s over every split and variant measured; and the split best at the median."""
    reps = [_reps(c) or [v] for c, v in zip(df.measured_transitions_per_s_reps, df.measured_transitions_per_s)]
    n = min(len(r) for r in reps)
    best = df.loc[df.measured_transitions_per_s.idxmax()]
    split = f"{best.actors} + {best.learners}, {best.aggregation}"
    return [max(r[i] for r in reps) for i in range(n)], split


def ray_node_end_to_end_block(results: Path) -> str:
    """The whole trainer, Ray's one-node placement against the process backend, measured in interleaved rounds
    (``--end-to-end STEPS --backend processes,ray-node``): each backend's best split per round, paired by round."""
    names = {"processes": "end_to_end_processes.csv", "ray-node": "end_to_end_ray_node.csv"}
    if not all((results / n).exists() for n in names.values()):
        return missing("end_to_end_ray_node.csv",
                       "python -m pal_bench.studies.scaling --backend processes,ray-node --end-to-end 5000")
    frames = {b: read_csv(results / n) for b, n in names.items()}
    if not all("measured_transitions_per_s_reps" in f and "rounds" in f for f in frames.values()):
        return missing("end_to_end_ray_node.csv (in rounds)",
                       "python -m pal_bench.studies.scaling --backend processes,ray-node --end-to-end 5000")
    rows, best = [], {}
    for b, df in frames.items():
        best[b], split = _best_by_round(df)
        rows.append({"backend": b, "rounds": len(best[b]), "best split (median)": split,
                     "best env steps/s per round (median)": pd.Series(best[b]).median(),
                     "range": f"{min(best[b]):.0f}-{max(best[b]):.0f}"})
    ratios = sorted(r / p for r, p in zip(best["ray-node"], best["processes"]))
    ratio = (f"Ray (one node) / processes, best split against best split, paired by round: "
             f"{pd.Series(ratios).median():.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f}, {len(ratios)} rounds: a "
             "range, not an interval)")
    return ("DQN on CartPole-v1, the whole trainer at every split of up to 3 workers (sync and async aggregation), "
            "the process backend and Ray's one-node placement in interleaved rounds; per round each backend's best "
            "split.\n\n" + md(pd.DataFrame(rows), ".0f") + "\n\n" + ratio + ".\n\n"
            + source(results, *names.values()) + "\n")


def two_nodes_block(results: Path) -> str:
    """``python -m pal_bench.studies.scaling.two_nodes``: one node against two, and the inserter's ceiling."""
    name = "end_to_end_ray_two_nodes.csv"
    path = results / name
    if not path.exists():
        return missing(name, "python -m pal_bench.studies.scaling.two_nodes")
    df = read_csv(path)
    runs = df[df.placement.isin(["one node", "two nodes"])]
    rows = []
    for placement, d in runs.groupby("placement", sort=False):
        rows.append({"placement": placement, "rounds": len(d), "env steps/s": d.env_steps_per_s.median(),
                     "range": f"{d.env_steps_per_s.min():.0f}-{d.env_steps_per_s.max():.0f}",
                     "updates/s": d.updates_per_s.median(), "MB/s into the inserter": d.mb_in_per_s.median(),
                     "inserter busy": d.inserter_busy.dropna().median() if d.inserter_busy.notna().any() else None})
    one = runs[runs.placement == "one node"].set_index("round").env_steps_per_s
    two = runs[runs.placement == "two nodes"].set_index("round").env_steps_per_s
    paired = sorted((two / one).dropna())
    ratio = (f"two nodes / one node, paired by round: {pd.Series(paired).median():.2f} "
             f"({paired[0]:.2f}-{paired[-1]:.2f}, {len(paired)} rounds)" if paired else "")
    ceil = df[df.placement.str.startswith("ceiling")].groupby("placement").agg(
        rows_per_s=("rows_per_s", "median"), mb_per_s=("mb_in_per_s", "median"), rounds=("round", "count"))
    ceiling = "; ".join(f"{esc(k)}: {v.rows_per_s:,.0f} rows/s ({v.mb_per_s:.1f} MB/s, median of {int(v.rounds)})"
                        for k, v in ceil.iterrows())
    return ("Two Ray nodes on this machine (1 CPU each): DQN on CartPole-v1 with 1 actor and 1 learner, the actor on "
            "the driver's node (one node) or on the other node sending chunks through the inserter (two nodes), "
            "alternating rounds.\n\n" + md(pd.DataFrame(rows), ".2f") + "\n\n" + ratio + ". Inserter ceiling (a task "
            "on the other node sending nothing but chunks): " + ceiling + ".\n\n" + source(results, name) + "\n")


def _paired(mine: pd.Series, ref: pd.Series, plain: pd.Series) -> pd.Series:
    """Per row: the median over rounds of mine[i] / ref[i] (round i of each stored repetition list) with a
    bootstrap interval, or ``plain`` (the ratio of medians) where the repetitions are not stored or differ in
    number."""
    out = []
    for a, b, c in zip(mine, ref, plain):
        a, b = _reps(a), _reps(b)
        if a and len(a) == len(b):
            out.append(fmt_ci(*median_ci([x / y for x, y in zip(a, b)])))
        else:
            out.append("" if pd.isna(c) else f"{c:.2f}")
    return pd.Series(out, index=plain.index)


def outputs(results: Path, figures: bool) -> list[Path]:
    """Every scaling figure whose CSV is stored: the curves of each backend, the backends side by side, the
    whole trainer per split."""
    if not figures:
        return []
    out: list[Path] = []
    for csv in sorted(results.glob("scaling*.csv")):
        out.append(draw(read_csv(csv), results / "figures" / csv.with_suffix(".png").name))
    if (fig := backends_figure(results)) is not None:
        out.append(fig)
    for csv in sorted(results.glob("end_to_end*.csv")):
        df = read_csv(csv)
        if "threads" not in df:          # not a per-split table (the two-node study's rounds draw their own)
            continue
        out.append(draw_end_to_end(df, results / "figures" / csv.with_suffix(".png").name))
    return out


def worker_costs_block(results: Path) -> str:
    """One step reservation and one pump poll against the number of actors (``--reservation-cost``), with the
    pre-issue-49 way of each measured beside it."""
    r_path, p_path = results / "reservation_cost.csv", results / "pump_cost.csv"
    if not (r_path.exists() and p_path.exists()):
        return missing("reservation_cost.csv", "pal-bench scaling --reservation-cost --actors 1,16,64,256")
    r, p = read_csv(r_path), read_csv(p_path)
    one = r[r.actors == r.actors.min()].iloc[0]
    res = pd.DataFrame({"actors": r.actors, "µs per reservation": r.us_per_reservation,
                        "vs the fewest actors": r.us_per_reservation / one.us_per_reservation,
                        "µs per insert count": r.us_per_insert,
                        "before: summing every actor (µs)": r.us_summing_all,
                        "two processes at once (reservations/s)": r.contended_per_s})
    pump = pd.DataFrame({"actor queues": p.queues, "µs per idle poll (epoll)": p.us_per_poll,
                         "before: trying every queue (µs)": p.us_drain_every_queue})
    return ("One step reservation (`reserve_steps`, per vector step of every actor process and ray-node inserter "
            "call) and one insert count with that many actors registered in a real shared control block, "
            "uncontended, single core: medians of `repeats` blocks of `rounds` calls; beside it the reservation as "
            "it was (the rule over the sum of every actor's counter, under the same lock), and two processes "
            "reserving at once. Then one idle poll of the driver's message pump (every 2 ms) against the number "
            "of actor queues.\n\n" + md(res, ".2f") + "\n\n" + md(pump, ".2f") + "\n\n"
            + source(results, "reservation_cost.csv", "pump_cost.csv") + "\n")


def end_to_end_allreduce_block(results: Path) -> str:
    return end_to_end_block(results, "end_to_end_learner_allreduce.csv")


PUBLICATION = Publication("scaling", {
    "worker-costs": worker_costs_block,
    "end-to-end-learner-allreduce": end_to_end_allreduce_block,
    "scaling": scaling_block,
    "end-to-end": end_to_end_block,
    "backends": backends_block,
    "end-to-end-ray": end_to_end_ray_block,
    "processes": processes_block,
    "end-to-end-processes": end_to_end_processes_block,
    "ray-node": ray_node_block,
    "ray-two-nodes": two_nodes_block,
    "ray-node-end-to-end": ray_node_end_to_end_block,
}, outputs)
