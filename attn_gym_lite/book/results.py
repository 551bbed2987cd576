"""Recorded GPU results: where they live, how to load them, and the line that says where they
were measured.

The recordings ship inside the package, as ``attn_gym_lite/results/<gpu>/<suite>.json`` (package
data, so an installed wheel carries them as well as a checkout does); they are written only by
``python -m attn_gym_lite.bench`` on a real GPU, and each carries a ``provenance`` block (see
:mod:`attn_gym_lite.bench.provenance`).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

import torch

from ..checks import check_path


def _results_root() -> Path:
    """The package's ``results`` folder, as a filesystem path (checkout, editable or wheel install)."""
    root = files("attn_gym_lite") / "results"
    if not isinstance(root, Path):  # a zipped install: the recordings are not files on disk
        raise RuntimeError(f"attn_gym_lite's recordings must be on the filesystem, got {root!r}; install the package unzipped")
    return root


RESULTS_ROOT = _results_root()
"""``attn_gym_lite/results``: one folder per GPU (``h200``), each with ``<suite>.json`` files and the
profiling suite's ``profiling_traces/``."""

DECLARED_STALE = "stale.json"
"""In :data:`RESULTS_ROOT`: recordings known to be older than the code their suite runs, each with the
reason it was not re-recorded (``"<gpu>/<file>.json" -> reason``). The tests refuse any other stale
recording, and any entry here that is not really stale; :func:`banner` prints the reason."""


def declared_stale(root: Path | str | None = None) -> dict[str, str]:
    """The :data:`DECLARED_STALE` entries under ``root`` (default :data:`RESULTS_ROOT`); ``{}`` if none."""
    path = Path(root or RESULTS_ROOT) / DECLARED_STALE
    return json.loads(path.read_text()) if path.is_file() else {}


def load_result(suite: str, gpu: str = "h200", root: Path | str | None = None) -> dict:
    """Load ``<root>/<gpu>/<suite>.json`` (``suite`` with ``-`` or ``_``); ``root`` defaults to
    :data:`RESULTS_ROOT`, the recordings shipped with the package.

    A recording listed in :data:`DECLARED_STALE` comes back with the reason under the key
    ``"declared_stale"`` (added in memory, never written), which :func:`banner` prints.

    Raises:
        TypeError: ``suite`` or ``gpu`` is not a str, ``root`` not a str, ``os.PathLike`` or ``None``.
        ValueError: ``suite`` or ``gpu`` is a path rather than a name (a separator, ``".."``); the
            file is not JSON, or not an object with a ``provenance`` object.
        FileNotFoundError: no such recording; the message lists the suites recorded for ``gpu`` and
            the GPU folders under ``root``, says when ``root`` does not exist, and when ``root`` is
            itself a GPU folder (what ``python -m attn_gym_lite.bench SUITE --out DIR`` writes to:
            pass its parent as ``root`` and its name as ``gpu``).
    """
    # Names, not paths: "../h200/x" would leave the GPU folder, an int failed on .replace.
    for argument, value in (("suite", suite), ("gpu", gpu)):
        if not isinstance(value, str):
            raise TypeError(f"load_result: {argument} must be a str, got {type(value).__name__}: {value!r:.40}")
        if not value or value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"load_result: {argument} must be a name (no path separator, not '.' or '..'), got {value!r}")
    base = RESULTS_ROOT if root is None or root == "" else check_path("load_result: root", root)
    folder = base / gpu
    name = f"{suite.replace('-', '_')}.json"
    path = folder / name
    if not path.is_file():
        if not base.is_dir():
            raise FileNotFoundError(f"load_result: root {str(base)!r} is not a folder")
        known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        gpus = sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.json")))
        hint = ""
        if (base / name).is_file():
            hint = (f"; {str(base)!r} itself holds {name}: the bench CLI's --out is a GPU folder, so load it "
                    f"with root={str(base.parent)!r}, gpu={base.name!r}")
        raise FileNotFoundError(f"load_result: no recording {path}; recorded for {gpu!r}: {known}; "
                                f"GPU folders under root: {gpus}{hint}")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"load_result: {str(path)!r} is not a recording (JSON as the bench CLI writes it): {error}") from None
    if not isinstance(record, dict) or not isinstance(record.get("provenance"), dict):
        raise ValueError(f"load_result: {str(path)!r} is not a recording: a JSON object with a 'provenance' object "
                         f"was expected, got {type(record).__name__}")
    reason = declared_stale(root).get(f"{gpu}/{path.name}")
    if reason:
        record["declared_stale"] = reason
    return record


def provenance_line(record: dict) -> str:
    """One line naming GPU, versions, date, commit and command of a recorded result (plain text).

    Raises:
        TypeError: ``record`` is not a dict with a ``provenance`` dict whose ``gpu`` is a dict or
            ``None`` and whose ``date``, ``command`` and ``commit`` (when set) are strings (as the
            bench CLI writes them; the message names the field).
    """
    if not isinstance(record, dict) or not isinstance(record.get("provenance"), dict):
        raise TypeError(f"record must be a recording (a dict with a 'provenance' dict, as load_result returns), "
                        f"got {type(record).__name__}" + (f" with provenance {record.get('provenance')!r:.40}"
                                                          if isinstance(record, dict) else ""))
    p = record["provenance"]
    expected = {"gpu": (dict, type(None)), "date": (str,), "command": (str,), "commit": (str, type(None))}
    for field, types in expected.items():
        if not isinstance(p.get(field), types):
            raise TypeError(f"record['provenance']['{field}'] must be {' or '.join(t.__name__ for t in types)}, "
                            f"got {type(p.get(field)).__name__}: {p.get(field)!r:.40}")
    gpu = p["gpu"]
    commit = (p.get("commit") or "unknown")[:12]
    # A CPU-only suite (packing-study) recorded where there is no GPU has no GPU, driver or CUDA.
    machine = (f"{gpu.get('name', '?')} ({gpu.get('sm_count', '?')} SMs), driver {p.get('driver')}, CUDA {p['cuda']}"
               if gpu else "a CPU (no GPU)")
    return (
        f"{machine}, torch {p['torch']}, triton {p['triton']}, {p['date'][:10]}, "
        f"commit {commit}, command: {p['command']}"
    )


