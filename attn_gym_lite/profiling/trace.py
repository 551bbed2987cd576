"""Recording a profiler trace and writing it where a viewer can open it.

A thin layer over ``torch.profiler.profile``: CPU and CUDA activities, optional warm-up steps,
and on exit the trace as a plain ``dict`` (the Chrome trace-event JSON the profiler exports)
written to ``.json``, ``.json.gz`` or Perfetto's native protobuf (``.pftrace``).

One repair happens on the way out. Chrome JSON lets two complete (``"ph": "X"``) slices on one
track overlap without nesting, which happens on GPU streams (CUPTI timestamps of back-to-back
graph kernels can overlap by a few hundred nanoseconds) and on the region boxes we add later.
Perfetto draws a track as a stack of nested slices and hides a slice that does not fit, so
:func:`split_overlapping_lanes` moves each such slice onto an extra lane of the same stream.

Source: ``torch.profiler`` documentation; the Chrome trace-event format ("Trace Event Format",
Google); Perfetto's TrackEvent protobuf.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from ..checks import check_bool, check_file, check_folder, check_int, check_path, check_real

Trace = dict[str, Any]
SUFFIXES = (".json", ".json.gz", ".pftrace")
LANE_TID_BASE = 1_000_000  # extra lanes of track ``tid`` get tid ``LANE_TID_BASE * lane + tid``
TOLERANCE_US = 1e-3  # slices that overlap by less than this (float rounding) count as touching
_PLAIN_NUMBERS = (int, float)  # bool is its own type: it takes the slow path and is refused


class profile:  # noqa: N801 -- a context manager named like the torch.profiler.profile it wraps
    """Profile the block (CPU activity, and CUDA where a GPU is available); write the trace to
    ``path`` on exit.

    Usage::

        with profile("trace.json.gz", warmup=1) as prof:
            for batch in batches:
                train_step(batch)
                prof.step()
        prof.trace  # the trace as a dict, as written

    Args:
        path: where to write: ``.json`` or ``.json.gz`` (Chrome trace-event JSON) or
            ``.pftrace`` (Perfetto native protobuf; needs the ``perfetto`` package). ``None``
            keeps the trace in memory only.
        warmup: steps (``prof.step()`` calls) profiled and then discarded before recording, as
            in ``torch.profiler.schedule(warmup=...)``: the profiler's own start-up cost lands
            there instead of in the first recorded step. ``0`` records from the start.
        split_lanes: move overlapping, non-nested slices onto extra lanes
            (:func:`split_overlapping_lanes`) so Perfetto shows every one.
        record_shapes, with_stack: passed to ``torch.profiler.profile``.

    Attributes:
        trace: the trace ``dict`` after exit (``{"traceEvents": [...], ...}``).

    Raises:
        TypeError: ``path`` is not ``None``, a str or an ``os.PathLike``; ``warmup`` is not an
            integer (numpy's included; not a bool); ``split_lanes``, ``record_shapes`` or
            ``with_stack`` is not a bool (at construction).
        FileNotFoundError: ``path`` is a directory, or its folder is a file (at construction).
        ValueError: ``path`` has another suffix, or ``warmup`` < 0 (at construction);
            ``warmup`` > 0 and no step after the warm-up ones (at exit).
        ImportError: a ``.pftrace`` path without the ``perfetto`` package (at construction).
        RuntimeError: the block is entered a second time (nested, or after it ended: a profile
            records one block; make a new one), or ``step()`` is called outside the block.
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        *,
        warmup: int = 0,
        split_lanes: bool = True,
        record_shapes: bool = False,
        with_stack: bool = False,
    ) -> None:
        self.path = None if path is None else _check_output_path("profile: path", path)
        warmup = check_int("profile: warmup", warmup, minimum=0)
        for argument, value in (("split_lanes", split_lanes), ("record_shapes", record_shapes),
                                ("with_stack", with_stack)):
            check_bool(f"profile: {argument}", value)
        if self.path is not None and self.path.suffix == ".pftrace":
            _perfetto_builder()  # fail now, not after the profiled work has run
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # A schedule even without warm-up: torch writes ProfilerStep#N ranges only under one.
        # Record every step after the warm-up ones, up to exit.
        with warnings.catch_warnings():  # warmup=0 is the caller's choice, not a mistake
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            schedule = torch.profiler.schedule(wait=0, warmup=warmup, active=2**31 - 1, repeat=1)
        self._profiler = torch.profiler.profile(
            activities=activities, schedule=schedule, record_shapes=record_shapes, with_stack=with_stack
        )
        self.warmup, self.steps = warmup, 0
        self.split_lanes = split_lanes
        self.trace: Trace | None = None
        self._state = "new"  # -> "recording" -> "done": torch's profiler records one block

    def __enter__(self) -> profile:
        if self._state != "new":
            # Nested, torch's profiler crashed the interpreter (a segmentation fault); after the
            # block, it went on counting steps, so a warm-up was not discarded again.
            raise RuntimeError(
                f"profile: this profile is {'already recording' if self._state == 'recording' else 'done'}; "
                f"a profile records one block: make a new profile(...) for another"
            )
        self._profiler.__enter__()
        self._state = "recording"
        return self

    def step(self) -> None:
        """Mark the end of one step (a ``ProfilerStep#N`` range in the trace).

        Raises:
            RuntimeError: called outside the ``with`` block.
        """
        if self._state != "recording":
            raise RuntimeError(f"profile: step() belongs inside the with block, but the profile is {self._state}")
        self.steps += 1
        self._profiler.step()

    def __exit__(self, *exc: object) -> None:
        self._state = "done"
        self._profiler.__exit__(*exc)
        if exc[0] is not None:
            return
        if self.warmup and self.steps <= self.warmup:
            raise ValueError(
                f"profile: warmup={self.warmup} discards the first {self.warmup} steps, but the block "
                f"called step() {self.steps} times, so nothing was recorded; call prof.step() after "
                f"each step, or lower warmup"
            )
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "trace.json"
            self._profiler.export_chrome_trace(str(raw))
            self.trace = json.loads(raw.read_text())
        if self.split_lanes:
            self.trace = split_overlapping_lanes(self.trace)
        if self.path is not None:
            save_trace(self.trace, self.path)


