"""Measure a corpus, then measure how well each packing policy fills batches from it.

The questions a training setup must answer before it captures a graph: how long are the
documents (:func:`document_lengths`, :func:`length_summary`); for a token capacity ``T`` and a
candidate buffer ``B``, how full are the batches and how many sequences ``M`` do they hold
(:func:`packing_study`, the seed article's table, for any corpus); what is the smallest ``B``
that meets a padding budget, which ``N`` does it guarantee, and is one graph enough
(:mod:`.recommend`); and can the CPU keep up with the GPU (``bench.packing.packer_throughput``).

The study works on document lengths only: tokenize once, then every packing experiment is a
fast pass over a list of ints. Its stream is ``passes`` shuffled passes over the documents
(each document cut at ``max_piece_tokens``), as consecutive epochs of a loader would be, so that
quantiles of ``M`` rest on many batches even for a small corpus.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from tqdm.auto import tqdm

from ..checks import check_int, check_int_sequence
from .corpora import resolve_corpus
from .packing import BestFit, FirstFit, InOrder, PackingPolicy
from .quantiles import sample_quantile
from .segment import segment_lengths
from .tokenizer import Tokenizer, encode_in_chunks, resolve_tokenizer

__all__ = [
    "document_lengths",
    "length_summary",
    "nearest_rank",
    "piece_stream",
    "pack_lengths",
    "PackingStats",
    "packing_stats",
    "study_policies",
    "packing_study",
]


# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


def document_lengths(
    corpus: Iterable[str] | None = None,
    tokenizer: Tokenizer | str | None = None,
    *,
    progress: bool = False,
) -> list[int]:
    """Tokenize every document once and return its length in tokens.

    Args:
        corpus: document strings; default :func:`~attn_gym_lite.data.python_stdlib_corpus`.
        tokenizer: a :class:`~attn_gym_lite.data.Tokenizer` or a
            :func:`~attn_gym_lite.data.load_tokenizer` spec; default the stdlib BPE.
        progress: show a tqdm progress bar (documents and documents/s).

    Returns:
        One int per document, in corpus order (0 for a document with no tokens).

    Raises:
        TypeError: ``corpus`` is a single string or not iterable, or ``tokenizer`` is invalid.
    """
    corpus = resolve_corpus(corpus)
    tokenizer = resolve_tokenizer(tokenizer)
    lengths: list[int] = []
    with tqdm(desc="tokenizing", unit=" docs", disable=not progress) as bar:
        for chunk in encode_in_chunks(enumerate(corpus), tokenizer):
            lengths += [len(ids) for _, ids in chunk]
            bar.update(len(chunk))
    return lengths


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank ``quantile`` of ``values``: the smallest value with at least a
    ``quantile`` fraction of ``values`` at or below it (always one of the values).

    :func:`~attn_gym_lite.data.quantiles.sample_quantile` with ``method="nearest-rank"``
    (Hyndman & Fan 1996, definition 1; numpy's ``method="inverted_cdf"``).

    Args:
        values: the samples, any order (not modified).
        quantile: a fraction in ``(0, 1]``.

    Raises:
        TypeError: ``quantile`` is not a real number.
        ValueError: ``values`` is empty or holds a NaN or infinite value, or ``quantile`` is
            outside ``(0, 1]``.
    """
    return sample_quantile(values, quantile, method="nearest-rank")


def length_summary(lengths: Sequence[int]) -> dict:
    """Count, total, mean, nearest-rank quantiles (p10, p50, p90, p99) and max of the lengths.

    Raises:
        ValueError: ``lengths`` is empty.
    """
    if not lengths:
        raise ValueError("lengths must be non-empty")
    return {
        "documents": len(lengths),
        "tokens": sum(lengths),
        "mean": statistics.fmean(lengths),
        **{f"p{round(q * 100)}": nearest_rank(lengths, q) for q in (0.1, 0.5, 0.9, 0.99)},
        "max": max(lengths),
    }


