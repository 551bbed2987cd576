"""Measure a corpus's document lengths, then how full each packing policy makes the batches and
how many sequences they hold (the seed article's table, for any corpus), on lengths alone."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from tqdm.auto import tqdm

from .corpora import python_stdlib_corpus
from .packing import BestFit, FirstFit, InOrder, PackingPolicy
from .quantiles import sample_quantile
from .segment import MIN_DOCUMENT_TOKENS, segment_lengths
from .tokenizer import Tokenizer, encode_in_chunks, resolve_tokenizer

__all__ = ["document_lengths", "length_summary", "nearest_rank", "piece_stream", "pack_lengths", "PackingStats",
           "packing_stats", "study_policies", "packing_study"]


def document_lengths(corpus: Iterable[str] | None = None, tokenizer: Tokenizer | str | None = None, *,
                     progress: bool = False) -> list[int]:
    """Tokens per document, in corpus order (default: the stdlib corpus and its BPE)."""
    corpus = python_stdlib_corpus() if corpus is None else corpus
    tokenizer = resolve_tokenizer(tokenizer)
    lengths: list[int] = []
    with tqdm(desc="tokenizing", unit=" docs", disable=not progress) as bar:
        for chunk in encode_in_chunks(enumerate(corpus), tokenizer):
            lengths += [len(ids) for _, ids in chunk]
            bar.update(len(chunk))
    return lengths


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The smallest value with at least a ``quantile`` fraction of ``values`` at or below it."""
    return sample_quantile(values, quantile, method="nearest-rank")


def length_summary(lengths: Sequence[int]) -> dict:
    """Count, total, mean, nearest-rank quantiles (p10, p50, p90, p99) and max of the lengths."""
    return {
        "documents": len(lengths),
        "tokens": sum(lengths),
        "mean": statistics.fmean(lengths),
        **{f"p{round(q * 100)}": nearest_rank(lengths, q) for q in (0.1, 0.5, 0.9, 0.99)},
        "max": max(lengths),
    }


def piece_stream(lengths: Sequence[int], *, max_piece_tokens: int, passes: int = 1, seed: int = 0) -> list[int]:
    """The piece lengths a loader sees: ``passes`` shuffled passes (one ``random.Random(seed)``)
    over the documents of 2 tokens or more, each cut by :func:`~attn_gym_lite.data.segment_lengths`."""
    rng = random.Random(seed)
    kept = [length for length in lengths if length >= MIN_DOCUMENT_TOKENS]
    pieces: list[int] = []
    for _ in range(passes):
        rng.shuffle(kept)
        for length in kept:
            pieces += segment_lengths(length, max_piece_tokens)
    return pieces


def pack_lengths(pieces: Sequence[int], policy: PackingPolicy, token_capacity: int,
                 sequence_capacity: int | None = None) -> list[list[int]]:
    """Each batch's piece lengths, in layout order."""
    return [[pieces[p] for p in batch] for batch in policy.batches(pieces, token_capacity, sequence_capacity)]


@dataclass(frozen=True)
class PackingStats:
    """Mean ``L / T``, mean ``T - L`` (tokens), nearest-rank quantiles and maximum of ``M``."""

    token_capacity: int
    batches: int
    mean_fill: float
    mean_padding: float
    median_M: int
    p99_M: int
    max_M: int


def packing_stats(batch_lengths: Sequence[Sequence[int]], token_capacity: int, *,
                  drop_last: bool = True) -> PackingStats:
    """:class:`PackingStats` of :func:`pack_lengths` batches; the last one, where the sample
    stopped, is not counted by default (unless it is the only one)."""
    counted = batch_lengths[:-1] if drop_last and len(batch_lengths) > 1 else batch_lengths
    active = [sum(batch) for batch in counted]
    sizes = [len(batch) for batch in counted]
    return PackingStats(
        token_capacity=token_capacity,
        batches=len(counted),
        mean_fill=statistics.fmean(active) / token_capacity,
        mean_padding=token_capacity - statistics.fmean(active),
        median_M=nearest_rank(sizes, 0.5),
        p99_M=nearest_rank(sizes, 0.99),
        max_M=max(sizes),
    )


STUDY_TOKEN_CAPACITIES = (8192, 16384, 32768)
STUDY_BUFFER_SIZES = (1, 8, 32, 64, 128)


def study_policies(buffer_sizes: Iterable[int] = STUDY_BUFFER_SIZES) -> list[PackingPolicy]:
    """In order, then first-fit and best-fit for each buffer size."""
    return [InOrder()] + [rule(size) for size in buffer_sizes for rule in (FirstFit, BestFit)]


def packing_study(lengths: Sequence[int], *, token_capacities: Iterable[int] = STUDY_TOKEN_CAPACITIES,
                  policies: Iterable[PackingPolicy] | None = None, max_piece_tokens: int = 8192, passes: int = 8,
                  seed: int = 0, progress: bool = False) -> list[dict]:
    """One row per (``T``, policy): ``T``, ``policy``, ``B``, ``N_bound`` and the
    :class:`PackingStats` of :func:`piece_stream` pieces of at most ``min(max_piece_tokens, T)``
    (the seed article cut Dolma 3 at 8192), packed without a sequence cap."""
    policies = study_policies() if policies is None else list(policies)
    runs = [(t, p) for t in token_capacities for p in policies]
    rows = []
    streams: dict[int, list[int]] = {}
    for token_capacity, policy in tqdm(runs, desc="packing study", disable=not progress):
        if token_capacity not in streams:
            streams[token_capacity] = piece_stream(lengths, max_piece_tokens=min(max_piece_tokens, token_capacity),
                                                   passes=passes, seed=seed)
        stats = asdict(packing_stats(pack_lengths(streams[token_capacity], policy, token_capacity), token_capacity))
        del stats["token_capacity"]
        rows.append({"T": token_capacity, "policy": policy.name, "B": getattr(policy, "buffer_size", None),
                     "N_bound": policy.sequence_bound(token_capacity), **stats})
    return rows
