"""The ``packing-study`` suite: the data chapter's study and packer throughput, recorded.

The study itself runs on a CPU. It is recorded on the GPU host anyway, so that its table and the
packer's throughput are measured on the same machine (and CPU) that produced the training-step
times the throughput is compared with, and carry the same provenance. The corpus there is that
host's Python standard library, so its numbers differ a little from a reader's live run.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from ..checks import check_int, check_real
from ..data import BestFit, PackingPolicy, Tokenizer, load_tokenizer, python_stdlib_corpus, segment
from ..data.batch import pack_pieces
from ..data.study import document_lengths, length_summary, packing_study
from ..data.tokenizer import resolve_tokenizer


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
    time the loader's stages on one core (:func:`packer_throughput`
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


# ---------------------------------------------------------------------------------------------
# Can the CPU keep up?
# ---------------------------------------------------------------------------------------------


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _rate(work: Callable[[], object], min_seconds: float) -> float:
    """Calls of ``work`` per second, repeating it for at least ``min_seconds`` (one warm-up)."""
    work()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds or calls == 0:
        work()
        calls += 1
    return calls / elapsed


def packer_throughput(
    documents: Sequence[str],
    tokenizer: Tokenizer | str | None = None,
    *,
    token_capacity: int = 4096,
    max_piece_tokens: int = 1024,
    policy: PackingPolicy | None = None,
    min_seconds: float = 0.5,
) -> dict:
    """Documents/s and tokens/s of each stage of the loader, on one CPU core.

    Stages, each timed on its own over the same documents: ``tokenize`` (``tokenizer.encode``
    one document at a time: single-threaded), ``pack`` (the policy over the piece lengths),
    ``assemble`` (building each :class:`~attn_gym_lite.data.PackedBatch` from its pieces' ids,
    with torch limited to one thread) and ``pack_and_assemble`` (the two in sequence: what a
    loader over pre-tokenized data costs). Compare ``tokens_per_s`` with
    :func:`attn_gym_lite.book.results.step_token_rate` to see whether the loader can feed the GPU.

    Args:
        documents: document strings (a few hundred are plenty).
        tokenizer: a :class:`~attn_gym_lite.data.Tokenizer` or spec; default the stdlib BPE.
        token_capacity: ``T`` of the batches; default the book's training size, 4096.
        max_piece_tokens: longest piece; default 1024, the book's training context length.
        policy: default ``BestFit(32)``.
        min_seconds: each stage is repeated for at least this long (> 0).

    Returns:
        ``{"T", "max_piece_tokens", "policy", "documents", "pieces", "tokens", "batches",
        "tokenize", "pack", "assemble", "pack_and_assemble"}``, each stage a dict with
        ``documents_per_s`` and ``tokens_per_s``.

    Raises:
        ValueError: no documents with at least one token, or an argument out of range.
    """
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    max_piece_tokens = check_int(
        "max_piece_tokens", max_piece_tokens, minimum=1, maximum=token_capacity
    )
    min_seconds = check_real("min_seconds", min_seconds, minimum=1e-3)
    policy = BestFit(32) if policy is None else policy
    tokenizer = resolve_tokenizer(tokenizer)
    documents = list(documents)
    with _one_torch_thread():
        start = time.perf_counter()
        encoded = [tokenizer.encode(document) for document in documents]
        tokenize_seconds = time.perf_counter() - start
        pieces = [piece for ids in encoded for piece in segment(ids, max_piece_tokens)]
        if not pieces:
            raise ValueError("documents must hold at least one token")
        lengths = [len(piece) for piece in pieces]
        batches = list(policy.batches(lengths, token_capacity))
        slots = policy.sequence_bound(token_capacity)

        def pack() -> None:
            for _ in policy.batches(lengths, token_capacity):
                pass

        def assemble() -> None:
            for batch in batches:
                # The loader's path (pack_pieces): its ids are a tokenizer's, already valid.
                chosen = [pieces[p] for p in batch]
                pack_pieces(chosen, [len(piece) for piece in chosen], token_capacity, slots)

        pack_rate = _rate(pack, min_seconds)
        assemble_rate = _rate(assemble, min_seconds)
    tokens, count = sum(lengths), len(documents)

    def stage(passes_per_second: float) -> dict:
        return {
            "documents_per_s": count * passes_per_second,
            "tokens_per_s": tokens * passes_per_second,
        }

    return {
        "T": token_capacity,
        "max_piece_tokens": max_piece_tokens,
        "policy": policy.label,
        "documents": count,
        "pieces": len(pieces),
        "tokens": tokens,
        "batches": len(batches),
        "tokenize": stage(1 / tokenize_seconds),
        "pack": stage(pack_rate),
        "assemble": stage(assemble_rate),
        "pack_and_assemble": stage(1 / (1 / pack_rate + 1 / assemble_rate)),
    }
