"""``pal-bench check-buffer NAME [NAME ...]``: does a buffer do what a prioritized replay buffer must?

One line per property (``pal_bench.bench.conformance`` says what each checks), exit status 1 if any fails. NAME is a
built-in buffer (``pal``, ``tianshou``, ``cpprb``, ``rllib``, ``rllib-episode``, ``pal-uniform``), a name
registered in the entry-point group ``pal_bench.buffers``, or ``module:Class`` (importable from the current
directory). ``--builtin`` checks every built-in buffer that is installed.

Each buffer is checked in a child process: one that crashes (cpprb on an out-of-range index) or hangs is reported
against the property it was on, the child is started again for the bad-input properties still to run, and the
command goes on. ``--out FILE`` stores the results as CSV (``results/conformance.csv``, from which ``make
figures`` builds the table in docs/latency.md).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from pal_bench import conditions
from pal_bench.argtypes import Range, UsageError, number, printable, rng_seed
from pal_bench.bench.adapters.registry import PROTOCOL_CLASSES, available
from pal_bench.bench.conformance import PROPERTIES, STATUSES
from pal_bench.bench.publishing import Markup, Publication, esc, md, missing, source, store
from pal_bench.bench.run import user_path
from pal_bench.stored_tables import Column, read_table
from pal_bench.studies.race import stop_on_termination

MAX_LINE = 1 << 16           # bytes of one line from the child (its details are cut to MAX_DETAIL characters)
MAX_DETAIL = 2000
LOAD_TIMEOUT_S = 60         # seconds a child may take to import a buffer's module
TIMEOUT_S = 300              # per buffer: a child that says nothing for this long is taken as hung
# properties that start from a fresh buffer: after a crash the child is restarted at the next of them
RESTARTABLE = tuple(p for p in PROPERTIES if p.startswith("bad-"))
COLUMNS = {"impl": Column(str), "property": Column(str, choices=PROPERTIES), "status": Column(str, choices=STATUSES),
           "detail": Column(str, required=False, default="")}


def _child_env() -> dict:
    """The child imports what this process can from the current directory and PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=user_path())


def _child(args: list[str], timeout_s: float, on_message) -> tuple[int | None, str]:
    """Run ``python -m pal_bench.bench.conformance ARGS FD`` in its own session; every JSON object it writes on its
    results pipe goes to ``on_message`` (which returns True when the child is making progress: the deadline
    starts again). Returns (its exit status, None when it was killed for saying nothing for ``timeout_s``; the last
    line it printed on stdout or stderr). The whole process group is killed before this returns."""
    fd, child_fd = os.pipe()          # results come on their own pipe: what the buffer prints goes to ``log``
    log = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "pal_bench.bench.conformance", *args, str(child_fd)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_child_env(),
                                start_new_session=True, pass_fds=(child_fd,))
    finally:
        os.close(child_fd)
    deadline = time.monotonic() + timeout_s
    pending = b""
    rc: int | None = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break                                    # hung: rc stays None
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            chunk = os.read(fd, 1 << 16) if ready else b""   # unbuffered: select sees every byte not yet read
            if ready and not chunk:
                rc = proc.wait()                         # end of the pipe: the child is gone (or closed it)
                break
            if not ready and proc.poll() is not None:   # the child ended; a process it forked may hold the pipe
                rc = proc.returncode
                break
            *lines, pending = (pending + chunk).split(b"\n")
            pending = pending[-MAX_LINE:]
            for line in lines:
                try:
                    msg = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(msg, dict) and on_message(msg):
                    deadline = time.monotonic() + timeout_s
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        os.close(fd)
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        last = log.read().decode(errors="replace").strip().splitlines()
        log.close()
    return rc, printable(last[-1][:300]) if last else ""


def _died(rc: int | None, timeout_s: float, last: str) -> str:
    if rc is None:
        return f"no answer in {timeout_s:g} s (hung); the child was killed"
    if rc < 0:
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exit status {rc}"
    return f"the process died ({how})" + (f": {last}" if last else "")


