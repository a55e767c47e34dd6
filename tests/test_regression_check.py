"""The CI regression check can fail: for each buffer operation made slower on purpose, and for a slow buffer."""

import importlib.util
import json
import shutil

import pytest

from pal_bench.bench import instructions, regression

needs_peers = pytest.mark.skipif(
    importlib.util.find_spec("tianshou") is None or importlib.util.find_spec("ray") is None,
    reason="tianshou and ray[rllib] are needed (pip install -e '.[peers]')",
)
needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None,
                                    reason="valgrind is needed (Debian: apt-get install valgrind)")


def failed_ops(lines: list[str]) -> list[str]:
    return [line.split()[0] for line in lines if "FAIL" in line]


@pytest.fixture(scope="module")
def counted():
    """One callgrind run: the real buffer, and each operation at 1.5x and 2x its work."""
    specs = ["pal"] + [f"slower:{op}:1.5" for op in instructions.OPS] + [f"double:{op}" for op in instructions.OPS]
    return instructions.count(specs)


@needs_valgrind
def test_counts_repeat_exactly(counted):
    again = instructions.count(["pal"])["pal"]
    assert {op: again[op]["project"] for op in instructions.OPS} == {
        op: counted["pal"][op]["project"] for op in instructions.OPS}


@needs_valgrind
def test_the_unmodified_buffer_passes_against_the_stored_baseline(counted):
    ok, lines = regression.check_counts(counted["pal"], regression.load_baseline())
    assert ok, lines


@needs_valgrind
@pytest.mark.parametrize("kind", ["slower:{op}:1.5", "double:{op}"])
@pytest.mark.parametrize("op", instructions.OPS)
def test_each_slower_operation_fails_the_check_naming_it(counted, op, kind):
    ok, lines = regression.check_counts(counted[kind.format(op=op)], regression.load_baseline())
    assert not ok
    assert failed_ops(lines) == [op], lines


@needs_valgrind
def test_a_toolchain_mismatch_is_explained(counted, tmp_path):
    base = regression.load_baseline()
    base["toolchain"] = dict(base["toolchain"], cython="0.29.0")
    ok, lines = regression.check_counts(counted["double:sample"], base)
    assert not ok and "cython: baseline '0.29.0'" in lines[-1] and "--update-baseline" in lines[-1]
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(base))
    assert regression.main(["--only", "counts", "--baseline", str(tmp_path / "missing.json")]) == 2


def test_bad_candidates_are_rejected_before_valgrind_runs():
    for spec in ("pal:x", "double:nope", "slower:add:0.5", "slower:add:x", "bogus"):
        with pytest.raises(ValueError, match="unknown candidate"):
            instructions.count([spec])


@needs_peers
def test_ratio_check_fails_for_a_slow_buffer():
    ok, lines = regression.check(candidate="naive-numpy", rounds=3)
    assert not ok
    assert any("FAIL" in line for line in lines)
