"""Small, JSON-ready summaries of a trace for the book's pictures (a raw trace is megabytes).

:func:`compact_timeline` keeps the rows a timeline picture needs; :func:`host_phases` the spans of
a training step's ``record_function`` phases and the Python frames of the longest one. Times: µs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .intervals import busy_and_gaps
from .record import HOST_OP_CATEGORIES
from .summary import device_events
from .trace import LANE_TID_BASE, Trace, check_trace

RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
PYTHON_CATEGORY = "python_function"
RUNTIME_TRACK = "CUDA runtime"
# host_phases keeps the TOP_FRAMES longest frames and FLAME_EVENTS flame slices of >= FLAME_MIN_FRACTION of the phase.
TOP_FRAMES, FLAME_EVENTS, FLAME_MIN_FRACTION = 12, 300, 0.005


def _complete(event: dict) -> bool:
    return event.get("ph") == "X" and "ts" in event and "dur" in event


def _thread(event: dict) -> tuple:
    """``(pid, tid)`` of the host thread, lanes added by split_overlapping_lanes folded back."""
    tid = event.get("tid")
    return event.get("pid"), tid % LANE_TID_BASE if isinstance(tid, int) else tid


def _depths(events: list[dict]) -> list[int]:
    """Nesting depth of each slice among ``events`` (one thread, in start order)."""
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
    """The rows a timeline picture of ``trace`` needs, small enough to store in a recording: tracks
    ``"CPU thread <i>"`` (host ops and ranges but ``ProfilerStep#``, at most ``max_depth`` deep),
    ``"CUDA runtime"`` and ``"GPU stream <id>"``. Past ``max_events`` rows the deepest host slices go
    first, then the latest rows. Returns ``{"tracks", "events": [[name, track, depth, start_us,
    dur_us], ...], "dropped", "counts": {"host_ops", "runtime_calls", "launches", "device_events",
    "device_busy_us"} (of the whole trace), "span_us"}``.
    """
    check_trace(trace, "compact_timeline")
    if max_depth < 0:
        raise ValueError(f"compact_timeline: max_depth must be >= 0, got {max_depth}")
    raw = trace["traceEvents"]
    by_thread: dict[Any, list[dict]] = defaultdict(list)
    runtime = []
    for event in raw:
        if not _complete(event):
            continue
        if event.get("cat") in HOST_OP_CATEGORIES and not str(event.get("name", "")).startswith("ProfilerStep#"):
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
    counts = {"host_ops": host_ops, "runtime_calls": len(runtime), "launches": sum(_is_launch(str(e.get("name", ""))) for e in runtime),
              "device_events": len(device), "device_busy_us": round(busy_and_gaps((e["ts"], e["ts"] + e["dur"]) for e in device)[0], 3)}
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
    events = [[_short(e.get("name", ""), name_chars), index_of[track], d, round(e["ts"] - origin, 3), round(e["dur"], 3)]
              for track, d, e in rows]
    return {"tracks": tracks, "events": events, "dropped": total - len(rows), "counts": counts, "span_us": round(end - origin, 3)}


def host_phases(trace: Trace, phases: Sequence[str], *, name_chars: int = 100) -> dict[str, Any]:
    """Host and GPU spans of the ``record_function`` phases of one step (the last range of each name;
    the GPU span of the device work launched inside it), and where the longest phase's host time
    went: ``top_frames`` (per Python frame name, the time and number of its outermost calls) and
    ``flame`` (frames and ops inside it). Returns ``{"order", "phases": {phase: {"start_us",
    "dur_us", "gpu_start_us", "gpu_end_us", "device_events", "launches"}}, "longest", "stacks",
    "top_frames", "flame": [[name, depth, start_us, dur_us]]}``.
    """
    raw = [e for e in trace["traceEvents"] if _complete(e)]
    ranges = {}
    for event in sorted(raw, key=lambda e: e["ts"]):
        if event.get("cat") == "user_annotation" and event.get("name") in phases:
            ranges[event["name"]] = event  # the last one of each name
    missing = [p for p in phases if p not in ranges]
    if missing:
        raise ValueError(f"host_phases: phases {missing} have no record_function range in the trace (found {sorted(ranges)})")
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
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:TOP_FRAMES]
    stacked = sorted((e for e in raw if e.get("cat") in (PYTHON_CATEGORY, *HOST_OP_CATEGORIES) and inside(e)),
                     key=lambda e: (e["ts"], -e["dur"]))
    flame = [(d, e) for d, e in zip(_depths(stacked), stacked) if e["dur"] >= FLAME_MIN_FRACTION * phase["dur"]]
    flame = sorted(sorted(flame, key=lambda item: -item[1]["dur"])[:FLAME_EVENTS], key=lambda item: item[1]["ts"])
    return {
        "order": list(phases),
        "phases": spans,
        "longest": longest,
        "stacks": bool(frames),
        "top_frames": [[_short(name, name_chars), round(total, 3), calls] for name, (total, calls) in top],
        "flame": [[_short(e.get("name", ""), name_chars), d, round(e["ts"] - start, 3), round(e["dur"], 3)]
                  for d, e in flame],
    }
