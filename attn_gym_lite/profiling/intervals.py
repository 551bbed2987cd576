"""Busy time of overlapping events (kernels on two streams, back-to-back graph nodes whose
timestamps overlap by nanoseconds): the length of the *union* of their intervals, not the sum."""

from __future__ import annotations

from collections.abc import Iterable


def busy_and_gaps(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[float]]:
    """``(busy, gaps)``: the length of the union of ``(start, end)`` pairs and the uncovered stretches
    between the first start and the last end, in order (``busy + sum(gaps)`` is the span). An empty
    interval covers nothing but ends a gap: the device did something there."""
    busy, gaps = 0.0, []
    covered_until = None
    for start, end in sorted(intervals, key=lambda pair: pair[0]):  # stable: equal inputs, equal sums
        if covered_until is None:
            covered_until = start
        elif start > covered_until:
            gaps.append(start - covered_until)
        busy += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    return busy, gaps
