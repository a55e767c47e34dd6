"""``pal-bench latency --impl mypkg.buf:MyBuffer``: your buffer's latency beside PAL, the installed peers and the
bandwidth floor, in one run, after checking that it is a correct prioritized buffer.

NAME (``--impl``, comma-separated) is ``module:Class`` (importable from the current directory), a name an installed
package registers in the entry-point group ``pal_bench.buffers``, or a built-in buffer; the class follows the
buffer protocol of docs/latency.md. The run:

1. checks every buffer that has a protocol class (``pal-bench check-buffer``: yours, PAL and the peers), unless
   ``--no-check``; a buffer that fails a property is still timed and marked in the table;
2. runs the latency-vs-capacity suite (insert 1, add_batch, sample, update, sample + update at batch 256; the
   quick sweep's timing) on each buffer, at each ``--capacity``, with the ``--workload``'s rows;
3. writes ``DIR/latency.csv`` (impl, workload, op, capacity, batch, median_us: pytest-benchmark's median over
   every round; ci_low, ci_high: a bootstrap 95% interval of the median from the 200 round times kept, evenly
   spaced over the run, so the all-rounds median can sit just outside it; rounds, status, reason, conformance),
   prints the table, and
   draws ``DIR/latency_vs_capacity.png`` (a panel of every operation; one figure per operation beside it).

The raw pytest-benchmark JSON is kept as ``DIR/latency_vs_capacity.json`` and the conditions in
``DIR/latency.csv.meta.json``. Like every measurement here it waits for a quiet machine (``--force`` skips that).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pal_bench import conditions
from pal_bench.argtypes import Range, UsageError, number
from pal_bench.bench import suite_json
from pal_bench.bench.adapters.registry import ADAPTERS, PROTOCOL_CLASSES, adapter_class, available, builtin
from pal_bench.bench.publishing import store
from pal_bench.bench.run import run_suite, user_path
from pal_bench.bench.stats import median_ci
from pal_bench.studies.conformance import check_buffers, resolve
from pal_bench.studies.latency.figures import latency_vs_capacity
from pal_bench.workloads import WORKLOADS

DEFAULT_CAPACITIES = (10**4, 10**5)
SUITE_TIMEOUT_S = 3600
MAX_CAPACITY = 10**9
COLUMNS = ["impl", "workload", "op", "capacity", "batch", "median_us", "ci_low", "ci_high", "iqr_us", "rounds",
           "status", "reason", "conformance"]


def _names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",")]
    if not text or "" in names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of buffer names; got {text!r}")
    return list(dict.fromkeys(names))


def _capacities(text: str) -> list[int]:
    try:
        values = [float(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected capacities such as 1e4,1e5; got {text!r}") from None
    if any(not v.is_integer() or not 1 <= v <= MAX_CAPACITY for v in values):
        raise argparse.ArgumentTypeError(f"capacities must be whole numbers in [1, 1e9]; got {text!r}")
    return sorted({int(v) for v in values})


def default_peers() -> list[str]:
    """PAL and every installed peer, then the bandwidth floor."""
    return [n for n in ADAPTERS if n != "pal-uniform" and available(n) is None] + ["floor-gather"]


def conformance_of(results: pd.DataFrame, names: list[str]) -> dict[str, str]:
    """impl -> "conforms", "FAILS sampling, weights" or "not checked"."""
    out = {}
    for name in names:
        rows = results[results.impl == name]
        bad = rows[rows.status == "FAIL"].property.tolist()
        out[name] = "not checked" if rows.empty else (f"FAILS {', '.join(bad)}" if bad else "conforms")
    return out


def tidy(json_path: Path, workload: str, conformance: dict[str, str]) -> pd.DataFrame:
    """latency.csv's rows from the suite's JSON: one per case, with the median's bootstrap interval."""
    df, _ = suite_json.load(json_path)
    rows = []
    for r in df.itertuples():
        point, lo, hi = median_ci(r.sample_us) if r.status == "ok" and r.sample_us else (r.median_us, None, None)
        rows.append(dict(impl=r.peer, workload=workload, op=r.op, capacity=r.capacity, batch=r.batch,
                         median_us=r.median_us if r.status == "ok" else None, ci_low=lo, ci_high=hi,
                         iqr_us=r.iqr_us if r.status == "ok" else None,
                         rounds=r.rounds if r.status == "ok" else None, status=r.status, reason=r.reason,
                         conformance=conformance.get(r.peer, "not checked")))
    return pd.DataFrame(rows, columns=COLUMNS)


