"""The race's publication: the target tables of both tracks, the speed table, the settings side by side
(from the run files), README's headline, and the race figures redrawn from the stored curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.bench.publishing import Publication, code, esc, md, missing, source
from pal_bench.stored_tables import read_csv, read_json
from pal_bench.studies.race import results as race_results
from pal_bench.studies.race.contestants import DEFAULT_CONTESTANTS
from pal_bench.studies.race.orchestrate import load_runs, runs_dir
from pal_bench.studies.race.pin import CPU_BUDGETS
from pal_bench.studies.race.probe import probe_spread
from pal_bench.studies.race.task import TASKS, suffix


def budget_words(cpus: int | None) -> str:
    """How a block names a core budget."""
    if cpus is None:
        return "stored before the core budgets: not pinned, each contestant used the cores its own processes took"
    return f"every contestant's process tree pinned to the same {cpus} CPU{'s' if cpus > 1 else ''}"


def race_rows(results: Path, task_name: str = "full", pinned: bool = True) -> pd.DataFrame | None:
    """The stored runs' rows on a core budget (``race[_quick].csv``, its rows with ``cpus``) or, ``pinned`` False,
    from before the budgets (``race[_quick]_unpinned.csv``, its rows without); None when the file does not exist.
    A row in the wrong file never counts as one of the other's."""
    path = results / f"race{suffix(task_name)}{'' if pinned else '_unpinned'}.csv"
    if not path.exists():
        return None
    df = read_csv(path)
    c = pd.to_numeric(df.cpus, errors="coerce") if "cpus" in df else pd.Series(float("nan"), index=df.index)
    return df[c.notna() if pinned else c.isna()]


def race_target_block(results: Path, track: str, task_name: str = "full", cpus: int | None = None) -> str:
    """Steps and wall time to target per contestant of one track on one core budget, with the CPU each used, the
    probe spread of the runs compared and how many runs were run again."""
    name = f"race{suffix(task_name)}{'' if cpus is not None else '_unpinned'}.csv"
    command = (f"pal-bench race --track {track}" + (f" --cpus {cpus}" if cpus else "")
               + (" --quick" if task_name == "quick" else ""))
    every = race_rows(results, task_name, pinned=cpus is not None)
    if every is None:
        return missing(name, command)
    df = race_results.track_runs(every, track, cpus)
    if df.empty:
        return missing(name, command)
    task = TASKS[task_name]
    t = race_results.target_table(df)
    if "own_cores" in df and df.own_cores.notna().any():
        cores = df.groupby("contestant").own_cores.agg(lambda v: f"{v.median():.2f} [{v.min():.2f}, {v.max():.2f}]")
        t.insert(3, "CPU used (cores)", t.contestant.map(cores).fillna("-"))
    if track == "tuned" and cpus is not None and "config" in df and df.config.notna().any():
        t.insert(1, "configuration", t.contestant.map(_configurations(df)).fillna("-"))
    med, lo, hi = probe_spread(df.probe_s.dropna())
    ref = race_results.best_pal(df)
    draws = race_results.track_runs(every, track, cpus, every_draw=True)
    again = draws[draws.superseded_by.notna() & (draws.superseded_by.astype(str) != "")] if "superseded_by" in draws \
        else draws.iloc[:0]
    over = race_results.over_budget_runs(every, track, cpus)
    fig = race_results.figure_name(suffix(task_name), track, cpus)
    figure_line = (f"![{track}, {cpus} CPU(s)](../results/figures/{fig})\n\n"
                   if cpus is not None and (results / "figures" / fig).exists() else "")
    rerun_note = (f" {len(again)} of {len(draws)} runs were run again (their first draws kept in `{name}`, marked "
                  f"`superseded_by`); with every draw kept:\n\n" + md(race_results.target_table(draws), "") + "\n"
                  if len(again) else " No run was run again.\n" if cpus is not None else "\n")
    over_note = f" {len(over)} runs used more CPU than their budget and are left out.\n" if len(over) else ""
    return figure_line + (f"{track.capitalize()} track, {budget_words(cpus)}; {task.env} to a mean greedy return of "
            f"{task.target:g} ({task.eval_episodes} episodes every {task.eval_interval:,} env steps; budget "
            f"{task.max_steps:,} env steps or {task.max_wall_s / 60:.0f} minutes of training). Medians over seeds "
            f"with the exact order-statistic interval of the median (95% or more; its true coverage in brackets "
            f"where the seeds are too few); a run that never reached the target counts at its stop "
            f"(`>=`: the median is then a lower bound, marked only where such a run could move it). Wall to target: "
            f"set-up plus training, evaluation excluded (every contestant's training stands "
            f"still while it is evaluated); 'with eval' adds the evaluations before the target. CPU used: the run's "
            f"process tree's CPU seconds over its wall time (median and range over its runs). Ratios: the "
            f"contestant's median over {code(ref)}'s (PAL's best {'matched ' if track == 'matched' else ''}"
            f"contestant here), the range over every pairing of seeds, and a bootstrap 95% interval where both have "
            f"at least 10 seeds. Speed probes of these runs: median {med:.1f} s, {lo:.2f}-{hi:.2f}x of it.\n\n"
            + md(t, "") + "\n\n" + rerun_note + over_note
            + (f"{line}\n\n" if (line := race_results.sitting(draws)) else "") + source(results, name) + "\n")


