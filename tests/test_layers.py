"""The package's layers (see attn_gym_lite/__init__.py): no module imports from a higher layer.
Every import of every module (function-level ones included) is read with ``ast`` and compared by layer.
"""

import ast
import re
from pathlib import Path

import pytest

from attn_gym_lite.bench import provenance

PACKAGE = Path(__file__).resolve().parents[1] / "attn_gym_lite"

#: Module prefix -> layer. A module belongs to the longest prefix that matches it.
LAYERS = {
    "attn_gym_lite": 0,  # the package's __init__: __version__ only
    "attn_gym_lite.checks": 0,
    "attn_gym_lite.isolation": 0,
    "attn_gym_lite.ragged": 1,
    "attn_gym_lite.schedule": 1,
    "attn_gym_lite.regions": 1,
    "attn_gym_lite.ops": 2,
    "attn_gym_lite.data": 3,
    "attn_gym_lite.models": 4,
    "attn_gym_lite.graph": 5,
    "attn_gym_lite.profiling": 6,
    "attn_gym_lite.testing": 6,
    "attn_gym_lite.book": 7,
    "attn_gym_lite.bench": 8,
}
# isolation.py may move into bench/ (then bench's layer holds it): only prefixes that exist count.
LAYERS = {prefix: n for prefix, n in LAYERS.items() if prefix == "attn_gym_lite"
          or (PACKAGE.parent / prefix.replace(".", "/")).with_suffix(".py").exists()
          or (PACKAGE.parent / prefix.replace(".", "/")).is_dir()}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return LAYERS[max(matches, key=len)]


def package_imports(path: Path) -> set[str]:
    """Every attn_gym_lite name ``path`` imports, as absolute dotted names (the parser the source
    digests use, so the layering checked here is the import graph the recordings hash)."""
    return provenance.package_imports(path, module_name(path))


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_from_a_higher_layer(path):
    here = module_name(path)
    upward = {target: layer(target) for target in package_imports(path) if layer(target) > layer(here)}
    assert not upward, f"{here} (layer {layer(here)}) imports from higher layers: {upward}"


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    for path in MODULES:
        layer(module_name(path))  # raises if no prefix matches


def test_the_checker_sees_relative_and_function_level_imports(tmp_path):
    # A known upward import must be found: graph.training imports models (allowed, 5 > 4), and
    # the capture machinery must not import profiling (it would be 5 -> 6).
    training = package_imports(PACKAGE / "graph" / "training.py")
    assert "attn_gym_lite.data" in training and "attn_gym_lite.regions" in training
    assert not any(t.startswith("attn_gym_lite.profiling") for t in package_imports(PACKAGE / "graph" / "capture.py"))
    pitfalls = package_imports(PACKAGE / "bench" / "pitfalls.py")
    assert layer("attn_gym_lite.bench.pitfalls") == 8 and "attn_gym_lite.book.pitfalls" in pitfalls


def test_the_package_docstring_states_this_table():
    """attn_gym_lite/__init__.py lists the layers as ``K. :mod:`.name` ...;`` items: the same
    modules in the same layers as LAYERS (read from the file, not imported)."""
    docstring = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    items = re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\n\n)", docstring, flags=re.M | re.S)
    stated = {f"attn_gym_lite.{name}": int(number) for number, text in items for name in re.findall(r":mod:`\.(\w+)`", text)}
    assert len(items) == 9 and "``__init__``" in items[0][1]
    assert stated == {prefix: number for prefix, number in LAYERS.items() if prefix != "attn_gym_lite"}
