"""Benchmark your own buffer: the public protocol, names that reach any implementation (``module:Class``, the
entry-point group ``pal_bench.buffers``), ``pal-bench check-buffer`` and ``pal-bench latency``.

The buffer under test is docs/latency.md's example, read from the page itself, so the example a user copies is the
one these tests run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pal_bench import PrioritizedReplayBuffer
from pal_bench.bench import conformance, protocol
from pal_bench.bench.adapters import registry
from pal_bench.paths import ROOT
from pal_bench.studies import conformance as check_cli

EXAMPLE = re.search(r"<!-- example: numpy buffer -->\n```python\n(.*?)```", (ROOT / "docs" / "latency.md").read_text(),
                    re.S).group(1)

# deviations of the example, each breaking one property
VARIANTS = """

class Uniform(NumpyPrioritized):
    def sample(self, batch_size, beta):
        idx = self.rng.integers(0, self.size, batch_size)
        p = self.prio[:self.size] / self.prio[:self.size].sum()
        w = (self.size * p[idx]) ** -beta / (self.size * p.min()) ** -beta
        return {k: v[idx] for k, v in self.data.items()} | {"indices": idx, "weights": w}


class FixedBeta(NumpyPrioritized):
    def sample(self, batch_size, beta):
        return super().sample(batch_size, 0.4)


class DeclaredUniform(NumpyPrioritized):
    PRIORITIZED = False
    update_priorities = None

    def __init__(self, capacity, fields, seed=None):
        super().__init__(capacity, fields, alpha=0.0, seed=seed)

    def sample(self, batch_size, beta):
        out = super().sample(batch_size, beta)
        out["weights"] = np.ones(batch_size)
        return out


class Crashes(NumpyPrioritized):
    def update_priorities(self, indices, priorities):
        import os, signal, time
        if np.any(np.isnan(np.asarray(priorities, dtype=float))):
            time.sleep(3600)                       # hangs on NaN
        if np.any(np.asarray(indices) < 0):
            os.kill(os.getpid(), signal.SIGSEGV)   # dies on a negative index
        return super().update_priorities(indices, priorities)


class DiesInTheSuite(NumpyPrioritized):
    def __init__(self, capacity, fields, alpha=0.6, seed=None):
        import os
        os._exit(3)


class RefusesToRestart(NumpyPrioritized):
    # dies on a NaN priority; built again (the child restarted for the rest), it raises

    def __init__(self, capacity, fields, alpha=0.6, seed=None):
        import sys
        if sys.argv[3] != "-":
            raise RuntimeError("cannot be built twice")
        super().__init__(capacity, fields, alpha, seed)

    def update_priorities(self, indices, priorities):
        import os
        if np.any(np.isnan(np.asarray(priorities, dtype=float))):
            os._exit(3)
        return super().update_priorities(indices, priorities)


class LongMessage(NumpyPrioritized):
    def __len__(self):
        raise ValueError("\x1b[2J" + "x" * 2_000_000)


class Hangs(NumpyPrioritized):
    def sample(self, batch_size, beta):
        import time
        time.sleep(3600)


class RealtimeSignal(NumpyPrioritized):
    def __init__(self, capacity, fields, alpha=0.6, seed=None):
        import os
        os.kill(os.getpid(), 40)


