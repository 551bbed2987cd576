"""Quantiles of samples: the package's one definition, with its two methods side by side.

Two callers record quantiles, and each keeps the method its records were described with:

* ``"nearest-rank"``: the smallest sample with at least a ``quantile`` fraction of the samples at
  or below it, ``sorted(values)[ceil(quantile * n) - 1]``; always one of the samples (a length a
  document really has, a batch's real ``M``). Hyndman & Fan (1996), definition 1; numpy's
  ``percentile(..., method="inverted_cdf")``. Used for the length and ``M`` statistics of the
  data chapter (:func:`~attn_gym_lite.data.study.nearest_rank`: ``length_summary``,
  ``packing_stats``, the length histogram).
* ``"linear"``: interpolated between the two samples closest to position ``quantile * (n - 1)``
  of the sorted samples; ``quantile = 0.5`` is the median (the mean of the middle two for even
  ``n``). Hyndman & Fan (1996), definition 7; numpy's default ``method="linear"``. Used for the
  spread of per-step timings (:func:`~attn_gym_lite.bench.timing.percentiles`), whose ``p50``
  must be the median the timings report.

Source: R. J. Hyndman and Y. Fan, "Sample Quantiles in Statistical Packages", The American
Statistician 50(4), 1996; numpy.percentile's ``method`` documentation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from ..checks import check_real

__all__ = ["METHODS", "sample_quantile"]

#: The methods :func:`sample_quantile` knows, each with the range of ``quantile`` it accepts.
METHODS = {"nearest-rank": "(0, 1]", "linear": "[0, 1]"}


def sample_quantile(values: Sequence[float], quantile: float, *, method: str) -> float:
    """The ``quantile`` of ``values`` by ``method`` (see the module docstring for both definitions).

    Args:
        values: the samples, any order, any unit (the result has the same); not modified.
        quantile: a fraction, in ``(0, 1]`` for ``"nearest-rank"`` (the 0 quantile has no nearest
            rank) and in ``[0, 1]`` for ``"linear"``.
        method: ``"nearest-rank"`` or ``"linear"``.

    Returns:
        For ``"nearest-rank"``, one of ``values`` (its type kept: an int stays an int); for
        ``"linear"``, a float between two of them.

    Raises:
        TypeError: ``quantile`` is not a real number (a bool is refused); ``values`` is not a
            sequence, or an entry is not a real number (``values[i]`` named).
        ValueError: ``method`` is not one of :data:`METHODS`; ``values`` is empty or holds a NaN
            or infinite sample (``values[i]`` named); ``quantile`` is outside the method's range
            (or NaN).
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    if isinstance(quantile, bool) or not isinstance(quantile, numbers.Real):
        raise TypeError(f"quantile must be a real number, got {type(quantile).__name__}: {quantile!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) and not hasattr(values, "tolist"):
        raise TypeError(f"values must be a sequence of real numbers, got {type(values).__name__}")
    if len(values) == 0:
        raise ValueError("values must be non-empty (at least one sample), got an empty sequence")
    # sorted() with a NaN among the samples leaves them unsorted (every comparison with NaN is
    # False), and an inf makes the linear interpolation inf - inf = NaN: refuse both by name.
    for index, value in enumerate(values):
        check_real(f"values[{index}]", value)
    low_ok = 0 < quantile if method == "nearest-rank" else 0 <= quantile
    if not (low_ok and quantile <= 1):
        raise ValueError(f"quantile must be in {METHODS[method]}, got {quantile} (the range of method {method!r})")
    ordered = sorted(values)
    if method == "nearest-rank":
        return ordered[math.ceil(quantile * len(ordered)) - 1]
    position = quantile * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
