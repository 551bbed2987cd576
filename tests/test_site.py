"""The rendered book, checked as a reader sees it: the HTML that ``make book`` writes to ``_build/html``.

Every page of ``_toc.yml`` exists; no page shows Markdown or MyST it failed to render (raw tables,
``{glue:...}``/``{ref}`` roles, reStructuredText double backticks, stray backticks), an error or a
traceback; every image is there and not empty; every internal link and ``#anchor`` resolves; every
chapter that plots shows its figures.

Skipped when the site is not built (run ``make book`` first); CI sets ``ATTN_GYM_LITE_REQUIRE_SITE=1``
after ``make book``, which makes a missing site a failure. ``ATTN_GYM_LITE_SITE`` points the checks
at another build folder.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("ATTN_GYM_LITE_SITE") or ROOT / "_build" / "html")

if not (SITE / "index.html").is_file():
    if os.environ.get("ATTN_GYM_LITE_REQUIRE_SITE") == "1":
        raise RuntimeError(f"ATTN_GYM_LITE_REQUIRE_SITE=1 but there is no built site at {SITE} (make book failed or did not run)")
    pytest.skip(f"no built book at {SITE}: run `make book` first (CI does, then runs this file)", allow_module_level=True)

bs4 = pytest.importorskip("bs4", reason="beautifulsoup4 (installed with jupyter-book's theme) parses the pages")


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"], *(chapter["file"] for part in toc["parts"] for chapter in part["chapters"])]


PAGES = _toc_files()
CHAPTERS = [page for page in PAGES if page.startswith("notebooks/")]


@cache
def _soup(path: Path):
    return bs4.BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _article(page: str):
    soup = _soup(SITE / f"{page}.html")
    article = soup.find("article") or soup.find("main")
    assert article is not None, f"{page}.html has no <article>/<main>"
    return article


def _reader_text(page: str) -> str:
    """The page's text as a reader reads it: prose and cell outputs, without code a reader reads as
    code (code cells' sources, literalinclude and fenced blocks, inline code)."""
    article = bs4.BeautifulSoup(str(_article(page)), "html.parser")
    for node in article.select(".cell_input, code, .headerlink"):
        node.decompose()
    for block in article.select("div[class*='highlight']"):
        if block.find_parent(class_="cell_output") is None:
            block.decompose()
    return article.get_text(" ")


def test_every_toc_page_is_built():
    assert len(PAGES) >= 9 and CHAPTERS
    missing = [page for page in PAGES if not (SITE / f"{page}.html").is_file()]
    assert not missing, f"pages of _toc.yml missing from {SITE}: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_page_has_no_unrendered_markup(page):
    text = _reader_text(page)
    problems = []
    for label, pattern in [
        ("raw Markdown table", r"\|\s*:?(-{3,}|—|–)"),
        ("unrendered MyST role", r"\{[a-z][a-z:_-]*\}`"),
        ("unrendered MyST directive", r"```\{[a-z]"),
        ("reStructuredText double backticks", r"``"),
        ("stray backtick", r"`"),
        ("literal Markdown bold", r"\*\*\S[^*\n]{0,80}\*\*"),
    ]:
        for match in re.finditer(pattern, text):
            problems.append(f"{label}: ...{text[max(match.start() - 60, 0):match.end() + 60]!r}...")
            break
    assert not problems, f"{page}.html shows markup it did not render:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_shows_no_error(page):
    article = _article(page)
    problems = []
    if article.select(".ansi-red-fg, .ansi-red-intense-fg, .ansi-red-bg"):
        problems.append("ANSI-red (error) output")
    for output in article.select(".cell_output"):
        text = output.get_text(" ")
        if "Traceback" in text:  # (an error message a cell prints on purpose, e.g. a refused cu_seqlens, is fine)
            problems.append(f"traceback in an output: {text.strip()[:300]!r}")
    for stderr in article.select(".stderr, .output.error, .output.traceback"):
        text = stderr.get_text(" ")
        if re.search(r"Error|Traceback|Warning|warn\(", text):
            problems.append(f"stderr output with an error or warning: {text.strip()[:300]!r}")
    assert not problems, f"{page}.html:\n" + "\n".join(problems)


def _local_target(page_path: Path, url: str) -> tuple[Path, str] | None:
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:")):
        return None
    target = page_path if not parts.path else (page_path.parent / unquote(parts.path)).resolve()
    return target, unquote(parts.fragment)


@cache
def _ids(path: Path) -> frozenset[str]:
    soup = _soup(path)
    return frozenset([tag["id"] for tag in soup.find_all(id=True)] + [tag["name"] for tag in soup.find_all("a", attrs={"name": True})])


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_and_anchors_resolve(page):
    page_path = (SITE / f"{page}.html").resolve()
    broken = []
    for link in _soup(page_path).find_all("a", href=True):
        resolved = _local_target(page_path, link["href"])
        if resolved is None:
            continue
        target, fragment = resolved
        if not target.exists():
            broken.append(f"{link['href']} (no file {target})")
        elif fragment and target.suffix == ".html" and fragment not in _ids(target):
            broken.append(f"{link['href']} (no id {fragment!r} in {target.name})")
    assert not broken, f"{page}.html has broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES)
def test_every_image_is_there_and_not_empty(page):
    page_path = (SITE / f"{page}.html").resolve()
    problems = []
    for image in _soup(page_path).find_all("img"):
        src = image.get("src", "")
        if src.startswith("data:"):
            payload = src.split(",", 1)[1] if "," in src else ""
            if not (base64.b64decode(payload) if ";base64" in src.split(",", 1)[0] else payload):
                problems.append(f"empty inline image {src[:40]}")
            continue
        resolved = _local_target(page_path, src)
        if resolved is None:
            continue
        target, _ = resolved
        if not target.is_file() or target.stat().st_size == 0:
            problems.append(f"{src} (missing or empty: {target})")
    assert not problems, f"{page}.html:\n" + "\n".join(problems)


def _plotting_cells(page: str) -> int:
    """Code cells of the chapter's notebook that show a figure on every run (``plt.show()`` outside any
    ``if``/``try`` block, so not a GPU-only or recording-only branch)."""
    cells = json.loads((ROOT / f"{page}.ipynb").read_text())["cells"]
    return sum(1 for cell in cells if cell["cell_type"] == "code"
               and re.search(r"^plt\.show\(\)", "".join(cell["source"]), re.MULTILINE))


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_shows_its_figures(page):
    expected = _plotting_cells(page)
    images = [image for image in _article(page).select(".cell_output img")]
    assert len(images) >= expected, f"{page}.html shows {len(images)} figures; its notebook draws at least {expected}"


def test_every_chapter_that_plots_has_a_figure():
    plotting = [page for page in CHAPTERS if _plotting_cells(page)]
    assert len(plotting) >= 6, plotting  # every chapter but masking draws figures today
    for page in plotting:
        assert _article(page).select(".cell_output img"), f"{page}.html shows no figure"


@pytest.mark.parametrize("page", CHAPTERS)
def test_slider_figures_respond_without_a_kernel_or_a_network(page):
    """A flipbook (attn_gym_lite.book.flipbook) whose notebook builds one shows its sliders, its
    first frame and its script in the page; no output loads a script or a widget state from outside."""
    source = (ROOT / f"{page}.ipynb").read_text()
    article = _article(page)
    books = article.select(".cell_output .flipbook")
    assert len(books) == source.count("HTML(flipbook("), f"{page}.html shows {len(books)} slider figures"
    for book in books:
        assert book.select("input[type=range]") and book.select("img[src^='data:image/png']") and book.script
    hovers = article.select(".cell_output .hover-figure")  # attn_gym_lite.book.flipbook.hover: SVG tooltips
    assert len(hovers) == source.count("HTML(hover(") and all(h.select("svg title") for h in hovers)
    assert not article.select(".cell_output script[src]") and "application/vnd.jupyter.widget" not in str(article)


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.mark.parametrize("page", CHAPTERS[:1] + CHAPTERS[-1:])
def test_screenshot_is_not_blank(page, tmp_path):
    browser = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if browser is None:
        pytest.skip(f"no headless browser ({', '.join(BROWSERS)}) on this machine: the screenshot pass needs one")
    import matplotlib.image

    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                    f"--screenshot={shot}", (SITE / f"{page}.html").as_uri()], check=True, capture_output=True, timeout=120)
    pixels = matplotlib.image.imread(shot)
    assert pixels.size and pixels.std() > 0.01, f"the screenshot of {page}.html is blank"