def _configurations(df: pd.DataFrame) -> dict[str, str]:
    """contestant -> the tuning search's configuration(s) its runs used (``tuning.config_name``), e.g. "3: prioritized
    replay (alpha 0.6, beta 0.4)"."""
    from pal_bench.studies.race.tuning import config_name

    configs = pd.to_numeric(df.config, errors="coerce")
    return {name: "; ".join(f"{c:g}: {config_name(name, c)}" for c in sorted(configs[g.index].dropna().unique()))
            for name, g in df.groupby("contestant")}


def race_speed_block(results: Path, track: str = "matched", task_name: str = "full", cpus: int | None = None) -> str:
    name = f"race{suffix(task_name)}_speed.csv"
    path = results / name
    command = f"pal-bench race --speed --track {track}" + (f" --cpus {cpus}" if cpus else "")
    if not path.exists():
        return missing(name, command)
    sp = read_csv(path)
    c = pd.to_numeric(sp.cpus, errors="coerce") if "cpus" in sp else pd.Series(float("nan"), index=sp.index)
    sp = sp[(sp.track == track) & (c.isna() if cpus is None else c == cpus)]
    if sp.empty:
        return missing(name, command)
    task = TASKS[task_name]
    return (f"Env steps per second of training in one sitting, {track} track, {budget_words(cpus)}: each round "
            f"runs every contestant for "
            f"{task.speed_span:,} env steps after learning starts ({task.learning_starts:,}), one after the other in "
            f"an order rotated by one each round; medians over the rounds with the range (with fewer than 10 rounds "
            f"the range, not an interval). Updates/s: the run's measured updates per env step times its env steps "
            f"per second.\n\n" + md(race_results.speed_table(sp), "") + "\n\n" + source(results, name) + "\n")


def race_settings_block(results: Path, track: str = "matched", task_name: str = "full",
                        cpus: int | None = None) -> str:

    where = runs_dir(results, task_name, track, cpus)
    runs = load_runs(where)
    if not runs:
        return missing(f"{where.relative_to(results)}/", f"pal-bench race --track {track}"
                       + (f" --cpus {cpus}" if cpus else ""))
    return (f"What each {track} contestant built ({budget_words(cpus)}), read back from its framework's own objects "
            f"when it was built (not from our configuration), and its measured updates per env step (median over its "
            f"runs).\n\n"
            + md(race_results.settings_table(runs), "") + "\n")