def resolve(names: list[str], timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, str]:
    """name -> why it cannot be checked ('' when it loads as a buffer of the protocol), each looked up in a child
    (a module that hangs, exits or crashes at import does so there, within ``timeout_s``)."""
    out = {}
    for name in names:
        said: dict = {}
        rc, last = _child([name, "0", "resolve"], timeout_s, said.update)
        if "resolved" in said:
            out[name] = "" if said["resolved"] is True else str(said["resolved"])
        else:
            out[name] = f"loading it failed: {_died(rc, timeout_s, last)}"
    return out


def check_one(name: str, seed: int, timeout_s: float, say) -> None:
    """Every property of ``name``, each result to ``say`` exactly once, in ``PROPERTIES`` order: a child runs them;
    when it dies or hangs, its property fails with how, and a child is started again at the next bad-input
    property (they start from a fresh buffer) for the ones left; one that cannot start fails those."""
    got: dict[str, dict] = {}

    def report(prop: str, status: str, detail: str) -> None:
        if prop not in got:
            got[prop] = {"property": prop, "status": status, "detail": printable(detail)[:MAX_DETAIL]}
            say(got[prop])

    start_at: str | None = None
    current: list[str | None] = [None]          # the property the child is on

    def on_message(msg: dict) -> bool:
        if msg.get("start") in PROPERTIES:
            current[0] = msg["start"]
            return True
        if msg.get("property") == current[0] and msg.get("status") in STATUSES:
            report(current[0], msg["status"], str(msg.get("detail", "")))
            current[0] = None
            return True
        return False

    while True:
        current[0] = None
        rc, last = _child([name, str(seed), start_at or "-"], timeout_s, on_message)
        todo = [p for p in PROPERTIES if p not in got]
        if not todo:
            return
        where = current[0] or todo[0]
        how = _died(rc, timeout_s, last) if rc != 0 else "the child ended without reporting it"
        if start_at is not None and where == start_at and current[0] is None:
            for p in todo:                    # the restarted child did not get as far as its first property
                report(p, "FAIL", f"not run: the child started again for it did not get there ({how})")
            return
        report(where, "FAIL", how)
        later = [p for p in RESTARTABLE if p in todo and PROPERTIES.index(p) > PROPERTIES.index(where)]
        if where == "construct":
            later = []                        # no buffer: nothing else can run
        for p in todo:
            if p != where and (not later or PROPERTIES.index(p) < PROPERTIES.index(later[0])):
                report(p, "skip", f"not run: the child died in {where}")
        if not later:
            return
        start_at = later[0]


def check_buffers(names: list[str], seed: int = 0, timeout_s: float = TIMEOUT_S, progress=print) -> pd.DataFrame:
    """Every property of every buffer in ``names`` (one row each: impl, property, status, detail)."""
    rows: list[dict] = []
    for name in names:
        got: dict[str, dict] = {}

        def say(msg: dict, name=name, got=got) -> None:
            got[msg["property"]] = msg
            progress(_line(name, msg["property"], msg["status"], msg["detail"]))

        check_one(name, seed, timeout_s, say)
        rows += [dict(impl=name, **{k: got[p][k] for k in ("property", "status", "detail")}) for p in PROPERTIES]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _line(name: str, prop: str, status: str, detail: str) -> str:
    return f"{printable(name)}  {prop:<13} {status:<5} {detail}"


# ------------------------------------------------------------------ the table in docs/latency.md

SHORT = {"pass": "yes", "FAIL": "**no**", "note": "note", "skip": "n/a"}


