"""The report on results it did not write: hostile labels are shown, never run (README.md, docs/*.md and the HTML
page), and a file missing a row, a point or a column skips its block with one line instead of a traceback."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pal_bench import report
from pal_bench.bench import html_report, publishing
from pal_bench.studies import registry

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "<img src=x onerror=alert(1)>|*_[x](javascript:alert(1))`\n"
# how the hostile label reads once escaped: in the markdown, and as text in the page
IN_MARKDOWN = r"&lt;img src=x onerror=alert(1)>\|\*\_[x\](javascript:alert(1))\` "
IN_PAGE = "&lt;img src=x onerror=alert(1)&gt;|*_[x](javascript:alert(1))` "


def checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the stored results, README.md and docs/ (the report rewrites them): (results, root)."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "docs", root / "docs")
    results = root / "results"
    shutil.copytree(ROOT / "results", results, ignore=shutil.ignore_patterns("report", "*.png"))
    return results, root


def doc(root: Path, *blocks: str) -> Path:
    """A page holding ``blocks``, each with an old body the report replaces (or, skipped, leaves)."""
    page = root / "README.md"
    page.write_text("".join(f"<!-- BEGIN generated:{b} -->\nOLD {b}\n<!-- END generated:{b} -->\n" for b in blocks))
    return page


def run(capsys, *argv) -> tuple[int, str, list[str]]:
    rc = report.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err.splitlines()


def assert_markdown_holds_nothing_raw(text: str, where: str) -> None:
    assert "<img" not in text and "<script" not in text, where
    assert not re.search(r"(?<!\\)\]\(javascript:", text), f"{where}: a javascript: link"
    for m in re.finditer(r"onerror=", text):
        assert text[:m.start()].endswith("&lt;img src=x "), f"{where}: onerror= outside escaped text"
    # every table row has as many cell borders (unescaped |) as its header: no label split a row
    for table in re.findall(r"(?:^\|.*\n)+", text, re.M):
        borders = {len(re.findall(r"(?<!\\)\|", row)) for row in table.splitlines()}
        assert len(borders) == 1, f"{where}: a row with a different number of cells:\n{table}"


def assert_page_holds_nothing_raw(page: str) -> None:
    for tag in re.findall(r"<img\b[^>]*>", page):
        # (a figure this copy lacks keeps its relative address)
        src = r'(?: src="(?:data:image/png;base64,[A-Za-z0-9+/=]*|[\w./-]+\.png)")?'
        assert re.fullmatch(rf'<img alt="[^"<]*"{src} ?/?>', tag), tag[:200]
    assert page.count("<script") == 1                               # the page's own image check, nothing else
    assert not re.search(r"<[^>]*\bon\w+\s*=", page), "an event handler attribute"
    assert not re.search(r"""(?:href|src)\s*=\s*["']?\s*javascript:""", page, re.I), "a javascript: address"


def test_every_string_of_every_stored_csv_is_shown_escaped_never_run(tmp_path, capsys):
    """Every string column of every stored CSV carries HTML and markdown: the docs and the page show it as text.
    Relabelled keys make some blocks unbuildable: each is skipped with one line, the report goes on (status 0)."""
    results, root = checkout(tmp_path)
    csvs = sorted(results.rglob("*.csv"))
    assert len(csvs) > 20
    for csv in csvs:
        df = pd.read_csv(csv)
        for col in df.select_dtypes(include="object").columns:
            df[col] = [HOSTILE + ("" if pd.isna(v) else str(v)) for v in df[col]]
        df.to_csv(csv, index=False)

    rc, out, err = run(capsys, "--results", results, "--root", root, "--html", "--out", tmp_path / "page")

    assert rc == 0
    assert err and all(line.startswith("pal-bench report: skipped ") for line in err), err
    docs = publishing.doc_files(root)
    for path in docs:
        assert_markdown_holds_nothing_raw(path.read_text(), path.name)
    built = [p.name for p in docs if IN_MARKDOWN in p.read_text()]
    assert len(built) >= 5, built                 # the labels did reach the blocks that could be built
    page = (tmp_path / "page" / "index.html").read_text()
    assert_page_holds_nothing_raw(page)
    assert page.count(IN_PAGE) > 100


