"""The report and figures are rebuilt from stored JSON alone, skipped cases included."""

import json

import pandas as pd

from pal_bench import report

MACHINE = {"cpu": {"brand_raw": "Test CPU", "count": 2}, "python_version": "3.11"}


def bench(peer, op, capacity, median_s, batch=256):
    return {"name": f"test_latency_vs_capacity[{op}-N={capacity}-{peer}]",
            "extra_info": {"peer": peer, "op": op, "capacity": capacity, "batch": batch, "profile": "quick"},
            "stats": {"median": median_s, "iqr": median_s / 10, "min": median_s * 0.9, "rounds": 100}}


def test_report_from_stored_json(tmp_path):
    benchmarks = [bench("pal", op, n, 1e-6 * n ** 0.1) for op in ("insert_one", "insert_batch", "sample_update")
                  for n in (1000, 10000)]
    benchmarks += [bench("tianshou", op, n, 5e-6 * n ** 0.1) for op in ("insert_one", "sample_update")
                   for n in (1000, 10000)]
    skipped = [{"peer": "tianshou", "op": "insert_batch", "capacity": n, "batch": 256, "profile": "quick",
                "reason": "tianshou has no native batch insert"} for n in (1000, 10000)]
    (tmp_path / "latency_vs_capacity.json").write_text(json.dumps(
        {"machine_info": MACHINE, "datetime": "2026-11-30T00:00:00", "benchmarks": benchmarks, "skipped": skipped}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- BEGIN generated:latency-headline -->\nOLD BLOCK\n"
                      "<!-- END generated:latency-headline -->\nrest\n")

    assert report.main(["--results", str(tmp_path), "--root", str(tmp_path)]) == 0

    csv = pd.read_csv(tmp_path / "latency.csv")
    assert len(csv) == len(benchmarks) + len(skipped)
    assert set(csv[csv.status == "skipped"].reason) == {"tianshou has no native batch insert"}
    tables = (tmp_path / "latency_tables.md").read_text()
    assert "no batch insert" in tables and "Test CPU" in tables
    assert "| tianshou: insert 1 " in tables and " 5.0 " in tables     # 5x slower, same growth
    for name in ("latency_vs_capacity", "latency_vs_capacity_sample_update"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 1000
    text = readme.read_text()
    assert "OLD BLOCK" not in text and "| insert 1 " in text and text.endswith("rest\n")
    assert "conditions not recorded" in text      # this JSON has no "conditions"


def test_report_without_results_is_a_clear_error(tmp_path, capsys):
    assert report.main(["--results", str(tmp_path)]) == 2
    assert "make bench" in capsys.readouterr().err


def test_scaling_figures_draw_both_backends_side_by_side(tmp_path):
    from pal_bench.studies.scaling.publish import PUBLICATION

    rows = [{"curve": c, "threads": x, "throughput": v * x ** 0.5, "speedup": x ** 0.5, "efficiency": x ** -0.5,
             "cores": 2, "oversubscribed": False, "algo": "dqn", "env": "CartPole-v1", "backend": b}
            for b, scale in (("threads", 1.0), ("ray", 0.7)) for x in (1, 2)
            for c, v in (("f_a", 3000.0 * scale), ("f_l", 300.0 * scale))]
    df = pd.DataFrame(rows)
    df[df.backend == "threads"].drop(columns="backend").to_csv(tmp_path / "scaling.csv", index=False)  # older CSV
    df[df.backend == "ray"].to_csv(tmp_path / "scaling_ray.csv", index=False)
    # the two-node study's rounds share the end_to_end prefix but are not a per-split table: not drawn here
    pd.DataFrame([{"round": 0, "placement": "one node", "actors": 1, "learners": 1, "env_steps_per_s": 3000.0}]).to_csv(
        tmp_path / "end_to_end_ray_two_nodes.csv", index=False)
    figures = PUBLICATION.outputs(tmp_path, True)
    assert tmp_path / "figures" / "end_to_end_ray_two_nodes.png" not in figures
    assert tmp_path / "figures" / "scaling_backends.png" in figures
    assert (tmp_path / "figures" / "scaling_backends.png").stat().st_size > 1000
    assert PUBLICATION.outputs(tmp_path, False) == []        # --no-figures draws nothing
