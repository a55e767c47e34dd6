"""The conditions a measurement ran under: machine, commit, versions, date, load before and after.

Every stored result carries them (``record(path, ...)`` writes ``<result>.meta.json`` beside a CSV;
JSON results embed them under ``"conditions"``), so a table can say where each number came from and
mark the ones measured on a busy machine (1-minute load average above half the usable cores) as noisy.

    check_quiet("scaling", force)         # BusyMachineError on a busy machine unless forced (then a warning)
    with Conditions("scaling") as c:      # reads the load before
        ...measure...
    c.write(Path("results/scaling.csv"))  # load after, commit, machine, versions -> results/scaling.csv.meta.json
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from pal_bench.argtypes import UsageError
from pal_bench.atomic import atomic_write_text  # noqa: F401 - re-exported: the studies write through it
from pal_bench.paths import ROOT

PACKAGES = ("numpy", "torch", "gymnasium", "cython", "tianshou", "cpprb", "ray", "pandas", "scipy")


class BusyMachineError(RuntimeError):
    """The machine's load is above half its cores and the caller did not pass ``force``."""


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load1() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def noisy_limit() -> float:
    """Load above which a measurement is marked noisy: half the usable cores."""
    return usable_cores() / 2


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def meminfo_bytes(key: str) -> int | None:
    """A /proc/meminfo entry (``MemTotal``, ``MemAvailable``) in bytes; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_gib() -> float | None:
    total = meminfo_bytes("MemTotal")
    return None if total is None else round(total / 2**30, 1)


def commit() -> str:
    """The checked-out commit, with ``+dirty`` when tracked code has changes ('' outside git). Changes to
    stored results and to the published text (results/, docs/, README.md) do not count: measuring
    commands write those themselves."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!results", ":!docs", ":!README.md"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + ("+dirty" if sha and dirty else "")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads() -> dict[str, str | int]:
    """The thread settings a measurement ran with: the variables above as set (unset: each library's default,
    about one thread per core), and torch's intra-op threads if torch is loaded (``torch``)."""
    out: dict[str, str | int] = {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        out["torch"] = torch.get_num_threads()
    return out


def machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable_cores(), "memory_gib": memory_gib(),
            "system": f"{platform.system()} {platform.release()}", "arch": platform.machine()}


def check_quiet(what: str, force: bool = False) -> float:
    """The load now; on a busy machine (load > half the cores) a warning, or ``BusyMachineError``
    unless ``force``. Sweep commands call this before they start."""
    load, limit = load1(), noisy_limit()
    if load > limit:
        msg = (f"the 1-minute load average is {load:.2f}, above half of the {usable_cores()} usable cores "
               f"({limit:g}); results measured now are marked noisy")
        if not force:
            raise BusyMachineError(msg + ". Wait for a quiet machine, or pass --force to measure anyway.")
        print(f"warning: {msg} (--force)", file=sys.stderr)
    return load


def settle(max_wait_s: float, poll_s: float = 5.0, progress=None, sleep=time.sleep, clock=time.monotonic) -> bool:
    """Wait (at most ``max_wait_s``) until the 1-minute load average is at or under half the usable cores;
    True once it is. Between runs of one command this lets the load average forget the previous run (it
    decays with a one-minute time constant, so two busy cores take about a minute to read as quiet), so that
    only other processes mark the next run noisy. ``progress`` gets one line when it starts waiting."""
    deadline = clock() + max_wait_s
    said = False
    while (load := load1()) > noisy_limit():
        if clock() >= deadline:
            return False
        if progress is not None and not said:
            progress(f"waiting up to {max_wait_s:.0f} s for the load average ({load:.2f}) to fall to "
                     f"{noisy_limit():g} (the previous run's own load)")
            said = True
        sleep(min(poll_s, max(0.0, deadline - clock())))
    return True


