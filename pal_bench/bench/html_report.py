"""One self-contained static HTML page of everything published: ``pal-bench report`` (``make report``).

``results/report/index.html`` holds README.md and every page of ``docs/`` (their prose, generated
tables and figures; figures embedded as data URIs, so the page needs no other file), links between
the pages turned into links between its sections, and a table of the conditions each stored result
was measured under (machine, date, load before/after, noisy or not, commit). A small script at the
end checks that every image decoded and shows a banner naming any that did not.

The pages are rendered as data, not trusted HTML: raw HTML in them is shown as text (python-markdown's raw HTML
passes are off), and a link or image whose address has a scheme other than http(s) or mailto (an image: or an
embedded PNG) loses it (``javascript:`` included, however it is spelled). Values from results files are escaped
already where they enter the markdown (``publishing.esc``); this is the second line.
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

from pal_bench import conditions
from pal_bench.argtypes import UsageError
from pal_bench.bench import publishing
from pal_bench.stored_tables import read_bytes, read_json

#: the generated blocks' marker lines (HTML comments: with raw HTML off they would show as text)
MARKER = re.compile(r"^<!-- (?:BEGIN|END) generated:[\w-]+ -->\n", re.M)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#222;line-height:1.45}
nav{position:fixed;top:0;left:0;bottom:0;width:14rem;overflow:auto;background:#f4f5f7;padding:1rem;
    border-right:1px solid #ddd;font-size:.9rem}
nav a{display:block;padding:.15rem 0;color:#0b57d0;text-decoration:none}
main{margin-left:16rem;padding:1rem 2rem;max-width:70rem}
section{border-bottom:2px solid #eee;padding-bottom:1.5rem;margin-bottom:1.5rem}
table{border-collapse:collapse;font-size:.82rem;margin:.6rem 0;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.2rem .45rem;text-align:right;white-space:nowrap}
th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.4rem 0}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:.82rem}
code{font-size:.88em}
.noisy{background:#fff3cd}
#image-check{display:none;background:#f8d7da;padding:.6rem;border:1px solid #c00;margin-bottom:1rem}
"""

CHECK = """
<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  document.body.setAttribute("data-images", imgs.length);
  document.body.setAttribute("data-broken-images", broken.length);
  if (broken.length) {
    var box = document.getElementById("image-check");
    box.style.display = "block";
    box.textContent = broken.length + " of " + imgs.length + " figures did not load: " +
      broken.map(function (i) { return i.getAttribute("alt"); }).join(", ");
  }
});
</script>
"""


def safe_url(url: str, image: bool = False) -> bool:
    """Whether a page may keep ``url`` as a link (or, with ``image``, an image source): relative, ``#anchor``,
    http(s) or mailto, or (an image) an embedded PNG; judged as a browser reads it (entities decoded, control
    characters and spaces dropped), so ``jav&#x61;script:`` and ``java\tscript:`` count as ``javascript:``."""
    plain = re.sub(r"[\x00-\x20\x7f]+", "", html.unescape(url))
    if image and plain.lower().startswith("data:image/png;base64,"):
        return True
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.\-]*):", plain)
    return scheme is None or scheme.group(1).lower() in ("http", "https", "mailto")


def _markdown():
    """python-markdown with tables and fenced code, raw HTML shown as text, unsafe addresses dropped."""
    import markdown
    from markdown.treeprocessors import Treeprocessor

    class SafeLinks(Treeprocessor):
        def run(self, root):
            for el in root.iter():
                for attr in ("href", "src"):
                    if el.get(attr) is not None and not safe_url(el.get(attr), image=el.tag == "img"):
                        del el.attrib[attr]

    md = markdown.Markdown(extensions=["tables", "fenced_code"])
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    md.treeprocessors.register(SafeLinks(md), "safe_links", -10)
    return md


def page_id(path: Path) -> str:
    return "readme" if path.name == "README.md" else path.stem


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_FIGURE_BYTES = 32 << 20


def _png(path: Path, root: Path) -> bytes | str:
    """The bytes of the figure ``path`` (a regular PNG file of at most ``MAX_FIGURE_BYTES``, inside ``root``, not
    a link), or why it is left out: a results folder is exchanged, and an embedded file goes into the page."""
    try:
        if not path.resolve().is_relative_to(root.resolve()):
            return "outside the project"
        data = read_bytes(path, MAX_FIGURE_BYTES, label=str(path))
    except (UsageError, OSError, RuntimeError) as e:     # RuntimeError: a symlink loop in resolve()
        return str(e).removeprefix(f"{path}: ")
    return data if data.startswith(PNG_SIGNATURE) else "not a PNG file"