def conformance_block(results: Path) -> str:
    path = results / "conformance.csv"
    if not path.exists():
        return missing("conformance.csv", "pal-bench check-buffer --builtin --out results/conformance.csv")
    df = read_table(path, COLUMNS, "conformance results as `pal-bench check-buffer --out` writes them", min_rows=1)
    if df.duplicated(["impl", "property"]).any():
        dup = df[df.duplicated(["impl", "property"])].iloc[0]
        raise UsageError(f"{path}: {dup.impl!r} has {dup.property!r} twice")
    impls = list(dict.fromkeys(df.impl))
    status = {(i, p): s for i, p, s in zip(df.impl, df.property, df.status)}
    props = [p for p in PROPERTIES if p in set(df.property)]
    # built cell by cell (an implementation may be named anything, "property" included)
    table = pd.DataFrame([[p] + [Markup(SHORT[status[i, p]]) if (i, p) in status else "" for i in impls]
                          for p in props], columns=pd.Index(["property", *impls]))
    lines = ["Each built-in buffer through the public protocol (`pal-bench check-buffer`; yes: the property holds, "
             "**no**: it does not, note: a deviation reported, not failed). Where each one differs from Schaul et al. "
             "2016, and how each normalises its weights:\n", md(table), ""]
    for impl in impls:
        rows = df[df.impl == impl]
        notes = [f"`{esc(p)}` {SHORT.get(s, esc(s))}: {esc(d)}" for p, s, d in zip(rows.property, rows.status,
                                                                                 rows.detail)
                 if s not in ("pass", "skip") or p in ("weights", "new-rows")]
        if notes:
            lines.append(f"- **{esc(impl)}**: " + "; ".join(notes))
    return "\n".join(lines) + "\n\n" + source(results, "conformance.csv") + "\n"


PUBLICATION = Publication("conformance", {"conformance": conformance_block})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pal-bench check-buffer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help="buffers to check (built-in, entry point or module:Class)")
    ap.add_argument("--builtin", action="store_true", help="every built-in buffer that is installed")
    ap.add_argument("--seed", type=rng_seed, default=0, help="seed of the buffers and of the checks' draws (default 0)")
    ap.add_argument("--timeout", type=number(Range(0, 86_400, lo_open=True), float), default=TIMEOUT_S,
                    help=f"seconds a property may run before the buffer is taken as hung (default {TIMEOUT_S})")
    ap.add_argument("--out", type=Path, help="store the results as CSV (e.g. results/conformance.csv)")
    args = ap.parse_args(argv)
    names = list(dict.fromkeys(args.names))
    if args.builtin:
        names += [n for n in PROTOCOL_CLASSES if n not in names and available(n) is None]
    if not names:
        ap.error("name a buffer (or --builtin)")
    if args.out is not None:
        _writable(args.out)
    stop_on_termination()
    try:
        # every name loads first (its module imported in a child: one that hangs at import is stopped)
        bad = {n: why for n, why in resolve(names, max(args.timeout, LOAD_TIMEOUT_S)).items() if why}
        if bad:
            raise UsageError("; ".join(f"{n}: {why}" for n, why in bad.items()))
        with conditions.Conditions(f"check-buffer {', '.join(names)}") as c:
            df = check_buffers(names, args.seed, args.timeout)
    except KeyboardInterrupt:
        print("check-buffer: interrupted; its child processes were stopped", file=sys.stderr)
        return 130
    if args.out is not None:
        store(df, args.out, c)
        print(f"wrote {args.out}", file=sys.stderr)
    failed = df[df.status == "FAIL"]
    for name in names:
        bad_props = failed[failed.impl == name].property.tolist()
        print(f"{printable(name)}: " + (f"FAILS {', '.join(bad_props)}" if bad_props else "conforms"), file=sys.stderr)
    return 1 if len(failed) else 0


def _writable(out: Path) -> None:
    """UsageError unless ``out`` can be written as a file (its folder made): found before anything runs."""
    if out.exists() and not out.is_file():
        raise UsageError(f"--out {out} is not a file")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot make its folder: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: its folder is not writable")


if __name__ == "__main__":
    sys.exit(main())
