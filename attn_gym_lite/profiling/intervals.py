"""Busy time of overlapping events: the union of half-open intervals ``[start, end)``.

Device events overlap (kernels on two streams, back-to-back graph nodes whose timestamps overlap
by a few hundred nanoseconds), so the time the GPU was busy is the length of the *union* of the
events' intervals, not the sum of their durations, and the idle gaps are the stretches that union
leaves uncovered. :func:`busy_and_gaps` is the one sweep that every reduction here uses
(:func:`~attn_gym_lite.profiling.trace_summary`, :func:`~attn_gym_lite.profiling.summary.replay_idle`,
:func:`~attn_gym_lite.profiling.compact.compact_timeline`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..checks import check_real

_PLAIN = (int, float)  # checked inline; bool is its own type, so it takes the slow path


def busy_and_gaps(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[float]]:
    """Length of the union of ``intervals`` and the gaps inside it, in one sweep by start.

    Args:
        intervals: ``(start, end)`` pairs of finite real numbers (µs, say) with ``start <= end``,
            in any order, overlapping or nested.

    Returns:
        ``(busy, gaps)``: ``busy`` (float) the length of the union, a stretch covered by several
        intervals counted once; ``gaps`` the lengths (each > 0) of the uncovered stretches between
        the first start and the last end, in time order, so that
        ``busy + sum(gaps) == max(end) - min(start)`` up to rounding. An empty interval
        (``start == end``: an event of no duration) covers nothing but ends a gap where it
        lies (the device did something there). ``(0.0, [])`` for no intervals. Intervals are
        visited by start (ties in the given order), so equal inputs give bit-identical sums.

    Raises:
        TypeError: ``intervals`` is not iterable, an entry is not a ``(start, end)`` pair, or a
            bound is not a real number.
        ValueError: a bound is NaN or infinite, or ``end < start``.
    """
    if isinstance(intervals, (str, bytes)) or not isinstance(intervals, Iterable):
        raise TypeError(f"intervals must be an iterable of (start, end) pairs, got {type(intervals).__name__}")
    pairs = []
    for index, pair in enumerate(intervals):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"intervals[{index}] must be a (start, end) pair, got {pair!r}")
        start, end = pair
        if not (type(start) in _PLAIN and type(end) in _PLAIN and -math.inf < start <= end < math.inf):
            # Off the fast path (another number type, or a bad one): the checks say which.
            check_real(f"intervals[{index}] start", start)
            check_real(f"intervals[{index}] end", end, minimum=float(start))
        pairs.append((start, end))  # the caller's numbers, unconverted: sums stay bit-identical
    busy, gaps = 0.0, []
    covered_until = None
    for start, end in sorted(pairs, key=lambda pair: pair[0]):
        if covered_until is None:
            covered_until = start
        elif start > covered_until:
            gaps.append(start - covered_until)
        busy += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    return busy, gaps
