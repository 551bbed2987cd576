"""Benchmark suite ``notebooks``: each chapter run top to bottom in GPU mode, as a reader runs it.

A notebook's recording is how long it took (kernel start included) and the most GPU memory in use
while it ran. The memory comes from the driver (``nvidia-smi``, sampled every 100 ms), not from
torch's allocator counters, because several chapters run their suites in child processes, and a
reader's GPU must hold those too, CUDA contexts included.

The notebooks run one after the other, so that no two share the GPU. All ten take longer than one
10-minute call on the H200, so a call may name fewer (``$ATTN_GYM_LITE_NOTEBOOKS``): each notebook
gets its own file, ``notebook_runs/<name>.json``, with its provenance, and a later call replaces only
the files of the notebooks it ran.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

from .provenance import package_imports, provenance, source_digest

SELECTION = "ATTN_GYM_LITE_NOTEBOOKS"  # notebooks to run: paths or globs, space-separated
DEFAULT_SELECTION = "notebooks/*.ipynb"  # from a checkout's root


def _code(path: Path) -> str:
    from IPython.core.inputtransformer2 import TransformerManager  # magics and shell escapes as Python

    cells = json.loads(path.read_text())["cells"]
    return "\n".join(TransformerManager().transform_cell("".join(c["source"])) for c in cells if c["cell_type"] == "code")


def notebook_digest(path: Path) -> str:
    """SHA-256 of the notebook's code cells and of every package module they import (with what those
    import): a run recorded with another digest ran other code. Prose edits leave it unchanged."""
    code = _code(path)
    modules = package_imports(path, "attn_gym_lite", source=code)
    return hashlib.sha256((code + source_digest(*modules)).encode()).hexdigest()


def _used_mib() -> list[int] | None:
    """Memory in use on each GPU of the machine (every process's), or None if nvidia-smi cannot say."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
        return [int(line) for line in done.stdout.split()] if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):  # no nvidia-smi; "[N/A]"
        return None


def run_notebook(path: Path, cell_timeout_s: float = 1200) -> dict:
    """Execute ``path`` top to bottom in a fresh kernel, in its own folder (as nbmake does), with
    empty Triton and inductor caches (a reader's first run compiles the kernels); a failing cell
    raises. Returns the seconds it took and the most memory in use on any one GPU above what was in
    use there before it started (GiB; None where nvidia-smi cannot say)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=cell_timeout_s, resources={"metadata": {"path": str(path.parent)}})
    before, peaks, done = _used_mib(), [], threading.Event()

    def sample() -> None:  # a thread: one query every 100 ms, each a whole answer
        while before and not done.wait(0.1):
            now = _used_mib()
            if now and len(now) == len(before):
                peaks.append(max(n - b for n, b in zip(now, before)))

    sampler = threading.Thread(target=sample, daemon=True)
    with tempfile.TemporaryDirectory() as caches, mock.patch.dict(  # the kernel inherits this environment
            os.environ, TRITON_CACHE_DIR=f"{caches}/triton", TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor"):
        sampler.start()
        start = time.perf_counter()
        try:
            client.execute()
        finally:
            seconds = time.perf_counter() - start
            done.set()
            sampler.join()
    return {"seconds": round(seconds, 1), "peak_gib": round(max(peaks) / 1024, 2) if peaks else None}


def notebooks_suite(out: Path) -> dict:
    """Run the selected notebooks (``$ATTN_GYM_LITE_NOTEBOOKS``, default every chapter of a checkout)
    one after the other; write ``out/notebook_runs/<name>.json`` for each, and list them."""
    paths = sorted({Path(p) for pattern in os.environ.get(SELECTION, DEFAULT_SELECTION).split()
                    for p in glob.glob(pattern)})
    if not paths:
        raise RuntimeError(f"no notebook matches ${SELECTION} (default {DEFAULT_SELECTION}, from a checkout's root)")
    (Path(out) / "notebook_runs").mkdir(parents=True, exist_ok=True)
    for path in paths:
        digest = notebook_digest(path)  # before the run: code it cannot read fails at once
        record = {"notebook": path.name, **run_notebook(path), "notebook_sha256": digest, "provenance": provenance()}
        (Path(out) / "notebook_runs" / f"{path.stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    return {"notebooks": [path.stem for path in paths]}  # the files this run wrote, which hold the figures
