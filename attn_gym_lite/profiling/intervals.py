"""Busy time of overlapping events: the union of intervals ``[start, end)``.

Device events overlap (kernels on two streams, back-to-back graph nodes whose timestamps overlap
by a few hundred nanoseconds), so the time the GPU was busy is the length of the *union* of their
intervals, not the sum of their durations; the idle gaps are what the union leaves uncovered.
"""

from __future__ import annotations

from collections.abc import Iterable


def busy_and_gaps(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[float]]:
    """``(busy, gaps)``: the length of the union of ``(start, end)`` pairs (any order, overlapping
    or nested), and the lengths of the uncovered stretches between the first start and the last
    end, in time order, so that ``busy + sum(gaps) == max(end) - min(start)``. An empty interval
    covers nothing but ends a gap where it lies (the device did something there)."""
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