def race_phases_block(results: Path, track: str = "matched", task_name: str = "full") -> str:
    """Where PAL's workers spent their time in the stored race runs (their own per-phase timers)."""
    where = runs_dir(results, task_name, track)
    runs = [r for r in load_runs(where) if r["contestant"].startswith("pal")]
    if not runs:
        return missing(f"{where.relative_to(results)}/", f"pal-bench race --track {track} --only pal pal-processes")
    return (f"PAL's per-phase times in its {track} race runs (each worker's own timers, `phase_seconds` of the run "
            f"files, summed over the {len(runs)} runs; set-up left out), as shares of each worker role's time: "
            "what the actor and the learner each wait for and spend.\n\n" + md(race_results.phase_table(runs), "")
            + f"\n\nSource: the run files in `results/{where.relative_to(results)}/`.\n")


def race_profile_block(results: Path) -> str:
    """The stored ``pal-bench race-profile`` tables: where a contestant's time went (cProfile for tianshou and
    RLlib, the trainer's own phase timers for PAL)."""

    stored = {f.name: read_json(f) for f in sorted(results.glob("race_profile_*.json"))}
    stored = {name: d for name, d in stored.items() if d.get("task") == "full"}
    if not stored:
        return missing("race_profile_matched_rllib.json", "pal-bench race-profile rllib --seconds 240")
    parts = []
    for name, d in stored.items():
        text = f"**{esc(d['contestant'])}** ({esc(d['track'])} track): {esc(d['summary'])}."
        if d.get("evaluation_s") is not None:
            text += f" The race's evaluation (cumulative, inside the areas below): {d['evaluation_s']:.1f} s."
        for title, records in d["tables"].items():
            text += f"\n\n{esc(title[0].upper() + title[1:])}:\n\n" + md(pd.DataFrame(records), ".1f")
        parts.append(text + "\n\n" + source(results, name))
    return "\n\n".join(parts) + "\n"


HEADLINE_CPUS = 2          # README's headline quotes the matched track on this many CPUs, once it has run ...
HEADLINE_SEEDS = 10        # ... at least this many seeds of every contestant


def _complete(every: pd.DataFrame) -> bool:
    """Whether the matched track on ``HEADLINE_CPUS`` CPUs has ``HEADLINE_SEEDS`` seeds of every contestant the race
    runs by default on it (not only of those with a pinned run so far)."""
    seeds = race_results.track_runs(every, "matched", HEADLINE_CPUS).groupby("contestant").size()
    return all(int(seeds.get(c, 0)) >= HEADLINE_SEEDS for c in DEFAULT_CONTESTANTS["matched"])


def race_headline_block(results: Path) -> str:
    """README's one sentence on the race: the matched track's best PAL contestant against each peer, on
    ``HEADLINE_CPUS`` CPUs (until that track has run: the runs stored before the core budgets, said so), each ratio
    of median wall times with its bootstrap and order-statistic 95% intervals; "at least" only where a run that
    stopped before the target could move a median."""

    every = race_rows(results)
    before = None if every is not None and _complete(every) else race_rows(results, pinned=False)
    if every is None and before is None:
        return missing("race.csv", "pal-bench race")
    every = pd.concat([f for f in (every, before) if f is not None], ignore_index=True)
    pinned = race_results.track_runs(every, "matched", HEADLINE_CPUS)
    seeds = pinned.groupby("contestant").size()
    complete = _complete(every)
    # the pinned track once complete; else the runs from before the budgets; else the pinned track as far as it is
    for cpus in ((HEADLINE_CPUS,) if complete else ()) + (None,) + (() if complete else (HEADLINE_CPUS,)):
        df = race_results.track_runs(every, "matched", cpus)
        ref = race_results.best_pal(df)
        if ref is not None and not race_results.peers(df).empty:
            break
    else:
        return missing("race.csv", f"pal-bench race --cpus {HEADLINE_CPUS}")
    under_way = ("" if complete or pinned.empty else
                 f" The pinned {HEADLINE_CPUS}-CPU track is being run: {len(pinned)} runs so far, at most "
                 f"{int(seeds.max())} seeds of a contestant ({HEADLINE_SEEDS} of each of "
                 f"{', '.join(DEFAULT_CONTESTANTS['matched'])} make the headline).")
    where = (f"matched track, {budget_words(cpus)}: every contestant trains the same Double DQN on the same data "
             f"rhythm" if cpus is not None else
             "matched track, stored before the core budgets: every contestant trains the same Double DQN on the same "
             "data rhythm, but the cores were not equal: `pal-processes` runs an actor process beside its learner "
             "while RLlib and tianshou ran in one process each; the pinned tracks replace it")
    return (f"**The race** ({where}; LunarLander-v3 to 200): " + _ratio_sentence(df, ref)
            + ". Ratios of medians; every table, the speed rounds and the tuned track: [docs/race.md](docs/race.md)."
            + under_way + "\n")


