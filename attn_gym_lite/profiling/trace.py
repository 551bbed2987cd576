"""Recording a profiler trace as a plain ``dict`` (Chrome trace-event JSON) and writing it.

Chrome JSON lets slices on one track overlap without nesting (back-to-back graph kernels, by
nanoseconds); Perfetto hides a slice it cannot nest, so :func:`split_overlapping_lanes` moves it.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

Trace = dict[str, Any]
LANE_TID_BASE = 1_000_000  # extra lane k of track tid gets tid LANE_TID_BASE * k + tid
TOLERANCE_US = 1e-3  # timestamps near 5e12 µs carry ~1e-3 µs of float error: touching is not overlapping


class profile:  # noqa: N801 -- named like the torch.profiler.profile it wraps
    """Profile the block (CPU, and CUDA where available); the trace is ``.trace`` after exit, its
    overlapping slices split onto lanes.

    Usage::

        with profile("trace.json.gz", warmup=1) as prof:
            for batch in batches:
                train_step(batch)
                prof.step()

    Args:
        path: ``.json``, ``.json.gz`` or ``.pftrace`` (needs ``perfetto``) to write, or ``None``.
        warmup: ``prof.step()`` calls profiled, then discarded (the profiler's start-up cost).
        with_stack: record Python frames (``python_function`` slices).
    """

    def __init__(self, path: str | os.PathLike | None, *, warmup: int = 0, with_stack: bool = False) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None and self.path.suffix == ".pftrace":
            _perfetto_builder()  # fail now, not after the profiled work
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        # A schedule even without warm-up: torch writes ProfilerStep#N ranges only under one.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            schedule = torch.profiler.schedule(wait=0, warmup=warmup, active=2**31 - 1, repeat=1)
        self._profiler = torch.profiler.profile(activities=activities, schedule=schedule, with_stack=with_stack)
        self.warmup, self.steps = warmup, 0
        self.trace: Trace | None = None
        self._entered = False

    def __enter__(self) -> profile:
        # Entering torch's profiler twice crashes the interpreter (a segmentation fault).
        if self._entered:
            raise RuntimeError("profile: a profile records one block; make a new profile(...) for another")
        self._entered = True
        self._profiler.__enter__()
        return self

    def step(self) -> None:
        """Mark the end of one step (a ``ProfilerStep#N`` range in the trace)."""
        self.steps += 1
        self._profiler.step()

    def __exit__(self, *exc: object) -> None:
        self._profiler.__exit__(*exc)
        if exc[0] is not None:
            return
        if self.warmup and self.steps <= self.warmup:
            raise ValueError(f"profile: warmup={self.warmup} discards the first {self.warmup} steps, but the block "
                             f"called step() {self.steps} times, so nothing was recorded")
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "trace.json"
            self._profiler.export_chrome_trace(str(raw))
            self.trace = split_overlapping_lanes(json.loads(raw.read_text()))
        if self.path is not None:
            save_trace(self.trace, self.path)


def load_trace(path: str | os.PathLike) -> Trace:
    """Read Chrome trace JSON (``.json``, ``.json.gz``); the array form comes back as ``{"traceEvents": [...]}``."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        trace = json.load(file)
    return {"traceEvents": trace} if isinstance(trace, list) else trace


def save_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` as ``.json``, ``.json.gz`` (``mtime=0``: same trace, same bytes) or ``.pftrace``."""
    path = Path(path)
    data = perfetto_protobuf(trace) if path.suffix == ".pftrace" else json.dumps(trace).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


def check_trace(trace: object, where: str) -> None:
    """Refuse what is not a trace dict: a path is the usual mistake."""
    if not isinstance(trace, dict):
        raise TypeError(f"{where}: trace must be a Chrome trace dict with a 'traceEvents' list, got "
                        f"{type(trace).__name__} (a path? load it with load_trace(path) first)")


def _slices(events: list[dict]) -> list[dict]:
    # Complete slices: an event without ts or dur cannot be placed in time.
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _thread_names(events: list[dict]) -> dict[tuple, Any]:
    return {(e.get("pid"), e.get("tid")): (e.get("args") or {}).get("name")
            for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def split_overlapping_lanes(trace: Trace) -> Trace:
    """A copy of ``trace`` where no two complete slices on one track overlap without nesting: a slice
    that neither follows nor nests in what is open on a lane moves, with its flow arrows, to the next
    lane ``k`` (``tid = LANE_TID_BASE * k + tid``, named ``"<name> (lane k)"``)."""
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    names = _thread_names(events)
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for event in _slices(events):
        if isinstance(event.get("tid"), int):
            tracks[(event.get("pid"), event["tid"])].append(event)
    flow_ends: dict[tuple, list[dict]] = defaultdict(list)  # a CPU -> GPU arrow ends at the kernel's start
    for event in events:
        if event.get("ph") == "f":
            flow_ends[(event.get("pid"), event.get("tid"), event.get("ts"))].append(event)
    added: set[tuple] = set()
    for (pid, tid), slices in tracks.items():
        slices.sort(key=lambda e: (e["ts"], -e["dur"]))
        lanes: list[list[float]] = []  # per lane: the end times of its open slices
        for event in slices:
            start, end = event["ts"], event["ts"] + event["dur"]
            for lane, stack in enumerate(lanes):  # noqa: B007 - `lane` is read after the break
                while stack and stack[-1] <= start + TOLERANCE_US:
                    stack.pop()
                if not stack or end <= stack[-1] + TOLERANCE_US:
                    break
            else:
                lanes.append([])
                lane = len(lanes) - 1
            lanes[lane].append(end)
            if lane:
                for flow in flow_ends.get((pid, tid, event["ts"]), ()):
                    flow["tid"] = LANE_TID_BASE * lane + tid
                event["tid"] = LANE_TID_BASE * lane + tid
                if "stream" in (event.get("args") or {}):
                    event["args"]["lane"] = lane
                added.add((pid, tid, lane))
    for pid, tid, lane in sorted(added, key=str):
        base = names.get((pid, tid)) or f"thread {tid}"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": LANE_TID_BASE * lane + tid,
                       "args": {"name": f"{base} (lane {lane})"}})
    return out


def perfetto_protobuf(trace: Trace) -> bytes:
    """The complete slices as Perfetto TrackEvents, one track per ``(pid, tid)``, args as annotations."""
    builder = _perfetto_builder()
    events = trace["traceEvents"]
    names = _thread_names(events)
    uuids: dict[tuple, int] = {}
    for event in sorted(_slices(events), key=lambda e: e["ts"]):
        key = (event.get("pid"), event.get("tid"))
        if key not in uuids:
            uuids[key] = len(uuids) + 1
            packet = builder.add_packet()
            packet.track_descriptor.uuid = uuids[key]
            packet.track_descriptor.name = str(names.get(key, f"{key[0]}/{key[1]}"))
        for begin, stamp in ((True, event["ts"]), (False, event["ts"] + event["dur"])):
            packet = builder.add_packet()
            packet.timestamp = int(round(stamp * 1000))  # µs -> ns
            packet.trusted_packet_sequence_id = 1
            track_event = packet.track_event
            track_event.track_uuid = uuids[key]
            if begin:
                track_event.type = track_event.TYPE_SLICE_BEGIN
                track_event.name = str(event.get("name", ""))
                for arg, value in (event.get("args") or {}).items():
                    annotation = track_event.debug_annotations.add()
                    annotation.name = str(arg)
                    annotation.string_value = str(value)
            else:
                track_event.type = track_event.TYPE_SLICE_END
    return builder.serialize()


def _perfetto_builder():
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder  # the optional [perfetto] extra

    return TraceProtoBuilder()