def test_pages_load_every_script_and_stylesheet_from_the_site():
    """Formulas (MathJax), theme and figures work offline: no page fetches a script or stylesheet from elsewhere."""
    tags = [(page, t) for page in PAGES for t in _soup(SITE / f"{page}.html").find_all(["script", "link"])]
    urls = [(page, t.get("src") or (t.get("href") if "stylesheet" in t.get("rel", []) else None)) for page, t in tags]
    assert not [(page, url) for page, url in urls if url and re.match(r"(https?:)?//", url)]
    # pages with formulas get it (a rebuild adds Sphinx's "?v=<checksum>" to the URL)
    assert any(url and urlsplit(url).path.endswith("_static/mathjax/tex-chtml.js") for _, url in urls)


LAYOUT_CSS = "_static/wide.css"  # Jupyter Book 1 links every _static/*.css after the theme's


def test_layout_css_is_linked_once_wraps_outputs_scrolls_tables_and_fetches_nothing():
    for page in PAGES:
        hrefs = [link["href"].split("?")[0] for link in _soup(SITE / f"{page}.html").find_all("link", rel="stylesheet", href=True)]
        assert sum(href.endswith(LAYOUT_CSS) for href in hrefs) == 1, (page, hrefs)
    css = re.sub(r"\s+", " ", re.sub(r"/\*.*?\*/", "", (SITE / LAYOUT_CSS).read_text(), flags=re.DOTALL))
    rules = re.findall(r"([^{}]+)\{([^{}]*)\}", css)
    declared = lambda words, declaration: any(all(w in sel for w in words) and re.search(declaration, body) for sel, body in rules)
    assert declared((".cell_output", "pre"), r"white-space:\s*pre-wrap")
    assert declared((".cell_output", ".text_html"), r"overflow-x:\s*auto")
    assert float(re.search(r"--pst-sidebar-secondary:\s*([\d.]+)rem", css).group(1)) < 17  # the theme's 17rem
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", css)



def test_prose_values_equal_what_the_build_computed():
    # The notebooks' prose holds its numbers as text, so that they show outside the site too;
    # scripts/sync_prose.py writes them from this very build's glue records (and says which differ).
    assert subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_prose.py"), "--check"]).returncode == 0