def test_labels_that_are_shown_but_not_keys_reach_every_kind_of_block_escaped(tmp_path, capsys):
    """A peer, contestant, framework and environment named with HTML and markdown: tables, captions, README's
    race sentence and the latency tables (pytest-benchmark JSON) show them as text."""
    results, root = checkout(tmp_path)
    for name, col, old in (("race.csv", "contestant", "rllib"), ("race_unpinned.csv", "contestant", "rllib"),
                           ("race_speed.csv", "contestant", "rllib"),
                           ("plugin.csv", "env", "LunarLander-v3"), ("longhaul.csv", "link", "fibre-10km")):
        df = pd.read_csv(results / name)
        df[col] = df[col].replace(old, HOSTILE)
        df.to_csv(results / name, index=False)
    suite = results / "latency_vs_capacity.json"
    suite.write_text(suite.read_text().replace('"tianshou"', json.dumps(HOSTILE)))
    blocks = ("race-headline", "race-matched", "race-speed", "plugin", "longhaul-quick", "latency-headline", "latency")
    readme = doc(root, *blocks)

    rc, _, err = run(capsys, "--results", results, "--root", root, "--no-figures", "--html", "--out", tmp_path / "pg")

    assert (rc, err) == (0, [])
    text = readme.read_text()
    assert "OLD" not in text
    assert_markdown_holds_nothing_raw(text, "README.md")
    for block in publishing.BLOCK.finditer(text):
        assert IN_MARKDOWN in block.group("body"), block.group("name")
    assert IN_MARKDOWN in (results / "latency_tables.md").read_text()
    page = (tmp_path / "pg" / "index.html").read_text()
    assert_page_holds_nothing_raw(page)
    assert IN_PAGE in page


def test_a_table_keeps_its_cells_and_numbers_their_format():
    df = pd.DataFrame({HOSTILE: [HOSTILE, "a_b [1, 2] >= 3"], "ms": [1.23456, None],
                       "mark": [publishing.Markup("**chosen**"), ""]})
    lines = publishing.md(df, ".2f").splitlines()
    assert [len(re.findall(r"(?<!\\)\|", line)) for line in lines] == [4, 4, 4, 4]
    assert [c.strip() for c in lines[2].split("|")[-3:]] == ["1.23", "**chosen**", ""]
    assert "| a_b [1, 2] >= 3 " in lines[3]                   # what the stored tables hold reads as it did
    assert publishing.esc("R&D\r\n\"q\"") == "R&amp;D &quot;q&quot;"
    assert publishing.code("results/a.csv") == "`results/a.csv`"
    assert publishing.code("a`b") == r"a\`b"                  # a code span could not hold it


