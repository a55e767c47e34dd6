"""The C floor of a prioritized sample+update (pal_bench.bench.floor): it builds, checks its own descent against
a linear scan of the leaves, and reports both sides."""

import subprocess

from pal_bench.bench import floor


def test_floor_builds_checks_its_descent_and_reports_both_sides(tmp_path, capsys):
    exe = floor.build(tmp_path)
    us = floor.floor_us(exe, 5000, 20)
    assert us["sample"] > 0 and us["update"] > 0
    assert floor.main(["--capacity", "2e3", "--rounds", "1", "--calls", "20"]) == 0
    line = capsys.readouterr().out
    assert "floor sample" in line and "PAL sample" in line and "PAL / floor" in line


def test_floor_rejects_bad_arguments(tmp_path):
    exe = floor.build(tmp_path)
    done = subprocess.run([str(exe), "8", "256", "10"], capture_output=True, text=True)
    assert done.returncode == 2 and "N >= 16" in done.stderr
