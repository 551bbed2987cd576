"""Recorded GPU results: where they live, how to load them, and the line that says where they
were measured.

``results/<gpu>/<suite>.json`` files are written only by ``python -m attn_gym_lite.bench`` on a
real GPU; each carries a ``provenance`` block (see :mod:`attn_gym_lite.bench.provenance`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

RESULTS_ROOT = Path(__file__).resolve().parents[1] / "results"


def load_result(suite: str, gpu: str = "h200", root: Path | str | None = None) -> dict:
    """Load ``<root>/<gpu>/<suite>.json`` (``suite`` with ``-`` or ``_``).

    Raises:
        FileNotFoundError: no such recording; the message lists the suites recorded for ``gpu``.
    """
    folder = Path(root or RESULTS_ROOT) / gpu
    path = folder / f"{suite.replace('-', '_')}.json"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise FileNotFoundError(f"load_result: no recording {path}; recorded for {gpu!r}: {known}")
    return json.loads(path.read_text())


def provenance_line(record: dict) -> str:
    """One line naming GPU, versions, date, commit and command of a recorded result."""
    p = record["provenance"]
    gpu = p["gpu"] or {}
    commit = (p.get("commit") or "unknown")[:12]
    return (
        f"{gpu.get('name', 'no GPU')} ({gpu.get('sm_count', '?')} SMs), driver {p.get('driver')}, "
        f"CUDA {p['cuda']}, torch {p['torch']}, triton {p['triton']}, {p['date'][:10]}, "
        f"commit {commit}, `{p['command']}`"
    )


def banner(record: dict, not_run: str) -> str:
    """The notice a notebook prints in CPU mode above a recorded figure.

    Args:
        record: the recorded result being shown.
        not_run: what this machine did not run, e.g. ``"the graph replay timings"``.
    """
    if torch.cuda.is_available():
        return f"Live run on {torch.cuda.get_device_name()}, beside the recording from:\n  {provenance_line(record)}"
    return (
        f"CPU mode: no CUDA device here, so {not_run} did not run.\n"
        f"Showing the recording from:\n  {provenance_line(record)}"
    )