class NotABuffer:
    def sample(self, batch_size, beta):
        return {}
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """docs/latency.md's buffer (and its broken variants) in a module outside the package, on the path."""
    (tmp_path / "mybuf.py").write_text(EXAMPLE + VARIANTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("mybuf", None)
    yield tmp_path
    sys.modules.pop("mybuf", None)


def statuses(results) -> dict[str, str]:
    return {r.property: r.status for r in results}


def test_pal_conforms_in_every_property():
    got = conformance.check(PrioritizedReplayBuffer)
    assert [r.property for r in got] == list(conformance.PROPERTIES)
    assert statuses(got) == dict.fromkeys(conformance.PROPERTIES, "pass"), got


def test_the_docs_example_conforms(user_module):
    got = statuses(conformance.check(protocol.load_target("mybuf:NumpyPrioritized")))
    assert got == dict.fromkeys(conformance.PROPERTIES, "pass")


def test_a_declared_uniform_buffer_is_checked_against_uniform_draws(user_module):
    got = conformance.check(protocol.load_target("mybuf:DeclaredUniform"))
    by = {r.property: r for r in got}
    assert "FAIL" not in statuses(got).values(), got
    assert by["sampling"].status == "pass" and "uniform" in by["sampling"].detail
    assert by["new-rows"].status == by["bad-nan"].status == "skip"


def test_check_buffer_fails_a_uniform_sampler_on_sampling(user_module, capsys):
    assert check_cli.main(["mybuf:Uniform"]) == 1
    out = capsys.readouterr()
    lines = {ln.split()[1]: ln for ln in out.out.splitlines() if ln.startswith("mybuf:Uniform ")}
    assert " FAIL " in lines["sampling"] and "closer to uniform" in lines["sampling"]
    assert " pass " in lines["fields"] and "FAILS sampling" in out.err


def test_check_buffer_fails_weights_that_ignore_beta(user_module, capsys):
    assert check_cli.main(["mybuf:FixedBeta"]) == 1
    lines = {ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines()}
    assert " FAIL " in lines["weights"] and "beta 1.0" in lines["weights"]
    assert " pass " in lines["sampling"]


def test_a_crash_or_hang_is_reported_on_its_property_and_the_rest_still_run(user_module, tmp_path):
    df = check_cli.check_buffers(["mybuf:Crashes"], timeout_s=5, progress=lambda _: None)
    by = df.set_index("property")
    assert list(df.property) == list(conformance.PROPERTIES)
    assert by.status["bad-nan"] == "FAIL" and "hung" in by.detail["bad-nan"]
    assert by.status["bad-index"] == "FAIL" and "SIGSEGV" in by.detail["bad-index"]
    assert by.status["bad-negative"] == by.status["bad-shape"] == by.status["sampling"] == "pass"


@pytest.mark.parametrize("name, says", [
    ("nosuch", "unknown buffer 'nosuch'"),
    ("nosuch_module_x:Buf", "cannot import 'nosuch_module_x'"),
    ("mybuf:Missing", "has no 'Missing'"),
    ("mybuf:NotABuffer", "lacks add_batch, __len__, update_priorities"),
    ("mybuf:rows", "not a class"),
])
def test_a_name_that_is_not_a_buffer_is_refused_before_anything_runs(user_module, name, says, capsys):
    (user_module / "mybuf.py").write_text(EXAMPLE + VARIANTS + "\nrows = 3\n")
    from pal_bench import cli

    assert cli.main(["check-buffer", name]) == 2
    assert says in capsys.readouterr().err
    assert cli.main(["latency", "--impl", name, "--peers", "none", "--force"]) == 2
    assert says in capsys.readouterr().err


def test_names_resolve_builtin_entry_point_and_module_class(user_module, monkeypatch):
    assert registry.adapter_class("pal").name == "pal"
    cls = registry.adapter_class("mybuf:NumpyPrioritized")
    assert cls.name == "mybuf:NumpyPrioritized" and cls.IMPL.__name__ == "NumpyPrioritized" and cls.SINGLE_INSERT

    class EP:
        name, module, attr = "npbuf", "mybuf", "NumpyPrioritized"

    monkeypatch.setattr(protocol.importlib.metadata, "entry_points", lambda group: [EP] if group ==
                        protocol.ENTRY_POINT_GROUP else [])
    assert registry.implementation("npbuf").__name__ == "NumpyPrioritized"
    assert registry.available("npbuf") is None
    assert "not one of" in registry.available("npbuf2")


def _latency(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pal_bench.cli", "latency", "--capacity", "1000", "--force", *args]
    return subprocess.run(cmd, cwd=cwd, env=env or os.environ.copy(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def latency_run(tmp_path_factory):
    """One ``pal-bench latency`` run (1e3 rows) of two buffers that are not part of the package beside ``pal``: the
    docs example as ``module:Class`` from the current directory, and a uniform sampler registered as
    ``uniform-numpy`` by a package installed the way pip installs one (a ``*.dist-info`` folder with
    ``entry_points.txt`` on the path, what ``importlib.metadata`` reads)."""
    tmp = tmp_path_factory.mktemp("latency")
    (tmp / "mybuf.py").write_text(EXAMPLE + VARIANTS)
    site = tmp / "site"
    (site / "plugbuf").mkdir(parents=True)
    (site / "plugbuf" / "__init__.py").write_text(EXAMPLE + VARIANTS)
    dist = site / "plugbuf-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugbuf\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pal_bench.buffers]\nuniform-numpy = plugbuf:Uniform\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    out = tmp / "res"
    r = _latency(tmp, "--impl", "mybuf:NumpyPrioritized,uniform-numpy", "--peers", "pal", "--out", str(out), env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, out, pd.read_csv(out / "latency.csv")


def test_latency_measures_a_module_class_outside_the_package_beside_pal(latency_run):
    r, out, df = latency_run
    ok = df[df.status == "ok"]
    assert set(ok.impl) == {"pal", "mybuf:NumpyPrioritized", "uniform-numpy"}
    mine = ok[ok.impl == "mybuf:NumpyPrioritized"]
    assert set(mine.op) == {"insert_one", "insert_batch", "sample", "update", "sample_update"}
    assert (ok.capacity == 1000).all() and (ok.median_us > 0).all() and (ok.ci_low <= ok.ci_high).all()
    # the interval is the stored 200-round sample's, the median pytest-benchmark's over every round: the same op in
    # the same unit, so within a factor of 2 (an interval of another op or unit is off by far more; closer is a
    # wall-clock claim a shared machine breaks: 30% apart in a CI run of 2026-12-07)
    assert ((ok.ci_low < 2 * ok.median_us) & (ok.ci_high > ok.median_us / 2)).all()
    assert set(df[df.impl != "uniform-numpy"].conformance) == {"conforms"}
    assert (out / "latency_vs_capacity.png").stat().st_size > 0 and (out / "latency.csv.meta.json").exists()
    assert "mybuf:NumpyPrioritized" in r.stdout and "sample_update" in r.stdout


def test_latency_measures_an_entry_point_and_marks_its_failed_check(latency_run):
    r, _, df = latency_run
    assert len(df[(df.impl == "uniform-numpy") & (df.status == "ok")]) == 5
    assert set(df[df.impl == "uniform-numpy"].conformance) == {"FAILS sampling, update"}
    assert "uniform-numpy (FAILS CHECK)" in r.stdout


def test_latency_never_shows_an_earlier_run_as_this_one(user_module):
    """(adversarial pass) a suite that dies wrote no JSON: the one an earlier run left is not tidied again."""
    out = user_module / "res"
    out.mkdir()
    (out / "latency_vs_capacity.json").write_text('{"benchmarks": [], "machine_info": {}}')
    r = _latency(user_module, "--impl", "mybuf:DiesInTheSuite", "--peers", "none", "--no-check", "--out", str(out))
    assert r.returncode == 2 and "wrote no results" in r.stderr, r.stderr[-2000:]
    assert not (out / "latency.csv").exists()


def test_peers_in_full_mode_go_through_the_protocol_adapter():
    from pal_bench.bench.adapters.protocol import ProtocolAdapter

    for name in ("tianshou", "cpprb", "rllib"):
        assert issubclass(registry.adapter_class(name), ProtocolAdapter)
    assert set(registry.PROTOCOL_CLASSES) >= {"pal", "tianshou", "cpprb", "rllib", "rllib-episode"}


def test_rows_are_episodes_a_buffer_storing_observations_once_can_hold():
    r = conformance.rows(np.arange(32))
    cont = ~r["done"][:-1]
    np.testing.assert_array_equal(r["next_obs"][:-1][cont], r["obs"][1:][cont])
    assert r["done"].sum() == 2 and conformance.row_numbers(r, 32).tolist() == list(range(32))


def test_a_restart_that_fails_fails_the_properties_left_and_keeps_the_earlier_ones(user_module):
    df = check_cli.check_buffers(["mybuf:RefusesToRestart"], timeout_s=60, progress=lambda _: None)
    by = df.set_index("property")
    assert by.status["construct"] == by.status["update"] == "pass"          # results already in are kept
    assert by.status["bad-nan"] == "FAIL" and "exit status 3" in by.detail["bad-nan"]
    for p in ("bad-negative", "bad-index", "bad-shape"):
        assert by.status[p] == "FAIL" and "cannot be built twice" in by.detail[p]


def test_a_long_message_is_cut_and_an_unnamed_signal_is_named(user_module):
    df = check_cli.check_buffers(["mybuf:LongMessage", "mybuf:RealtimeSignal"], timeout_s=60,
                                 progress=lambda _: None)
    long = df[df.impl == "mybuf:LongMessage"].set_index("property")
    assert long.status["len"] == "FAIL" and len(long.detail["len"]) <= conformance.MAX_DETAIL
    assert "\x1b" not in long.detail["len"] and "\\x1b" in long.detail["len"]
    rt = df[df.impl == "mybuf:RealtimeSignal"].set_index("property")
    assert rt.status["construct"] == "FAIL" and "killed by signal 40" in rt.detail["construct"]
    assert len(rt) == len(conformance.PROPERTIES) and set(rt.status[1:]) == {"skip"}


def test_sigterm_stops_check_buffer_and_its_child(user_module):
    p = subprocess.Popen([sys.executable, "-m", "pal_bench.cli", "check-buffer", "--timeout", "120", "mybuf:Hangs"],
                         cwd=user_module, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def children() -> list[int]:
        out = subprocess.run(["pgrep", "-f", "pal_bench.bench.conformance mybuf:Hangs 0 -"], capture_output=True,
                             text=True).stdout
        return [int(x) for x in out.split()]

    deadline = time.monotonic() + 60
    while not children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert children(), "the check never started"
    time.sleep(1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 130 and "interrupted" in p.stderr.read()
    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert children() == []


def test_names_and_paths_the_adversarial_pass_found(user_module, monkeypatch, tmp_path):
    from pal_bench.bench.run import user_path

    # a module that raises at import is one line, not a traceback
    (user_module / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(protocol.BufferNameError, match="RuntimeError: boom at import"):
        protocol.load_target("boom:C")
    # an entry point named like module:Class does not take that name over; a built-in name wins over an entry point

    class EP:
        name, module, attr = "mybuf:NumpyPrioritized", "mybuf", "Uniform"

    monkeypatch.setattr(protocol.importlib.metadata, "entry_points", lambda group: [EP])
    assert registry.implementation("mybuf:NumpyPrioritized").__name__ == "NumpyPrioritized"
    # a relative PYTHONPATH is made absolute for the suite's process, which runs in suites/
    monkeypatch.setenv("PYTHONPATH", "src")
    monkeypatch.chdir(tmp_path)
    assert user_path().split(os.pathsep) == [str(tmp_path), str(tmp_path / "src")]


def test_a_stored_table_with_a_property_twice_is_one_line(tmp_path):
    from pal_bench.argtypes import UsageError

    rows = [{"impl": "a", "property": "len", "status": "pass", "detail": ""}] * 2
    pd.DataFrame(rows).to_csv(tmp_path / "conformance.csv", index=False)
    with pytest.raises(UsageError, match="'len' twice"):
        check_cli.conformance_block(tmp_path)
    rows = [{"impl": "property", "property": "len", "status": "FAIL", "detail": "<b>x</b>"}]
    pd.DataFrame(rows).to_csv(tmp_path / "conformance.csv", index=False)
    block = check_cli.conformance_block(tmp_path)
    assert "<b>" not in block and "**no**" in block


@pytest.mark.parametrize("value", ["inf", "-1", "0", "1e30", "1e3,,1e4", "x"])
def test_hostile_capacities_for_the_suites_are_one_line(value):
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "test_latency_vs_capacity.py"], cwd=ROOT / "suites", capture_output=True, text=True,
                       env=dict(os.environ, PAL_BENCH_CAPACITIES=value), timeout=120)
    assert r.returncode != 0 and "PAL_BENCH_CAPACITIES" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
