"""Everything published, rebuilt from stored results: ``python -m pal_bench.report`` (``make figures``).

Reads only the files in ``results/`` (never re-measures), so it can be re-run at any time. It knows no study:
each study registered in ``pal_bench.studies.registry`` publishes itself (``pal_bench.bench.publishing``): its
derived files and figures (``outputs``) and its generated blocks of README.md and ``docs/*.md``. ``--html``
(``pal-bench report``) also writes the static page ``results/report/index.html`` (``pal_bench.bench.html_report``).

Results directories come from other versions, other people and interrupted runs: a study whose block or figures
cannot be built from what is stored (a row, point or column missing or relabelled) is skipped with one line on
stderr naming the block (or study) and why, its block left as it was; everything else is still built, and the
exit status stays 0 (``make figures`` goes on). Every value from a results file is escaped where it enters the
markdown (``publishing.esc``), and the HTML page passes no raw HTML through.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pal_bench.bench import publishing
from pal_bench.paths import RESULTS, ROOT
from pal_bench.studies import registry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="where README.md and docs/ are (their generated blocks are rebuilt)")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    ap.add_argument("--no-docs", action="store_true", help="leave README.md and docs/ alone")
    ap.add_argument("--html", action="store_true", help="also write the HTML page (see --out)")
    ap.add_argument("--out", type=Path, help="where the HTML page goes (default: <results>/report)")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        ap.error(f"argument --results: {args.results} is not a directory")
    written: list[Path] = []
    skipped: list[str] = []
    for pub in registry.publications():
        try:
            written += pub.outputs(args.results, not args.no_figures)
        except publishing.SKIPPABLE as e:
            skipped.append(f"the files and figures of study {pub.study}: {publishing.reason(e)}")
        finally:
            _close_figures()
    if not written and not any(p.suffix in (".json", ".csv") for p in args.results.iterdir()):
        print(f"pal-bench report: no results in {args.results}: run `make bench` (or another study) first",
              file=sys.stderr)
        return 2
    for f in written:
        print(f"{'figure' if f.suffix == '.png' else 'wrote'}: {f}")
    if not args.no_docs:
        files = [f for f in publishing.doc_files(args.root) if f.exists()]
        changed = publishing.regenerate(files, args.results, registry.blocks(), skipped=skipped)
        print(f"generated blocks rebuilt in {len(files)} files; changed: "
              + (", ".join(changed) if changed else "none"))
    for line in skipped:
        print(f"pal-bench report: skipped {line}", file=sys.stderr)
    if args.html:
        from pal_bench.bench import html_report

        print(f"report: {html_report.write(args.root, args.results, args.out)}")
    return 0


def _close_figures() -> None:
    """Close the figures a study left open when it stopped half-way (only if it loaded matplotlib at all)."""
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


if __name__ == "__main__":
    sys.exit(main())
