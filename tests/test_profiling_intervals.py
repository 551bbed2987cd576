"""busy_and_gaps, the one interval-union sweep of the profiling layer, against a brute-force
reference: the elementary segments between sorted endpoints, each tested against every interval."""

import random
from fractions import Fraction

import numpy as np
import pytest

from attn_gym_lite.profiling.compact import compact_timeline
from attn_gym_lite.profiling.intervals import busy_and_gaps
from attn_gym_lite.profiling.summary import replay_idle, trace_summary


def brute_force(intervals):
    """(busy, gaps) of the union, exactly: cut the line at every endpoint and keep the pieces that
    some interval covers; gaps are the maximal runs of uncovered pieces, where an empty interval
    (an event of no duration) ends a run: the device did something there."""
    points = sorted({Fraction(p) for pair in intervals for p in pair})
    instants = {Fraction(s) for s, e in intervals if s == e}
    busy, gaps, run = Fraction(0), [], Fraction(0)
    for left, right in zip(points, points[1:]):
        if left in instants and run:
            gaps.append(run)
            run = Fraction(0)
        covered = any(Fraction(s) <= left and right <= Fraction(e) for s, e in intervals)
        if covered:
            if run:
                gaps.append(run)
            run = Fraction(0)
            busy += right - left
        else:
            run += right - left
    if run:  # uncovered up to the last point: an empty interval lies there
        gaps.append(run)
    return busy, gaps


def _random_intervals(rng, n, scale, integer):
    out = []
    for _ in range(n):
        start = rng.randint(0, scale) if integer else rng.random() * scale
        length = rng.choice([0, rng.randint(0, scale // 4)]) if integer else rng.choice([0.0, rng.random() * scale / 4])
        out.append((start, start + length))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_union_matches_the_brute_force_reference_exactly_on_integers(seed):
    rng = random.Random(seed)
    intervals = _random_intervals(rng, rng.randint(1, 30), 200, integer=True)
    busy, gaps = busy_and_gaps(intervals)
    expected_busy, expected_gaps = brute_force(intervals)
    assert busy == expected_busy  # small integers: every float sum is exact
    assert gaps == expected_gaps
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    assert busy + sum(gaps) == span


@pytest.mark.parametrize("seed", range(40))
def test_union_matches_the_brute_force_reference_on_floats(seed):
    rng = random.Random(1000 + seed)
    offset = rng.choice([0.0, 1.7e12])  # profiler timestamps are µs since the epoch
    intervals = [(offset + s, offset + e) for s, e in _random_intervals(rng, rng.randint(1, 40), 500, integer=False)]
    busy, gaps = busy_and_gaps(intervals)
    expected_busy, expected_gaps = brute_force(intervals)
    tolerance = 1e-9 * (1 + offset) * len(intervals)
    assert busy == pytest.approx(float(expected_busy), abs=tolerance)
    # A float gap can only be lost or gained where it is below rounding; there are none that small here.
    assert len(gaps) == len(expected_gaps)
    assert gaps == pytest.approx([float(g) for g in expected_gaps], abs=tolerance)


def test_union_by_sampling():
    """Independent of endpoints: count the sample points t + 0.5 that some interval holds."""
    rng = random.Random(7)
    for _ in range(20):
        intervals = _random_intervals(rng, rng.randint(1, 25), 300, integer=True)
        sampled = sum(any(s <= t + 0.5 < e for s, e in intervals) for t in range(0, 400))
        assert busy_and_gaps(intervals)[0] == sampled


def test_edge_cases():
    assert busy_and_gaps([]) == (0.0, [])
    assert busy_and_gaps(iter([(3, 3)])) == (0.0, [])  # any iterable; an empty interval covers nothing
    assert busy_and_gaps([(0, 10), (2, 3), (10, 12)]) == (12.0, [])  # nested, touching
    assert busy_and_gaps([(5, 6), (0, 1), (2, 4)]) == (4.0, [1.0, 1.0])  # any order
    assert busy_and_gaps([(0, 1), (3, 3), (6, 7)]) == (2.0, [2.0, 3.0])  # an instant splits a gap
    assert busy_and_gaps([(np.float64(0.5), np.float64(2.0))]) == (1.5, [])


def _kernel(name, ts, dur, correlation, tid=7):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid,
            "args": {"correlation": correlation, "stream": tid}}


@pytest.mark.parametrize("seed", range(10))
def test_every_reduction_reads_the_same_union(seed):
    """trace_summary, replay_idle and compact_timeline agree with the brute force on one trace."""
    rng = random.Random(seed)
    kernels = [_kernel(f"k{i}", rng.randint(0, 300), rng.randint(0, 40), rng.randint(0, 2), rng.choice([7, 8]))
               for i in range(rng.randint(2, 25))]
    launches = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 1, "pid": 1, "tid": 1,
                 "args": {"correlation": c}} for c in range(3)]
    trace = {"traceEvents": kernels + launches}
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    busy, gaps = brute_force(spans)
    summary = trace_summary(trace)
    assert summary["busy_us"] == busy and summary["gaps"]["total_us"] == sum(gaps)
    assert summary["gaps"]["count"] == len(gaps)
    assert compact_timeline(trace)["counts"]["device_busy_us"] == busy
    idle = sum(sum(brute_force([(k["ts"], k["ts"] + k["dur"]) for k in kernels if k["args"]["correlation"] == c])[1])
               for c in {k["args"]["correlation"] for k in kernels})
    assert replay_idle(trace)["idle_us"] == idle
