"""The ``packing-study`` suite: the data chapter's study and packer throughput, recorded.

It runs on a CPU, but is recorded on the GPU host, so that the packer's throughput is measured
on the machine whose training-step times it is compared with.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from ..data import BestFit, PackingPolicy, Tokenizer, load_tokenizer, python_stdlib_corpus, segment
from ..data.batch import pack_pieces
from ..data.study import document_lengths, length_summary, packing_study
from ..data.tokenizer import resolve_tokenizer


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def packing_study_suite(max_piece_tokens: int = 8192, passes: int = 8, seed: int = 0,
                        throughput_documents: int = 200) -> dict:
    """:func:`~attn_gym_lite.data.study.packing_study` on the tokenized default corpus, and
    :func:`packer_throughput` on its first ``throughput_documents`` documents."""
    tokenizer = load_tokenizer()
    lengths = document_lengths(python_stdlib_corpus(), tokenizer, progress=True)
    rows = packing_study(lengths, max_piece_tokens=max_piece_tokens, passes=passes, seed=seed, progress=True)
    documents = list(python_stdlib_corpus(limit=throughput_documents))
    return {
        "config": {"max_piece_tokens": max_piece_tokens, "passes": passes, "seed": seed,
                   "throughput_documents": throughput_documents},
        "corpus": {"name": "python-stdlib", "python": platform.python_version(), "tokenizer": tokenizer.name,
                   **length_summary(lengths)},
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count()},
        "document_lengths": lengths,
        "table": rows,
        "throughput": packer_throughput(documents, tokenizer),
    }


# Can the CPU keep up?


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


def packer_throughput(documents: Sequence[str], tokenizer: Tokenizer | str | None = None, *,
                      token_capacity: int = 4096, max_piece_tokens: int = 1024, policy: PackingPolicy | None = None,
                      min_seconds: float = 0.5) -> dict:
    """Documents/s and tokens/s of each stage of the loader on one CPU core: ``tokenize``, ``pack``
    (the policy, default ``BestFit(32)``, over the piece lengths), ``assemble`` (the batches from
    their pieces) and ``pack_and_assemble`` (what a loader over pre-tokenized data costs). Each
    stage repeats for at least ``min_seconds``; compare with the training step's tokens/s
    (:func:`attn_gym_lite.book.results.step_token_rate`).
    """
    policy = BestFit(32) if policy is None else policy
    tokenizer = resolve_tokenizer(tokenizer)
    documents = list(documents)
    with _one_torch_thread():
        start = time.perf_counter()
        encoded = [tokenizer.encode(document) for document in documents]
        tokenize_seconds = time.perf_counter() - start
        pieces = [piece for ids in encoded for piece in segment(ids, max_piece_tokens)]
        if not pieces:  # rates of nothing would read as an infinitely fast packer
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
        return {"documents_per_s": count * passes_per_second, "tokens_per_s": tokens * passes_per_second}

    return {
        "T": token_capacity, "max_piece_tokens": max_piece_tokens, "policy": policy.label, "documents": count,
        "pieces": len(pieces), "tokens": tokens, "batches": len(batches),
        "tokenize": stage(1 / tokenize_seconds),
        "pack": stage(pack_rate),
        "assemble": stage(assemble_rate),
        "pack_and_assemble": stage(1 / (1 / pack_rate + 1 / assemble_rate)),
    }
