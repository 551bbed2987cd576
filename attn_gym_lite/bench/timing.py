"""Two clocks for GPU work, because they answer different questions.

* ``wall_clock_us``: host time per call over many back-to-back calls, synchronised only at the
  ends. It includes Python, dispatcher and launch overhead, which is what CUDA graphs remove, and
  is not inflated the way a profiler inflates each launch call.
* ``cuda_event_us``: device time of each call between two CUDA events on the stream; when the
  host cannot launch fast enough this includes the GPU's idle gaps between kernels.

And for a training loop, whose every step takes another input: ``step_intervals_us``, the time
from one step's start to the next's, per step; ``percentiles`` summarises per-step samples.
"""

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


def step_intervals_us(step: Callable[[_Input], _Output], inputs: Iterable[_Input], *,
                      cuda: bool) -> tuple[list[float], list[_Output]]:
    """Run ``step(x)`` for each ``x`` of ``inputs``; the time from each step's start to the next's.

    The interval between consecutive step starts is what a training loop's throughput sees: the
    step's own work plus whatever the host or the device does between steps (copying the next
    batch in, idle gaps). The last step's interval ends at a mark after it.

    Args:
        step: called once per input, in order.
        inputs: the steps' inputs (e.g. one batch per step).
        cuda: clock by CUDA events recorded on the current stream at each step start and after the
            last step, with no synchronisation until every step is issued (device time; one
            ``torch.cuda.synchronize()`` at the end); ``False``: the host's ``time.perf_counter``
            (for work that runs synchronously on the CPU).

    Returns:
        ``(intervals_us, outputs)``: one interval (µs) and one return value per input.
    """
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
    """Percentiles of a non-empty list, linearly interpolated between the closest ranks (numpy's
    default ``"linear"`` method, Hyndman & Fan 1996 definition 7; ``p50`` is :func:`median`).

    :func:`~attn_gym_lite.data.quantiles.sample_quantile` with ``method="linear"`` at ``q / 100``
    (the data chapter's length statistics use its ``"nearest-rank"`` method instead).

    Args:
        values: the samples (any unit; the result has the same).
        qs: percentiles to compute, each in ``[0, 100]``.

    Returns:
        ``{"p<q>": value}`` for each ``q`` (``"p10"``, ``"p50"``, ``"p90"`` by default; a
        fractional ``q`` keeps its decimals, ``"p99.9"``).

    Raises:
        ValueError: ``values`` is empty or holds a NaN or infinite sample (``values[i]``, from
            :func:`~attn_gym_lite.data.quantiles.sample_quantile`), or a ``q`` is outside ``[0, 100]``.
    """
    samples = [float(v) for v in values]
    if not samples:
        raise ValueError("values must hold at least one sample, got none")
    result = {}
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"qs must be percentiles in [0, 100], got {q!r}")
        result[f"p{q:g}"] = sample_quantile(samples, q / 100, method="linear")
    return result