def _embed_images(text: str, base: Path, missing: list[str], root: Path | None = None) -> str:
    """Figures (``![alt](x.png)``, relative to ``base``) embedded as data: addresses; one that is absent or cannot
    be embedded (``_png``) keeps its relative address and is added to ``missing`` (with why, where it exists)."""
    root = root or base.parent

    def repl(m: re.Match) -> str:
        alt, src = m.group(1), m.group(2)
        path = base / src
        if not os.path.lexists(path):
            missing.append(src)
            return f"![{alt}]({src})"
        data = _png(path, root)
        if isinstance(data, str):
            missing.append(f"{src} ({data})")
            return f"![{alt}]({src})"
        return f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode()})"
    return re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", repl, text)


def _relink(text: str, pages: dict[str, str]) -> str:
    """Links to README.md or docs/*.md become links to their sections; other relative links stay."""
    def repl(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        name, _, anchor = target.partition("#")
        stem = Path(name).name
        if stem in pages:
            return f"[{label}](#{pages[stem]}{'--' + anchor if anchor else ''})"
        return m.group(0)
    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+\.md(?:#[\w-]+)?)\)", repl, text)


def conditions_table(results: Path) -> str:
    """HTML table: one row per stored result file with recorded (or unrecorded) conditions."""
    rows = []
    files = sorted(p for p in results.rglob("*") if p.suffix in (".csv", ".json") and not p.name.endswith(".meta.json")
                   and "report" not in p.parts and "tmp" not in p.parts and "runs" not in p.parts)
    for path in files:
        try:
            meta = conditions.read_meta(path)
            if meta is None and path.suffix == ".json":
                meta = read_json(path).get("conditions")
        except (OSError, ValueError, AttributeError, UsageError):   # another version's or a damaged file: not recorded
            meta = None
        rel = path.relative_to(results)
        if isinstance(meta, dict) and meta:
            m = meta.get("machine") if isinstance(meta.get("machine"), dict) else {}
            cells = [str(rel), m.get("cpu", ""), str(m.get("usable_cores", "")), str(meta.get("started") or "")[:16],
                     f"{meta.get('load_before')} → {meta.get('load_after')}", "noisy" if meta.get("noisy") else "quiet",
                     meta.get("commit", ""), meta.get("command", "")]
            cls = ' class="noisy"' if meta.get("noisy") else ""
        else:
            cells = [str(rel), "", "", "", "", "not recorded", publishing.git_stamp(path), ""]
            cls = ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("result", "CPU", "cores", "started (UTC)", "load before → after",
                                             "load", "commit", "command"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def build(root: Path, results: Path) -> tuple[str, list[str]]:
    """The page's HTML and the figure paths that were referenced but missing."""
    docs = [p for p in publishing.doc_files(root) if p.exists()]
    pages = {p.name: page_id(p) for p in docs}
    missing: list[str] = []
    sections, nav = [], []
    for path in docs:
        text = _relink(_embed_images(MARKER.sub("", path.read_text()), path.parent, missing, root), pages)
        body = _markdown().convert(text)
        title = re.search(r"^# (.+)$", path.read_text(), re.M)
        title = title.group(1) if title else path.stem
        pid = pages[path.name]
        nav.append(f'<a href="#{pid}">{html.escape(title)}</a>')
        # headings get ids "<page>--<slug>" so links to a page's anchor land on the heading
        body = re.sub(r"<h([23])>(.*?)</h\1>", lambda m, pid=pid: (
            f'<h{m.group(1)} id="{pid}--{_slug(m.group(2))}">{m.group(2)}</h{m.group(1)}>'), body)
        sections.append(f'<section id="{pid}">\n{body}\n</section>')
    nav.append('<a href="#conditions">Conditions of every result</a>')
    sections.append('<section id="conditions"><h1>Conditions of every stored result</h1>'
                    "<p>Machine, start time, 1-minute load average before and after, whether it counts as noisy "
                    "(load above half the usable cores), commit and command, from each result's recorded "
                    "conditions; older results say they were not recorded and name the commit that stored them.</p>"
                    + conditions_table(results) + "</section>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>PAL-Bench report</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>\n'
            f'<body><nav><strong>PAL-Bench</strong>{"".join(nav)}</nav>\n<main><div id="image-check"></div>\n'
            + "\n".join(sections) + f"\n</main>{CHECK}</body></html>\n")
    return page, missing


def _slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", html.unescape(heading)).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def write(root: Path, results: Path, out: Path | None = None) -> Path:
    """Write ``results/report/index.html`` (or ``out``/index.html); returns its path."""
    page, missing = build(root, results)
    folder = out or results / "report"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.html"
    conditions.atomic_write_text(path, page)
    if missing:
        print(f"warning: {len(missing)} figure(s) referenced but missing: {', '.join(sorted(set(missing)))}")
    return path
