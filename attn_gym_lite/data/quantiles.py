"""The package's one sample-quantile definition: ``"nearest-rank"`` (always one of the samples,
for data statistics; Hyndman & Fan 1996 def. 1, numpy's ``"inverted_cdf"``) and ``"linear"``
(``p50`` is the median, for timings; def. 7, numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["METHODS", "sample_quantile"]

#: The methods :func:`sample_quantile` knows, each with the range of ``quantile`` it accepts.
METHODS = {"nearest-rank": "(0, 1]", "linear": "[0, 1]"}


def sample_quantile(values: Sequence[float], quantile: float, *, method: str) -> float:
    """The ``quantile`` of ``values`` (not modified) by ``method``, one of :data:`METHODS`."""
    ordered = sorted(values)
    if method == "nearest-rank":
        return ordered[max(math.ceil(quantile * len(ordered)) - 1, 0)]
    if method != "linear":
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    position = quantile * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
