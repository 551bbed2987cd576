"""The book's structure: every notebook is in the table of contents, runs in both modes, and
names only code that exists (its imports, its literal includes)."""

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


def _defines(tree: ast.Module, dotted: str) -> bool:
    scope = tree.body
    for part in dotted.split("."):
        found = [node for node in scope if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == part]
        if not found:
            return False
        scope = found[0].body
    return True


def test_every_literal_include_names_a_file_and_an_object_it_defines():
    # The book build fails on a missing :pyobject: (a renamed or moved function), but only in the
    # book step; this finds it with the tests.
    documents = _cells("markdown") + [(path, path.read_text()) for path in sorted((ROOT / "book").glob("*.md"))]
    includes = [(path, (path.parent / included).resolve(), re.search(r"^:pyobject:\s*(\S+)", options, re.MULTILINE))
                for path, text in documents for included, options in re.findall(r"```\{literalinclude\}\s+(\S+)\n((?::[^\n]*\n)*)", text)]
    assert len(includes) >= 20  # the chapters show the package's code in about two dozen places
    for document, included, name in includes:
        assert included.is_file(), f"{document.name}: literalinclude of a missing file {included}"
        assert name is None or _defines(ast.parse(included.read_text()), name.group(1)), f"{document.name}: {included.name} has no {name}"


def test_every_package_name_a_notebook_imports_exists():
    # Like a missing :pyobject:, a moved or removed name fails only when the book executes.
    imports = [node for _, source in _cells("code") for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_gym_lite")]
    assert len(imports) > 30
    for node in imports:
        module = importlib.import_module(node.module)
        for alias in node.names:  # a name the module defines, or a submodule of it
            assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (node.module, alias.name)
