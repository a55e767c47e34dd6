"""The published text: every generated block matches the stored results, links and figures resolve."""

import re
from pathlib import Path

import pandas as pd
import pytest

from pal_bench.bench import publishing
from pal_bench.studies import registry
from pal_bench.studies.scaling.publish import (
    processes_block,
    ray_node_block,
    ray_node_end_to_end_block,
    two_nodes_block,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = publishing.doc_files(ROOT)
BLOCKS = registry.blocks()


def test_every_generated_block_matches_the_stored_results():
    """Rebuilds every block of README.md and docs/*.md from results/ in memory; `make figures` rewrites them."""
    stale = publishing.regenerate(DOCS, ROOT / "results", BLOCKS, check=True)
    assert stale == [], f"generated blocks differ from the stored results (run `make figures`): {stale}"


def test_a_changed_result_makes_the_check_fail(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "longhaul.csv").write_text((ROOT / "results" / "longhaul.csv").read_text().replace("8000,", "8001,", 1))
    doc = tmp_path / "page.md"
    doc.write_text("x\n<!-- BEGIN generated:longhaul-quick -->\n<!-- END generated:longhaul-quick -->\n")
    assert publishing.regenerate([doc], results, BLOCKS) == ["page.md:longhaul-quick"]
    assert publishing.regenerate([doc], results, BLOCKS, check=True) == []
    text = doc.read_text()
    assert "8001" in text and "conditions not recorded" in text
    doc.write_text(text.replace("8001", "9999"))         # a hand edit inside the block
    assert publishing.regenerate([doc], results, BLOCKS, check=True) == ["page.md:longhaul-quick"]


def test_unknown_block_names_are_an_error(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- BEGIN generated:nope -->\n<!-- END generated:nope -->\n")
    with pytest.raises(KeyError, match="nope"):
        publishing.regenerate([doc], ROOT / "results", BLOCKS, check=True)


def test_every_table_is_published_somewhere():
    published = {name for path in DOCS for name in publishing.names_in(path)}
    assert published == set(BLOCKS)


def test_two_studies_cannot_claim_one_block(monkeypatch):
    from pal_bench.bench.publishing import Publication

    twin = Publication("twin", {"latency": lambda results: ""})
    real = registry.publications()
    monkeypatch.setattr(registry, "publications", lambda: [*real, twin])
    with pytest.raises(ValueError, match="'latency' is claimed by both latency and twin"):
        registry.blocks()


def test_readme_is_short_and_links_every_study_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, page.name


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_and_figures_resolve(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http", "#", "data:")):
            continue
        file = target.split("#")[0]
        assert (path.parent / file).exists(), f"{path.name}: {target} does not exist"


def test_backend_ratios_pair_the_rounds_measured_side_by_side(tmp_path):
    """The processes/threads ratio is the median of per-round ratios, not the ratio of medians: here threads
    and processes slow down together in rounds 2-3, so every paired ratio is 1.0 while the medians differ."""
    head = "curve,threads,throughput,throughput_reps,speedup\n"
    (tmp_path / "scaling.csv").write_text(head + 'f_a,1,100,"100 60 50",1\n')
    (tmp_path / "scaling_processes.csv").write_text(head + 'f_a,1,80,"100 80 50",1\n')
    block = processes_block(tmp_path)
    row = next(line for line in block.splitlines() if line.startswith("| f_a"))
    assert re.search(r"\|\s*1\.00( \[[^]]*\])?\s*\|", row) and "0.80" not in row, row
    (tmp_path / "scaling_processes.csv").write_text(head + "f_a,1,80,,1\n")      # no rounds stored: plain ratio
    row = next(line for line in processes_block(tmp_path).splitlines() if line.startswith("| f_a"))
    assert re.search(r"\|\s*0\.80\s*\|", row), row


def test_ray_node_ratios_are_paired_by_round_with_their_range(tmp_path):
    """Ray's one-node block pairs each round with the same round of threads and processes (median and range of
    the paired ratios), and gives the speedup over one worker the same way."""
    head = "curve,threads,throughput,throughput_reps,speedup\n"
    (tmp_path / "scaling.csv").write_text(head + 'f_l,1,100,"100 50 80",1\n')
    (tmp_path / "scaling_processes.csv").write_text(head + 'f_l,1,100,"100 50 80",1\n')
    (tmp_path / "scaling_ray_node.csv").write_text(head + 'f_l,1,90,"90 50 40",1\n')
    row = next(line for line in ray_node_block(tmp_path).splitlines() if line.startswith("| f_l"))
    assert "0.90 (0.50-1.00)" in row, row          # ratios 0.9, 1.0, 0.5: median 0.9, range 0.5-1.0
    (tmp_path / "scaling_ray_node.csv").unlink()
    assert "Not measured yet" in ray_node_block(tmp_path)


def test_two_nodes_block_pairs_the_placements_by_round(tmp_path):
    rows = ["round,placement,actors,learners,env_steps_per_s,updates_per_s,mb_in_per_s,inserter_busy,rows_per_s",
            "1,one node,1,1,1000,200,0,,", "1,two nodes,1,1,800,160,0.5,0.1,",
            "2,two nodes,1,1,450,90,0.3,0.1,", "2,one node,1,1,500,100,0,,",
            "1,\"ceiling, 1 in flight\",1,0,,,20.0,,50000", "2,\"ceiling, 1 in flight\",1,0,,,22.0,,60000"]
    (tmp_path / "end_to_end_ray_two_nodes.csv").write_text("\n".join(rows) + "\n")
    block = two_nodes_block(tmp_path)
    assert "0.85 (0.80-0.90, 2 rounds)" in block, block     # 800/1000 and 450/500, paired by round
    assert "55,000 rows/s" in block, block


def test_ray_node_end_to_end_pairs_each_rounds_best_split(tmp_path):
    """The whole-trainer comparison takes each backend's best split per round (whichever split it is) and pairs
    the rounds: round 2 was slow for both, so the paired ratios stay near 1 while the medians alone would not."""
    from pal_bench.studies.scaling.measure import _median_of_rounds

    def rounds(values):    # values[round][split]: env steps/s of splits (1, 1) and (2, 1)
        return [pd.DataFrame({"actors": [1, 2], "learners": [1, 1], "aggregation": "sync", "env_backend": "sync",
                              "measured_transitions_per_s": v, "measured_updates_per_s": [10.0, 10.0],
                              "wall_s": [1.0, 1.0], "threads": [2, 3], "oversubscribed": [False, True],
                              "backend": "x"}) for v in values]

    procs = _median_of_rounds(rounds([[1000.0, 900.0], [500.0, 600.0], [1000.0, 800.0]]))
    ray = _median_of_rounds(rounds([[950.0, 700.0], [400.0, 570.0], [900.0, 1000.0]]))
    assert list(procs.measured_transitions_per_s_reps) == ["1000.0 500.0 1000.0", "900.0 600.0 800.0"]
    assert list(procs.measured_transitions_per_s) == [1000.0, 800.0] and set(procs["rounds"]) == {3}
    procs.to_csv(tmp_path / "end_to_end_processes.csv", index=False)
    ray.to_csv(tmp_path / "end_to_end_ray_node.csv", index=False)
    block = ray_node_end_to_end_block(tmp_path)
    # best per round: processes 1000, 600, 1000; Ray 950, 570, 1000: ratios 0.95, 0.95, 1.00
    assert "paired by round: 0.95 (range 0.95-1.00, 3 rounds" in block, block
    (tmp_path / "end_to_end_ray_node.csv").unlink()
    assert "Not measured yet" in ray_node_end_to_end_block(tmp_path)
