"""Region labels on the kernels of a replay trace, and one box per region per replay.

Capture order: the device events of one ``cudaGraphLaunch`` are, in start order, the graph's nodes;
the replay is matched to a captured graph by its sequence of event kinds, where several fit by a
``record_function`` range around the replay named after one, or by their labels being the same.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

from .record import DEVICE_CATEGORIES, GRAPH_NODE_ID, GraphAnnotations, enclosing_ranges, launch_kind, launch_labels
from .trace import LANE_TID_BASE, Trace, split_overlapping_lanes

REGION_TRACK_OFFSET = 500_000  # the region boxes of stream s live on tid REGION_TRACK_OFFSET + s
REGION_CATEGORY = "graph_region"


def annotate_trace(trace: Trace, annotations: GraphAnnotations) -> Trace:
    """A copy of ``trace`` with ``args["region"]`` on the device events it can label, and boxes.

    Replayed kernels get their labels from ``annotations`` (``record_annotations``); kernels
    launched eagerly in the trace from the regions open around their launch. Each region gets a box
    per replay and stream on a "stream <s> regions" track. The ``"attn_gym_lite"`` entry reports
    ``{"route", "labelled_events", "replays", "unmatched_replays", "labelled_eager_events"}``.
    """
    out = copy.deepcopy(trace)
    events = out["traceEvents"]
    for event in events:
        event.setdefault("args", {})
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X" and "dur" in e and "ts" in e]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("name") == "cudaGraphLaunch" and "ts" in e and "correlation" in e["args"]}
    by_launch: dict[Any, list[dict]] = defaultdict(list)
    for event in device:
        if event["args"].get("correlation") in launches:
            by_launch[event["args"]["correlation"]].append(event)
    report = {"route": annotations.route, "labelled_events": 0, "replays": len(by_launch), "unmatched_replays": [],
              "labelled_eager_events": 0}
    if annotations.route == GRAPH_NODE_ID:
        for event in device:
            args = event["args"]
            if "graph node id" in args:
                node = int(args["graph node id"])
                key = node if node >= 1 << 32 else (int(args.get("graph id", 0)) << 32) | node
                if key in annotations.nodes:
                    args["region"] = annotations.nodes[key]
                    report["labelled_events"] += 1
    else:
        stacks = enclosing_ranges(events, list(launches.values()))
        for correlation, replay in by_launch.items():
            replay.sort(key=lambda e: e["ts"])
            around = {r["name"] for r in stacks.get(id(launches[correlation]), [])}
            labels, reason = _match(replay, annotations.graphs, around)
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
    labels = launch_labels(events, [launched[e["args"]["correlation"]] for e in eager], annotations.regions)
    for event in eager:
        label = labels[id(launched[event["args"]["correlation"]])]
        if label is not None:
            event["args"]["region"] = label
            report["labelled_eager_events"] += 1
    events.extend(_region_boxes(by_launch))
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
    if len({tuple(op[1] for op in g["ops"]) for g in candidates}) > 1:
        return None, f"ambiguous: graphs {[g['name'] for g in candidates]} fit; replay inside record_function(<name>) to choose"
    return [op[1] for op in candidates[0]["ops"]], ""


def _region_boxes(by_launch: dict[Any, list[dict]]) -> list[dict]:
    """One box per (replay, stream, region) on a regions track per stream, and the tracks' names."""
    boxes, tracks = [], {}
    for correlation, replay in by_launch.items():
        spans: dict[tuple, list[float]] = {}
        for event in replay:
            region, stream = event["args"].get("region"), _stream(event)
            if region is None or not isinstance(stream, int):  # a track needs an integer stream id
                continue
            start, end = event["ts"], event["ts"] + event["dur"]
            span = spans.setdefault((event.get("pid"), stream, region), [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        for (pid, stream, region), (start, end) in spans.items():
            tid = REGION_TRACK_OFFSET + stream
            tracks[(pid, tid)] = stream
            boxes.append({"ph": "X", "cat": REGION_CATEGORY, "name": region, "pid": pid, "tid": tid, "ts": start,
                          "dur": end - start, "args": {"region": region, "stream": stream, "correlation": correlation}})
    for (pid, tid), stream in sorted(tracks.items(), key=str):
        boxes.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"stream {stream} regions"}})
    return boxes


def _stream(event: dict) -> object:
    """The CUDA stream of a device event, also after it was moved onto an extra lane."""
    tid = event.get("tid")
    return event["args"].get("stream", tid % LANE_TID_BASE if isinstance(tid, int) else tid)