def machine_busy_seconds() -> float | None:
    """CPU seconds every process of the machine has kept cores busy since boot (/proc/stat), or None: the
    difference over a run counts work in processes this one never reaps (Ray's workers)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)          # idle + iowait
    busy = sum(fields[:8]) - idle                                      # guest time is inside user time
    return busy / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _cpu_seconds() -> float:
    """CPU seconds used by this process and its reaped children so far."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def descendants(root: int | None = None) -> dict[int, list[str]]:
    """{pid: its /proc/<pid>/stat fields after the command name} for every live descendant of ``root`` (default:
    this process), a zombie included (Linux /proc; empty where it cannot be read)."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return {}
    for d in entries:
        if not d.name.isascii() or not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(d.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        stats[int(d.name)] = fields
    out = {}
    for pid, fields in stats.items():
        p, hops = parents.get(pid), 0
        while p not in (None, 0, 1, root) and hops < 64:
            p, hops = parents.get(p), hops + 1
        if p == root and pid != root:
            out[pid] = fields
    return out


class _TreeCpu:
    """CPU seconds of this process's descendants that rusage cannot see: those still alive (not reaped) when the
    measurement ends, such as Ray's workers or a child killed later (Linux /proc, read at the start and at
    ``stop()``; nothing runs in between).

    Every descendant's CPU is counted once: a descendant that ended and was reaped by its parent is inside that
    parent's counters (``RUSAGE_CHILDREN`` for our own children, ``cutime``/``cstime`` of a live descendant), so
    only the descendants alive at ``stop()`` are added, each from where it stood at the start. A descendant that
    was alive at the start and ended during the run brought its CPU before the start into its parent's counters;
    that part is taken off again. A descendant orphaned before the end (its parent died first, it was reparented
    away) is not seen: its CPU reads as other processes', which errs towards marking the run noisy."""

    def __init__(self):
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.before: dict[tuple[int, str], float] = self.sample()

    def sample(self) -> dict[tuple[int, str], float]:
        """{(pid, start time): CPU seconds of it and its reaped children} for every live descendant (a zombie
        included: its times stay readable until its parent reaps it)."""
        out = {}
        for pid, fields in descendants().items():       # utime + stime + its reaped children's
            try:
                out[(pid, fields[19])] = sum(int(fields[i]) for i in (11, 12, 13, 14)) / self._tick
            except (IndexError, ValueError):
                continue
        return out

    def stop(self) -> float:
        """CPU seconds the descendants used since the start that ``RUSAGE_CHILDREN`` does not hold."""
        now = self.sample()
        alive = sum(cpu - self.before.get(key, 0.0) for key, cpu in now.items())
        ended = sum(cpu for key, cpu in self.before.items() if key not in now)
        return alive - ended


class Conditions:
    """Conditions of one measurement: load before (at construction) and after (at ``finish``).

    The load average counts the measurement's own runnable threads too (more than its cores when it
    oversubscribes them), so the result is marked noisy when the load before exceeded half the usable
    cores (the machine was busy as it started), or when *other* processes kept more than half the cores
    busy on average while it ran: ``other_cores`` = the machine's busy CPU seconds (/proc/stat) less those
    of this process and its descendants (``own_cores``: rusage for this process and its reaped children,
    /proc for the descendants still alive at the end, such as Ray's workers; each counted once), over the
    wall time.
    """

    def __init__(self, what: str, command: str | None = None):
        self.what = what
        self.command = command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self.load_before = load1()
        self.commit = commit()           # the code that measured, read before any result is written
        self.load_after: float | None = None
        self.own_cores: float | None = None
        self.finished: _dt.datetime | None = None
        self._cpu0, self._t0 = _cpu_seconds(), _dt.datetime.now().timestamp()
        self._busy0 = machine_busy_seconds()
        self.other_cores: float | None = None
        self._tree = _TreeCpu()

    def __enter__(self) -> Conditions:
        return self

    def __exit__(self, *exc) -> None:
        if self.load_after is None:
            self.finish()

    def finish(self) -> dict:
        self.load_after = load1()
        self.finished = _dt.datetime.now(_dt.timezone.utc)
        wall = max(_dt.datetime.now().timestamp() - self._t0, 1e-9)
        # reaped descendants are in rusage (or in a live descendant's own counters), live ones in the sampler:
        # each counted once
        self.own_cores = (_cpu_seconds() - self._cpu0 + self._tree.stop()) / wall
        busy = machine_busy_seconds()
        if busy is not None and self._busy0 is not None:
            self.other_cores = max(0.0, (busy - self._busy0) / wall - self.own_cores)
        return self.as_dict()

    def noisy(self) -> bool:
        """Busy as it started (load before), or other processes kept more than half the cores busy on
        average while it ran (``other_cores``; where /proc/stat is missing: load after less ``own_cores``)."""
        if self.other_cores is not None:
            during = self.other_cores
        elif self.load_after is not None:
            during = self.load_after - (self.own_cores or 0.0)
        else:
            during = 0.0
        return max(self.load_before, during) > noisy_limit()

    def as_dict(self) -> dict:
        return {
            "what": self.what, "command": self.command,
            "started": self.started.isoformat(timespec="seconds"),
            "finished": self.finished.isoformat(timespec="seconds") if self.finished else None,
            "load_before": round(self.load_before, 2),
            "load_after": None if self.load_after is None else round(self.load_after, 2),
            "own_cores": None if self.own_cores is None else round(self.own_cores, 2),
            "other_cores": None if self.other_cores is None else round(self.other_cores, 2),
            "noisy": self.noisy(),
            "noisy_limit": noisy_limit(),
            "commit": self.commit, "machine": machine(), "versions": versions(), "threads": threads(),
        }

    def write(self, result: Path) -> Path:
        """Write ``<result>.meta.json`` beside a stored result file (atomically)."""
        if self.load_after is None:
            self.finish()
        return write_meta(result, self.as_dict())


