"""The ``packing-study`` suite: the data chapter's study and packer throughput, recorded.

The study itself runs on a CPU. It is recorded on the GPU host anyway, so that its table and the
packer's throughput are measured on the same machine (and CPU) that produced the training-step
times the throughput is compared with, and carry the same provenance. The corpus there is that
host's Python standard library, so its numbers differ a little from a reader's live run.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from ..data import load_tokenizer, python_stdlib_corpus
from ..data.study import (
    document_lengths,
    length_summary,
    packer_throughput,
    packing_study,
)


def _cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` reports."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def packing_study_suite(
    max_piece_tokens: int = 8192,
    passes: int = 8,
    seed: int = 0,
    throughput_documents: int = 200,
) -> dict:
    """Tokenize the default corpus once, run :func:`~attn_gym_lite.data.study.packing_study`
    (T in 8192, 16384, 32768; in order, first-fit and best-fit with B in 1, 8, 32, 64, 128) and
    time the loader's stages on one core (:func:`~attn_gym_lite.data.study.packer_throughput`
    on the first ``throughput_documents`` documents, at the book's training sizes)."""
    tokenizer = load_tokenizer()
    lengths = document_lengths(python_stdlib_corpus(), tokenizer, progress=True)
    rows = packing_study(
        lengths, max_piece_tokens=max_piece_tokens, passes=passes, seed=seed, progress=True
    )
    documents = list(python_stdlib_corpus(limit=throughput_documents))
    return {
        "config": {
            "max_piece_tokens": max_piece_tokens,
            "passes": passes,
            "seed": seed,
            "throughput_documents": throughput_documents,
        },
        "corpus": {
            "name": "python-stdlib",
            "python": platform.python_version(),
            "tokenizer": tokenizer.name,
            **length_summary(lengths),
        },
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count()},
        "document_lengths": lengths,
        "table": rows,
        "throughput": packer_throughput(documents, tokenizer),
    }
