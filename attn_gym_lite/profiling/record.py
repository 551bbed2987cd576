"""Naming the kernels of a captured graph by region, on every torch the project supports.

A replay runs no Python, so labels are recorded while capturing and joined to the replay later.
Where torch's ``torch.cuda.graph_annotations`` works (torch >= 2.14, CUDA >= 13.1) it tags each node
and the profiler writes the node id on each replayed kernel: we delegate to it. Elsewhere (our H200:
torch 2.11, CUDA 13.0) we profile the capture: a launch on a capturing stream appears as a runtime
call with no device activity, inside the ranges open at that moment, so the capture trace lists
every node in order with its region; a graph captured from one stream replays in that order.
Backward kernels take the region of the forward op that created their autograd node
(``evaluate_function`` ranges carry its sequence number): "R backward".
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from ..graph.capture import capture_options
from ..regions import collect_region_names, native_annotations_available

CAPTURE_ORDER = "capture order"
GRAPH_NODE_ID = "graph node id"
EVALUATE_FUNCTION = "autograd::engine::evaluate_function"
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memset": "memset", "gpu_memcpy": "memcpy"}
HOST_OP_CATEGORIES = ("cpu_op", "user_annotation")  # torch operators and record_function ranges


@dataclasses.dataclass
class GraphAnnotations:
    """Region labels of the graphs captured inside one :func:`record_annotations` block.

    ``graphs`` (capture order): per graph ``{"name", "ops": [[kind, label], ...]}``, one op per node
    in capture order, ``kind`` ``"kernel"``/``"memset"``/``"memcpy"``, ``label`` a region or None.
    ``nodes`` (graph node id): ``(graph id << 32) | graph node id -> label``. ``region_names``:
    every ``mark_kernels`` name entered while recording, to label eager kernels of those regions.
    """

    route: str
    graphs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    nodes: dict[int, str] = dataclasses.field(default_factory=dict)
    region_names: list[str] = dataclasses.field(default_factory=list)

    @property
    def regions(self) -> set[str]:
        """``region_names`` and every region seen in the labels."""
        labels = {op[1] for graph in self.graphs for op in graph["ops"] if op[1]} | set(self.nodes.values())
        return {label.removesuffix(" backward") for label in labels if label != "backward"} | set(self.region_names)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the ids as strings), as the profiling suite records it."""
        return {"route": self.route, "graphs": self.graphs, "nodes": {str(k): v for k, v in self.nodes.items()},
                "region_names": sorted(self.region_names)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> GraphAnnotations:
        nodes = {int(key): label for key, label in record["nodes"].items()}
        return cls(record["route"], record["graphs"], nodes, record.get("region_names", []))


@contextmanager
def record_annotations(names: Sequence[str] | None = None) -> Iterator[GraphAnnotations]:
    """Record the region labels of every CUDA graph captured inside the block.

    Usage::

        with record_annotations(["train step"]) as annotations:
            graph, outputs = capture_graph(step)   # step uses mark_kernels(...)
        annotate_trace(replay_trace, annotations)

    ``names``: one per graph captured in the block, in capture order (a replay inside a
    ``record_function`` range of that name picks that graph where several fit); default
    ``"graph <i>"``. On the capture-order route the captures run under the profiler (slower).
    """
    route = GRAPH_NODE_ID if native_annotations_available() else CAPTURE_ORDER
    annotations = GraphAnnotations(route)
    with collect_region_names() as regions:
        if route == GRAPH_NODE_ID:
            module = torch.cuda.graph_annotations
            before = dict(module.get_kernel_annotations())
            with capture_options(enable_annotations=True):  # captures must ask torch for node ids
                yield annotations
            annotations.nodes = {int(tools_id): _native_label(entries)
                                 for tools_id, entries in module.get_kernel_annotations().items() if tools_id not in before}
        else:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            with torch.profiler.profile(activities=activities) as profiler:
                yield annotations
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # device records of non-captured launches must arrive
            with tempfile.TemporaryDirectory() as folder:
                raw = Path(folder) / "capture.json"
                profiler.export_chrome_trace(str(raw))
                trace = json.loads(raw.read_text())
            annotations.graphs = graphs_from_capture_trace(trace, regions, names)
        annotations.region_names = sorted(regions)


def _native_label(entries: list[Any]) -> str:
    """torch's annotation list for one node -> our label (the inner scope wins)."""
    merged: dict[str, Any] = {}
    for entry in entries:
        merged.update(entry if isinstance(entry, dict) else {"name": entry})
    name = str(merged.get("name", merged.get("str", "")))
    return f"{name} backward" if merged.get("autograd_phase") == "backward" else name


def launch_kind(event: dict) -> str | None:
    """The device work (a graph node, when capturing) a runtime/driver call puts on a stream, or ``None``."""
    name = event.get("name", "")
    if event.get("cat") not in ("cuda_runtime", "cuda_driver") or "HostFunc" in name:  # host nodes run no device event
        return None
    if name.startswith(("cudaLaunch", "cuLaunch")):
        return "kernel"
    if "Memset" in name:
        return "memset"
    if "Memcpy" in name and "Async" in name:
        return "memcpy"
    return None


def _args(event: dict) -> dict:
    return event.get("args") or {}


def graphs_from_capture_trace(trace: dict, regions: set[str], names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per capture (``cudaStreamBeginCapture`` to ``EndCapture``) in a profiled block, its launches that
    ran no device work (a launch on a capturing stream does not run), labelled, in time order."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    windows, paired = [], True  # (begin, end) of each capture, paired on the thread that made it
    for thread in {e.get("tid") for e in events if e.get("name") in ("cudaStreamBeginCapture", "cudaStreamEndCapture")}:
        begins = sorted(e["ts"] for e in events if e.get("name") == "cudaStreamBeginCapture" and e.get("tid") == thread)
        ends = sorted(e["ts"] for e in events if e.get("name") == "cudaStreamEndCapture" and e.get("tid") == thread)
        paired &= len(begins) == len(ends)
        windows += zip(begins, ends)
    windows.sort()
    # Overlapping captures (several threads at once) cannot be told apart: their launches mix.
    if not paired or any(b > e for b, e in windows) or any(
            later[0] < earlier[1] for earlier, later in zip(windows, windows[1:])):
        raise ValueError("graphs_from_capture_trace: capture begin/end events do not pair up into one capture "
                         "at a time; capture one graph at a time inside record_annotations")
    if names is not None and len(names) != len(windows):
        raise ValueError(f"graphs_from_capture_trace: names has {len(names)} entries but {len(windows)} graphs were captured")
    ran = {_args(e).get("correlation") for e in events if e.get("cat") in DEVICE_CATEGORIES} - {None}
    launches = sorted((e for e in events if launch_kind(e) and _args(e).get("correlation") not in ran
                       and any(b <= e["ts"] <= end for b, end in windows)), key=lambda e: e["ts"])
    labels = launch_labels(events, launches, set(regions))
    return [{"name": names[i] if names else f"graph {i}",
             "ops": [[launch_kind(e), labels[id(e)]] for e in launches if begin <= e["ts"] <= end]}
            for i, (begin, end) in enumerate(windows)]


def launch_labels(events: list[dict], launches: list[dict], regions: set[str]) -> dict[int, str | None]:
    """``id(launch) -> label``: the innermost enclosing region on the launching thread; inside
    autograd's ``evaluate_function`` ranges ``"<region> backward"`` for a node created by a forward
    op in ``<region>``, else ``"backward"``; ``None`` outside every region."""
    # A forward op carries the sequence number of the node it creates or, creating none, of the next
    # node: so a node's creator is the *last* forward op with its number.
    sequence_region: dict[int, str | None] = {}
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and "ts" in e and "dur" in e), key=lambda e: e["ts"])
    op_stacks = enclosing_ranges(events, ops)
    for op in ops:
        stack = op_stacks[id(op)]
        sequence = _args(op).get("Sequence number")
        if sequence is not None and not any(a["name"].startswith(EVALUATE_FUNCTION) for a in stack):
            sequence_region[sequence] = _innermost_region(stack, regions)
    stacks = enclosing_ranges(events, launches)
    return {id(launch): _label(stacks.get(id(launch), []), regions, sequence_region) for launch in launches}