# ---------------------------------------------------------------------------------------------
# Packing a length stream
# ---------------------------------------------------------------------------------------------


def piece_stream(
    lengths: Sequence[int],
    *,
    max_piece_tokens: int,
    min_document_tokens: int = 2,
    passes: int = 1,
    seed: int = 0,
) -> list[int]:
    """The piece lengths a loader sees: ``passes`` shuffled passes, documents cut into pieces.

    Documents shorter than ``min_document_tokens`` are dropped (as the loaders drop them); each
    pass shuffles the rest with ``random.Random(seed)`` (continuing across passes) and cuts each
    document by :func:`~attn_gym_lite.data.segment_lengths`.

    Raises:
        TypeError, ValueError: an argument or a length is not an int in range (lengths >= 0).
    """
    max_piece_tokens = check_int("max_piece_tokens", max_piece_tokens, minimum=1)
    min_document_tokens = check_int("min_document_tokens", min_document_tokens, minimum=1)
    passes = check_int("passes", passes, minimum=1)
    rng = random.Random(check_int("seed", seed, minimum=0))
    kept = [
        length
        for index, length in enumerate(lengths)
        if check_int(f"lengths[{index}]", length, minimum=0) >= min_document_tokens
    ]
    pieces: list[int] = []
    for _ in range(passes):
        rng.shuffle(kept)
        for length in kept:
            pieces += segment_lengths(length, max_piece_tokens)
    return pieces


def pack_lengths(
    pieces: Sequence[int],
    policy: PackingPolicy,
    token_capacity: int,
    sequence_capacity: int | None = None,
) -> list[list[int]]:
    """Pack piece lengths with ``policy``; return each batch's piece lengths in layout order.

    Raises:
        As :meth:`~attn_gym_lite.data.PackingPolicy.batches`.
    """
    return [
        [pieces[position] for position in batch]
        for batch in policy.batches(pieces, token_capacity, sequence_capacity)
    ]


@dataclass(frozen=True)
class PackingStats:
    """How full a run of batches is.

    Attributes:
        token_capacity: ``T`` (tokens).
        batches: batches counted.
        mean_fill: mean of ``L / T`` over the batches (fraction).
        mean_padding: mean of ``T - L`` (tokens per batch).
        median_M, p99_M, max_M: nearest-rank quantiles and maximum of ``M``.
    """

    token_capacity: int
    batches: int
    mean_fill: float
    mean_padding: float
    median_M: int
    p99_M: int
    max_M: int


def packing_stats(
    batch_lengths: Sequence[Sequence[int]], token_capacity: int, *, drop_last: bool = True
) -> PackingStats:
    """Fill and ``M`` statistics of packed batches.

    A finite stream ends with whatever is left, so by default the last batch is not counted
    (unless it is the only one): it measures where the sample stopped, not the policy.

    Args:
        batch_lengths: each batch's piece lengths (tokens), as :func:`pack_lengths` returns.
        token_capacity: ``T`` (tokens), at least every batch's total.
        drop_last: leave the last batch out when there are two or more.

    Raises:
        ValueError: no batches, an empty batch, or a batch holding more than ``T`` tokens.
        TypeError: ``token_capacity`` is not an int.
    """
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    if not batch_lengths:
        raise ValueError("batch_lengths must hold at least one batch")
    counted = batch_lengths[:-1] if drop_last and len(batch_lengths) > 1 else batch_lengths
    active = [sum(batch) for batch in counted]
    sizes = [len(batch) for batch in counted]
    if min(sizes) == 0 or max(active) > token_capacity:
        raise ValueError(
            f"every batch must hold 1..token_capacity={token_capacity} tokens in >= 1 pieces, "
            f"got batch sizes {min(sizes)}..{max(sizes)} pieces, up to {max(active)} tokens"
        )
    return PackingStats(
        token_capacity=token_capacity,
        batches=len(counted),
        mean_fill=statistics.fmean(active) / token_capacity,
        mean_padding=token_capacity - statistics.fmean(active),
        median_M=nearest_rank(sizes, 0.5),
        p99_M=nearest_rank(sizes, 0.99),
        max_M=max(sizes),
    )


