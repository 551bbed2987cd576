"""The book's two statistics, each defined once in the package and checked against numpy:
nearest-rank quantiles of length distributions (chapters 1 and 7, the packing study) and the median
of timings (every recorded timing; chapters 4 and 6)."""

import random

import numpy as np
import pytest

from attn_gym_lite.bench.timing import median
from attn_gym_lite.data.study import length_summary, nearest_rank

QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0)


@pytest.mark.parametrize("size", [1, 2, 3, 10, 99, 100, 101, 1000])
def test_nearest_rank_is_numpys_inverted_cdf_percentile(size):
    rng = random.Random(size)
    values = [rng.randint(0, 5000) for _ in range(size)]
    for q in QUANTILES:
        assert nearest_rank(values, q) == np.percentile(values, q * 100, method="inverted_cdf")
    summary = length_summary(values)
    for name, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert summary[name] == np.percentile(values, q * 100, method="inverted_cdf")
    assert summary["max"] == max(values) and summary["tokens"] == sum(values)


def test_nearest_rank_is_not_numpys_default_interpolation():
    # chapter 1 used np.quantile (linear interpolation): a value that need not occur in the data
    assert nearest_rank([1, 2, 3, 100], 0.5) == 2
    assert np.quantile([1, 2, 3, 100], 0.5) == 2.5


@pytest.mark.parametrize("size", [1, 2, 5, 6, 50, 51])
def test_timing_median_is_numpys_median(size):
    rng = random.Random(size)
    values = [rng.uniform(1.0, 1e4) for _ in range(size)]
    assert median(values) == pytest.approx(np.median(values), rel=1e-15)
    if size % 2 == 0:  # the mean of the two middle values, not the upper one (chapter 6's old lambda)
        ordered = sorted(values)
        assert median(values) != ordered[size // 2]