def load_trace(path: str | os.PathLike) -> Trace:
    """Read a Chrome trace-event JSON file (``.json`` or ``.json.gz``) into a trace dict.

    The file holds either the object form :func:`save_trace` and :class:`profile` write,
    ``{"traceEvents": [event, ...], ...}``, or the trace-event format's array form, a bare
    ``[event, ...]``, returned as ``{"traceEvents": [...]}``: either way the result is what
    :func:`~attn_gym_lite.profiling.annotate_trace` and :func:`split_overlapping_lanes` take.
    Each event must be a JSON object.

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike``.
        FileNotFoundError: no file at ``path``, or a directory (the message says which).
        ValueError: another suffix (a ``.pftrace`` cannot be read back here); a file that is not
            gzip (``.json.gz``), not UTF-8 or not JSON (the message names the path, and the line
            and column of a JSON error); JSON that is not a trace: neither a dict with a
            ``"traceEvents"`` list nor a list, or an event that is not an object.
    """
    path = check_path("path", path)
    gzipped = path.name.endswith(".json.gz")
    if not gzipped and path.suffix != ".json":
        raise ValueError(f"load_trace: path must end with .json or .json.gz, got {str(path)!r}")
    path = check_file("path", path)
    where = f"load_trace: path={str(path)!r}"
    try:
        if gzipped:
            with gzip.open(path, "rt", encoding="utf-8") as file:
                trace = json.load(file)
        else:
            trace = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{where} must hold Chrome trace-event JSON, but it is not JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}"
        ) from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as error:
        kind = "a gzip-compressed" if gzipped else "a UTF-8"
        raise ValueError(f"{where} must be {kind} Chrome trace-event JSON file: {error}") from None
    expected = "a Chrome trace: a dict with a 'traceEvents' list of event objects, or a list of event objects"
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    elif not isinstance(trace, dict):
        raise ValueError(f"{where} must hold {expected}, got {type(trace).__name__} {trace!r:.60}")
    elif "traceEvents" not in trace:
        keys = sorted(map(str, trace))
        raise ValueError(f"{where} must hold {expected}, got a dict without 'traceEvents' (keys {keys[:8]})")
    events = trace["traceEvents"]
    if not isinstance(events, list):
        raise ValueError(f"{where} must hold {expected}, got 'traceEvents' of type {type(events).__name__}")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise ValueError(
                f"{where} must hold {expected}, got event {i} of type {type(event).__name__}: {event!r:.60}"
            )
    return trace


def _check_output_path(argument: str, path: object) -> Path:
    """``path`` as a :class:`Path` a trace can be written to: a known suffix, not a directory,
    its folder a folder (or not there yet: the writer makes it)."""
    path = check_path(argument, path)
    if not path.name.endswith(SUFFIXES):
        raise ValueError(f"{argument} must end with one of {SUFFIXES}, got {str(path)!r}")
    if path.is_dir():
        raise FileNotFoundError(f"{argument}={str(path)!r} is a directory, expected a file")
    for folder in (path.parent, *path.parent.parents):  # the first one that exists must be a folder
        if folder.exists():
            check_folder(f"{argument}'s folder", folder)
            break
    return path