# ---------------------------------------------------------------------------------------------
# The study
# ---------------------------------------------------------------------------------------------

STUDY_TOKEN_CAPACITIES = (8192, 16384, 32768)
STUDY_BUFFER_SIZES = (1, 8, 32, 64, 128)


def study_policies(buffer_sizes: Iterable[int] = STUDY_BUFFER_SIZES) -> list[PackingPolicy]:
    """In order, then first-fit and best-fit for each buffer size: ``1 + 2 * len(buffer_sizes)``
    policies, the study's (:func:`packing_study`) default set.

    Args:
        buffer_sizes: the look-ahead buffer sizes (documents), a non-empty sequence of ints >= 1.

    Raises:
        TypeError: ``buffer_sizes`` is not a sequence of ints (the message names the entry).
        ValueError: it is empty, or an entry is < 1.
    """
    sizes = check_int_sequence("buffer_sizes", buffer_sizes, minimum=1)
    return [InOrder()] + [rule(size) for size in sizes for rule in (FirstFit, BestFit)]


def packing_study(
    lengths: Sequence[int],
    *,
    token_capacities: Iterable[int] = STUDY_TOKEN_CAPACITIES,
    policies: Iterable[PackingPolicy] | None = None,
    max_piece_tokens: int = 8192,
    min_document_tokens: int = 2,
    passes: int = 8,
    seed: int = 0,
    progress: bool = False,
) -> list[dict]:
    """Pack a corpus's documents with every policy at every ``T``; one row of statistics each.

    For each ``T`` the piece stream is :func:`piece_stream` with pieces of at most
    ``min(max_piece_tokens, T)`` tokens (the seed article cut Dolma 3 into 8192-token segments),
    the same for every policy. No sequence cap is applied, so ``M`` shows what each policy does
    on its own.

    Args:
        lengths: document lengths in tokens (:func:`document_lengths`).
        token_capacities: the ``T`` values.
        policies: default :func:`study_policies` (in order; first-fit and best-fit with
            ``B`` in 1, 8, 32, 64, 128).
        max_piece_tokens, min_document_tokens, passes, seed: as in :func:`piece_stream`.
        progress: show a tqdm bar over the runs.

    Returns:
        One dict per (``T``, policy): ``T``, ``policy`` (name), ``B`` (None in order),
        ``N_bound`` (the ``M`` bound the policy guarantees), then :class:`PackingStats` fields
        (``batches``, ``mean_fill``, ``mean_padding``, ``median_M``, ``p99_M``, ``max_M``).

    Raises:
        ValueError, TypeError: an argument is out of range.
    """
    policies = study_policies() if policies is None else list(policies)
    runs = [(check_int("T", t, minimum=1), p) for t in token_capacities for p in policies]
    rows = []
    streams: dict[int, list[int]] = {}
    for token_capacity, policy in tqdm(runs, desc="packing study", disable=not progress):
        if token_capacity not in streams:
            streams[token_capacity] = piece_stream(
                lengths,
                max_piece_tokens=min(max_piece_tokens, token_capacity),
                min_document_tokens=min_document_tokens,
                passes=passes,
                seed=seed,
            )
        batches = pack_lengths(streams[token_capacity], policy, token_capacity)
        stats = asdict(packing_stats(batches, token_capacity))
        del stats["token_capacity"]
        rows.append(
            {
                "T": token_capacity,
                "policy": policy.name,
                "B": getattr(policy, "buffer_size", None),
                "N_bound": policy.sequence_bound(token_capacity),
                **stats,
            }
        )
    return rows


