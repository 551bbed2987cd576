"""Where and how a measurement was made, stored beside every recorded result."""

from __future__ import annotations

import ast
import datetime
import hashlib
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

import attn_gym_lite

PACKAGE_ROOT = Path(attn_gym_lite.__file__).resolve().parent


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_commit() -> str | None:
    """``$ATTN_GYM_LITE_GIT_COMMIT`` when set (a GPU host's copy of the working tree may carry a
    stale ``.git``), which must be a full 40-hex commit; else the checkout's commit (``+dirty``
    when tracked files changed); else ``None``."""
    given = os.environ.get("ATTN_GYM_LITE_GIT_COMMIT")
    if given:
        if not re.fullmatch(r"[0-9a-f]{40}", given):
            raise ValueError("ATTN_GYM_LITE_GIT_COMMIT must be the full commit the recording measures "
                             f"(git rev-parse HEAD: 40 hex digits), got {given!r}")
        return given
    root = Path(__file__).resolve().parents[2]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return commit + ("+dirty" if dirty else "")


def _module_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE_ROOT / "__init__.py"
    relative = Path(*parts)
    for candidate in (PACKAGE_ROOT / relative.with_suffix(".py"), PACKAGE_ROOT / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def package_imports(path: Path, module: str, source: str | None = None) -> set[str]:
    """Every ``attn_gym_lite`` name the file ``path`` (module ``module``; its text, or ``source``)
    imports, as absolute dotted names, function-level imports included, read with ``ast``;
    ``from .x import y`` yields ``...x`` and ``...x.y`` (``y`` may be a submodule). The layering test
    and the notebooks suite use it too."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attn_gym_lite")}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            if target.startswith("attn_gym_lite"):
                found.add(target)
                # `from .x import y` may import the submodule y
                found |= {f"{target}.{a.name}" for a in node.names}
    return found


def source_files(*modules: str) -> list[Path]:
    """The package's source files ``modules`` run: each and every package module it imports,
    transitively (read statically, function-level imports included), parent packages too."""
    seen: dict[str, Path] = {}
    pending = list(modules)
    while pending:
        name = pending.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__ too
            prefix = ".".join(parts[:i])
            path = _module_file(prefix)
            if path is None or prefix in seen:
                continue
            seen[prefix] = path
            pending.extend(package_imports(path, prefix))
    return sorted(set(seen.values()))


def source_digest(*modules: str) -> str:
    """SHA-256 of :func:`source_files` (relative path and bytes of each, in order): a recording whose
    digest differs from today's was made by other code."""
    digest = hashlib.sha256()
    for path in source_files(*modules):
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def provenance(suite_module: str | None = None) -> dict:
    """GPU (name, SM count, memory, capability), driver, CUDA, torch, triton, Python, date, command,
    commit, package version and, for a suite, :func:`source_digest` of its source, JSON-ready."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
        }
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "gpu": gpu,
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in ["python", "-m", "attn_gym_lite.bench", *sys.argv[1:]]),
        "commit": git_commit(),
        "package_version": attn_gym_lite.__version__,
        "source_sha256": source_digest(suite_module) if suite_module else None,
    }
