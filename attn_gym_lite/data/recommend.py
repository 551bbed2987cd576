"""Choosing the candidate buffer ``B`` and the sequence capacity ``N`` from a corpus sample, and
whether one graph is enough (:func:`recommend`).

Source: seed article, "Show me the data!" (the padding budget and ``N = min(B, T)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..checks import check_int, check_int_sequence, check_real
from .capacity import BucketPlan, plan_buckets
from .packing import BestFit, FirstFit
from .study import pack_lengths, packing_stats, piece_stream

__all__ = ["Recommendation", "recommend"]


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
            :func:`~attn_gym_lite.data.capacity.plan_buckets` plan on ``active_tokens`` with the
            fewest buckets that meets the budget, or with ``max_buckets`` if none does.
        buckets_meet_budget: whether ``bucket_plan`` meets the budget (False when None).
        active_tokens: ``L`` of every batch of the sample with this policy.

    Raises:
        Nothing on its values: a record that :func:`recommend` fills in, so its fields are
        not checked (a missing field is Python's ``TypeError`` from the dataclass ``__init__``).
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
    :func:`~attn_gym_lite.data.capacity.plan_buckets` (the graph-buckets chapter) with 2, 3, ...,
    ``max_buckets`` capacities, to see whether a few graphs of smaller capacity would.

    Bucket capacities are multiples of ``bucket_align`` capped at ``T`` (the top one may be ``T``
    itself), never larger than ``T``. The plan has fewer capacities than asked when the ``L``
    round up to fewer distinct candidates: with ``bucket_align >= T`` every ``L`` rounds to
    ``T``, so the plan is the one graph of capacity ``T`` (buckets cannot help; choose a
    ``bucket_align`` well below ``T``, e.g. ``T // 8``).

    Args:
        lengths: document lengths of a corpus sample (tokens).
        token_capacity: ``T`` (tokens).
        padding_budget: the mean padding allowed, as a fraction of ``T`` (``0 <= budget < 1``).
        rule: :class:`~attn_gym_lite.data.BestFit` (fills best) or
            :class:`~attn_gym_lite.data.FirstFit` (bounded reordering).
        buffer_sizes: the candidates for ``B``.
        max_buckets: most graph buckets to consider (>= 2).
        bucket_align: bucket capacities are multiples of this (tokens, >= 1), or ``T``.
        max_piece_tokens, min_document_tokens, passes, seed: as in :func:`piece_stream`
            (pieces of at most ``min(max_piece_tokens, T)``).

    Returns:
        A :class:`Recommendation`.

    Raises:
        TypeError: ``rule`` is not FirstFit or BestFit, a size is not an int, ``padding_budget``
            not a real number, or ``buffer_sizes`` not a sequence of ints (``32``, ``"32"``).
        ValueError: ``padding_budget`` outside ``[0, 1)`` (or NaN), no buffer sizes, or no
            document of at least ``min_document_tokens`` tokens.
    """
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    padding_budget = check_real("padding_budget", padding_budget, minimum=0.0)
    if padding_budget >= 1:
        raise ValueError(f"padding_budget must be a fraction of T in [0, 1), got {padding_budget!r}")
    if not (rule is FirstFit or rule is BestFit):  # identity: `in` compares, and an array answers with an array
        raise TypeError(f"rule must be FirstFit or BestFit, got {rule!r:.60}")
    # Checked here, before min() below compares it with T (None gave "'<' not supported").
    max_piece_tokens = check_int("max_piece_tokens", max_piece_tokens, minimum=1)
    sizes = sorted(set(check_int_sequence("buffer_sizes", buffer_sizes, minimum=1)))
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
            plan = plan_buckets(active_tokens, count, align=bucket_align, token_capacity=token_capacity)
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
