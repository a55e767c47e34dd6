"""Benchmark your own buffer: the public protocol, names that reach any implementation (``module:Class``, the
entry-point group ``pal_bench.buffers``), ``pal-bench check-buffer`` and ``pal-bench latency``.

The buffer under test is docs/latency.md's example, read from the page itself, so the example a user copies is the
one these tests run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
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


def test_latency_measures_a_buffer_outside_the_package_beside_pal(user_module):
    out = user_module / "res"
    r = _latency(user_module, "--impl", "mybuf:NumpyPrioritized", "--peers", "pal", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    df = pd.read_csv(out / "latency.csv")
    ok = df[df.status == "ok"]
    assert set(ok.impl) == {"pal", "mybuf:NumpyPrioritized"}
    assert set(ok.op) == {"insert_one", "insert_batch", "sample", "update", "sample_update"}
    assert (ok.capacity == 1000).all() and (ok.median_us > 0).all() and (ok.ci_low <= ok.median_us).all()
    assert set(df.conformance) == {"conforms"}
    assert (out / "latency_vs_capacity.png").stat().st_size > 0 and (out / "latency.csv.meta.json").exists()
    assert "mybuf:NumpyPrioritized" in r.stdout and "sample_update" in r.stdout


def test_an_entry_point_of_an_installed_package_is_measured(tmp_path):
    """A package registered the way pip installs one: a ``*.dist-info`` folder with ``entry_points.txt`` on the
    path (what ``importlib.metadata`` reads), the buffer marked as failing its check (a uniform sampler)."""
    site = tmp_path / "site"
    (site / "plugbuf").mkdir(parents=True)
    (site / "plugbuf" / "__init__.py").write_text(EXAMPLE + VARIANTS)
    dist = site / "plugbuf-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugbuf\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""\
        [pal_bench.buffers]
        uniform-numpy = plugbuf:Uniform
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    r = _latency(tmp_path, "--impl", "uniform-numpy", "--peers", "pal", "--out", str(tmp_path / "res"), env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    df = pd.read_csv(tmp_path / "res" / "latency.csv")
    assert set(df[df.status == "ok"].impl) == {"pal", "uniform-numpy"}
    assert set(df[df.impl == "uniform-numpy"].conformance) == {"FAILS sampling, update"}
    assert "uniform-numpy (FAILS CHECK)" in r.stdout


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
