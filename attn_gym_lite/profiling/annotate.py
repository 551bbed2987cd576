"""Putting region labels on the kernels of a replay trace, and one box per region per replay.

:func:`annotate_trace` joins what :func:`~attn_gym_lite.profiling.record_annotations` recorded
at capture time to the device events of a profiled replay:

* graph-node-id route: each replayed kernel/memcpy/memset event carries ``graph id`` and
  ``graph node id`` (torch >= 2.14, CUDA >= 13.1); the label is looked up by
  ``(graph id << 32) | graph node id``. Node id 0 is a valid id like any other.
* capture-order route: the device events of one ``cudaGraphLaunch`` (same ``correlation``)
  are, in start order, the graph's nodes in capture order. The launch is matched to a captured
  graph by its sequence of event kinds; if several graphs fit, a ``record_function`` range
  around the replay named after one of them decides, and if none does but all candidates carry
  the same labels (the buckets of one function), those labels are used.

Labelled events get ``args["region"]``; events with no label keep their fields, except that the
result is passed through :func:`split_overlapping_lanes`, which may move an overlapping slice
onto an extra lane of its track.
Kernels launched eagerly in the same trace (an eager optimizer step, or a whole eager run) are
labelled from the regions open around their launch, with the same backward rule as at capture.
For every replay and stream, each region gets one box spanning its first to last event, on
a "regions" track beside the stream, so Perfetto and :func:`plot_timeline` show the structure.

Source: the seed article, "Small Digression into profiling" (labelled graph traces), and torch's
``_annotate_cuda_graph_trace`` post-processor, whose node-id join this mirrors.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .record import (
    DEVICE_CATEGORIES,
    GRAPH_NODE_ID,
    GraphAnnotations,
    check_annotations,
    enclosing_ranges,
    launch_kind,
    launch_labels,
)
from .trace import LANE_TID_BASE, Trace, check_slices, check_trace, split_overlapping_lanes

REGION_TRACK_OFFSET = 500_000  # the region boxes of stream ``s`` live on tid ``REGION_TRACK_OFFSET + s``
REGION_CATEGORY = "graph_region"


def annotate_trace(trace: Trace, annotations: GraphAnnotations, extra_regions: Iterable[str] = ()) -> Trace:
    """A copy of ``trace`` with region labels on replayed device events and region boxes added.

    Args:
        trace: a Chrome trace dict of one or more graph replays (as :class:`profile` writes).
        annotations: what :func:`record_annotations` recorded when the graphs were captured.
        extra_regions: further region names for labelling eager kernels, for regions that were
            not entered while recording (e.g. ``mark_kernels("optimizer")`` around an eager step).

    Returns:
        The annotated copy (``trace`` itself is not modified). Its ``"attn_gym_lite"`` entry
        reports ``{"route", "labelled_events", "replays", "unmatched_replays": [{"correlation",
        "events", "reason"}, ...], "labelled_eager_events"}``.

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict: not a dict, ``traceEvents`` missing
            or not a list (:func:`~attn_gym_lite.profiling.trace.check_trace`); an event that is
            not a dict, or a malformed complete slice
            (:func:`~attn_gym_lite.profiling.trace.check_slices`; the message names the event).
        TypeError: ``annotations`` is not a ``GraphAnnotations``, or one whose fields are not of
            the documented form
            (:func:`~attn_gym_lite.profiling.record.check_annotations`); ``extra_regions`` is a
            str or not an iterable of non-empty str.
        ValueError: ``annotations.route`` is not a known route, or ``trace`` is already
            annotated; a device event's ``args["graph node id"]`` (or ``"graph id"``) is not an
            integer (graph-node-id route).
    """
    check_trace(trace, "annotate_trace")
    check_slices(trace, None, "annotate_trace")
    check_annotations(annotations, "annotate_trace")
    # A str would be its letters, a number fail only when an eager kernel needs the regions.
    if isinstance(extra_regions, str) or not isinstance(extra_regions, Iterable):
        raise TypeError(f"annotate_trace: extra_regions must be an iterable of region names (str), got {extra_regions!r:.80}")
    extra_regions = list(extra_regions)
    if not all(isinstance(name, str) and name for name in extra_regions):
        raise TypeError(f"annotate_trace: extra_regions must be an iterable of region names (non-empty str), "
                        f"got {extra_regions!r:.80}")
    if "attn_gym_lite" in trace or any(e.get("cat") == REGION_CATEGORY for e in trace["traceEvents"]):
        raise ValueError("annotate_trace: trace is already annotated (it has region boxes); pass the stock trace")
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    for event in events:
        if not isinstance(event.get("args"), dict):
            event["args"] = {}
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X" and "dur" in e and "ts" in e]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("name") == "cudaGraphLaunch" and e.get("ph") == "X" and "ts" in e and "correlation" in e["args"]
    }
    by_launch: dict[Any, list[dict]] = defaultdict(list)
    for event in device:
        correlation = event["args"].get("correlation")
        if correlation in launches:
            by_launch[correlation].append(event)
    report = {"route": annotations.route, "labelled_events": 0, "replays": len(by_launch), "unmatched_replays": [],
              "labelled_eager_events": 0}
    if annotations.route == GRAPH_NODE_ID:
        for event in device:
            args = event.get("args", {})
            if "graph node id" not in args:
                continue
            try:
                node = int(args["graph node id"])
                key = node if node >= 1 << 32 else (int(args.get("graph id", 0)) << 32) | node
            except (TypeError, ValueError):
                raise ValueError(
                    f"annotate_trace: a {event.get('cat')} event's args 'graph node id' and 'graph id' must be "
                    f"integers, got {args.get('graph node id')!r} and {args.get('graph id', 0)!r}"
                ) from None
            if key in annotations.nodes:
                args["region"] = annotations.nodes[key]
                report["labelled_events"] += 1
    else:
        stacks = enclosing_ranges(events, list(launches.values()))
        enclosing = {c: {r["name"] for r in stacks.get(id(launch), [])} for c, launch in launches.items()}
        for correlation, replay in by_launch.items():
            replay.sort(key=lambda e: e["ts"])
            labels, reason = _match(replay, annotations.graphs, enclosing.get(correlation, set()))
            if labels is None:
                report["unmatched_replays"].append({"correlation": correlation, "events": len(replay), "reason": reason})
                continue
            for event, label in zip(replay, labels):
                if label is not None:
                    event["args"]["region"] = label
                    report["labelled_events"] += 1
    # Eager work in the same trace: a kernel launched inside a region's range gets its label too.
    launched = {e["args"]["correlation"]: e for e in events if launch_kind(e) and "ts" in e and "correlation" in e["args"]}
    eager = [e for e in device if e["args"].get("correlation") in launched and "region" not in e["args"]]
    if eager:
        regions = annotations.regions | set(extra_regions)
        labels = launch_labels(events, [launched[e["args"]["correlation"]] for e in eager], regions)
        for event in eager:
            label = labels[id(launched[event["args"]["correlation"]])]
            if label is not None:
                event["args"]["region"] = label
                report["labelled_eager_events"] += 1
    events.extend(_region_boxes(by_launch, events))
    out["attn_gym_lite"] = report
    return split_overlapping_lanes(out)


def _match(replay: list[dict], graphs: list[dict], around: set[str]) -> tuple[list | None, str]:
    """The labels of the captured graph this replay ran, or ``(None, reason)``."""
    if len({_stream(e) for e in replay}) > 1:
        return None, "the replay ran on several streams: its order is not the capture order"
    kinds = [DEVICE_CATEGORIES[e["cat"]] for e in replay]
    candidates = [g for g in graphs if [op[0] for op in g["ops"]] == kinds]
    if not candidates:
        return None, f"no captured graph has these {len(kinds)} nodes"
    named = [g for g in candidates if g["name"] in around]
    if len(named) == 1:
        candidates = named
    label_sets = {tuple(op[1] for op in g["ops"]) for g in candidates}
    if len(label_sets) > 1:
        names = [g["name"] for g in candidates]
        return None, f"ambiguous: graphs {names} fit; replay inside record_function(<name>) to choose"
    return [op[1] for op in candidates[0]["ops"]], ""


def _region_boxes(by_launch: dict[Any, list[dict]], events: list[dict]) -> list[dict]:
    """One box per (replay, stream, region), on a regions track per stream, with its name."""
    boxes, tracks = [], {}
    for correlation, replay in by_launch.items():
        spans: dict[tuple, list[float]] = {}
        for event in replay:
            region = event["args"].get("region")
            stream = _stream(event)
            if region is None or not isinstance(stream, int):  # boxes need an integer stream id
                continue
            key = (event.get("pid"), stream, region)
            start, end = event["ts"], event["ts"] + event.get("dur", 0)
            span = spans.setdefault(key, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        for (pid, stream, region), (start, end) in spans.items():
            tid = REGION_TRACK_OFFSET + stream
            tracks[(pid, tid)] = stream
            boxes.append({"ph": "X", "cat": REGION_CATEGORY, "name": region, "pid": pid, "tid": tid,
                          "ts": start, "dur": end - start,
                          "args": {"region": region, "stream": stream, "correlation": correlation}})
    for (pid, tid), stream in sorted(tracks.items(), key=str):
        boxes.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                      "args": {"name": f"stream {stream} regions"}})
    return boxes


def _stream(event: dict) -> object:
    """The CUDA stream of a device event, also after it was moved onto an extra lane."""
    tid = event.get("tid")
    return event.get("args", {}).get("stream", tid % LANE_TID_BASE if isinstance(tid, int) else tid)
