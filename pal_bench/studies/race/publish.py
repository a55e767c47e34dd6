"""The race's publication: the target tables of both tracks, the speed table, the settings side by side
(from the run files), README's headline, and the race figures redrawn from the stored curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pal_bench.bench.publishing import Publication, code, esc, md, missing, source
from pal_bench.stored_tables import read_csv, read_json
from pal_bench.studies.race import results as race_results
from pal_bench.studies.race.orchestrate import load_runs, runs_dir
from pal_bench.studies.race.probe import probe_spread
from pal_bench.studies.race.task import TASKS, suffix


def race_target_block(results: Path, track: str, task_name: str = "full") -> str:
    """Steps and wall time to target per contestant of one track, with the probe spread of the runs compared."""
    name = f"race{suffix(task_name)}.csv"
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench race" + (" --quick" if task_name == "quick" else ""))
    df = read_csv(path)
    df = df[df.track == track]
    if df.empty:
        return missing(name, f"pal-bench race --track {track}" + (" --quick" if task_name == "quick" else ""))
    task = TASKS[task_name]
    t = race_results.target_table(df)
    med, lo, hi = probe_spread(df.probe_s.dropna())
    ref = race_results.best_pal(df)
    return (f"{track.capitalize()} track, {task.env} to a mean greedy return of {task.target:g} ({task.eval_episodes} "
            f"episodes every {task.eval_interval:,} env steps; budget {task.max_steps:,} env steps or "
            f"{task.max_wall_s / 60:.0f} minutes of training). Medians over seeds with the exact order-statistic "
            f"interval of the median (95% or more; its true coverage in brackets where the seeds are too few); a "
            f"run that never reached the target counts at its stop (`>=`: a lower bound). Wall to target: set-up "
            f"plus training, evaluation excluded (every contestant's training stands still while it is evaluated); "
            f"'with eval' adds the evaluations before the target. Ratios: the contestant's median over "
            f"{code(ref)}'s (PAL's best {'matched ' if track == 'matched' else ''}contestant here), the range over "
            f"every pairing of seeds, and a "
            f"bootstrap 95% interval where both have at least 10 seeds. Speed probes of these runs: median "
            f"{med:.1f} s, {lo:.2f}-{hi:.2f}x of it.\n\n" + md(t, "") + "\n\n" + source(results, name) + "\n")


def race_speed_block(results: Path, track: str = "matched", task_name: str = "full") -> str:
    name = f"race{suffix(task_name)}_speed.csv"
    path = results / name
    if not path.exists():
        return missing(name, "pal-bench race --speed")
    sp = read_csv(path)
    sp = sp[sp.track == track]
    if sp.empty:
        return missing(name, f"pal-bench race --speed --track {track}")
    task = TASKS[task_name]
    return (f"Env steps per second of training in one sitting, {track} track: each round runs every contestant for "
            f"{task.speed_span:,} env steps after learning starts ({task.learning_starts:,}), one after the other in "
            f"an order rotated by one each round; medians over the rounds with the range (with fewer than 10 rounds "
            f"the range, not an interval). Updates/s: the run's measured updates per env step times its env steps "
            f"per second.\n\n" + md(race_results.speed_table(sp), "") + "\n\n" + source(results, name) + "\n")


def race_settings_block(results: Path, track: str = "matched", task_name: str = "full") -> str:

    where = runs_dir(results, task_name, track)
    runs = load_runs(where)
    if not runs:
        return missing(f"{where.relative_to(results)}/", f"pal-bench race --track {track}")
    return (f"What each {track} contestant built, read back from its framework's own objects when it was built "
            f"(not from our configuration), and its measured updates per env step (median over its runs).\n\n"
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


def race_headline_block(results: Path) -> str:
    """README's one sentence on the race: the matched track's best PAL contestant against each peer that raced."""

    path = results / "race.csv"
    if not path.exists():
        return missing("race.csv", "pal-bench race")
    df = read_csv(path)
    df = df[df.track == "matched"]
    ref = race_results.best_pal(df)
    if ref is None:
        return missing("race.csv", "pal-bench race --only pal pal-processes")
    mine = df[df.contestant == ref]
    parts = []
    for name, g in df[~df.contestant.isin(race_results.PAL_MATCHED)].groupby("contestant"):
        bound = "at least " if not g.reached.all() else ""
        parts.append(f"{bound}{g.wall_to_target_s.median() / mine.wall_to_target_s.median():.1f}x sooner than "
                     f"{esc(name)} ({int(g.reached.sum())} of {len(g)} seeds reached; median "
                     f"{g.steps_to_target.median() / 1000:.0f}k steps, {g.wall_to_target_s.median():.0f} s)")
    return (f"**The race** (matched track: every contestant trains the same Double DQN on the same data rhythm; "
            f"LunarLander-v3 to 200): PAL's {code(ref)} reached the target in {int(mine.reached.sum())} of {len(mine)} "
            f"seeds, in a median {mine.steps_to_target.median() / 1000:.0f}k env steps and "
            f"{mine.wall_to_target_s.median():.0f} s of set-up and training: " + "; ".join(parts)
            + ". Ratios of medians; intervals, the speed table and the tuned track: [docs/race.md](docs/race.md).\n")


def race_blocks(results: Path, task_name: str = "full") -> str:
    """Every race table of a task (what ``pal-bench race`` prints)."""
    parts = [race_target_block(results, track, task_name) for track in ("matched", "tuned")]
    if task_name == "full":
        parts.append(race_speed_block(results))
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
            for track, c in curves.groupby("track"):
                out.append(draw(c, track, TASKS[task], results / "figures" / f"race{suffix(task)}_{track}.png"))
    return out


PUBLICATION = Publication("race", {
    "race-quick": lambda results: race_target_block(results, "matched", "quick"),
    "race-headline": race_headline_block,
    "race-matched": lambda results: race_target_block(results, "matched"),
    "race-tuned": lambda results: race_target_block(results, "tuned"),
    "race-speed": race_speed_block,
    "race-settings": race_settings_block,
    "race-settings-tuned": lambda results: race_settings_block(results, "tuned"),
    "race-phases": race_phases_block,
    "race-profile": race_profile_block,
}, outputs)