def _ratio_sentence(df: pd.DataFrame, ref: str, labels: dict[str, str] | None = None) -> str:
    """PAL's ``ref`` over its seeds, then each peer (every contestant not of PAL's) as a ratio of median wall times
    to target with its bootstrap and order-statistic 95% intervals; "at least" / "at most" only where a run that
    stopped before the target could move a median. ``labels``: a text after a contestant's name."""
    labels = labels or {}
    mine = df[df.contestant == ref]
    mine_moved = race_results.censoring_moves_median(mine.wall_to_target_s, mine.reached)
    parts = []
    for name, g in race_results.peers(df).groupby("contestant"):
        r = race_results.ratio_intervals(g.wall_to_target_s, mine.wall_to_target_s)
        bound = race_results.bound_word(race_results.censoring_moves_median(g.wall_to_target_s, g.reached),
                                        mine_moved)
        ratio = (f"{bound}{r['ratio']:.1f}x" if bound is not None else
                 f"an unknown multiple (both censored; {r['ratio']:.1f}x at the stops) of")
        parts.append(f"{esc(name)}{labels.get(name, '')} took {ratio} PAL's median wall time (95%: "
                     f"{race_results.interval_text(r)}; {int(g.reached.sum())} of {len(g)} seeds reached, median "
                     f"{g.steps_to_target.median() / 1000:.0f}k steps, {g.wall_to_target_s.median():.0f} s)")
    stop = " (runs that did not reach it counted at their stop)" if not mine.reached.all() else ""
    return (f"PAL's {code(ref)}{labels.get(ref, '')} reached the target in {int(mine.reached.sum())} of {len(mine)} "
            f"seeds, in a median {mine.steps_to_target.median() / 1000:.0f}k env steps and "
            f"{mine.wall_to_target_s.median():.0f} s of set-up and training{stop}; " + "; ".join(parts))


def race_tuned_headline_block(results: Path) -> str:
    """The tuned track's sentence: each framework at the best configuration of its equal tuning search, on
    ``HEADLINE_CPUS`` CPUs, PAL's against each peer as in the README's headline; said to be under way until every
    default tuned contestant has ``HEADLINE_SEEDS`` seeds."""
    from pal_bench.studies.race.tuning import CONFIGS_PER_FRAMEWORK, TUNING_SEEDS

    every = race_rows(results)
    command = f"pal-bench race --track tuned --seeds {HEADLINE_SEEDS}"
    if every is None:
        return missing("race.csv", command)
    df = race_results.track_runs(every, "tuned", HEADLINE_CPUS)
    ref = race_results.best_pal(df)
    if ref is None or race_results.peers(df).empty:
        return missing("race.csv", command)
    seeds = df.groupby("contestant").size()
    short = [c for c in DEFAULT_CONTESTANTS["tuned"] if int(seeds.get(c, 0)) < HEADLINE_SEEDS]
    labels = {name: f" (its configuration {text})" for name, text in _configurations(df).items()}
    under_way = (f" Under way: {HEADLINE_SEEDS} seeds of each of {', '.join(DEFAULT_CONTESTANTS['tuned'])} make "
                 f"the track ({', '.join(f'{esc(c)} {int(seeds.get(c, 0))}' for c in short)} so far)."
                 if short else "")
    return (f"**The tuned track** (each framework at the best of its {CONFIGS_PER_FRAMEWORK} configurations, "
            f"{TUNING_SEEDS} seeds each, of the equal tuning search; {budget_words(HEADLINE_CPUS)}; LunarLander-v3 "
            f"to 200): " + _ratio_sentence(df, ref, labels) + ". Ratios of medians." + under_way + "\n")


