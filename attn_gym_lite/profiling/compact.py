"""Small, JSON-ready summaries of a trace for the book's pictures.

A recorded benchmark stores numbers, not raw traces (a Chrome trace of one step is megabytes):

* :func:`compact_timeline` keeps one row per event that a timeline picture needs: host ops
  (nested at most ``max_depth`` deep), CUDA runtime/driver calls (the launches) and device
  events per stream, as ``[name, track, depth, start_us, dur_us]``;
* :func:`host_phases` reads the ``record_function`` ranges of a training step (data loading,
  copy to static buffers, replay, optimizer step): each phase's host span and the GPU span of the
  work it launched, and, for the longest phase, the Python frames the profiler recorded with
  ``with_stack=True`` (where its host time went).

Both read the Chrome trace dict that :func:`~attn_gym_lite.profiling.profile` returns; device
events come from :func:`~attn_gym_lite.profiling.device_events`. Times are µs.

Source: the seed article, "Hello World" (eager versus replay traces) and "Small Digression into
profiling" (``record_function`` labels, ``with_stacks``); the Chrome trace-event format.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..checks import check_int, check_real
from .intervals import busy_and_gaps
from .record import DEVICE_CATEGORIES, HOST_OP_CATEGORIES
from .summary import device_events
from .trace import LANE_TID_BASE, Trace, check_slices, check_trace

RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
PYTHON_CATEGORY = "python_function"
RUNTIME_TRACK = "CUDA runtime"
_SKIPPED_PREFIXES = ("ProfilerStep#",)  # the profiler's own step ranges, not work


def _complete(event: dict) -> bool:
    return event.get("ph") == "X" and isinstance(event.get("ts"), (int, float)) and isinstance(event.get("dur"), (int, float))


def _thread(event: dict) -> tuple:
    """``(pid, tid)`` of the host thread, lanes added by :func:`split_overlapping_lanes` folded back."""
    tid = event.get("tid")
    return event.get("pid"), tid % LANE_TID_BASE if isinstance(tid, int) else tid


def _depths(events: list[dict]) -> list[int]:
    """Nesting depth of each slice among ``events`` (one thread), in the given start order."""
    open_ends: list[float] = []
    depths = []
    for event in events:
        while open_ends and open_ends[-1] <= event["ts"]:
            open_ends.pop()
        depths.append(len(open_ends))
        open_ends.append(event["ts"] + event["dur"])
    return depths


def _short(name: object, name_chars: int) -> str:
    text = str(name)
    return text if len(text) <= name_chars else text[: name_chars - 1] + "…"


def _is_launch(name: str) -> bool:
    return "Launch" in name  # cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch, ...


def compact_timeline(trace: Trace, *, max_depth: int = 2, max_events: int = 3000, name_chars: int = 80) -> dict[str, Any]:
    """The rows a timeline picture of ``trace`` needs, small enough to store in a recording.

    Tracks, in this order: ``"CPU thread 0"``, ``"CPU thread 1"``, ... (``cpu_op`` and
    ``record_function`` slices per host thread, numbered by first appearance; the profiler's
    ``ProfilerStep#`` ranges are left out), ``"CUDA runtime"`` (runtime and driver calls of every
    thread: the launches and synchronizes) and ``"GPU stream <id>"`` (kernels, memcpys and
    memsets; lanes made by :func:`split_overlapping_lanes` are folded back into their stream).

    Args:
        trace: Chrome trace dict (:func:`~attn_gym_lite.profiling.profile`'s ``.trace``).
        max_depth: host slices nested deeper than this (0 = outermost) are dropped.
        max_events: at most this many events are kept; past it the deepest host slices go first,
            then the latest events; ``"dropped"`` counts them.
        name_chars: names are cut to this many characters (kernel names run to hundreds).

    Returns:
        ``{"tracks": [str], "events": [[name, track index, depth, start_us, dur_us], ...] (by
        start, µs from the first kept event), "dropped": int, "counts": {"host_ops",
        "runtime_calls", "launches", "device_events", "device_busy_us"}, "span_us": float}``.
        The counts are over the whole trace (before ``max_depth`` and ``max_events``);
        ``device_busy_us`` is the union of device events.

    Raises:
        TypeError / ValueError: a malformed trace, by the rules of :func:`~attn_gym_lite.profiling.trace.check_trace` and
            :func:`~attn_gym_lite.profiling.trace.check_slices` (the message names the event).
        ValueError: ``max_depth`` < 0, ``max_events`` < 1 or ``name_chars`` < 8; the trace has no
            host, runtime or device event.
    """
    check_trace(trace, "compact_timeline")
    check_slices(trace, (*HOST_OP_CATEGORIES, *RUNTIME_CATEGORIES, *DEVICE_CATEGORIES), "compact_timeline")
    check_int("max_depth", max_depth, minimum=0)
    check_int("max_events", max_events, minimum=1)
    check_int("name_chars", name_chars, minimum=8)
    raw = trace.get("traceEvents", [])
    by_thread: dict[Any, list[dict]] = defaultdict(list)
    runtime = []
    for event in raw:
        if not _complete(event):
            continue
        if event.get("cat") in HOST_OP_CATEGORIES and not str(event.get("name", "")).startswith(_SKIPPED_PREFIXES):
            by_thread[_thread(event)].append(event)
        elif event.get("cat") in RUNTIME_CATEGORIES:
            runtime.append(event)
    device = device_events(trace)
    if not (by_thread or runtime or device):
        raise ValueError("compact_timeline: the trace has no host op, runtime call or device event")
    rows: list[tuple[str, int, dict]] = []  # (track name, depth, event)
    host_ops = 0
    threads = sorted(by_thread, key=lambda key: min(e["ts"] for e in by_thread[key]))
    for index, key in enumerate(threads):
        events = sorted(by_thread[key], key=lambda e: (e["ts"], -e["dur"]))
        host_ops += len(events)
        rows += [(f"CPU thread {index}", depth, e) for depth, e in zip(_depths(events), events)]
    rows += [(RUNTIME_TRACK, 0, e) for e in runtime]
    streams = set()
    for event in device:
        stream = (event.get("args") or {}).get("stream", event.get("tid"))
        if isinstance(stream, int):
            stream %= LANE_TID_BASE
        streams.add(stream)
        rows.append((f"GPU stream {stream}", 0, event))
    counts = {
        "host_ops": host_ops,
        "runtime_calls": len(runtime),
        "launches": sum(_is_launch(str(e.get("name", ""))) for e in runtime),
        "device_events": len(device),
        "device_busy_us": round(busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in device)[0], 3),
    }
    total = len(rows)
    rows = [row for row in rows if row[1] <= max_depth]
    depth = max_depth
    while len(rows) > max_events and depth > 0:  # the deepest host slices go first
        depth -= 1
        rows = [row for row in rows if row[1] <= depth]
    rows.sort(key=lambda row: (row[2]["ts"], row[1]))
    rows = rows[:max_events]
    tracks = [f"CPU thread {i}" for i in range(len(threads))] + ([RUNTIME_TRACK] if runtime else [])
    tracks += [f"GPU stream {s}" for s in sorted(streams, key=str)]
    index_of = {name: i for i, name in enumerate(tracks)}
    origin = min(row[2]["ts"] for row in rows)
    end = max(row[2]["ts"] + row[2]["dur"] for row in rows)
    return {
        "tracks": tracks,
        "events": [[_short(e.get("name", ""), name_chars), index_of[track], d,
                    round(e["ts"] - origin, 3), round(e["dur"], 3)] for track, d, e in rows],
        "dropped": total - len(rows),
        "counts": counts,
        "span_us": round(end - origin, 3),
    }


def host_phases(trace: Trace, phases: Sequence[str], *, top_frames: int = 12, flame_events: int = 300,
                flame_min_fraction: float = 0.005, name_chars: int = 100) -> dict[str, Any]:
    """Host and GPU spans of the ``record_function`` phases of one step, and where the longest
    phase's host time went.

    Each phase is the last ``record_function`` range (``user_annotation`` slice) of that name in
    the trace. Its GPU span runs from the first to the last device event launched from inside it
    (joined by ``correlation`` through the runtime/driver calls on the phase's thread). For the
    longest phase, the Python frames recorded with ``with_stack=True`` (``python_function``
    slices inside it, on its thread) give ``top_frames``: per frame name, the time of its
    outermost calls (a recursive call is not counted twice) and the number of those calls; and
    ``flame``: the frames and ops inside it that last at least ``flame_min_fraction`` of it, for a
    flame chart.

    Args:
        trace: Chrome trace dict of one profiled step.
        phases: the range names, in the order the step runs them.
        top_frames: how many frames to keep, longest first.
        flame_events: at most this many flame-chart slices (the longest are kept).
        flame_min_fraction: shorter flame slices are left out (fraction of the phase, 0 to 1).
        name_chars: names are cut to this many characters.

    Returns:
        ``{"order": [phase], "phases": {phase: {"start_us", "dur_us", "gpu_start_us",
        "gpu_end_us", "device_events", "launches"}}, "longest": phase, "stacks": bool,
        "top_frames": [[frame, total_us, calls]], "flame": [[name, depth, start_us, dur_us]]}``:
        µs from the first phase's start (flame slices: from the longest phase's start);
        ``gpu_start_us``/``gpu_end_us`` are ``None`` for a phase that launched no device work;
        ``stacks`` is False (and the frame lists empty) for a trace without Python frames.

    Raises:
        TypeError / ValueError: a malformed trace, by the rules of :func:`~attn_gym_lite.profiling.trace.check_trace` and
            :func:`~attn_gym_lite.profiling.trace.check_slices` (the message names the event).
        ValueError: ``phases`` is empty or not strings, or a phase has no range in the trace; a
            count or fraction out of range.
    """
    check_trace(trace, "host_phases")
    check_slices(trace, (*HOST_OP_CATEGORIES, *RUNTIME_CATEGORIES, PYTHON_CATEGORY, *DEVICE_CATEGORIES), "host_phases")
    if isinstance(phases, str) or not phases or not all(isinstance(p, str) for p in phases):
        raise ValueError(f"host_phases: phases must be a non-empty sequence of range names, got {phases!r}")
    check_int("top_frames", top_frames, minimum=0)
    check_int("flame_events", flame_events, minimum=0)
    check_real("flame_min_fraction", flame_min_fraction, minimum=0.0, maximum=1.0)
    check_int("name_chars", name_chars, minimum=8)
    raw = [e for e in trace.get("traceEvents", []) if _complete(e)]
    ranges = {}
    for event in sorted(raw, key=lambda e: e["ts"]):
        if event.get("cat") == "user_annotation" and event.get("name") in phases:
            ranges[event["name"]] = event  # the last one of each name
    missing = [p for p in phases if p not in ranges]
    if missing:
        raise ValueError(f"host_phases: no record_function range named {missing} in the trace "
                         f"(found {sorted(ranges)})")
    origin = min(e["ts"] for e in ranges.values())
    runtime = [e for e in raw if e.get("cat") in RUNTIME_CATEGORIES]
    by_correlation: dict[Any, list[dict]] = defaultdict(list)
    for event in device_events(trace):
        by_correlation[(event.get("args") or {}).get("correlation")].append(event)
    spans: dict[str, dict] = {}
    for name in phases:
        phase = ranges[name]
        start, end = phase["ts"], phase["ts"] + phase["dur"]
        calls = [e for e in runtime if _thread(e) == _thread(phase) and start <= e["ts"] <= end]
        launched = [d for c in calls for d in by_correlation.get((c.get("args") or {}).get("correlation"), ())]
        spans[name] = {
            "start_us": round(start - origin, 3),
            "dur_us": round(phase["dur"], 3),
            "gpu_start_us": round(min(d["ts"] for d in launched) - origin, 3) if launched else None,
            "gpu_end_us": round(max(d["ts"] + d["dur"] for d in launched) - origin, 3) if launched else None,
            "device_events": len(launched),
            "launches": sum(_is_launch(str(c.get("name", ""))) for c in calls),
        }
    longest = max(phases, key=lambda p: ranges[p]["dur"])
    phase = ranges[longest]
    start, end = phase["ts"], phase["ts"] + phase["dur"]

    def inside(event: dict) -> bool:
        return (_thread(event) == _thread(phase) and start <= event["ts"] and event["ts"] + event["dur"] <= end and event is not phase)

    frames = sorted((e for e in raw if e.get("cat") == PYTHON_CATEGORY and inside(e)), key=lambda e: (e["ts"], -e["dur"]))
    totals: dict[str, list] = {}
    open_frames: list[tuple[float, str]] = []  # (end, name) of the frames around the current one
    for event in frames:
        while open_frames and open_frames[-1][0] <= event["ts"]:
            open_frames.pop()
        name = str(event.get("name", ""))
        if name not in {n for _, n in open_frames}:  # outermost call of this frame
            entry = totals.setdefault(name, [0.0, 0])
            entry[0] += event["dur"]
            entry[1] += 1
        open_frames.append((event["ts"] + event["dur"], name))
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:top_frames]
    stacked = sorted((e for e in raw if e.get("cat") in (PYTHON_CATEGORY, *HOST_OP_CATEGORIES) and inside(e)),
                     key=lambda e: (e["ts"], -e["dur"]))
    flame = [(d, e) for d, e in zip(_depths(stacked), stacked) if e["dur"] >= flame_min_fraction * phase["dur"]]
    flame = sorted(sorted(flame, key=lambda item: -item[1]["dur"])[:flame_events], key=lambda item: item[1]["ts"])
    return {
        "order": list(phases),
        "phases": spans,
        "longest": longest,
        "stacks": bool(frames),
        "top_frames": [[_short(name, name_chars), round(total, 3), calls] for name, (total, calls) in top],
        "flame": [[_short(e.get("name", ""), name_chars), d, round(e["ts"] - start, 3), round(e["dur"], 3)]
                  for d, e in flame],
    }
