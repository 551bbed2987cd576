"""attn_gym_lite.bench.timing on the CPU: per-step intervals (host clock) and percentiles, against
numpy and known sleeps. (The CUDA-event clocks run in the GPU suites.)"""

import time

import numpy as np
import pytest

from attn_gym_lite.bench.timing import percentiles, step_intervals_us


def test_percentiles_and_step_intervals_against_numpy_and_a_sleep():
    values = [7.0, 1.0, 3.5, 10.0, 2.0, 2.0, 9.0]
    got = percentiles(values, (0, 10, 25, 50, 90, 99.5, 100))
    assert list(got) == ["p0", "p10", "p25", "p50", "p90", "p99.5", "p100"]
    assert list(got.values()) == pytest.approx(np.percentile(values, [0, 10, 25, 50, 90, 99.5, 100]), rel=1e-12)
    assert percentiles([4.0]) == {"p10": 4.0, "p50": 4.0, "p90": 4.0}

    intervals, outputs = step_intervals_us(lambda s: (time.sleep(s), s * 2)[1], [0.02, 0.0, 0.05], cuda=False)
    assert outputs == [0.04, 0.0, 0.1]
    # Each interval holds its step's sleep (µs), and no more than a loaded machine adds to it.
    assert 20e3 <= intervals[0] < 220e3 and 0 < intervals[1] < 200e3 and 50e3 <= intervals[2] < 250e3
