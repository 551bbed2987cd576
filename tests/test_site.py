"""The rendered book, checked as a reader sees it: the HTML that ``make book`` writes to ``_build/html``.

Every page of ``_toc.yml`` exists; no page shows Markdown or MyST it failed to render (raw tables,
``{glue:...}``/``{ref}`` roles, reStructuredText double backticks, stray backticks), an error or a
traceback; every image is there and not empty; every internal link and ``#anchor`` resolves; every
chapter that plots shows its figures. In headless Chromium, offline at 1280 px: no page fetches from
elsewhere or throws, every formula is typeset, nothing runs past the column, and every slider redraws
its figure (skipped without Playwright and Chromium; CI installs both).

Skipped when the site is not built (run ``make book`` first); CI sets ``ATTN_GYM_LITE_REQUIRE_SITE=1``
after ``make book``, which makes a missing site a failure. ``ATTN_GYM_LITE_SITE`` points the checks
at another build folder.
"""

from __future__ import annotations

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


def _plotting_cells(page: str) -> int:
    """Code cells of the chapter's notebook that show a figure on every run (``plt.show()`` outside any
    ``if``/``try`` block, so not a GPU-only or recording-only branch)."""
    cells = json.loads((ROOT / f"{page}.ipynb").read_text())["cells"]
    return sum(1 for cell in cells if cell["cell_type"] == "code"
               and re.search(r"^plt\.show\(\)", "".join(cell["source"]), re.MULTILINE))


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_shows_its_figures(page):
    expected = _plotting_cells(page)
    assert sum(map(bool, map(_plotting_cells, CHAPTERS))) >= 6  # every chapter but masking draws today
    images = [image for image in _article(page).select(".cell_output img")]
    assert len(images) >= expected, f"{page}.html shows {len(images)} figures; its notebook draws at least {expected}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_every_slider_and_hover_figure_is_in_its_page(page):
    """Every flipbook and hover figure (attn_gym_lite.book.flipbook) a notebook builds is in its page
    (the browser checks below move the sliders)."""
    source = (ROOT / f"{page}.ipynb").read_text()
    article = _article(page)
    books = article.select(".cell_output .flipbook")
    assert len(books) == source.count("HTML(flipbook("), f"{page}.html shows {len(books)} slider figures"
    hovers = article.select(".cell_output .hover-figure")  # attn_gym_lite.book.flipbook.hover: SVG tooltips
    assert len(hovers) == source.count("HTML(hover(") and all(h.select("svg title") for h in hovers)


# What only a browser shows: Debian's Chromium, headless, driven by Playwright, 1280 px wide, offline.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
# Jupyter Book 1 writes sphinx-thebe's config script twice (its `const` throws); no thebe button uses it.
KNOWN_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)
MEASURE = """async () => {
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  const article = document.querySelector('article'), right = article.getBoundingClientRect().right + 1;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const inScrollBox = el => { for (let a = el.parentElement; a !== article; a = a.parentElement) if (scrolls(a)) return true; };
  // Code listings may scroll sideways; what a cell shows (banners, tables, figures) must fit.
  const wide = [...article.querySelectorAll('*')].filter(el => el.getBoundingClientRect().right > right && !inScrollBox(el)
    || el.closest('.cell_output') && scrolls(el) && el.scrollWidth > el.clientWidth + 1);
  const sliders = [...article.querySelectorAll('.flipbook input[type=range]')].map(input => {
    const img = input.closest('.flipbook').querySelector('img'), start = input.value, seen = new Set(), labels = [];
    for (let v = +input.min; v <= +input.max; v++) {
      input.value = v; input.dispatchEvent(new Event('input'));
      seen.add(img.src); labels.push(input.nextElementSibling.textContent);
    }
    input.value = start; input.dispatchEvent(new Event('input'));
    return {name: input.dataset.name, pictures: seen.size, labels};
  });
  return {sliders, page_width: document.documentElement.scrollWidth, wide: wide.slice(0, 5).map(el => el.outerHTML.slice(0, 120)),
          images: [...document.images].filter(i => !i.complete || !i.naturalWidth).map(i => i.src.slice(0, 80)),
          untypeset: [...article.querySelectorAll('.math')].filter(m => !m.querySelector('mjx-container')).map(m => m.textContent)};
}"""


@pytest.fixture(scope="module")
def in_chromium(tmp_path_factory):
    """Each page as Chromium shows it offline: what ``MEASURE`` found, the page's uncaught errors,
    the requests that tried to leave the site, and a screenshot of its first screen."""
    sync_api = pytest.importorskip("playwright.sync_api")  # requirements.txt installs it
    chromium = shutil.which("chromium")
    if chromium is None:  # CI installs Debian's chromium: there, a missing one fails
        (pytest.fail if os.environ.get("ATTN_GYM_LITE_REQUIRE_SITE") == "1" else pytest.skip)("no chromium here")
    seen = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        for page_name in PAGES:
            page, row = context.new_page(), {"errors": [], "outside": []}
            page.route("**/*", lambda route, row=row: route.continue_() if route.request.url.startswith("file:")
                       else (row["outside"].append(route.request.url), route.abort()))
            page.on("pageerror", lambda error, row=row: row["errors"].append(str(error)))
            page.goto((SITE / f"{page_name}.html").as_uri(), wait_until="load")
            row.update(page.evaluate(MEASURE), screenshot=tmp_path_factory.mktemp("shots") / "page.png")
            page.screenshot(path=row["screenshot"])
            seen[page_name] = row
    return seen


@pytest.mark.parametrize("page", PAGES)
def test_page_in_chromium_offline_fits_1280px_and_typesets_its_formulas(page, in_chromium):
    """Offline, the page fetches nothing, throws nothing, shows every image, typesets every formula,
    and nothing in it runs past the column or hides behind a cell output's scroll bar."""
    import matplotlib.image

    row = in_chromium[page]
    assert not row["outside"], f"{page}.html fetches from outside the site: {row['outside']}"
    assert not row["images"], f"{page}.html shows broken or empty images: {row['images']}"
    assert not [e for e in row["errors"] if not e.startswith(KNOWN_ERRORS)], row["errors"]
    assert not row["untypeset"], f"formulas left as LaTeX in {page}.html: {row['untypeset']}"
    assert row["page_width"] <= 1280 and not row["wide"], f"wider than the column in {page}.html: {row['wide']}"
    assert matplotlib.image.imread(row["screenshot"]).std() > 0.01, f"the screenshot of {page}.html is blank"


def test_every_slider_redraws_its_figure_in_chromium(in_chromium):
    sliders = [(page, s) for page in CHAPTERS for s in in_chromium[page]["sliders"]]
    assert len(sliders) >= 8  # chapters 1, 4 and 7 today
    for page, slider in sliders:
        assert slider["pictures"] > 1 and len(set(slider["labels"])) == len(slider["labels"]), (page, slider)


def test_prose_values_equal_what_the_build_computed():
    # The notebooks' prose holds its numbers as text, so that they show outside the site too;
    # scripts/sync_prose.py writes them from this very build's glue records (and says which differ).
    assert subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_prose.py"), "--check"]).returncode == 0
