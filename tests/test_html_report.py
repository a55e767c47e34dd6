"""`pal-bench report`: one static page, checked in a real headless browser (Debian's chromium)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pal_bench.bench import html_report

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def chromium():
    """The chromium binary; installed with apt-get where missing and possible, else the tests skip."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and shutil.which("apt-get"):
        try:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300, check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], capture_output=True, timeout=900,
                           check=True)
        except (subprocess.SubprocessError, OSError) as e:
            pytest.skip(f"chromium is not installed and `apt-get install chromium` failed: {e}")
        exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not installed and cannot be (no apt-get): the report's browser test needs it")
    return exe


def load(chromium: str, page: Path, tmp_path: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """The page's DOM after load, and every console message chromium logged."""
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
    p = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    if screenshot is not None:
        subprocess.run(base + [f"--screenshot={screenshot}", "--window-size=1400,2400", page.as_uri()],
                       capture_output=True, timeout=120)
    return p.stdout, console


def test_report_loads_without_errors_and_every_figure_decodes(chromium, tmp_path):
    out = ROOT / "results" / "report"
    page = html_report.write(ROOT, ROOT / "results", out)
    dom, console = load(chromium, page, tmp_path, screenshot=out / "screenshot.png")
    assert console == [], console
    images = int(re.search(r'data-images="(\d+)"', dom).group(1))
    broken = int(re.search(r'data-broken-images="(\d+)"', dom).group(1))
    assert images >= 15 and broken == 0
    assert (out / "screenshot.png").stat().st_size > 10_000
    # every page of the docs and the conditions table are there, and the pages link to each other's sections
    for section in ("readme", "latency", "trainer", "scaling", "backends", "plugin", "race", "longhaul", "aggregation",
                    "conditions"):
        assert f'id="{section}"' in dom, section
    assert 'href="#latency"' in dom and not re.search(r'href="[^"#]*\.md', dom)
    assert "load before" in dom and "<table" in dom


def test_the_browser_check_catches_a_broken_figure_and_a_script_error(chromium, tmp_path):
    page = tmp_path / "bad.html"
    good = html_report.build(ROOT, ROOT / "results")[0]
    page.write_text(good.replace("</main>", '<img alt="gone" src="missing.png"><script>nope();</script></main>'))
    dom, console = load(chromium, page, tmp_path)
    assert any("nope is not defined" in line for line in console)
    assert re.search(r'data-broken-images="1"', dom) and "gone" in dom