BANNER_WIDTH = 88
"""Characters per banner line: a code cell's output in the rendered book shows about 90 before it cuts."""


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, BANNER_WIDTH, initial_indent=indent, subsequent_indent=indent + "  " if indent else "  ",
                         break_long_words=False, break_on_hyphens=False)


def banner(record: dict, not_run: str) -> str:
    """The notice a notebook prints in CPU mode above a recorded figure, wrapped to
    :data:`BANNER_WIDTH` characters per line.

    Args:
        record: the recorded result being shown (with its ``provenance``).
        not_run: what this machine did not run, e.g. ``"the graph replay timings"``.

    Returns:
        Lines of plain text: on a CPU, ``"CPU mode: no CUDA device here, so <not_run> did not run."``,
        then the recording's :func:`provenance_line`, indented, and for a recording listed in
        :data:`DECLARED_STALE` why it is older than the package.

    Raises:
        TypeError: ``record`` is not a recording (:func:`provenance_line`'s checks), or
            ``not_run`` not a str.
    """
    if not isinstance(not_run, str):
        raise TypeError(f"not_run must be a str (what this machine did not run), got {type(not_run).__name__}")
    if torch.cuda.is_available():
        head = [f"Live run on {torch.cuda.get_device_name()}, beside the recording from:"]
    else:
        head = [f"CPU mode: no CUDA device here, so {not_run} did not run.", "Showing the recording from:"]
    lines = [*(_wrap(text) for text in head), _wrap(provenance_line(record), indent="  ")]
    if record.get("declared_stale"):
        lines.append(_wrap(f"Older than this package: {record['declared_stale']}"))
    return "\n".join(lines)


def rst_to_markdown(text: str) -> str:
    """Inline reStructuredText literals (````x````, as in docstrings) as Markdown code spans (```x```)."""
    return re.sub(r"``(.+?)``", r"`\1`", text)


def pitfall_markdown(report: dict, source: str) -> str:
    """A pitfall's report (:func:`attn_gym_lite.book.pitfalls.pitfall_report`) as Markdown: what
    the mistake is, then its outcome and every measured detail as a list.

    Args:
        report: ``{"name", "what", "outcome", ...details}``, live or from the ``pitfalls`` recording.
        source: where it comes from, e.g. ``"live"`` or ``"recorded"``.

    Raises:
        ValueError: ``report`` lacks ``"what"`` or ``"outcome"``.
    """
    missing = [key for key in ("what", "outcome") if key not in report]
    if missing:
        raise ValueError(f"report must hold 'what' and 'outcome', got keys {sorted(report)} (missing {missing})")
    lines = [f"**[{source}]** {rst_to_markdown(report['what'])}", "", f"- outcome: **{report['outcome']}**"]
    for key, value in report.items():
        if key not in ("name", "what", "outcome"):
            shown = str(value).replace("`", "'")
            lines.append(f"- {key}: `{shown}`")
    return "\n".join(lines)


def study_markdown(rows: Sequence[dict]) -> str:
    """The study's rows as a Markdown table (fill in %, padding in tokens)."""
    lines = [
        "| T | policy | B | mean fill | mean padding | median M | p99 M | max M | M bound |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['T']} | {row['policy']} | {row['B'] if row['B'] is not None else '–'} "
            f"| {row['mean_fill']:.2%} | {row['mean_padding']:.0f} | {row['median_M']} "
            f"| {row['p99_M']} | {row['max_M']} | {row['N_bound']} |"
        )
    return "\n".join(lines)


def step_token_rate(training_loop_record: dict, mode: str = "graph") -> dict:
    """Tokens per second a recorded training step consumes: ``T / step time``.

    Every step takes one batch of ``T`` rows, so a loader must deliver ``T`` tokens per step
    (an upper bound on the real tokens, ``L <= T``).

    Args:
        training_loop_record: the ``training-loop`` suite's result
            (``attn_gym_lite.book.results.load_result("training-loop")``).
        mode: ``"graph"`` or ``"eager"``.

    Returns:
        ``{"T", "step_us", "batches_per_s", "tokens_per_s"}``.

    Raises:
        ValueError: ``mode`` is not in the record.
    """
    if mode not in ("graph", "eager") or mode not in training_loop_record:
        raise ValueError(f"mode must be 'graph' or 'eager' and present in the record, got {mode!r}")
    token_capacity = training_loop_record["config"]["T"]
    step_us = training_loop_record[mode]["step_us"]
    return {
        "T": token_capacity,
        "step_us": step_us,
        "batches_per_s": 1e6 / step_us,
        "tokens_per_s": token_capacity * 1e6 / step_us,
    }
