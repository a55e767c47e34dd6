"""The plug-in benchmark's machinery: the buffer clock, the speedup table and its Amdahl bound, the paired runs."""

import time

import pandas as pd
import pytest

from pal_bench.studies.plugin import measure as plugin_bench
from pal_bench.studies.plugin.publish import speedup_table


def test_buffer_clock_sums_time_inside_the_wrapped_methods():
    class Slow:
        def add(self, x):
            time.sleep(0.01)
            return x

    buf = Slow()
    clock = plugin_bench.BufferClock(buf, methods=("add", "sample"))
    assert buf.add(3) == 3 and buf.add(4) == 4
    assert 0.02 <= clock.seconds < 0.5


def test_speedup_table_and_amdahl_bound():
    rows = [dict(framework="rllib-dqn", env="E", batch_size=32, env_runners=0, buffer="default",
                 iteration_s=1.0, buffer_share=0.5),
            dict(framework="rllib-dqn", env="E", batch_size=32, env_runners=0, buffer="pal",
                 iteration_s=0.8, buffer_share=0.3)]
    t = speedup_table(pd.DataFrame(rows))
    assert t.speedup.iloc[0] == pytest.approx(1.25) and t.bound.iloc[0] == pytest.approx(2.0)
    assert t.note.iloc[0] == ""
    # above the bound: expected for a drop-in that changes work outside the buffer, a problem otherwise
    fast = [r | {"iteration_s": 0.4} if r["buffer"] == "pal" else r for r in rows]
    for framework, problem in (("rllib-dqn", False), ("tianshou-dqn", True)):
        t = speedup_table(pd.DataFrame([r | {"framework": framework} for r in fast]))
        assert t.speedup.iloc[0] == pytest.approx(2.5)
        assert ("measurement problem" in t.note.iloc[0] or "not a result" in t.note.iloc[0]) == problem
        assert "learner-connector" in t.note.iloc[0] or problem


def test_paired_alternates_the_two_buffers_and_closes_both():
    log = []

    class Buf:
        def __len__(self):
            return 7

        def add(self):
            time.sleep(0.002)

    class Run:
        methods = ("add",)

        def __init__(self, name):
            self.name, self.buffer, self.closed = name, Buf(), False

        def prepare(self, warmup):
            log.append(("prepare", self.name, warmup))

        def iterate(self):
            log.append(("iterate", self.name))
            self.buffer.add()

        def close(self):
            log.append(("close", self.name))

    out = plugin_bench.paired(Run, warmup=2, iters=4)
    order = [name for what, name, *_ in log if what == "iterate"]
    assert order == ["default", "pal", "pal", "default", "default", "pal", "pal", "default"]
    assert [e for e in log if e[0] == "close"] == [("close", "default"), ("close", "pal")]
    for r in out.values():
        assert r["iterations"] == 4 and r["buffer_len"] == 7 and 0 < r["buffer_share"] <= 1
