"""Reading a trace as numbers: is the GPU waiting for the host? Times are µs."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from .intervals import busy_and_gaps
from .record import DEVICE_CATEGORIES, HOST_OP_CATEGORIES
from .trace import Trace, check_trace

_NO_GPU_HINT = " (a trace recorded without a GPU has none)"


def device_events(trace: Trace) -> list[dict]:
    """Kernel, memcpy and memset slices (``"ph": "X"`` with ``ts`` and ``dur``), sorted by start."""
    check_trace(trace, "device_events")
    return sorted((e for e in trace["traceEvents"]
                   if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X" and "dur" in e and "ts" in e),
                  key=lambda e: e["ts"])


def trace_summary(trace: Trace, steps: int | None = None, min_gap_us: float = 0.0) -> dict[str, Any]:
    """Kernels per step, GPU busy time and the idle gaps between device events.

    ``steps`` defaults to the ``ProfilerStep#`` ranges holding CPU work (``profile.step()`` leaves an
    empty one open), or 1; idle stretches shorter than ``min_gap_us`` are not counted as gaps.
    Returns ``{"steps", "kernels", "kernels_per_step", "device_events", "window_us", "busy_us",
    "busy_fraction", "gaps": {"count", "total_us", "largest_us"}, "region_us": {label: µs}}``: the
    window spans the device events; busy time is their union over all streams; ``region_us`` sums
    durations per ``args["region"]``.
    """
    events = device_events(trace)
    if not events:
        raise ValueError(f"trace_summary: the trace has no kernel, memcpy or memset events{_NO_GPU_HINT}")
    steps = steps or _profiler_steps(trace) or 1
    busy, gaps = busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in events)
    counted = [g for g in gaps if g >= min_gap_us]
    regions: dict[str, float] = defaultdict(float)
    for event in events:
        regions[event.get("args", {}).get("region", "(unlabelled)")] += event["dur"]
    kernels = sum(e["cat"] == "kernel" for e in events)
    window = max(e["ts"] + e["dur"] for e in events) - events[0]["ts"]
    return {"steps": steps, "kernels": kernels, "kernels_per_step": kernels / steps, "device_events": len(events),
            "window_us": window, "busy_us": busy, "busy_fraction": busy / window if window > 0 else 1.0,
            "gaps": {"count": len(counted), "total_us": sum(counted), "largest_us": max(counted, default=0.0)},
            "region_us": dict(regions)}


def _profiler_steps(trace: Trace) -> int:
    """``ProfilerStep#`` ranges that contain the start of some other CPU event on their thread."""
    starts: dict = defaultdict(list)
    steps = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in HOST_OP_CATEGORIES and "dur" in e and "ts" in e:
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                steps.append(e)
            else:
                starts[e.get("tid")].append(e["ts"])
    for values in starts.values():
        values.sort()
    return sum(bisect.bisect_left(starts[s.get("tid")], s["ts"] + s["dur"]) > bisect.bisect_left(starts[s.get("tid")], s["ts"])
               for s in steps)


def replay_idle(trace: Trace) -> dict[str, Any]:
    """Idle GPU time *inside* graph replays (the device events of one ``cudaGraphLaunch``), not
    between them: ``{"replays", "node_boundaries", "idle_us", "idle_us_per_replay",
    "idle_us_per_boundary"}``."""
    launches = {e["args"]["correlation"] for e in trace["traceEvents"]
                if e.get("name") == "cudaGraphLaunch" and "correlation" in e.get("args", {})}
    replays: dict[Any, list[dict]] = defaultdict(list)
    for event in device_events(trace):
        if event.get("args", {}).get("correlation") in launches:
            replays[event["args"]["correlation"]].append(event)
    if not replays:
        raise ValueError(f"replay_idle: the trace has no cudaGraphLaunch with device events{_NO_GPU_HINT}")
    idle = 0.0
    for events in replays.values():
        for gap in busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in events)[1]:
            idle += gap
    boundaries = sum(len(events) - 1 for events in replays.values())
    return {"replays": len(replays), "node_boundaries": boundaries, "idle_us": idle, "idle_us_per_replay": idle / len(replays),
            "idle_us_per_boundary": idle / boundaries if boundaries else 0.0}