def race_tuning_block(results: Path, task_name: str = "full") -> str:
    """The tuning search of the tuned track: per framework and configuration, the seeds, how many reached and the
    median wall time to target; the best configuration of each framework marked."""
    from pal_bench.studies.race.tuning import CONFIGS_PER_FRAMEWORK, TUNING_SEEDS

    name = f"race{suffix(task_name)}_tuning.csv"
    if not (results / name).exists():
        return missing(name, "pal-bench race --track tuned --tune")
    df = read_csv(results / name)
    df = df[df.superseded_by.isna() & ~df.over_budget.fillna(False).astype(bool)]
    rows = []
    for (contestant, config), g in df.groupby(["contestant", "config"]):
        censored = not g.reached.all()
        rows.append({"framework's contestant": contestant, "configuration": f"{config}: {g.config_name.iloc[0]}",
                     "seeds": len(g), "reached": f"{int(g.reached.sum())}/{len(g)}",
                     "median env steps to target": f"{'>= ' if censored else ''}{g.steps_to_target.median():,.0f}",
                     "median wall to target, s": f"{'>= ' if censored else ''}{g.wall_to_target_s.median():,.1f}",
                     "best": "yes" if g.best.any() else ""})
    return (f"The tuning search: each framework gets {CONFIGS_PER_FRAMEWORK} configurations, starting from its own "
            f"published example (configuration 0), each on {TUNING_SEEDS} seeds, interleaved; its best (smallest "
            f"median wall time to target, a run that never reached counted at its stop) is what the tuned track "
            f"runs on its full seeds." + _search_state(df) + "\n\n"
            + md(pd.DataFrame(rows), "") + "\n\n" + source(results, name) + "\n")


def _search_state(df: pd.DataFrame) -> str:
    """A sentence when the stored search is not complete: how many of its runs are stored, and no best yet."""
    from pal_bench.studies.race.tuning import SEARCH, TUNING_SEEDS, search_left

    names = sorted(set(df.contestant) & set(SEARCH))
    left = search_left(df, names)
    if not left:
        return ""
    want = sum(len(SEARCH[n]) for n in names) * TUNING_SEEDS
    return (f" The search is stored in part ({want - left} of its {want} runs): no best is marked until it is "
            f"complete (`pal-bench race --track tuned --tune` goes on).")


GOALS = {2: {"tianshou": 3.0, "rllib": 10.0}, 1: {"tianshou": 2.0, "rllib": 6.0}}   # the issue's, per core budget


