"""Clocks for GPU work: host time over back-to-back calls (launch overhead included: what CUDA graphs
remove), device time per call between CUDA events, and per training step, start to next start."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch

from ..data.quantiles import sample_quantile

_Input = TypeVar("_Input")
_Output = TypeVar("_Output")


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
    """Median host time of one ``fn()`` call in µs. ``sync_before``: the GPU is idle at each call's
    start (what issuing the work costs); else the synchronize follows each call."""
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
    """The statistic every recorded timing uses."""
    return statistics.median(values)


def step_intervals_us(step: Callable[[_Input], _Output], inputs: Iterable[_Input], *,
                      cuda: bool) -> tuple[list[float], list[_Output]]:
    """Run ``step(x)`` for each of ``inputs``: ``(intervals_us, outputs)``, per step the time from its
    start to the next's (what a training loop's throughput sees), by CUDA events on the current stream
    (``cuda=True``, one synchronize at the end) or ``time.perf_counter``."""
    marks: list = []

    def mark() -> None:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            marks.append(time.perf_counter())

    outputs = []
    for item in inputs:
        mark()
        outputs.append(step(item))
    mark()
    if cuda:
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in zip(marks, marks[1:])], outputs
    return [(b - a) * 1e6 for a, b in zip(marks, marks[1:])], outputs


def percentiles(values: Sequence[float], qs: Sequence[float] = (10, 50, 90)) -> dict[str, float]:
    """``{"p<q>": value}`` for each ``q`` in ``qs`` (``"p10"``, ``"p99.9"``), linearly interpolated
    between the closest ranks (numpy's default, Hyndman & Fan definition 7; ``p50`` is :func:`median`)."""
    samples = [float(v) for v in values]
    return {f"p{q:g}": sample_quantile(samples, q / 100, method="linear") for q in qs}
