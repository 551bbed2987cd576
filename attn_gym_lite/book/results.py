"""Recorded GPU results (``results/<gpu>/<suite>.json``, written by ``python -m attn_gym_lite.bench``
on a GPU, each with a ``provenance`` block): loading them, and the banner printed above a figure."""

import json
import re
import textwrap
from pathlib import Path

import torch

RESULTS_ROOT = Path(__file__).resolve().parents[1] / "results"  # a folder per GPU (h200) of <suite>.json
#: ``{"<gpu>/<file>.json": why it was not re-recorded}``: recordings older than their suite's code
#: (beside this module, not among the recordings: it is no recording itself).
DECLARED_STALE = Path(__file__).with_name("stale_recordings.json")
BANNER_WIDTH = 88  # characters: a rendered code cell's output shows about 90


def declared_stale() -> dict[str, str]:
    return json.loads(DECLARED_STALE.read_text()) if DECLARED_STALE.is_file() else {}


def load_result(suite: str, gpu: str = "h200", root=None) -> dict:
    """Load ``<root>/<gpu>/<suite>.json`` (``suite`` spelt with ``-`` or ``_``; ``root`` defaults to
    :data:`RESULTS_ROOT`, the recordings shipped with the package). A recording declared stale
    carries the reason under ``"declared_stale"``, which :func:`banner` prints."""
    path = Path(root or RESULTS_ROOT) / gpu / f"{suite.replace('-', '_')}.json"
    record = json.loads(path.read_text())
    reason = declared_stale().get(f"{gpu}/{path.name}")
    if reason:
        record["declared_stale"] = reason
    return record


def notebook_run(notebook: str, gpu: str = "h200", root=None) -> str:
    """One sentence for a chapter's "What you need": how long ``notebook`` (its file name without
    ``.ipynb``) ran top to bottom in GPU mode and the most GPU memory it used, from the ``notebooks``
    suite's recording ``<root>/<gpu>/notebook_runs/<notebook>.json``."""
    path = Path(root or RESULTS_ROOT) / gpu / "notebook_runs" / f"{notebook}.json"
    if not path.is_file():
        return f"Its run time in GPU mode on the {gpu.upper()} is not recorded yet."
    run = json.loads(path.read_text())
    p = run["provenance"]
    older = " by an older version of its code" if declared_stale().get(f"{gpu}/notebook_runs/{path.name}") else ""
    memory = "" if run["peak_gib"] is None else f" and used at most {run['peak_gib']:.1f} GiB of its memory"
    return (f"In GPU mode it ran top to bottom in {run['seconds']:.0f} s on one {p['gpu']['name']}{memory} "
            f"(recorded {p['date'][:10]}{older}, commit {(p.get('commit') or 'unknown')[:12]}).")


def provenance_line(record: dict) -> str:
    """GPU, versions, date, commit and command of a recording, on one line."""
    p = record["provenance"]
    gpu = p["gpu"]  # None for a CPU-only suite (packing-study) recorded without a GPU
    machine = (f"{gpu.get('name', '?')} ({gpu.get('sm_count', '?')} SMs), driver {p.get('driver')}, CUDA {p['cuda']}"
               if gpu else "a CPU (no GPU)")
    return (f"{machine}, torch {p['torch']}, triton {p['triton']}, {p['date'][:10]}, "
            f"commit {(p.get('commit') or 'unknown')[:12]}, command: {p['command']}")


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, BANNER_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def banner(record: dict, not_run: str) -> str:
    """What a notebook prints above a recorded figure, wrapped to :data:`BANNER_WIDTH`: on a CPU,
    that ``not_run`` (e.g. ``"the graph replay timings"``) did not run; then where the recording
    was made (:func:`provenance_line`) and, if declared stale, why it is older than the package."""
    if torch.cuda.is_available():
        head = [f"Live run on {torch.cuda.get_device_name()}, beside the recording from:"]
    else:
        head = [f"CPU mode: no CUDA device here, so {not_run} did not run.", "Showing the recording from:"]
    lines = [*map(_wrap, head), _wrap(provenance_line(record), indent="  ")]
    if record.get("declared_stale"):
        lines.append(_wrap(f"Older than this package: {record['declared_stale']}"))
    return "\n".join(lines)


def pitfall_markdown(report: dict, source: str) -> str:
    """A pitfall's report (:func:`~attn_gym_lite.book.pitfalls.pitfall_report`, live or recorded) as
    Markdown: the mistake, then its outcome and every measured detail as a list; ``source`` is
    ``"live"`` or ``"recorded"``."""
    what = re.sub(r"``(.+?)``", r"`\1`", report["what"])  # docstring literals as Markdown code spans
    lines = [f"**[{source}]** {what}", "", f"- outcome: **{report['outcome']}**"]
    for key, value in report.items():
        if key not in ("name", "what", "outcome"):
            shown = str(value).replace("`", "'")
            lines.append(f"- {key}: `{shown}`")
    return "\n".join(lines)


def study_markdown(rows) -> str:
    """The packing study's rows as a Markdown table (fill in %, padding in tokens)."""
    lines = ["| T | policy | B | mean fill | mean padding | median M | p99 M | max M | M bound |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['T']} | {r['policy']} | {r['B'] if r['B'] is not None else '–'} | {r['mean_fill']:.2%} "
              f"| {r['mean_padding']:.0f} | {r['median_M']} | {r['p99_M']} | {r['max_M']} | {r['N_bound']} |" for r in rows]
    return "\n".join(lines)


def step_token_rate(training_loop_record: dict, mode: str = "graph") -> dict:
    """Tokens per second a recorded training step (``training-loop``, ``mode`` ``"graph"`` or
    ``"eager"``) consumes: every step takes one batch of ``T`` rows, so a loader must deliver ``T``
    tokens per step. Returns ``{"T", "step_us", "batches_per_s", "tokens_per_s"}``."""
    T, step_us = training_loop_record["config"]["T"], training_loop_record[mode]["step_us"]
    return {"T": T, "step_us": step_us, "batches_per_s": 1e6 / step_us, "tokens_per_s": T * 1e6 / step_us}