def test_the_page_shows_raw_html_of_a_page_as_text_and_drops_unsafe_addresses(tmp_path):
    """The HTML page's own line: hand-written markdown with raw HTML and script links renders none of it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "latency.md").write_text("# Latency\n\n## Sub\n")
    (tmp_path / "README.md").write_text(
        "# PAL-Bench\n\n<!-- BEGIN generated:x -->\n<script>alert(1)</script>\n<!-- END generated:x -->\n\n"
        "<img src=x onerror=alert(1)> [a](javascript:alert(1)) [b](jav&#x61;script:alert(1)) "
        "[c](java\tscript:alert(1)) ![d](javascript:alert(1)) [e](data:text/html,x) <b>bold</b>\n\n"
        "[the latency page](docs/latency.md#sub), [a site](https://example.org), [anchor](#pal-bench).\n")
    page, missing = html_report.build(tmp_path, tmp_path)
    assert missing == []
    assert_page_holds_nothing_raw(page)
    assert "generated:" not in page and "<b>" not in page and "&lt;b&gt;bold" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not re.search(r"(?:href|src)=\"(?:jav|data:text)", page)
    assert 'href="#latency--sub"' in page and 'href="https://example.org"' in page and 'href="#pal-bench"' in page
    assert html_report.safe_url("data:image/png;base64,AAAA", image=True)
    assert not html_report.safe_url("data:image/png;base64,AAAA")
    assert not html_report.safe_url(" JAVASCRIPT&colon;alert(1)")


def test_a_plugin_result_without_its_baseline_row_is_skipped_with_its_reason(tmp_path, capsys):
    """An interrupted plugin-bench stored PAL's rows, not the default buffer's they are compared with: the plugin
    block and figure are skipped with one line naming the file and the row, everything else is built."""
    results = tmp_path / "results"
    results.mkdir()
    df = pd.read_csv(ROOT / "results" / "plugin.csv")
    gone = (df.buffer == "default") & (df.framework == "rllib-sac")
    df[~gone].to_csv(results / "plugin.csv", index=False)
    shutil.copy(ROOT / "results" / "longhaul.csv", results / "longhaul.csv")
    readme = doc(tmp_path, "plugin", "longhaul-quick")

    rc, out, err = run(capsys, "--results", results, "--root", tmp_path)

    assert rc == 0
    why = f"{results / 'plugin.csv'}: no 'default' buffer row for framework rllib-sac, env Pendulum-v1"
    assert len(err) == 2 and all(why in line for line in err), err
    assert err[0].startswith("pal-bench report: skipped the files and figures of study plugin: ")
    assert err[1].startswith("pal-bench report: skipped block plugin of README.md (left as it was): ")
    text = readme.read_text()
    assert "OLD plugin\n" in text and "OLD longhaul-quick" not in text and "fibre-10km" in text


def test_a_scaling_csv_without_its_one_worker_point_is_skipped_with_its_reason(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    df = pd.read_csv(ROOT / "results" / "scaling.csv")
    df[~((df.curve == "f_a") & (df.threads == 1))].to_csv(results / "scaling.csv", index=False)
    readme = doc(tmp_path, "scaling")

    rc, _, err = run(capsys, "--results", results, "--root", tmp_path, "--no-figures")

    assert rc == 0
    assert err == [f"pal-bench report: skipped block scaling of README.md (left as it was): {results / 'scaling.csv'}: "
                   "no 1-worker point for f_a: the speedup over 1 worker is taken from it"]
    assert readme.read_text().count("OLD scaling") == 1


def test_a_relabelled_column_skips_only_its_block_and_check_mode_still_raises(tmp_path, capsys):
    """Any builder's KeyError/IndexError/ValueError/TypeError/AttributeError: one line, the block left as it was."""
    results = tmp_path / "results"
    results.mkdir()
    pd.read_csv(ROOT / "results" / "longhaul.csv").rename(columns={"link": "route"}).to_csv(
        results / "longhaul.csv", index=False)
    shutil.copy(ROOT / "results" / "plugin.csv", results / "plugin.csv")
    readme = doc(tmp_path, "longhaul-quick", "plugin")

    rc, _, err = run(capsys, "--results", results, "--root", tmp_path, "--no-figures")

    assert rc == 0
    assert err == ["pal-bench report: skipped block longhaul-quick of README.md (left as it was): AttributeError: "
                   "'DataFrame' object has no attribute 'link'"]
    assert "OLD longhaul-quick" in readme.read_text() and "OLD plugin" not in readme.read_text()
    with pytest.raises(AttributeError):        # the docs' own check (and any caller without `skipped`) still fails
        publishing.regenerate([readme], results, registry.blocks(), check=True)


# ---------------------------------------------------------------------- files that are not small regular files

