"""Choosing graph-bucket capacities from data, and picking one for a batch (no CUDA here: the
capture side is :class:`~attn_gym_lite.graph.buckets.GraphBuckets`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import INT32_MAX, check_int_sequence

__all__ = ["BucketPlan", "plan_buckets", "select_bucket"]


def _ascending(capacities: object) -> list[int]:
    # Positive and strictly ascending: on another order the binary search picks a wrong bucket.
    capacities = check_int_sequence("capacities", capacities, minimum=1)
    if any(a >= b for a, b in zip(capacities, capacities[1:])):
        raise ValueError(f"capacities must be strictly ascending, got {list(capacities)}")
    return capacities


@dataclass(frozen=True)
class BucketPlan:
    """Ascending capacities (tokens), mean ``bucket(L) - L`` per batch, and ``sum L / sum bucket(L)``."""

    capacities: tuple[int, ...]
    expected_padded_rows: float
    expected_fill: float

    def __post_init__(self) -> None:
        _ascending(self.capacities)


def plan_buckets(active_token_samples: Sequence[int], k: int, *, align: int = 128,
                 token_capacity: int | None = None) -> BucketPlan:
    """Choose ``k`` token capacities that minimise the expected padded rows for a measured
    distribution of active tokens ``L``.

    Every capacity is a multiple of ``align`` (kernels like tiles of 64 or 128 rows), or
    ``token_capacity`` ``T`` itself where given (none exceeds it); fewer than ``k`` come back
    when the samples round to fewer. An optimal set only uses samples rounded up to ``align``, so
    an exact dynamic program over those ``m`` candidates finds it in ``O(k m^2)``: ``best[b][j]``
    is the least padding covering every sample up to candidate ``j`` with ``b`` buckets.

    Source: the seed article, "Could we use more than one graph?"; vLLM's captured batch sizes.
    """
    values = check_int_sequence("active_token_samples", active_token_samples, minimum=0, maximum=INT32_MAX)
    samples = np.asarray(values, dtype=np.int64)
    if token_capacity is not None and samples.max() > token_capacity:  # its padding would come out negative
        i = int(np.argmax(samples > token_capacity))
        raise ValueError(f"active_token_samples[{i}] must be at most token_capacity T = {token_capacity} "
                         f"(a batch holds at most T tokens), got {values[i]}")

    # A batch with L = 0 still needs a graph to replay: round it up to one tile.
    rounded = np.maximum(-(-samples // align) * align, align)
    # Never past T, nor past int32 (a sample near 2**31 rounds up beyond what cu_seqlens holds).
    rounded = np.minimum(rounded, token_capacity if token_capacity is not None else INT32_MAX)
    candidates, counts = np.unique(rounded, return_counts=True)
    sums = np.array([samples[rounded == c].sum() for c in candidates])
    # Padding if candidates i..j (inclusive) are all served by candidate j:
    #   cost(i, j) = c_j * count(i..j) - sum(i..j), from prefix sums.
    count_prefix = np.concatenate(([0], np.cumsum(counts)))
    sum_prefix = np.concatenate(([0], np.cumsum(sums)))

    def cost(i: int, j: int) -> int:
        return int(candidates[j] * (count_prefix[j + 1] - count_prefix[i]) - (sum_prefix[j + 1] - sum_prefix[i]))

    m = len(candidates)
    buckets = min(k, m)
    best = [[cost(0, j) for j in range(m)]]
    choice = [[-1] * m]
    for _ in range(1, buckets):
        previous = best[-1]
        row, back = [], []
        for j in range(m):
            # The bucket below the top one sits at candidate i - 1 < j.
            options = [(previous[i - 1] + cost(i, j), i - 1) for i in range(1, j + 1)]
            value, arg = min(options) if options else (previous[j], -1)
            row.append(value)
            back.append(arg)
        best.append(row)
        choice.append(back)

    capacities, j = [], m - 1
    for b in range(buckets - 1, -1, -1):
        capacities.append(int(candidates[j]))
        j = choice[b][j]
        if j < 0:
            break
    capacities.reverse()
    padded = best[buckets - 1][m - 1]
    total = int(samples.sum())
    return BucketPlan(tuple(capacities), padded / samples.size, total / (total + padded) if total + padded else 1.0)


def select_bucket(capacities: Sequence[int], active_tokens: int) -> int:
    """The smallest capacity ``>= active_tokens``, the host-side ``L`` (reading ``cu_seqlens`` would sync)."""
    capacities = _ascending(capacities)
    index = bisect.bisect_left(capacities, active_tokens)
    if index == len(capacities):
        raise ValueError(f"select_bucket: active_tokens = {active_tokens} exceeds the largest captured "
                         f"capacity {capacities[-1]}; capacities are {list(capacities)}")
    return capacities[index]
