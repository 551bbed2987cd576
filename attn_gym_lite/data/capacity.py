"""Choosing graph-bucket capacities from data, and picking one for a batch: pure Python, no CUDA.

:func:`plan_buckets` chooses ``k`` token capacities for a measured distribution of active tokens
``L`` (an exact dynamic program); :func:`select_bucket` picks the smallest captured capacity that
holds a batch. The capture side, :class:`~attn_gym_lite.graph.buckets.GraphBuckets`, lives with
the graph machinery; the data layer (the study's recommendation) needs only this part.

Source: the seed article, section "Could we use more than one graph?"; vLLM's captured batch sizes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import INT32_MAX, check_int, check_int_sequence, check_real

__all__ = ["BucketPlan", "plan_buckets", "select_bucket"]


def _check_capacities(capacities: object) -> list[int]:
    """``capacities`` as a list of positive, strictly ascending ints: the order
    :func:`select_bucket`'s binary search relies on and :func:`plan_buckets` produces."""
    capacities = check_int_sequence("capacities", capacities, minimum=1)
    if any(a >= b for a, b in zip(capacities, capacities[1:])):
        raise ValueError(f"capacities must be strictly ascending, got {list(capacities)}")
    return capacities


@dataclass(frozen=True)
class BucketPlan:
    """Capacities chosen by :func:`plan_buckets`.

    Checked when built, so a plan made by hand (or read back from a record) is one
    :func:`select_bucket` and ``GraphBuckets`` can use.

    Attributes:
        capacities: token capacities (tokens), a non-empty tuple of ints >= 1, strictly ascending;
            the last one holds every sample.
        expected_padded_rows: mean over the samples of ``bucket(L) - L`` (tokens per batch), a
            finite number in ``[0, capacities[-1]]`` (a batch pads at most its whole bucket);
            stored as a ``float``.
        expected_fill: mean real fraction of the replayed rows, ``sum L / sum bucket(L)``, a finite
            number in ``[0, 1]``; stored as a ``float``.

    Raises:
        TypeError: ``capacities`` is not a tuple or holds a non-int (``True`` and ``8.0`` included);
            ``expected_padded_rows`` or ``expected_fill`` is not a real number.
        ValueError: ``capacities`` is empty, holds a capacity < 1 or is not strictly ascending;
            ``expected_padded_rows`` or ``expected_fill`` is NaN, infinite or outside its range.
    """

    capacities: tuple[int, ...]
    expected_padded_rows: float
    expected_fill: float

    def __post_init__(self) -> None:
        if not isinstance(self.capacities, tuple):
            raise TypeError(f"capacities must be a tuple of ints (a plan is immutable and hashable), "
                            f"got {type(self.capacities).__name__}: {self.capacities!r:.60}")
        capacities = tuple(_check_capacities(self.capacities))
        padded = check_real("expected_padded_rows", self.expected_padded_rows, minimum=0)
        if padded > capacities[-1]:
            raise ValueError(f"expected_padded_rows must be at most the largest capacity, {capacities[-1]} tokens "
                             f"(a batch pads at most its whole bucket), got {padded!r}")
        fill = check_real("expected_fill", self.expected_fill, minimum=0, maximum=1)
        object.__setattr__(self, "capacities", capacities)
        object.__setattr__(self, "expected_padded_rows", padded)
        object.__setattr__(self, "expected_fill", fill)


def plan_buckets(active_token_samples: Sequence[int], k: int, *, align: int = 128,
                 token_capacity: int | None = None) -> BucketPlan:
    """Choose ``k`` token capacities that minimise the expected padded rows for a measured
    distribution of active tokens ``L``.

    Every capacity is a multiple of ``align`` (kernels like tiles of 64 or 128 rows), or
    ``token_capacity`` itself where one is given: no capacity exceeds it (a graph larger than
    the batches' own capacity ``T`` would hold rows no batch has). An optimal set only ever uses
    capacities equal to some sample rounded up to ``align`` (capped at ``token_capacity``), so an
    exact dynamic program over those sorted candidates finds it in ``O(k m^2)`` for ``m``
    distinct candidates: ``best[b][j]`` is the least padding that covers every sample up to
    candidate ``j`` with ``b`` buckets, the top one at candidate ``j``.

    Args:
        active_token_samples: observed ``L`` per batch (ints >= 0, at least one; at most
            ``token_capacity`` where given).
        k: number of buckets (>= 1); fewer are returned when there are fewer distinct candidates
            (with ``align >= token_capacity`` every sample rounds to ``token_capacity``: one).
        align: capacity granularity in tokens (>= 1).
        token_capacity: the batches' capacity ``T`` (>= 1), the largest capacity allowed; ``None``
            for no bound (capacities may then round past every sample's ``T``).

    Returns:
        A :class:`BucketPlan`.

    Raises:
        TypeError: a sample, ``k``, ``align`` or ``token_capacity`` is not an int (floats are not
            truncated, strings not parsed, ``True`` is not 1).
        ValueError: no samples, a negative one or one above ``2**31 - 1`` (``cu_seqlens`` is
            int32), ``k < 1``, ``align`` or ``token_capacity`` outside ``[1, 2**31 - 1]``, or a sample above
            ``token_capacity`` (the message names the sample and ``T``).
    """
    # At most int32's largest (cu_seqlens is int32, so no batch holds more): past int64 numpy
    # raised a bare OverflowError, near it the rounding below overflowed into negative padding.
    values = check_int_sequence("active_token_samples", active_token_samples, minimum=0, maximum=INT32_MAX,
                                allow_set=False)  # samples: repeats weigh the plan
    samples = np.asarray(values, dtype=np.int64)
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=INT32_MAX)
    if token_capacity is not None:
        token_capacity = check_int("token_capacity", token_capacity, minimum=1, maximum=INT32_MAX)
        above = np.flatnonzero(samples > token_capacity)
        if above.size:
            i = int(above[0])
            raise ValueError(
                f"active_token_samples[{i}] must be at most token_capacity T = {token_capacity} "
                f"(a batch holds at most T tokens), got {values[i]}"
            )

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
    """The smallest of the ascending ``capacities`` that is ``>= active_tokens``.

    ``active_tokens`` is the host-side ``L`` the loader already knows: reading
    ``cu_seqlens[-1]`` to dispatch would sync with the device.

    Raises:
        TypeError: ``active_tokens`` or a capacity is not an int.
        ValueError: ``active_tokens < 0``; ``capacities`` empty, not positive or not strictly
            ascending (a plan's or ``GraphBuckets.capacities`` are); ``active_tokens`` past the
            largest capacity.
    """
    active_tokens = check_int("active_tokens", active_tokens, minimum=0)
    capacities = _check_capacities(capacities)
    index = bisect.bisect_left(capacities, active_tokens)
    if index == len(capacities):
        raise ValueError(
            f"select_bucket: active_tokens = {active_tokens} exceeds the largest captured capacity "
            f"{capacities[-1]}; capacities are {list(capacities)}"
        )
    return capacities[index]