def _report(root: Path, results: Path, *extra: str) -> subprocess.CompletedProcess:
    """The report in a subprocess (a FIFO that hangs it would hang the test run), 120 s at most."""
    return subprocess.run([sys.executable, "-m", "pal_bench.report", "--root", str(root), "--results", str(results),
                           "--no-figures", *extra], capture_output=True, text=True, timeout=120, cwd=root)


def test_a_figure_that_is_a_link_a_fifo_or_not_a_png_is_left_out_of_the_page(tmp_path):
    """A shared results folder whose figure is a link to a private file (it was embedded in the page, base64), a
    FIFO (it hung the report), not a PNG, or outside the project: left out, named as missing with why; a real PNG
    is embedded."""
    root = tmp_path / "root"
    figures = root / "results" / "figures"
    figures.mkdir(parents=True)
    (root / "docs").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET KEY\n")
    (figures / "link.png").symlink_to(secret)
    os.mkfifo(figures / "fifo.png")
    (figures / "text.png").write_text("<script>alert(1)</script>")
    (tmp_path / "outside.png").write_bytes(html_report.PNG_SIGNATURE + b"outside")
    (figures / "good.png").write_bytes(html_report.PNG_SIGNATURE + b"good")
    (figures / "inlink.png").symlink_to(figures / "good.png")
    text = "".join(f"![{n}](../results/figures/{n}.png)\n" for n in ("link", "inlink", "fifo", "text", "good"))
    text += "![outside](../../outside.png)\n"
    missing: list[str] = []
    out = html_report._embed_images(text, root / "docs", missing, root)
    assert base64.b64encode(b"SECRET KEY\n").decode() not in out
    assert base64.b64encode(html_report.PNG_SIGNATURE + b"outside").decode() not in out
    assert base64.b64encode(html_report.PNG_SIGNATURE + b"good").decode() in out
    why = dict(m.split(" (", 1) for m in missing)
    assert set(why) == {f"../results/figures/{n}.png" for n in ("link", "inlink", "fifo", "text")} | {
        "../../outside.png"}
    assert why["../results/figures/link.png"].startswith("outside the project")
    assert "symbolic link" in why["../results/figures/inlink.png"] and "FIFO" in why["../results/figures/fifo.png"]
    assert why["../results/figures/text.png"].startswith("not a PNG")


def test_stored_files_that_are_not_small_regular_files_skip_their_blocks_only(tmp_path):
    """Five stored files, each hostile its own way, in one report run (a report takes seconds: one run covers the
    five): results/fanout.csv as a FIFO, longhaul.csv a directory, plugin.csv a link to /dev/zero, memory.csv's
    conditions JSON nested past the recursion limit and gather_floor.csv's conditions a FIFO. Each CSV's block is
    skipped with one line naming it, the other blocks and the page are still written, exit 0 (it hung, aborted with
    RecursionError, or stopped with exit 2)."""
    results, root = checkout(tmp_path)
    os.unlink(results / "fanout.csv")
    os.mkfifo(results / "fanout.csv")
    os.unlink(results / "longhaul.csv")
    (results / "longhaul.csv").mkdir()
    os.unlink(results / "plugin.csv")
    (results / "plugin.csv").symlink_to("/dev/zero")
    (results / "memory.csv.meta.json").write_text("[" * 100_000 + "]" * 100_000)
    (results / "gather_floor.csv.meta.json").unlink(missing_ok=True)
    os.mkfifo(results / "gather_floor.csv.meta.json")
    r = _report(root, results, "--html")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    skipped = [line for line in r.stderr.splitlines() if line.startswith("pal-bench report: skipped")]
    for name in ("fanout.csv", "longhaul.csv", "plugin.csv"):
        assert any(name in line for line in skipped), (name, r.stderr[-3000:])
    assert all(name not in line for line in skipped for name in ("race.csv", "scaling.csv")), skipped
    assert (results / "report" / "index.html").is_file()
