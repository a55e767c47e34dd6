"""What a measurement ran under, and the bootstrap intervals of ratios."""

import json
import math

import numpy as np
import pytest

from pal_bench import conditions
from pal_bench.bench import stats


class FakeClock:
    """``sleep`` and ``clock`` for ``settle``: sleeping advances the clock, nothing waits."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, s):
        self.now += s

    def clock(self):
        return self.now


def test_a_busy_machine_is_refused_unless_forced(monkeypatch, capsys):
    monkeypatch.setattr(conditions, "load1", lambda: 5.0)
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    with pytest.raises(conditions.BusyMachineError, match="--force"):
        conditions.check_quiet("sweep")
    fake = FakeClock()
    assert conditions.refuse_if_busy("sweep", force=False, sleep=fake.sleep, clock=fake.clock) is True
    assert fake.now == conditions.SETTLE_S                       # it waited the whole settle time first
    assert conditions.refuse_if_busy("sweep", force=True) is False
    err = capsys.readouterr().err
    assert "sweep" in err and "load average is 5.00" in err and "marked noisy" in err
    assert "waiting up to 120 s" in err


def test_a_sweep_waits_for_the_previous_steps_load_to_fall(monkeypatch, capsys):
    """``make bench`` runs its steps back to back: a load left by the previous step that falls within the
    settle time delays the next one instead of refusing it."""
    loads = iter([1.46, 1.3, 1.1, 0.9, 0.9, 0.9])
    monkeypatch.setattr(conditions, "load1", lambda: next(loads))
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    fake = FakeClock()
    assert conditions.refuse_if_busy("suites", force=False, sleep=fake.sleep, clock=fake.clock) is False
    assert 0 < fake.now < conditions.SETTLE_S
    err = capsys.readouterr().err
    assert "suites: waiting up to 120 s for the load average (1.46)" in err and "marked noisy" not in err


def test_conditions_are_recorded_beside_the_result_and_mark_noise(tmp_path, monkeypatch):
    loads = iter([0.2, 3.0])
    monkeypatch.setattr(conditions, "load1", lambda: next(loads))
    monkeypatch.setattr(conditions, "_cpu_seconds", lambda: 0.0)      # this process was idle: the load was others
    monkeypatch.setattr(conditions, "machine_busy_seconds", lambda: None)   # no /proc/stat: the load decides
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    result = tmp_path / "x.csv"
    result.write_text("a\n1\n")
    with conditions.Conditions("test run", command="cmd --flag") as c:
        pass
    c.write(result)
    meta = conditions.read_meta(result)
    assert meta == json.loads((tmp_path / "x.csv.meta.json").read_text())
    assert (meta["load_before"], meta["load_after"], meta["noisy"]) == (0.2, 3.0, True)
    assert meta["command"] == "cmd --flag" and meta["machine"]["cpu"] and meta["versions"]["numpy"]
    assert meta["threads"]["OMP_NUM_THREADS"] == "1" and "MKL_NUM_THREADS" not in meta["threads"]
    assert "**noisy**" in conditions.describe(meta) and "load 0.2 -> 3.0" in conditions.describe(meta)
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob(".*.tmp"))


def test_the_measurements_own_load_does_not_make_it_noisy(monkeypatch):
    loads = iter([0.3, 1.8])
    monkeypatch.setattr(conditions, "load1", lambda: next(loads))
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    cpu = iter([0.0, 90.0])                           # 90 CPU seconds ...
    monkeypatch.setattr(conditions, "_cpu_seconds", lambda: next(cpu))
    busy = iter([1000.0, 1000.0 + 96.0])               # the machine: 96 busy CPU seconds, 90 of them ours
    monkeypatch.setattr(conditions, "machine_busy_seconds", lambda: next(busy))
    c = conditions.Conditions("own load")
    c._t0 -= 60                                       # ... over 60 s: 1.5 cores of the 1.8 were ours
    meta = c.finish()
    assert meta["own_cores"] == pytest.approx(1.5, abs=0.05) and meta["noisy"] is False
    assert meta["other_cores"] == pytest.approx(0.1, abs=0.05)


def test_other_processes_busy_during_the_run_make_it_noisy(monkeypatch):
    loads = iter([0.3, 1.9])
    monkeypatch.setattr(conditions, "load1", lambda: next(loads))
    monkeypatch.setattr(conditions, "usable_cores", lambda: 2)
    cpu = iter([0.0, 30.0])                           # we used half a core over 60 s ...
    monkeypatch.setattr(conditions, "_cpu_seconds", lambda: next(cpu))
    busy = iter([0.0, 110.0])                         # ... the machine 110 CPU seconds: others 80 (1.33 cores)
    monkeypatch.setattr(conditions, "machine_busy_seconds", lambda: next(busy))
    c = conditions.Conditions("contended")
    c._t0 -= 60
    meta = c.finish()
    assert meta["other_cores"] == pytest.approx(1.33, abs=0.05) and meta["noisy"] is True


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_text("good")

    def boom(*a):
        raise OSError("disk full")
    monkeypatch.setattr(conditions.os, "fsync", boom)
    with pytest.raises(OSError):
        conditions.atomic_write_text(path, "half")
    assert path.read_text() == "good" and len(list(tmp_path.iterdir())) == 1


def test_ratio_interval_covers_the_true_ratio_and_needs_repetitions():
    rng = np.random.default_rng(0)
    slow, fast = rng.normal(30, 2, 200), rng.normal(10, 1, 200)
    point, lo, hi = stats.ratio_ci(slow, fast)
    assert lo < 3.0 < hi and lo < point < hi and hi - lo < 0.3
    assert math.isnan(stats.ratio_ci([30.0], fast)[1])
    assert stats.fmt_ci(point, lo, hi, 1).startswith(f"{point:.1f} [")
    assert stats.fmt_ci(2.0, math.nan, math.nan) == "2.00" and stats.fmt_ci(math.nan, 1, 2) == "n/a"


def test_descendants_cpu_is_counted_as_our_own():
    """A child that has used 0.8 s of CPU (its own clock, so the machine's load does not matter) and is
    still alive, never reaped: its CPU time is counted from /proc."""
    import subprocess
    import sys

    c = conditions.Conditions("busy child")
    burn = ("import sys, time\nwhile time.process_time() < 0.8: pass\n"
            "print('done', flush=True)\ntime.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        c._tree.sample()                              # sampled while alive, never reaped by rusage ...
        tree = c._tree.stop()
    finally:
        child.kill()
        child.wait()
    assert tree >= 0.7                                # ... but its CPU time was seen