def save_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` as Chrome JSON (``.json``, ``.json.gz``) or Perfetto protobuf (``.pftrace``).

    Gzip output is written with ``mtime=0``, so the same trace gives the same bytes. Missing
    folders on the way are made, after every check has passed (a refused call leaves no folder
    behind).

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict, or has a malformed slice
            (:func:`~attn_gym_lite.profiling.trace.check_trace`,
            :func:`~attn_gym_lite.profiling.trace.check_slices`); ``trace`` holds a value JSON
            cannot write (TypeError, the message names ``trace``).
        TypeError: ``path`` is not a str or ``os.PathLike``.
        ValueError: another suffix.
        FileNotFoundError: ``path`` is a directory, or a file stands where a folder of it should be.
        ImportError: ``.pftrace`` without the ``perfetto`` package (``pip install perfetto``).
    """
    check_trace(trace, "save_trace")
    check_slices(trace, None, "save_trace")
    path = _check_output_path("save_trace: path", path)
    if path.suffix == ".pftrace":
        data = perfetto_protobuf(trace)
    else:
        try:
            data = json.dumps(trace).encode()
        except (TypeError, ValueError) as error:  # e.g. a tensor in an event's args
            raise TypeError(f"save_trace: trace must hold only JSON values, got {error}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".json.gz"):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


def split_overlapping_lanes(trace: Trace) -> Trace:
    """A copy of ``trace`` where no two complete slices on one track overlap without nesting.

    Per track ``(pid, tid)``, slices are placed in start order (longer first on ties) on the
    first lane where they either start after everything open has ended or nest inside the
    innermost open slice; a slice that fits nowhere opens a new lane. Lane 0 keeps the track's
    ``tid``; lane ``k`` gets ``tid = LANE_TID_BASE * k + tid`` and a ``thread_name`` of
    ``"<name> (lane k)"``. Non-slice events and the input are left unchanged.

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict: not a dict, ``traceEvents`` missing
            or not a list (:func:`~attn_gym_lite.profiling.trace.check_trace`); an event that is
            not a dict, or a complete slice with a ``ts`` that is not a finite real number, a
            ``dur`` that is not one >= 0, or ``args`` that are not a dict
            (:func:`~attn_gym_lite.profiling.trace.check_slices`; the message names the event).
            A slice without ``ts`` or ``dur`` is incomplete and stays where it is.
    """
    check_trace(trace, "split_overlapping_lanes")
    check_slices(trace, None, "split_overlapping_lanes")
    out = copy.deepcopy(trace)
    events = out.get("traceEvents", [])
    names = {
        (e.get("pid"), e.get("tid")): _metadata_name(e)
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and "dur" in event and "ts" in event and isinstance(event.get("tid"), int):
            tracks[(event.get("pid"), event["tid"])].append(event)
    # The end of a CPU -> GPU flow arrow sits on the kernel's track at its start: it moves with it.
    flow_ends: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "f":
            flow_ends[(event.get("pid"), event.get("tid"), event.get("ts"))].append(event)
    added_lanes: set[tuple] = set()
    for (pid, tid), slices in tracks.items():
        slices.sort(key=lambda e: (e["ts"], -e["dur"]))
        lanes: list[list[float]] = []  # per lane: stack of end times of open slices
        for event in slices:
            start, end = event["ts"], event["ts"] + event["dur"]
            for lane, stack in enumerate(lanes):  # noqa: B007 - `lane` is read after the break
                # Timestamps near 5e12 µs carry ~1e-3 µs of float error: touching is not overlapping.
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
                if isinstance(event.get("args"), dict) and "stream" in event["args"]:
                    event["args"]["lane"] = lane
                added_lanes.add((pid, tid, lane))
    for pid, tid, lane in sorted(added_lanes, key=str):
        base = names.get((pid, tid)) or f"thread {tid}"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": LANE_TID_BASE * lane + tid,
                       "args": {"name": f"{base} (lane {lane})"}})
    return out


def _metadata_name(event: dict) -> object:
    """The ``args["name"]`` of a metadata event; ``None`` where its ``args`` are not a dict."""
    args = event.get("args")
    return args.get("name") if isinstance(args, dict) else None


def perfetto_protobuf(trace: Trace) -> bytes:
    """Encode the complete slices of a Chrome trace as Perfetto TrackEvent protobuf bytes.

    Each ``(pid, tid)`` becomes a track named after its ``thread_name`` (or ``"pid/tid"``);
    each ``"X"`` slice a begin/end pair on it, its ``args`` as debug annotations. Overlapping
    slices should be split onto lanes first (:func:`split_overlapping_lanes`).

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict: not a dict, ``traceEvents`` missing
            or not a list (:func:`~attn_gym_lite.profiling.trace.check_trace`); a malformed slice
            (:func:`~attn_gym_lite.profiling.trace.check_slices`).
        ImportError: the ``perfetto`` package is not installed.
    """
    check_trace(trace, "perfetto_protobuf")
    check_slices(trace, None, "perfetto_protobuf")
    builder = _perfetto_builder()
    events = trace.get("traceEvents", [])
    names = {
        (e.get("pid"), e.get("tid")): str(_metadata_name(e))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    sequence_id = 1
    uuids: dict[tuple, int] = {}
    slices = sorted((e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e), key=lambda e: e["ts"])
    for event in slices:
        key = (event.get("pid"), event.get("tid"))
        if key not in uuids:
            uuids[key] = len(uuids) + 1
            packet = builder.add_packet()
            packet.track_descriptor.uuid = uuids[key]
            packet.track_descriptor.name = names.get(key, f"{key[0]}/{key[1]}")
        for phase, stamp in (("begin", event["ts"]), ("end", event["ts"] + event["dur"])):
            packet = builder.add_packet()
            packet.timestamp = int(round(stamp * 1000))  # µs -> ns
            packet.trusted_packet_sequence_id = sequence_id
            track_event = packet.track_event
            track_event.track_uuid = uuids[key]
            if phase == "begin":
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
    try:
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("writing a .pftrace needs the perfetto package: pip install perfetto") from error
    return TraceProtoBuilder()


def check_trace(trace: object, where: str) -> None:
    """Raise unless ``trace`` is a Chrome trace dict (``{"traceEvents": [...]}``).

    Messages start with ``where`` (the public function's name), then
    ``trace must be <expectation>, got <value>``.

    Raises:
        TypeError: ``trace`` is not a dict (a path gets a hint to :func:`load_trace` it first), or
            its ``"traceEvents"`` is not a list.
        ValueError: a dict without ``"traceEvents"``.
    """
    if not isinstance(trace, dict):
        hint = " (a path? load it with load_trace(path) first)" if isinstance(trace, (str, os.PathLike)) else ""
        raise TypeError(
            f"{where}: trace must be a Chrome trace dict with a 'traceEvents' list, got "
            f"{type(trace).__name__}{hint}"
        )
    if "traceEvents" not in trace:
        keys = sorted(map(str, trace))
        shown = f"keys {keys[:8]}" + (f" and {len(keys) - 8} more" if len(keys) > 8 else "") if keys else "no keys"
        raise ValueError(
            f"{where}: trace must be a Chrome trace dict with a 'traceEvents' list, got a dict without "
            f"'traceEvents' ({shown})"
        )
    if not isinstance(trace["traceEvents"], list):
        raise TypeError(
            f"{where}: trace['traceEvents'] must be a list of trace events, got {type(trace['traceEvents']).__name__}"
        )


def check_slices(trace: Trace, categories: Collection[str] | None, where: str) -> None:
    """Raise unless every event of ``trace`` is a dict and every complete slice (``"ph": "X"``)
    of one of ``categories`` (``None``: of any category) that has a ``"ts"`` and a ``"dur"`` has a finite ``ts`` and a
    ``dur >= 0`` (µs), and ``"args"``, if present, a dict. Call :func:`check_trace` first.

    A slice without ``ts`` or ``dur`` is incomplete, not malformed: every reader here skips it
    (it cannot be placed on a timeline), as it always has; a value that is present but wrong is
    an error.

    Raises:
        TypeError: an event is not a dict; its ``cat`` or ``ph``, where present, not a string;
            a ``ts`` or ``dur`` that is not a real number
            (``None``, a string, a ``bool``); ``args`` that is not a dict. Messages name the event
            by its index, ``trace['traceEvents'][i]``.
        ValueError: a NaN or infinite ``ts``; a negative, NaN or infinite ``dur``.
    """
    for index, event in enumerate(trace["traceEvents"]):
        name = f"{where}: trace['traceEvents'][{index}]"
        if not isinstance(event, dict):
            raise TypeError(f"{name} must be a dict (a trace event), got {type(event).__name__} {event!r:.60}")
        # cat and ph are looked up in sets by every reader: a list there raised "unhashable type".
        for key in ("cat", "ph"):
            if key in event and not isinstance(event[key], str):
                raise TypeError(f"{name}['{key}'] must be a str, got {type(event[key]).__name__} {event[key]!r:.40}")
        if event.get("ph") != "X" or (categories is not None and event.get("cat") not in categories) or (
                "ts" not in event or "dur" not in event):
            continue
        ts, dur = event["ts"], event["dur"]
        if not (type(ts) in _PLAIN_NUMBERS and math.isfinite(ts)):  # fast path for the usual floats
            check_real(f"{name}['ts']", ts)
        if not (type(dur) in _PLAIN_NUMBERS and 0 <= dur < math.inf):
            check_real(f"{name}['dur']", dur, minimum=0.0)
        if "args" in event and not isinstance(event["args"], dict):
            raise TypeError(f"{name}['args'] must be a dict, got {type(event['args']).__name__} {event['args']!r:.60}")
