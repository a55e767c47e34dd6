"""The files ``pal-bench simulate`` reads and writes: its stored inputs (a missing file is an error naming the
command that makes it), the stored validation's development residuals (the model's own error, for every stated
interval), and every output written atomically with its ``.meta.json``."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pandas as pd

from pal_bench.atomic import atomic_write_text
from pal_bench.conditions import write_meta

INPUTS = "simulation_inputs.csv"
VALIDATION = "simulation_validation.csv"


def write_csv(df: pd.DataFrame, path: Path, conditions=None, sources: tuple[Path, ...] = ()) -> Path:
    """``df`` to ``path`` atomically, and its ``.meta.json``: the ``conditions`` of a measurement, or (simulated)
    the commit, the command and each of ``sources`` with the commit its own meta names."""
    if conditions is not None and conditions.load_after is None:
        conditions.finish()
    meta = conditions.as_dict() if conditions is not None else simulated_meta(sources)   # built before writing
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, df.to_csv(index=False, float_format="%.6g"))
    write_meta(path, meta)
    return path


def simulated_meta(sources) -> dict:
    """The ``.meta.json`` of a file computed from stored files (measures nothing): what, command, commit, machine,
    and each source with its commit (from its own meta; None where it has none)."""
    from pal_bench.conditions import commit, machine, read_meta

    def commit_of(p: Path):
        """The commit a source's own meta names: a short or full hash (with ``+dirty``), else None."""
        try:
            meta = read_meta(p)
        except ValueError:
            return None
        c = meta.get("commit") if isinstance(meta, dict) else None
        return c if isinstance(c, str) and re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", c) else None

    return {"what": "simulated from stored files (measures nothing)",
            "command": " ".join(["pal-bench simulate", *sys.argv[1:]]), "commit": commit(), "machine": machine(),
            "sources": [{"file": Path(p).name, "commit": commit_of(Path(p))} for p in sources]}


def require_inputs(results: Path) -> pd.DataFrame:
    """The stored inputs; a ``UsageError`` naming the command that measures them when there are none."""
    from pal_bench.argtypes import UsageError
    from pal_bench.studies.simulate.costs import RAY_IDLE, stored_costs

    rounds = load_inputs(results)
    if rounds is None:
        raise UsageError(f"{results / INPUTS}: no stored inputs; measure them first with "
                         f"`pal-bench simulate --measure-inputs --out {results}` (about 2 min a round, quiet machine)")
    costs = stored_costs(results)
    for k in ("ray_idle_cores", "ray_session_idle_cores"):
        if costs.get(k, 0.0) >= rounds.cores.min():
            raise UsageError(f"{results / RAY_IDLE}: Ray idle keeps {costs[k]:.3g} cores busy, "
                             f"as many as the inputs' machine has ({rounds.cores.min()}): not an idle measurement")
    return rounds.assign(**costs)


def dev_residuals(results: Path):
    """The model's own error: the development set's multi-worker residuals of the stored validation; a
    ``UsageError`` naming the command when it is missing."""
    from pal_bench.argtypes import UsageError
    from pal_bench.stored_tables import read_table
    from pal_bench.studies.simulate.validate import VALIDATION_COLUMNS, development_residuals_mask

    path = results / VALIDATION
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no stored validation, whose residuals the intervals use; run "
                         f"`pal-bench simulate --validate --out {results}` first")
    v = read_table(path, VALIDATION_COLUMNS, "the validation `pal-bench simulate --validate` writes")
    residuals = v[development_residuals_mask(v)].error.to_numpy(dtype=float)
    if not len(residuals):
        print(f"pal-bench simulate: warning: {path} has no development residuals; the intervals are the inputs' "
              "spread alone", file=sys.stderr)
    return residuals


def load_inputs(results: Path) -> pd.DataFrame | None:
    """The stored inputs, checked (``calibrate.read_inputs``); None when there is no file (a link, even a dangling
    one, is there: it is refused, not measured over)."""
    from pal_bench.studies.simulate.calibrate import read_inputs

    path = results / INPUTS
    return read_inputs(path) if os.path.lexists(path) else None
