"""Measure a corpus, then measure how well each packing policy fills batches from it.

The questions a training setup must answer before it captures a graph: how long are the
documents (:func:`document_lengths`, :func:`length_summary`); for a token capacity ``T`` and a
candidate buffer ``B``, how full are the batches and how many sequences ``M`` do they hold
(:func:`packing_study`, the seed article's table, for any corpus); what is the smallest ``B``
that meets a padding budget, which ``N`` does it guarantee, and is one graph enough
(:func:`recommend`); and can the CPU keep up with the GPU (:func:`packer_throughput` against
:func:`step_token_rate`).

The study works on document lengths only: tokenize once, then every packing experiment is a
fast pass over a list of ints. Its stream is ``passes`` shuffled passes over the documents
(each document cut at ``max_piece_tokens``), as consecutive epochs of a loader would be, so that
quantiles of ``M`` rest on many batches even for a small corpus.

:data:`SEED_PUBLISHED` keeps the seed article's own packing figures (Dolma 3, FineWeb), to be
shown beside ours as citations; they were not measured by this project.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from ..buckets import BucketPlan, plan_buckets
from ._validate import check_int
from .batch import batch_from_pieces
from .corpora import resolve_corpus
from .packing import BestFit, FirstFit, InOrder, PackingPolicy
from .segment import segment, segment_lengths
from .tokenizer import ENCODE_BATCH_SIZE, Tokenizer, resolve_tokenizer

__all__ = [
    "SEED_PUBLISHED",
    "document_lengths",
    "length_summary",
    "nearest_rank",
    "piece_stream",
    "pack_lengths",
    "PackingStats",
    "packing_stats",
    "study_policies",
    "packing_study",
    "study_markdown",
    "Recommendation",
    "recommend",
    "packer_throughput",
    "step_token_rate",
]

SEED_PUBLISHED = {
    "source": 'seed article "So you wanna CUDA Graph", section "Show me the data!"',
    "setup": (
        "the article's own measurements (its GPU figures are from an NVIDIA B200, torch 2.15 "
        "nightly, CUDA 13.2); packing statistics depend on the data, not the GPU"
    ),
    "policy": "look-ahead packing with a candidate buffer (the article does not name the rule)",
    "corpora": {
        "Dolma 3": {
            "sample": "20,000 source rows of the OLMo 3 7B stage-1 mix, OLMo 3 tokenizer",
            "max_piece_tokens": 8192,
            "rows": [
                {"T": 8192, "B": 32, "median_M": 1, "p99_M": 13, "mean_fill": 0.9980,
                 "mean_padding": 16},
                {"T": 16384, "B": 32, "median_M": 4, "p99_M": 32, "mean_fill": 0.9975,
                 "mean_padding": 40},
            ],
        },
        "FineWeb sample-10BT": {
            "sample": "FineWeb sample-10BT, tiktoken o200k_base (not tokenizer-controlled)",
            "max_piece_tokens": None,
            "rows": [
                {"T": 16384, "B": 32, "mean_fill": 1 - 0.088},
                {"T": 16384, "B": 64, "mean_fill": 1 - 0.007},
            ],
        },
    },
}
"""The seed article's published packing figures (citations, not our measurements)."""


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
    documents = iter(corpus)
    with tqdm(desc="tokenizing", unit=" docs", disable=not progress) as bar:
        while chunk := list(itertools.islice(documents, ENCODE_BATCH_SIZE)):
            lengths += [len(ids) for ids in tokenizer.encode_batch(chunk)]
            bar.update(len(chunk))
    return lengths


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank ``quantile`` of ``values``: the smallest value with at least a
    ``quantile`` fraction of ``values`` at or below it (always one of the values).

    Raises:
        ValueError: ``values`` is empty or ``quantile`` is outside ``(0, 1]``.
    """
    if not values:
        raise ValueError("values must be non-empty")
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    ordered = sorted(values)
    return ordered[math.ceil(quantile * len(ordered)) - 1]


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
    """In order, then first-fit and best-fit for each buffer size."""
    return [InOrder()] + [rule(size) for size in buffer_sizes for rule in (FirstFit, BestFit)]


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


# ---------------------------------------------------------------------------------------------
# Choosing B and N
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """The smallest candidate buffer that meets a padding budget, and what it implies.

    Attributes:
        token_capacity: ``T`` (tokens).
        policy: the chosen policy's label, e.g. ``"best-fit B=32"``.
        buffer_size: ``B``.
        sequence_capacity: ``N = min(B, T)``, the bound on ``M`` the policy guarantees: capture
            the graph with this many sequence slots.
        mean_fill: mean ``L / T`` with this policy on the sample.
        mean_padding: mean ``T - L`` (tokens per batch).
        padding_budget: the budget asked for (fraction of ``T``).
        one_graph: True when packing alone meets the budget: one graph of capacity ``T`` with
            ``N`` sequence slots suffices. When no buffer tried meets it, ``buffer_size`` is the
            one with the least padding and ``bucket_plan`` says whether buckets would.
        bucket_plan: None when ``one_graph``; otherwise the
            :func:`~attn_gym_lite.buckets.plan_buckets` plan on ``active_tokens`` with the
            fewest buckets that meets the budget, or with ``max_buckets`` if none does.
        buckets_meet_budget: whether ``bucket_plan`` meets the budget (False when None).
        active_tokens: ``L`` of every batch of the sample with this policy.
    """

    token_capacity: int
    policy: str
    buffer_size: int
    sequence_capacity: int
    mean_fill: float
    mean_padding: float
    padding_budget: float
    one_graph: bool
    bucket_plan: BucketPlan | None
    buckets_meet_budget: bool
    active_tokens: list[int]

    def summary(self) -> str:
        """One sentence for a log or a notebook."""
        if self.one_graph:
            verdict = "one graph suffices"
        elif self.buckets_meet_budget:
            verdict = (
                f"packing alone misses the budget; {len(self.bucket_plan.capacities)} graph "
                f"buckets {self.bucket_plan.capacities} meet it "
                f"({self.bucket_plan.expected_padded_rows:.0f} padding rows per batch)"
            )
        else:
            verdict = (
                f"neither packing nor {len(self.bucket_plan.capacities)} buckets meet the "
                f"budget (buckets leave {self.bucket_plan.expected_padded_rows:.0f} padding rows)"
            )
        return (
            f"T={self.token_capacity}: {self.policy} fills {self.mean_fill:.2%} "
            f"({self.mean_padding:.0f} padding tokens per batch, budget "
            f"{self.padding_budget:.2%} of T); N={self.sequence_capacity} by construction; "
            f"{verdict}"
        )


def recommend(
    lengths: Sequence[int],
    token_capacity: int,
    padding_budget: float = 0.01,
    *,
    rule: type[FirstFit] | type[BestFit] = BestFit,
    buffer_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    max_buckets: int = 4,
    bucket_align: int = 128,
    max_piece_tokens: int = 8192,
    min_document_tokens: int = 2,
    passes: int = 8,
    seed: int = 0,
) -> Recommendation:
    """The smallest candidate buffer ``B`` whose mean padding fits the budget, and its ``N``.

    A larger buffer packs better but lets more sequences into a batch, and ``N`` (the sequence
    slots a graph is captured with) must cover the worst case: ``N = min(B, T)``. Sequence-aware
    kernels launch work that grows with ``N``, so the smallest ``B`` that meets the budget is the
    one to use. Buffers are tried in increasing order on :func:`piece_stream` of the sample. If
    none meets the budget, the batches' ``L`` distribution goes to
    :func:`~attn_gym_lite.buckets.plan_buckets` (the graph-buckets chapter) with 2, 3, ...,
    ``max_buckets`` capacities, to see whether a few graphs of smaller capacity would.

    Args:
        lengths: document lengths of a corpus sample (tokens).
        token_capacity: ``T`` (tokens).
        padding_budget: the mean padding allowed, as a fraction of ``T`` (``0 <= budget < 1``).
        rule: :class:`~attn_gym_lite.data.BestFit` (fills best) or
            :class:`~attn_gym_lite.data.FirstFit` (bounded reordering).
        buffer_sizes: the candidates for ``B``.
        max_buckets: most graph buckets to consider (>= 2).
        bucket_align: bucket capacities are multiples of this (tokens, >= 1).
        max_piece_tokens, min_document_tokens, passes, seed: as in :func:`piece_stream`
            (pieces of at most ``min(max_piece_tokens, T)``).

    Returns:
        A :class:`Recommendation`.

    Raises:
        TypeError: ``rule`` is not FirstFit or BestFit, or a size is not an int.
        ValueError: ``padding_budget`` outside ``[0, 1)``, no buffer sizes, or no document of
            at least ``min_document_tokens`` tokens.
    """
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    if (
        isinstance(padding_budget, bool)
        or not isinstance(padding_budget, (int, float))
        or not 0 <= padding_budget < 1
    ):
        raise ValueError(
            f"padding_budget must be a fraction of T in [0, 1), got {padding_budget!r}"
        )
    if rule not in (FirstFit, BestFit):
        raise TypeError(f"rule must be FirstFit or BestFit, got {rule!r}")
    sizes = sorted({check_int("buffer_sizes", size, minimum=1) for size in buffer_sizes})
    if not sizes:
        raise ValueError("buffer_sizes must name at least one buffer size")
    max_buckets = check_int("max_buckets", max_buckets, minimum=2)
    bucket_align = check_int("bucket_align", bucket_align, minimum=1)
    pieces = piece_stream(
        lengths,
        max_piece_tokens=min(max_piece_tokens, token_capacity),
        min_document_tokens=min_document_tokens,
        passes=passes,
        seed=seed,
    )
    if not pieces:
        raise ValueError(f"lengths has no document of at least {min_document_tokens} tokens")
    allowed = padding_budget * token_capacity
    best = None
    for size in sizes:
        policy = rule(size)
        batches = pack_lengths(pieces, policy, token_capacity)
        stats = packing_stats(batches, token_capacity)
        if best is None or stats.mean_padding < best[0].mean_padding:
            best = (stats, policy, batches)
        if stats.mean_padding <= allowed:
            best = (stats, policy, batches)
            break
    stats, policy, batches = best
    active_tokens = [sum(batch) for batch in batches]
    one_graph = stats.mean_padding <= allowed
    plan = None
    if not one_graph:
        for count in range(2, max_buckets + 1):
            plan = plan_buckets(active_tokens, count, align=bucket_align)
            if plan.expected_padded_rows <= allowed:
                break
    return Recommendation(
        token_capacity=token_capacity,
        policy=policy.label,
        buffer_size=policy.buffer_size,
        sequence_capacity=policy.sequence_bound(token_capacity),
        mean_fill=stats.mean_fill,
        mean_padding=stats.mean_padding,
        padding_budget=float(padding_budget),
        one_graph=one_graph,
        bucket_plan=plan,
        buckets_meet_budget=plan is not None and plan.expected_padded_rows <= allowed,
        active_tokens=active_tokens,
    )


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
    :func:`step_token_rate` to see whether the loader can feed the GPU.

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
    if not min_seconds > 0:
        raise ValueError(f"min_seconds must be > 0, got {min_seconds!r}")
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
                batch_from_pieces([pieces[p] for p in batch], token_capacity, slots)

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


def step_token_rate(training_loop_record: dict, mode: str = "graph") -> dict:
    """Tokens per second a recorded training step consumes: ``T / step time``.

    Every step takes one batch of ``T`` rows, so a loader must deliver ``T`` tokens per step
    (an upper bound on the real tokens, ``L <= T``).

    Args:
        training_loop_record: the ``training-loop`` suite's result
            (``attn_gym_lite.results.load_result("training-loop")``).
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
