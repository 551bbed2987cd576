"""Every dotted ``attn_gym_lite.<name>`` the package mentions (in messages, docstrings, comments),
and the book and notebooks, names something that exists: a module, or an attribute of one.

Before: ``varlen_attention(..., impl="triton")`` on CPU told the user to "set TRITON_INTERPRET=1
before importing attn_gym_lite.kernels", a module that does not exist (it is
``attn_gym_lite.ops.kernels``), and nine other names in docstrings (twelve places in all) had gone
stale the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_gym_lite"
DOTTED = re.compile(r"\battn_gym_lite(?:\.[A-Za-z_][A-Za-z0-9_]*)+")

#: Dotted strings that are no references, each with the reason.
NOT_REFERENCES = {
    "attn_gym_lite.isolation.result": "the marker isolation.py prefixes to a child process's result line",
}


def _sources() -> list[Path]:
    """The package's Python source, the README, the book's pages and the notebooks."""
    files = sorted(PACKAGE.rglob("*.py")) + [ROOT / "README.md"]
    files += sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    return [path for path in files if path.is_file()]


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute (chain) of the longest module it starts with.

    Modules are found without being imported (``attn_gym_lite.bench.__main__`` would run the CLI);
    only a module whose attribute is named is imported.
    """
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


def test_the_finder_sees_references_and_tells_stale_ones():
    mentions = _mentions()
    # Known references of each form: a module, a class in its module, a re-export from a package.
    for name in ("attn_gym_lite.ops.kernels", "attn_gym_lite.graph.training.FixedCapacityTrainer",
                 "attn_gym_lite.data.PackedBatch", "attn_gym_lite.ops.kernels.AttentionConfig"):
        assert name in mentions, name
        assert _resolves(name), name
    for stale in ("attn_gym_lite.kernels", "attn_gym_lite.kernels.tasks", "attn_gym_lite.masking.mask_inactive_tokens",
                  "attn_gym_lite.data.study.SEED_PUBLISHED", "attn_gym_lite.ops.kernels.SCHEDULES"):
        assert not _resolves(stale), stale
    assert _resolves("attn_gym_lite.bench.__main__")  # found, not imported (that would run the CLI)


def test_every_dotted_package_name_mentioned_resolves():
    stale = {name: where for name, where in _mentions().items() if name not in NOT_REFERENCES and not _resolves(name)}
    assert not stale, f"dotted names that name nothing (module or attribute): {stale}"


def test_not_references_are_still_mentioned():
    mentions = _mentions()
    assert all(name in mentions for name in NOT_REFERENCES), "drop entries nothing mentions any more"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for CPU tensors without the interpreter")
def test_the_triton_cpu_message_names_a_module_that_exists():
    """The example of the trial: the advice must name the module to import after the variable."""
    code = (
        "import torch\n"
        "from attn_gym_lite.ops.attention import varlen_attention\n"
        "q = torch.randn(8, 2, 16, dtype=torch.bfloat16)\n"
        "try:\n"
        "    varlen_attention(q, q, q, torch.tensor([0, 8], dtype=torch.int32), impl='triton')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                            cwd=ROOT, timeout=300, check=True)
    message = result.stdout.strip()
    assert message == ("q must be a CUDA tensor (or set TRITON_INTERPRET=1 before importing attn_gym_lite.ops.kernels "
                       "to run on CPU), got device cpu"), result.stdout + result.stderr
    (named,) = DOTTED.findall(message)
    assert importlib.util.find_spec(named) is not None
