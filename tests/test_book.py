"""The book's structure: every notebook is in the table of contents, runs in both modes, and
executes cleanly from a blank state."""

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def test_every_notebook_and_page_is_in_the_toc():
    files = _toc_files()
    for notebook in NOTEBOOKS:
        assert f"notebooks/{notebook.stem}" in files
    for file in files:
        assert (ROOT / f"{file}.md").exists() or (ROOT / f"{file}.ipynb").exists(), file


def test_notebooks_are_committed_without_outputs():
    # The book executes them; stored outputs would be stale numbers typed into the repository.
    for notebook in NOTEBOOKS:
        for cell in json.loads(notebook.read_text())["cells"]:
            assert not cell.get("outputs"), f"{notebook.name} has stored outputs"


def test_notebooks_check_for_a_gpu_and_say_what_they_ran():
    for notebook in NOTEBOOKS:
        text = notebook.read_text()
        assert "What this chapter ran" in text, notebook.name


def test_book_config_raises_on_notebook_errors():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["raise_on_error"] is True
    assert config["execute"]["execute_notebooks"] == "force"
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