OUTLIER_DEVIATION = 0.15     # a repeat this far from the median of the others is flagged (17% seen: issue 49)


def outlier_repeats(values) -> list[int]:
    """Indices of the repeats of one point whose throughput is an outlier among its repeats: more than
    ``OUTLIER_DEVIATION`` (relative) away from the median of all of them. Needs three repeats (of two, neither can
    be told from the other: none is flagged)."""
    values = [float(v) for v in values]
    if len(values) < 3:
        return []
    mid = statistics.median(values)
    return [i for i, v in enumerate(values) if mid > 0 and abs(v - mid) / mid > OUTLIER_DEVIATION]


def meta_path(result: Path) -> Path:
    result = Path(result)
    return result.with_name(result.name + ".meta.json")


def write_meta(result: Path, meta: dict) -> Path:
    path = meta_path(result)
    atomic_write_text(path, json.dumps(meta, indent=1) + "\n")
    return path


MAX_META_BYTES = 1 << 20        # a conditions file is about 2 kB


def read_meta(result: Path) -> dict | None:
    """The conditions stored beside ``result`` (None where none were recorded); ValueError naming the file where
    it is not a small regular file of JSON (a FIFO, a link, nested past the recursion limit: results directories
    are exchanged)."""
    from pal_bench.stored_tables import read_json  # (it loads pandas: only where conditions are read)

    path = meta_path(result)
    if not os.path.lexists(path):
        return None
    try:
        return read_json(path, MAX_META_BYTES)
    except UsageError as e:
        raise ValueError(str(e)) from None


def describe(meta: dict | None) -> str:
    """One line for a table's caption: machine, date, load, commit; '(no conditions recorded)' otherwise."""
    if not meta:
        return "conditions not recorded"
    m = meta.get("machine", {})
    load = f"load {meta.get('load_before')} -> {meta.get('load_after')}"
    noisy = " **noisy**" if meta.get("noisy") else ""
    when = (meta.get("started") or "")[:16].replace("T", " ")
    return (f"{m.get('cpu', '?')}, {m.get('usable_cores', '?')} cores, {m.get('memory_gib', '?')} GiB; {when} UTC; "
            f"{load}{noisy}; commit {meta.get('commit') or '?'}")


def add_force_flag(parser) -> None:
    """``--force``: measure even when the machine is busy (the results are then marked noisy)."""
    parser.add_argument("--force", action="store_true",
                        help="measure even when the 1-minute load average is above half the cores "
                             "(the results are marked noisy)")


#: seconds a sweep waits for the load average to fall before it refuses (the previous step of ``make bench``
#: leaves its own load behind: two busy cores read as busy for about a minute after they stop)
SETTLE_S = 120.0


def refuse_if_busy(what: str, force: bool, settle_s: float = SETTLE_S, sleep=time.sleep,
                   clock=time.monotonic) -> bool:
    """True (after printing why) when a sweep should not start: the machine is still busy after waiting up to
    ``settle_s`` for the load average to fall (one progress line while it waits), and ``force`` is off."""
    if not force:
        settle(settle_s, progress=lambda m: print(f"{what}: {m}", file=sys.stderr, flush=True),
               sleep=sleep, clock=clock)
    try:
        check_quiet(what, force)
    except BusyMachineError as e:
        print(f"{what}: {e}", file=sys.stderr)
        return True
    return False
