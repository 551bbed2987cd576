"""Choosing the candidate buffer ``B`` and the sequence capacity ``N`` from a corpus sample."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .capacity import BucketPlan, plan_buckets
from .packing import BestFit, FirstFit
from .study import pack_lengths, packing_stats, piece_stream

__all__ = ["Recommendation", "recommend"]


@dataclass(frozen=True)
class Recommendation:
    """:func:`recommend`'s answer; without ``one_graph``, ``buffer_size`` has the least padding and
    ``bucket_plan`` is the plan on ``active_tokens`` with the fewest buckets that meets the budget."""

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
    passes: int = 8,
    seed: int = 0,
) -> Recommendation:
    """The smallest buffer ``B`` whose mean padding on the sample's :func:`piece_stream` is at most
    ``padding_budget * T``, and its ``N = min(B, T)`` (a larger ``B`` packs better, but ``N`` must
    cover the worst case and kernels' work grows with it). If no ``B`` meets the budget, the
    batches' ``L`` go to :func:`~attn_gym_lite.data.capacity.plan_buckets` with 2 to
    ``max_buckets`` capacities. Source: seed article, "Show me the data!"."""
    pieces = piece_stream(lengths, max_piece_tokens=min(max_piece_tokens, token_capacity), passes=passes, seed=seed)
    allowed = padding_budget * token_capacity
    best = None
    for size in sorted(set(buffer_sizes)):
        policy = rule(size)
        batches = pack_lengths(pieces, policy, token_capacity)
        stats = packing_stats(batches, token_capacity)
        if best is None or stats.mean_padding < best[0].mean_padding or stats.mean_padding <= allowed:
            best = (stats, policy, batches)
        if stats.mean_padding <= allowed:
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