def race_goals_block(results: Path) -> str:
    """The goals of the core tracks as measured: PAL's best matched contestant's median wall time to target against
    each peer's, on each budget, with both 95% intervals; met or not by the median ratio."""
    path = results / "race.csv"
    if not path.exists():
        return missing("race.csv", "pal-bench race --cpus 2")
    every = read_csv(path)
    rows = []
    for cpus, goals in GOALS.items():
        df = race_results.track_runs(every, "matched", cpus)
        ref = race_results.best_pal(df)
        for peer, goal in goals.items():
            g = df[df.contestant == peer]
            if ref is None or g.empty:
                rows.append({"track": f"matched, {cpus} CPU{'s' if cpus > 1 else ''}", "goal": f">= {goal:g}x {peer}",
                             "measured": "not run yet", "met": ""})
                continue
            mine = df[df.contestant == ref]
            r = race_results.ratio_intervals(g.wall_to_target_s, mine.wall_to_target_s)
            bound = race_results.bound_word(race_results.censoring_moves_median(g.wall_to_target_s, g.reached),
                                            race_results.censoring_moves_median(mine.wall_to_target_s, mine.reached))
            # met when the median ratio reaches the goal and censoring cannot make it smaller (PAL's median exact)
            met = "yes" if r["ratio"] >= goal and bound in ("", "at least ") else \
                "no" if r["ratio"] < goal and bound in ("", "at most ") else "unknown (censored)"
            if min(len(mine), len(g)) < HEADLINE_SEEDS:        # the track is not complete: what it says so far
                met = f"{met} so far ({min(len(mine), len(g))} of {HEADLINE_SEEDS} seeds)"
            rows.append({"track": f"matched, {cpus} CPU{'s' if cpus > 1 else ''}", "goal": f">= {goal:g}x {peer}",
                         "measured": f"{bound or ''}{r['ratio']:.2f}x ({code(ref)}, {len(mine)} seeds; {peer} "
                                     f"{len(g)} seeds; {race_results.interval_text(r)})", "met": met})
    return ("The goals of the core tracks (median wall time to target, set-up and training, of each peer over PAL's "
            "best matched contestant on the same CPUs; met when the median ratio reaches the goal; the intervals "
            "say how sure):\n\n" + md(pd.DataFrame(rows), "") + "\n\n" + source(results, "race.csv") + "\n")


def race_blocks(results: Path, task_name: str = "full") -> str:
    """Every race table of a task (what ``pal-bench race`` prints): each track on each core budget that has runs."""
    parts = []
    for track in ("matched", "tuned"):
        for cpus in (*CPU_BUDGETS, None):
            block = race_target_block(results, track, task_name, cpus)
            if not block.startswith("_Not measured yet"):
                parts.append(block)
    if task_name == "full":
        parts += [race_speed_block(results, "matched", cpus=c) for c in CPU_BUDGETS]
    return "\n".join(parts)


def outputs(results: Path, figures: bool) -> list[Path]:
    """The race figures (``figures/race[_quick]_<track>.png``) from the stored curves."""
    from pal_bench.studies.race.figure import draw

    if not figures:
        return []
    out = []
    for task in ("quick", "full"):
        path = results / f"race{suffix(task)}_curves.csv"
        if path.exists():
            curves = read_csv(path)
            cpus = curves.cpus.fillna(-1) if "cpus" in curves else pd.Series(-1, index=curves.index)
            for (track, n), c in curves.groupby(["track", cpus]):
                n = None if n == -1 else int(n)
                out.append(draw(c, track, TASKS[task], results / "figures" /
                                race_results.figure_name(suffix(task), track, n), n))
    return out


PUBLICATION = Publication("race", {
    "race-quick": lambda results: race_target_block(results, "matched", "quick", HEADLINE_CPUS),
    "race-headline": race_headline_block,
    "race-goals": race_goals_block,
    "race-tuning": race_tuning_block,
    "race-matched-1cpu": lambda results: race_target_block(results, "matched", cpus=1),
    "race-matched-2cpu": lambda results: race_target_block(results, "matched", cpus=2),
    "race-tuned-2cpu": lambda results: race_target_block(results, "tuned", cpus=2),
    "race-tuned-headline": race_tuned_headline_block,
    "race-speed-1cpu": lambda results: race_speed_block(results, "matched", cpus=1),
    "race-speed-2cpu": lambda results: race_speed_block(results, "matched", cpus=2),
    "race-settings-2cpu": lambda results: race_settings_block(results, "matched", cpus=2),
    "race-matched": lambda results: race_target_block(results, "matched"),
    "race-tuned": lambda results: race_target_block(results, "tuned"),
    "race-speed": race_speed_block,
    "race-settings": race_settings_block,
    "race-settings-tuned": lambda results: race_settings_block(results, "tuned"),
    "race-phases": race_phases_block,
    "race-profile": race_profile_block,
}, outputs)
