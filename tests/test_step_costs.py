"""The step attribution of one sample+update (pal_bench.bench.step_costs): every step the docs table names gets
instructions, and the attribution follows the source, not the machine."""

import shutil
from pathlib import Path

import pytest

from pal_bench.bench import step_costs

ROOT = Path(__file__).resolve().parents[1]


def test_rules_follow_the_enclosing_function_and_the_line():
    assert step_costs.classify("_find_step", "x = target[0]") == "descent (targets to leaves)"
    assert step_costs.classify("tree_recompute", "t.mins[t.min_offset[level] + pos] = m") == "min-tree maintenance"
    assert step_costs.classify("tree_recompute", "t.sums[pos] = _group_sum(c, t.stride)").startswith("sum maintenance")
    assert step_costs.classify("sample", "_copy(dst, rec, n)").startswith("gather")
    assert step_costs.classify("sample", "if ids[k] < 0 or self._slot_ids[slots[k]] != ids[k]:") == "seqlock re-check"
    assert step_costs.classify("something_else", "pass") == step_costs.OTHER_PROJECT


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_small_buffer_spends_instructions_in_every_named_step():
    steps = step_costs.measure(10**4, ROOT)
    for name in ("descent (targets to leaves)", "min-tree maintenance", "sum maintenance (parents from children)",
                 "gather (rows into the output)", "random targets", "seqlock re-check", "weight computation",
                 "pow: priority transform and weights", step_costs.OTHER_PROJECT):
        assert steps.get(name, 0) > 0, (name, steps)
    # most of the project's work is attributed to a named step, not to the catch-all
    assert steps[step_costs.OTHER_PROJECT] < 0.5 * sum(steps.values())


def test_compare_builds_times_each_tree_in_its_own_process(tmp_path):
    from pal_bench.bench import compare_builds

    res = compare_builds.compare([ROOT, ROOT], capacity=300, rounds=1, calls=5, progress=lambda _: None)
    (row,) = res.values()                              # the same tree twice: one entry
    assert set(row) == {"sample", "update", "sample+update", "add_batch", "add"}
    assert all(v > 0 for v in row.values())
    with pytest.raises(SystemExit):
        compare_builds.main([str(tmp_path)])           # not a checkout
