"""Where and how a measurement was made, stored beside every recorded result."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_commit() -> str | None:
    """``$ATTN_GYM_LITE_GIT_COMMIT`` when set (a GPU host gets a copy of the working tree whose
    ``.git``, if any, need not be the checkout's: one such copy reported a stale commit), else
    the checkout's commit (``+dirty`` when tracked files changed), else ``None``."""
    if os.environ.get("ATTN_GYM_LITE_GIT_COMMIT"):
        return os.environ["ATTN_GYM_LITE_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return commit + ("+dirty" if dirty else "")


def provenance() -> dict:
    """GPU (name, SM count, memory), driver, CUDA, torch, triton, Python, date, command, commit.

    Returns a JSON-ready dict; GPU fields are ``None`` without CUDA.
    """
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
    }