def table(df: pd.DataFrame) -> str:
    """Median µs per operation and capacity (rows) and implementation (columns); a failed check is marked."""
    ok = df[df.status == "ok"].copy()
    if ok.empty:
        return "no case ran (see the reasons in latency.csv)"
    ok["impl"] = [i + (" (FAILS CHECK)" if c.startswith("FAILS") else "") for i, c in zip(ok.impl, ok.conformance)]
    ok["capacity"] = [f"{c:.0e}".replace("e+0", "e") for c in ok.capacity]
    wide = ok.pivot_table(index=["op", "capacity"], columns="impl", values="median_us", sort=False)
    return wide.to_string(float_format=lambda v: f"{v:,.1f}", na_rep="-")


def _builtin_problem(name: str, as_impl: bool) -> str:
    why = available(name) or ""
    if not why and as_impl and not adapter_class(name).INSERTS:
        why = "stores no transitions"
    return why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", type=_names, required=True,
                    help="your buffer(s): module:Class or an entry-point name (comma-separated)")
    ap.add_argument("--peers", type=_names,
                    help="measured beside it (default: pal, every installed peer and floor-gather; 'none' for none)")
    ap.add_argument("--workload", choices=list(WORKLOADS), default="lunarlander",
                    help="the transition every buffer stores (default lunarlander)")
    ap.add_argument("--capacity", type=_capacities, default=list(DEFAULT_CAPACITIES),
                    help="buffer sizes, comma-separated (default 1e4,1e5)")
    ap.add_argument("--out", type=Path, default=Path("pal-bench-latency"),
                    help="folder for latency.csv, the figures and the raw JSON (default ./pal-bench-latency)")
    ap.add_argument("--no-check", action="store_true", help="time without running check-buffer first")
    ap.add_argument("--timeout", type=number(Range(0, 7 * 86_400, lo_open=True), float), default=SUITE_TIMEOUT_S,
                    help=f"seconds the timing may take before it is stopped (default {SUITE_TIMEOUT_S})")
    conditions.add_force_flag(ap)
    args = ap.parse_args(argv)

    peers = [] if args.peers == ["none"] else (args.peers if args.peers is not None else default_peers())
    names = list(dict.fromkeys([*peers, *args.impl]))
    # a built-in name is looked up here; any other buffer is loaded in a child first (a module that hangs or exits
    # at import does so there)
    why = {n: resolve([n])[n] if not builtin(n) else _builtin_problem(n, n in args.impl) for n in names}
    bad = {n: w for n, w in why.items() if w}
    if bad:
        raise UsageError("; ".join(f"{n}: {w}" for n, w in bad.items()))
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    if conditions.refuse_if_busy("pal-bench latency", args.force):
        return 2
    checked = pd.DataFrame(columns=["impl", "property", "status", "detail"])
    if not args.no_check:
        to_check = [n for n in names if n in PROTOCOL_CLASSES or not builtin(n)]
        print(f"== check-buffer {', '.join(to_check)}", flush=True)
        checked = check_buffers(to_check, progress=lambda line: print(line, flush=True))
    conformance = conformance_of(checked, names)
    broken = set(checked[(checked.property == "construct") & (checked.status == "FAIL")].impl)
    timed = [n for n in names if n not in broken]
    for n in sorted(broken):
        print(f"not timed: {n} (its construct check failed)")
    if not timed:
        raise UsageError("no buffer left to time")
    env = {"PAL_BENCH_CAPACITIES": ",".join(map(str, args.capacity)), "PYTHONPATH": user_path()}
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "latency_vs_capacity.json"
    json_path.unlink(missing_ok=True)          # never tidy an earlier run's results as this one's
    with conditions.Conditions(f"pal-bench latency {', '.join(args.impl)} ({args.workload})") as c:
        rc = run_suite("latency_vs_capacity", "quick", args.out, ",".join(timed), [], args.workload, env=env,
                       timeout_s=args.timeout)
    if not json_path.exists():
        raise UsageError(f"the suite wrote no results (pytest exit status {rc}); its output is above")
    df = tidy(json_path, args.workload, conformance)
    store(df, args.out / "latency.csv", c, float_format="%.3f")
    print(f"\n{args.workload} rows, batch 256: median µs per call\n{table(df)}")
    skipped = df[df.status == "skipped"]
    for r in skipped.drop_duplicates(["impl", "reason"]).itertuples():
        print(f"  skipped {r.impl}: {r.reason}")
    ok = df[df.status == "ok"].rename(columns={"impl": "peer"})
    if not ok.empty:
        note = f"PAL-Bench latency, {args.workload} rows, {conditions.cpu_model()}"
        for f in latency_vs_capacity(ok, args.out, note):
            print(f"figure: {f}")
    print(f"wrote {args.out / 'latency.csv'}")
    return 0 if rc in (0, 5) else rc


if __name__ == "__main__":
    sys.exit(main())
