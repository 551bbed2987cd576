"""Keep the numbers and the code listings in the notebooks' prose true to what computes them.

Jupyter Book would paste values with `{glue:text}` roles and code with `{literalinclude}`, but only
when it builds the site: a reader who opens a notebook in Jupyter, Colab or a GitHub preview would
see the raw markup instead. So the Markdown holds the values and the code themselves, between markers
that no renderer shows, and this script rewrites them from their sources:

- a value in a sentence: `<span data-glue="KEY">TEXT</span>`, TEXT being what the notebook's
  `glue("KEY", ...)` call recorded when the book build executed it (`_build/jupyter_execute`), as
  `{glue:text}` would render it; a paragraph of Markdown glued on its own: `<!--glue:KEY-->`, the
  paragraph, `<!--/glue-->`, each on its own line (a comment that opened a line of prose would turn
  the whole line into an HTML block, hence the span inside sentences);
- a listing: `<!--listing:PATH:NAME-->` on its own line, then a fenced block holding the source of
  NAME (a function, a class or `Class.method`) in PATH, as `literalinclude`'s `:pyobject:` shows it.

Usage, from the project root:
    make book && python scripts/sync_prose.py     # rewrite the notebooks
    python scripts/sync_prose.py --check          # list what differs, exit 1 if anything does
    python scripts/sync_prose.py --check --listings   # the listings only (no build needed)
tests/test_site.py runs `--check` after the book build; tests/test_book.py checks the listings.
"""
import ast
import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_build" / "jupyter_execute" / "notebooks"
VALUE = re.compile(r'(<span data-glue="([\w-]+)">)(.*?)(</span>)|(<!--glue:([\w-]+)-->\n)(.*?)(\n<!--/glue-->)', re.S)
LISTING = re.compile(r"<!--listing:([^:>]+):([\w.]+)-->\n```python\n(.*?)```", re.S)


def glued_values(notebook: Path) -> dict:
    """KEY -> the text `{glue:text}` (or `{glue:md}`) renders, from an executed notebook's outputs."""
    # The book build keeps the glue outputs beside the notebook (NAME.glue.json); nbmake leaves them
    # in the cells, their MIME types prefixed with "application/papermill.record/".
    glued = notebook.with_suffix(".glue.json")
    outputs = (json.loads(glued.read_text()).values() if glued.exists() else
               [o for cell in json.loads(notebook.read_text())["cells"] for o in cell.get("outputs", [])])
    values = {}
    for output in outputs:
        key = output.get("metadata", {}).get("scrapbook", {}).get("name")
        data = {k.rpartition("record/")[2]: "".join(v) for k, v in output.get("data", {}).items()}
        if key and "text/markdown" in data:
            values[key] = data["text/markdown"].strip()
        elif key:
            try:  # what myst-nb does: a str's repr loses its quotes
                values[key] = str(ast.literal_eval(data["text/plain"]))
            except (SyntaxError, ValueError):
                values[key] = data["text/plain"]
    return values


def source_of(path: str, name: str) -> str:
    """The source of NAME in PATH (decorators included, dedented), ending in a newline."""
    lines = (ROOT / path).read_text().splitlines(keepends=True)
    body = ast.parse("".join(lines)).body
    for part in name.split("."):
        node = next(n for n in body if getattr(n, "name", None) == part)
        body = getattr(node, "body", [])
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return textwrap.dedent("".join(lines[first - 1:node.end_lineno]))


def sync(text: str, values: dict | None) -> tuple[str, list[str]]:
    """The Markdown with its listings (and, given values, its values) rewritten; what changed."""
    changed = []

    def listing(match):
        new = source_of(match[1], match[2])
        if new != match[3]:
            changed.append(f"listing {match[1]}:{match[2]}")
        return f"<!--listing:{match[1]}:{match[2]}-->\n```python\n{new}```"

    def value(match):
        opening, key, old, closing = match.groups()[:4] if match[1] else match.groups()[4:]
        if values is None:
            return match[0]
        new = values.get(key, f"(no glue value {key!r})")
        if new != old:
            changed.append(f"value {key}: {old!r} -> {new!r}")
        return opening + new + closing

    return VALUE.sub(value, LISTING.sub(listing, text)), changed


def main(check: bool, listings_only: bool, executed: Path) -> int:
    differences = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        values = None if listings_only else glued_values(executed / path.name)
        if values == {} and executed != EXECUTED:
            continue  # --executed: a notebook that did not run there
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            if cell["cell_type"] == "markdown":
                text, changed = sync("".join(cell["source"]), values)
                differences += [f"{path.name}: {c}" for c in changed]
                cell["source"] = text.splitlines(keepends=True)
        if not check:
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    print("\n".join(differences) or "prose in sync")
    return 1 if check and differences else 0


if __name__ == "__main__":
    # --executed DIR: the values of notebooks executed elsewhere (`pytest --nbmake --overwrite` in
    # GPU mode, say) instead of the book build's.
    executed = Path(sys.argv[sys.argv.index("--executed") + 1]) if "--executed" in sys.argv else EXECUTED
    sys.exit(main("--check" in sys.argv, "--listings" in sys.argv, executed))
