"""Reading a trace as numbers and as a picture.

:func:`trace_summary` answers "is the GPU waiting for the host?": how many kernels a step
launches, what fraction of the profiled window the GPU was busy, and the idle gaps between
device events (count, total, largest). :func:`plot_timeline` draws streams as rows and device
events as boxes coloured by region, so the book can show a trace as an image.

All times are microseconds, as in the Chrome trace format.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from ..checks import check_int, check_real
from .intervals import busy_and_gaps
from .record import DEVICE_CATEGORIES, HOST_OP_CATEGORIES
from .trace import Trace, check_slices, check_trace

_NO_GPU_HINT = " (a trace recorded without a GPU has none)"


def device_events(trace: Trace) -> list[dict]:
    """Kernel, memcpy and memset events (complete ``"ph": "X"`` slices with a ``ts`` and a
    ``dur``, µs), sorted by start.

    Raises:
        TypeError / ValueError: a malformed trace, by the rules of :func:`~attn_gym_lite.profiling.trace.check_trace` and
            :func:`~attn_gym_lite.profiling.trace.check_slices` (the message names the event).
    """
    check_trace(trace, "device_events")
    check_slices(trace, DEVICE_CATEGORIES, "device_events")
    return sorted(
        (e for e in trace.get("traceEvents", [])
         if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X" and "dur" in e and "ts" in e),
        key=lambda e: e["ts"],
    )


def trace_summary(trace: Trace, steps: int | None = None, min_gap_us: float = 0.0) -> dict[str, Any]:
    """GPU-side summary numbers of a trace.

    Args:
        trace: Chrome trace dict.
        steps: steps the trace covers; default the number of ``ProfilerStep#`` ranges that
            contain CPU work (``profile.step()`` leaves an empty one open at exit), or 1.
        min_gap_us: idle intervals shorter than this are not counted as gaps (they still count
            as idle in ``busy_fraction``).

    Returns:
        ``{"steps", "kernels", "kernels_per_step", "device_events", "window_us", "busy_us",
        "busy_fraction", "gaps": {"count", "total_us", "largest_us"}, "region_us": {label: µs}}``.
        The window runs from the first device event's start to the last one's end; busy time
        is the union of device events over all streams; ``region_us`` sums event durations per
        ``args["region"]`` (unlabelled events under ``"(unlabelled)"``).

    Raises:
        TypeError / ValueError: a malformed trace, by the rules of :func:`~attn_gym_lite.profiling.trace.check_trace` and
            :func:`~attn_gym_lite.profiling.trace.check_slices` (the message names the event).
        TypeError: ``steps`` is neither ``None`` nor an integer (numpy's included; not a bool), or
            ``min_gap_us`` is not a real number (not a bool).
        ValueError: the trace has no device events, ``steps`` < 1, or ``min_gap_us`` is
            negative, NaN or infinite.
    """
    check_trace(trace, "trace_summary")
    check_slices(trace, (*DEVICE_CATEGORIES, *HOST_OP_CATEGORIES), "trace_summary")
    if steps is not None:
        steps = check_int("trace_summary: steps", steps, minimum=1)
    # NaN compared false with every gap (no gap counted) and True counted as 1 µs.
    min_gap_us = check_real("trace_summary: min_gap_us", min_gap_us, minimum=0.0)
    events = device_events(trace)
    if not events:
        raise ValueError(f"trace_summary: the trace has no kernel, memcpy or memset events{_NO_GPU_HINT}")
    if steps is None:
        steps = _profiler_steps(trace) or 1
    window_start = events[0]["ts"]
    window_end = max(e["ts"] + e["dur"] for e in events)
    busy, gaps = busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in events)
    counted = [g for g in gaps if g >= min_gap_us]
    regions: dict[str, float] = defaultdict(float)
    for event in events:
        regions[event.get("args", {}).get("region", "(unlabelled)")] += event["dur"]
    kernels = sum(1 for e in events if e["cat"] == "kernel")
    window = window_end - window_start
    return {
        "steps": steps,
        "kernels": kernels,
        "kernels_per_step": kernels / steps,
        "device_events": len(events),
        "window_us": window,
        "busy_us": busy,
        "busy_fraction": busy / window if window > 0 else 1.0,
        "gaps": {"count": len(counted), "total_us": sum(counted), "largest_us": max(counted, default=0.0)},
        "region_us": dict(regions),
    }


def _profiler_steps(trace: Trace) -> int:
    """``ProfilerStep#`` ranges that contain the start of some other CPU event on their thread."""
    starts: dict = defaultdict(list)
    steps = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in HOST_OP_CATEGORIES or "dur" not in e or "ts" not in e:
            continue
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.append(e)
        else:
            starts[e.get("tid")].append(e["ts"])
    for values in starts.values():
        values.sort()
    return sum(
        bisect.bisect_left(starts[s.get("tid")], s["ts"] + s["dur"]) > bisect.bisect_left(starts[s.get("tid")], s["ts"])
        for s in steps
    )


def replay_idle(trace: Trace) -> dict[str, Any]:
    """Idle GPU time *inside* graph replays: the gaps between the nodes of each replay.

    A replay is the set of device events whose ``args["correlation"]`` is that of a
    ``cudaGraphLaunch`` (complete ``"ph": "X"`` runtime event) in the trace. Within one replay,
    idle time is the span from its first event's start to its last event's end minus the union
    of its events (overlapping nodes count once). Idle time between replays (copies of the next
    batch, eager optimizer steps, synchronizes) is not counted: :func:`trace_summary` gives the
    idle time of the whole window.

    Args:
        trace: Chrome trace dict (times in µs).

    Returns:
        ``{"replays": int, "node_boundaries": int, "idle_us": float, "idle_us_per_replay":
        float, "idle_us_per_boundary": float}``: replays with at least one device event, the
        number of consecutive-node boundaries over all of them (events minus one per replay),
        total idle µs inside replays, and its means per replay and per boundary (0.0 where there
        is no boundary).

    Raises:
        TypeError / ValueError: a malformed trace, by the rules of :func:`~attn_gym_lite.profiling.trace.check_trace` and
            :func:`~attn_gym_lite.profiling.trace.check_slices` (the message names the event).
        ValueError: the trace has no ``cudaGraphLaunch`` with device events (an eager trace, or
            one recorded without a GPU).

    Source: chapter "Profiling" (replayed step's idle time between graph nodes).
    """
    check_trace(trace, "replay_idle")
    check_slices(trace, DEVICE_CATEGORIES, "replay_idle")
    launches = {
        e["args"]["correlation"]
        for e in trace.get("traceEvents", [])
        if e.get("name") == "cudaGraphLaunch" and e.get("ph") == "X"
        and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    replays: dict[Any, list[dict]] = defaultdict(list)
    for event in device_events(trace):  # sorted by start
        correlation = event.get("args", {}).get("correlation")
        if correlation in launches:
            replays[correlation].append(event)
    if not replays:
        raise ValueError(f"replay_idle: the trace has no cudaGraphLaunch with device events{_NO_GPU_HINT}")
    idle = 0.0
    for events in replays.values():
        for gap in busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in events)[1]:
            idle += gap
    boundaries = sum(len(events) - 1 for events in replays.values())
    return {
        "replays": len(replays),
        "node_boundaries": boundaries,
        "idle_us": idle,
        "idle_us_per_replay": idle / len(replays),
        "idle_us_per_boundary": idle / boundaries if boundaries else 0.0,
    }