def _label(stack: list[dict], regions: set[str], sequence_region: dict[int, str | None]) -> str | None:
    for ancestor in reversed(stack):  # the innermost evaluate_function decides
        if ancestor["name"].startswith(EVALUATE_FUNCTION):
            region = sequence_region.get(_args(ancestor).get("Sequence number"))
            return "backward" if region is None else f"{region} backward"
    return _innermost_region(stack, regions)


def _innermost_region(stack: list[dict], regions: set[str]) -> str | None:
    return next((a["name"] for a in reversed(stack) if a.get("cat") == "user_annotation" and a["name"] in regions), None)


def enclosing_ranges(events: list[dict], targets: list[dict]) -> dict[int, list[dict]]:
    """``id(target) -> [CPU ranges around it on its thread, outermost first]``, one sweep per thread."""
    ranges = defaultdict(list)
    for event in events:
        if event.get("cat") in HOST_OP_CATEGORIES and event.get("ph") == "X" and "dur" in event and "ts" in event:
            ranges[(event.get("pid"), event.get("tid"))].append(event)
    wanted = defaultdict(list)
    for target in targets:
        wanted[(target.get("pid"), target.get("tid"))].append(target)
    result: dict[int, list[dict]] = {}
    for thread, items in wanted.items():
        # Ranges before targets at equal start, so a range starting with its first launch encloses it.
        timeline = sorted([(r["ts"], 0, -r["dur"], i, r) for i, r in enumerate(ranges.get(thread, []))]
                          + [(t["ts"], 1, -t.get("dur", 0), i, t) for i, t in enumerate(items)], key=lambda row: row[:4])
        stack: list[dict] = []
        for _, is_target, _, _, event in timeline:
            end = event["ts"] + event.get("dur", 0)
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < end - 1e-3:  # ns rounding
                stack.pop()
            if is_target:
                result[id(event)] = list(stack)
            else:
                stack.append(event)
    return result
