"""The book's structure: every notebook is in the table of contents, runs in both modes, and
names only code that exists (its imports, its listings)."""

import ast
import importlib
import importlib.util
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cells(kind):
    return [(path, "".join(cell["source"])) for path in NOTEBOOKS for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == kind]


def test_every_notebook_and_page_is_in_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [chapter["file"] for part in toc["parts"] for chapter in part["chapters"]]
    assert {f"notebooks/{notebook.stem}" for notebook in NOTEBOOKS} <= set(files)
    for file in files:
        assert (ROOT / f"{file}.md").exists() or (ROOT / f"{file}.ipynb").exists(), file


def test_notebooks_have_no_outputs_and_say_what_they_ran():
    for notebook in NOTEBOOKS:
        # The book executes them; stored outputs would be stale numbers typed into the repository.
        assert not any(cell.get("outputs") for cell in json.loads(notebook.read_text())["cells"]), notebook.name
        assert "What this chapter ran" in notebook.read_text(), notebook.name


def test_book_config_raises_on_notebook_errors():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["raise_on_error"] is True and config["execute"]["execute_notebooks"] == "force"
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


def test_notebook_prose_shows_its_code_anywhere():
    # Outside the Sphinx build (Jupyter, Colab, GitHub) roles, directives and `(label)=` lines show raw:
    # values, listings and links (to a heading's slug) are plain Markdown; answers fold in <details>.
    markdown = "\n".join(text for _, text in _cells("markdown"))
    assert not re.search(r"\{(glue|literalinclude|dropdown|ref|doc)[:}]|^\([\w-]+\)=$", markdown, re.MULTILINE)
    spec = importlib.util.spec_from_file_location("sync_prose", ROOT / "scripts" / "sync_prose.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    assert len(sync.LISTING.findall(markdown)) >= 20 and len(sync.VALUE.findall(markdown)) >= 300
    # Each listing equals the package's source (a renamed or moved function fails here); the values
    # are checked against the book build in tests/test_site.py.
    assert [change for _, text in _cells("markdown") for change in sync.sync(text, None)[1]] == []


def test_every_package_name_a_notebook_imports_exists():
    # Like a missing :pyobject:, a moved or removed name fails only when the book executes.
    imports = [node for _, source in _cells("code") for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_gym_lite")]
    assert len(imports) > 30
    for node in imports:
        module = importlib.import_module(node.module)
        for alias in node.names:  # a name the module defines, or a submodule of it
            assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (node.module, alias.name)
