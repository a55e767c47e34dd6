"""The package's layers hold (import-linter contracts in pyproject.toml), and each contract can fail: a copy of
the package with one forbidden import added breaks the contract that forbids it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over the ``pal_bench`` package found first on the path from ``root``."""
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    """The package's Python files and pyproject.toml in a temporary directory (nothing is imported from it)."""
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(ROOT / "pal_bench", root / "pal_bench", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c"))
    shutil.copy(ROOT / "pyproject.toml", root)
    return root


def test_the_package_keeps_its_contracts():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(("added", "broken"), [
    ({"pal_bench/bench/_upward.py": "import pal_bench.studies"}, "commands above studies"),       # bench -> studies
    ({"pal_bench/train/_sideways.py": "from pal_bench.bench import stats"}, "commands above studies"),  # train -> bench
    ({"pal_bench/studies/_upward.py": "from pal_bench import cli"}, "commands above studies"),     # studies -> cli
    ({"pal_bench/atomic.py": "import pal_bench.train"}, "commands above studies"),                 # core -> train
    ({"pal_bench/train/_cycle_a.py": "from pal_bench.train import _cycle_b",
      "pal_bench/train/_cycle_b.py": "from pal_bench.train import _cycle_a"}, "no import cycles"),
], ids=["bench-studies", "train-bench", "studies-cli", "core-train", "cycle"])
def test_each_contract_fails_on_a_forbidden_import(package_copy, added, broken):
    """Each line added to a module of the copy (appended to one that exists) breaks the named contract."""
    before = {path: (package_copy / path).read_text() if (package_copy / path).exists() else None for path in added}
    try:
        for path, line in added.items():
            (package_copy / path).write_text((before[path] or "") + "\n" + line + "\n")
        out = lint(package_copy)
        assert out.returncode != 0 and "BROKEN" in out.stdout
        assert broken in out.stdout.split("Broken contracts")[1], out.stdout
    finally:
        for path, text in before.items():
            if text is None:
                (package_copy / path).unlink()
            else:
                (package_copy / path).write_text(text)


def test_a_study_needs_its_module_and_one_registry_line(tmp_path, monkeypatch, capsys):
    """docs/architecture.md's "how to add a study": a module with main(argv) and PUBLICATION, one Study line in
    the registry, a block in a page; then `pal-bench <command>` runs it and the report fills its block."""
    from pal_bench import cli, report
    from pal_bench.studies import registry

    (tmp_path / "toy_study.py").write_text('''
from pathlib import Path
from pal_bench.bench.publishing import Publication, missing

def main(argv):
    Path(argv[0], "toy.csv").write_text("x\\n42\\n")
    return 0

def toy_block(results):
    path = results / "toy.csv"
    return f"toy: {path.read_text().split()[1]}\\n" if path.exists() else missing("toy.csv", "pal-bench toy")

def outputs(results, figures):
    return [results / "toy.csv"] if (results / "toy.csv").exists() else []

PUBLICATION = Publication("toy", {"toy": toy_block}, outputs)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "STUDIES", (*registry.STUDIES, registry.Study("toy_study", "toy", "toy_study")))
    results = tmp_path / "results"
    results.mkdir()
    assert cli.main(["toy", str(results)]) == 0
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "toy.md"
    page.write_text("# toy\n<!-- BEGIN generated:toy -->\n<!-- END generated:toy -->\n")
    (tmp_path / "README.md").write_text("readme\n")
    assert report.main(["--results", str(results), "--root", str(tmp_path), "--no-figures"]) == 0
    assert "toy: 42" in page.read_text()
