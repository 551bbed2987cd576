"""Two clocks for GPU work, because they answer different questions.

* ``wall_clock_us``: host time per call over many back-to-back calls, synchronised only at the
  ends. It includes Python, dispatcher and launch overhead, which is what CUDA graphs remove, and
  is not inflated the way a profiler inflates each launch call.
* ``cuda_event_us``: device time of each call between two CUDA events on the stream; when the
  host cannot launch fast enough this includes the GPU's idle gaps between kernels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def wall_clock_us(fn: Callable[[], object], iters: int, warmup: int = 5) -> float:
    """Mean host time per call of ``fn`` in µs, over ``iters`` calls (after ``warmup``)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def host_call_us(fn: Callable[[], object], iters: int, sync_before: bool = True) -> float:
    """Median host time of one ``fn()`` call in µs, over ``iters`` calls.

    With ``sync_before`` the GPU is idle at the start of each call (synchronised before each), so
    the figure is what issuing the work costs the host, not how long the GPU then runs; without,
    the synchronize follows each call instead (the call itself may then wait on earlier work).
    """
    samples = []
    for _ in range(iters):
        if sync_before:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
        if not sync_before:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return median(samples)


def cuda_event_us(fn: Callable[[], object], iters: int, warmup: int = 5) -> list[float]:
    """Device time of each of ``iters`` calls in µs (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]


def median(values: list[float]) -> float:
    """Median of a non-empty list (the statistic every recorded timing uses)."""
    return statistics.median(values)
