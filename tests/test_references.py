"""Every dotted ``attn_gym_lite.<name>`` the package mentions (in messages, docstrings, comments),
and the book and notebooks, names something that exists: a module, or an attribute of one."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_gym_lite"
DOTTED = re.compile(r"\battn_gym_lite(?:\.[A-Za-z_][A-Za-z0-9_]*)+")

#: Dotted strings that are no references, each with the reason.
NOT_REFERENCES = {
    "attn_gym_lite.isolation.result": "the marker isolation.py prefixes to a child process's result line",
}


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py")) + [ROOT / "README.md"]
    files += sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    return [path for path in files if path.is_file()]


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module (found, not imported: ``bench.__main__`` would run the CLI), or an
    attribute (chain) of the longest module it starts with."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            spec = importlib.util.find_spec(module_name)
        except (ModuleNotFoundError, ValueError):
            continue
        if spec is None:
            continue
        if end == len(parts):
            return True
        obj = importlib.import_module(module_name)
        for attribute in parts[end:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def _mentions() -> dict[str, list[str]]:
    """Each dotted name -> where it is mentioned (``path:line``)."""
    found: dict[str, list[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for match in DOTTED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.setdefault(match.group(0), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_the_finder_tells_references_from_stale_ones():
    assert _mentions()
    # Known references of each form: a module, a class in its module, a re-export from a package.
    for name in ("attn_gym_lite.ops.kernels", "attn_gym_lite.graph.training.FixedCapacityTrainer",
                 "attn_gym_lite.data.PackedBatch", "attn_gym_lite.ops.kernels.AttentionConfig"):
        assert _resolves(name), name
    for stale in ("attn_gym_lite.kernels", "attn_gym_lite.kernels.tasks", "attn_gym_lite.masking.mask_inactive_tokens",
                  "attn_gym_lite.data.study.SEED_PUBLISHED", "attn_gym_lite.ops.kernels.SCHEDULES"):
        assert not _resolves(stale), stale
    assert _resolves("attn_gym_lite.bench.__main__")  # found, not imported (that would run the CLI)


def test_every_dotted_package_name_mentioned_resolves():
    mentions = _mentions()
    stale = {name: where for name, where in mentions.items() if name not in NOT_REFERENCES and not _resolves(name)}
    assert not stale, f"dotted names that name nothing (module or attribute): {stale}"
    assert all(name in mentions for name in NOT_REFERENCES), "drop entries nothing mentions any more"
