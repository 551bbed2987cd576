"""The book's statistics, each defined once in the package and checked against numpy:
quantiles (attn_gym_lite.data.quantiles: nearest-rank for length distributions, chapters 1 and 7,
the packing study; linear for the spread of per-step timings, chapter 10) and the median of timings
(every recorded timing; chapters 4 and 6)."""

import random

import numpy as np
import pytest

from attn_gym_lite.bench.timing import median, percentiles
from attn_gym_lite.data.quantiles import sample_quantile
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


def test_sample_quantile_by_hand():
    # [1, 2, 3, 100], n = 4. Nearest rank: sorted[ceil(q * 4) - 1]. Linear: position q * 3,
    # interpolated between its two neighbours.
    values = [100, 3, 1, 2]
    assert [sample_quantile(values, q, method="nearest-rank") for q in (0.1, 0.25, 0.26, 0.5, 0.75, 1.0)] == [1, 1, 2, 2, 3, 100]
    assert [sample_quantile(values, q, method="linear") for q in (0.0, 0.1, 0.5, 0.9, 1.0)] == pytest.approx(
        [1.0, 1.3, 2.5, 3 + 0.7 * 97, 100.0], rel=1e-12)
    assert values == [100, 3, 1, 2]  # not sorted in place
    assert type(sample_quantile([5, 7], 0.5, method="nearest-rank")) is int


@pytest.mark.parametrize("size", [1, 2, 3, 10, 99, 100, 101])
def test_sample_quantile_methods_are_numpys_and_the_callers_keep_theirs(size):
    rng = random.Random(1000 + size)
    values = [rng.uniform(0.0, 1e6) for _ in range(size)]
    for q in QUANTILES:
        assert sample_quantile(values, q, method="nearest-rank") == np.percentile(values, q * 100, method="inverted_cdf")
        assert sample_quantile(values, q, method="linear") == pytest.approx(
            np.percentile(values, q * 100, method="linear"), rel=1e-12)
        assert nearest_rank(values, q) == sample_quantile(values, q, method="nearest-rank")
    # bench.timing.percentiles is the linear method in percent; its p50 is the timings' median.
    got = percentiles(values, (0, 10, 50, 90, 100))
    assert list(got.values()) == pytest.approx(np.percentile(values, [0, 10, 50, 90, 100], method="linear"), rel=1e-12)
    assert got["p50"] == pytest.approx(median(values), rel=1e-15)


def test_sample_quantile_edges():
    assert sample_quantile([4, 2], 0, method="linear") == 2  # the 0 quantile is defined for linear
    values = [3.0, 1.0, 2.0, 4.0]
    assert sample_quantile(values, np.float32(0.5), method="linear") == pytest.approx(np.percentile(values, 50))
    assert sample_quantile(np.array(values), 0.75, method="nearest-rank") == 3.0
    with pytest.raises(ValueError, match="method"):
        sample_quantile([1], 0.5, method="nearest")
