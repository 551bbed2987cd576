"""Naming the kernels of a captured graph by region, on every torch the project supports.

Python does not run while a graph replays, so ``record_function`` ranges opened at capture time
never reach a replay trace: the trace shows the graph's kernels, each with its stream and the
correlation id of the ``cudaGraphLaunch`` that ran it, and nothing else. The labels have to be
recorded while capturing and joined to the replay afterwards. Two routes do that:

* **graph node id** (torch >= 2.14 with CUDA >= 13.1 and ``cuda-bindings``): torch's own
  ``torch.cuda.graph_annotations.mark_kernels`` tags every graph node a region adds, and the
  profiler writes ``graph id`` / ``graph node id`` on each replayed kernel. We delegate to it.
* **capture order** (everything else, e.g. torch 2.11 with CUDA 13.0 on our H200): we run the
  profiler *during the capture*. A launch made while a stream is capturing is recorded as a
  runtime/driver API event (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``cudaMemsetAsync``...)
  with no device activity, nested in the ``record_function`` ranges open at that moment. So the
  capture trace lists, in order, every node the graph got and the region that launched it. A
  graph captured from one stream is a chain, and a chain replays in exactly that order: the
  k-th device event of a replay is the k-th captured launch. The graph itself is untouched, so
  this route costs nothing at replay; it costs one profiled capture.

Backward kernels come out of autograd's ``evaluate_function: <Node>`` ranges, which carry the
*sequence number* of the forward op that created the node. A forward op inside region R
therefore labels its backward kernels "R backward"; backward kernels of nodes created outside
every region are labelled "backward".

What the capture-order route cannot do: label a graph whose capture forked onto several
streams (its replay order is not the capture order; :func:`annotate_trace` leaves such replays
unlabelled and reports them), or see launches made through APIs the profiler does not trace.

Source: ``torch.cuda.graph_annotations`` (torch 2.14 docs), and the probe on the H200 recorded
in ``FIELD-NOTES.md`` (capture-time launch events; replay events carry only stream and
correlation).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from ..checks import check_file, check_folder, check_keys, check_path
from ..graph.capture import capture_options
from ..regions import collect_region_names, native_annotations_available
from .trace import check_slices, check_trace

CAPTURE_ORDER = "capture order"
GRAPH_NODE_ID = "graph node id"
EVALUATE_FUNCTION = "autograd::engine::evaluate_function"
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memset": "memset", "gpu_memcpy": "memcpy"}
#: Trace categories of host-side ops: torch operators and record_function ranges (ProfilerStep# too).
HOST_OP_CATEGORIES = ("cpu_op", "user_annotation")


@dataclasses.dataclass
class GraphAnnotations:
    """Region labels of the graphs captured inside one :func:`record_annotations` block.

    Attributes:
        route: :data:`CAPTURE_ORDER` or :data:`GRAPH_NODE_ID`.
        graphs: capture-order route: one entry per captured graph, in capture order:
            ``{"name": str, "ops": [[kind, label], ...]}`` with ``kind`` one of ``"kernel"``,
            ``"memset"``, ``"memcpy"`` and ``label`` a region name or ``None``, one per graph
            node in the order the nodes were captured.
        nodes: graph-node-id route: ``tools id -> label``, where the tools id is
            ``(graph id << 32) | graph node id`` as the profiler writes them.
        region_names: every ``mark_kernels`` name entered inside the recording block (also
            regions that added no graph node, e.g. an eager optimizer step), so
            :func:`annotate_trace` can label eager kernels of those regions too.
    """

    route: str
    graphs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    nodes: dict[int, str] = dataclasses.field(default_factory=dict)
    region_names: list[str] = dataclasses.field(default_factory=list)

    @property
    def regions(self) -> set[str]:
        """Every region entered while recording (``region_names``), plus those seen in the labels."""
        labels = {op[1] for graph in self.graphs for op in graph["ops"] if op[1]} | set(self.nodes.values())
        seen = {label.removesuffix(" backward") for label in labels if label != "backward"}
        return seen | set(self.region_names)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tools ids as strings), e.g. to store beside a recorded trace."""
        return {"route": self.route, "graphs": self.graphs, "nodes": {str(k): v for k, v in self.nodes.items()},
                "region_names": sorted(self.region_names)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> GraphAnnotations:
        """The inverse of :meth:`to_dict`.

        Raises:
            TypeError / ValueError: ``record`` is not a dict with ``"route"``, ``"graphs"`` and
                ``"nodes"``, a ``nodes`` key is not an integer (as a string), or a field is not
                of the form :class:`GraphAnnotations` describes (:func:`check_annotations`).
        """
        where = "GraphAnnotations.from_dict: record"
        record = check_keys(where, record, ("route", "graphs", "nodes"))
        if not isinstance(record["nodes"], dict):
            raise TypeError(f"{where}['nodes'] must be a dict of tools id -> label, got {type(record['nodes']).__name__}")
        nodes = {}
        for key, label in record["nodes"].items():
            try:
                nodes[int(key)] = label
            except (TypeError, ValueError):
                raise ValueError(f"{where}['nodes'] keys must be integer tools ids, got {key!r}") from None
        annotations = cls(record["route"], record["graphs"], nodes, record.get("region_names", []))
        check_annotations(annotations, "GraphAnnotations.from_dict")
        return annotations

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as a JSON file.

        Raises:
            TypeError: ``path`` is not a str or ``os.PathLike``.
            FileNotFoundError: ``path`` is a directory, or its folder does not exist.
            TypeError / ValueError: the annotations are malformed (:func:`check_annotations`).
        """
        path = check_path("GraphAnnotations.save: path", path)
        if path.is_dir():
            raise FileNotFoundError(f"GraphAnnotations.save: path={str(path)!r} is a directory, expected a file")
        check_folder("GraphAnnotations.save: path's folder", path.parent)
        check_annotations(self, "GraphAnnotations.save")
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> GraphAnnotations:
        """Read what :meth:`save` wrote.

        Raises:
            TypeError: ``path`` is not a str or ``os.PathLike``.
            FileNotFoundError: no file at ``path``, or a directory.
            ValueError: the file is not JSON (the message names the path); TypeError / ValueError
                as :meth:`from_dict` for JSON that is not what :meth:`save` writes.
        """
        path = check_file("GraphAnnotations.load: path", path)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"GraphAnnotations.load: path={str(path)!r} must hold the JSON GraphAnnotations.save "
                             f"writes: {error}") from None
        return cls.from_dict(record)


def check_annotations(annotations: object, where: str) -> None:
    """Raise unless ``annotations`` is a :class:`GraphAnnotations` of the form it describes.

    Messages start with ``where`` and name the field (``annotations.graphs[0]['ops'][3]``).

    Raises:
        TypeError: not a ``GraphAnnotations``; ``graphs`` not a list of dicts with a str
            ``"name"`` and an ``"ops"`` list of ``[kind, label]`` pairs; ``nodes`` not a dict of
            int -> str; ``region_names`` not a list of str.
        ValueError: an unknown ``route``, or an op ``kind`` other than ``"kernel"``,
            ``"memset"``, ``"memcpy"``.
    """
    if not isinstance(annotations, GraphAnnotations):
        raise TypeError(
            f"{where}: annotations must be a GraphAnnotations (from record_annotations, or "
            f"GraphAnnotations.load(path)), got {type(annotations).__name__}"
        )
    if annotations.route not in (CAPTURE_ORDER, GRAPH_NODE_ID):
        raise ValueError(f"{where}: unknown annotations.route {annotations.route!r} "
                         f"(expected {CAPTURE_ORDER!r} or {GRAPH_NODE_ID!r})")
    kinds = tuple(DEVICE_CATEGORIES.values())
    graphs = annotations.graphs
    if not isinstance(graphs, list):
        raise TypeError(f"{where}: annotations.graphs must be a list of graphs, got {type(graphs).__name__}")
    for i, graph in enumerate(graphs):
        name = f"{where}: annotations.graphs[{i}]"
        if not (isinstance(graph, dict) and isinstance(graph.get("name"), str) and isinstance(graph.get("ops"), list)):
            raise TypeError(f"{name} must be a dict {{'name': str, 'ops': [[kind, label], ...]}}, got {graph!r:.80}")
        for j, op in enumerate(graph["ops"]):
            if not (isinstance(op, (list, tuple)) and len(op) == 2 and (op[1] is None or isinstance(op[1], str))):
                raise TypeError(f"{name}['ops'][{j}] must be a [kind, label] pair, label a str or None, got {op!r:.80}")
            if op[0] not in kinds:
                raise ValueError(f"{name}['ops'][{j}] kind must be one of {kinds}, got {op[0]!r}")
    nodes = annotations.nodes
    if not isinstance(nodes, dict) or not all(
            isinstance(k, int) and not isinstance(k, bool) and isinstance(v, str) for k, v in nodes.items()):
        raise TypeError(f"{where}: annotations.nodes must be a dict of int tools id -> str label, got {nodes!r:.80}")
    names = annotations.region_names
    if isinstance(names, str) or not isinstance(names, (list, tuple, set)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{where}: annotations.region_names must be a list of str, got {names!r:.80}")


def _check_names(where: str, names: object) -> None:
    """``names`` is ``None`` or a sequence of str (one graph name each), not a str."""
    if names is not None and (isinstance(names, str) or not isinstance(names, Sequence)
                              or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"{where}: names must be a list of strings (one per graph), got {names!r:.80}")


@contextmanager
def record_annotations(names: Sequence[str] | None = None) -> Iterator[GraphAnnotations]:
    """Record the region labels of every CUDA graph captured inside the block.

    Usage::

        with record_annotations(["train step"]) as annotations:
            graph, outputs = capture_graph(step)   # step uses mark_kernels(...)
        annotations.save("annotations.json")

    On the capture-order route the block runs under ``torch.profiler`` (CPU + CUDA), which
    slows the captures (measured in the "Profiling" chapter) and nothing after them.

    Args:
        names: one name per graph captured in the block, in capture order (the name a replay
            can be matched by: :func:`annotate_trace` prefers the graph whose name is a
            ``record_function`` range around the replay). Default ``"graph 0"``, ``"graph 1"``...

    Yields:
        A :class:`GraphAnnotations`, filled when the block exits.

    Raises:
        TypeError: ``names`` is not a list of strings (a str, or something not a sequence, is
            refused at entry).
        ValueError: ``names`` given, but a different number of graphs was captured.
        RuntimeError: another ``record_annotations`` block is already active.
    """
    _check_names("record_annotations", names)
    route = GRAPH_NODE_ID if native_annotations_available() else CAPTURE_ORDER
    annotations = GraphAnnotations(route)
    with collect_region_names() as regions:
        if route == GRAPH_NODE_ID:
            module = torch.cuda.graph_annotations
            before = dict(module.get_kernel_annotations())
            # Captures must ask torch to record the node ids: the capture machinery offers a hook.
            with capture_options(enable_annotations=True):
                yield annotations
            annotations.nodes = {
                int(tools_id): _native_label(entries)
                for tools_id, entries in module.get_kernel_annotations().items()
                if tools_id not in before
            }
            annotations.region_names = sorted(regions)
            return
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
    """torch's annotation list for one node -> our label (inner scope wins)."""
    merged: dict[str, Any] = {}
    for entry in entries:
        merged.update(entry if isinstance(entry, dict) else {"name": entry})
    name = str(merged.get("name", merged.get("str", "")))
    return f"{name} backward" if merged.get("autograd_phase") == "backward" else name


def launch_kind(event: dict) -> str | None:
    """``"kernel"``, ``"memset"`` or ``"memcpy"`` for a runtime/driver API event that puts work
    on a stream (and so becomes a graph node when the stream is capturing); ``None`` otherwise."""
    if event.get("cat") not in ("cuda_runtime", "cuda_driver"):
        return None
    name = event.get("name", "")
    if not isinstance(name, str):
        return None
    if "HostFunc" in name:  # a host node: no device event at replay
        return None
    if name.startswith(("cudaLaunch", "cuLaunch")):
        return "kernel"
    if "Memset" in name:
        return "memset"
    if "Memcpy" in name and "Async" in name:
        return "memcpy"
    return None


def graphs_from_capture_trace(
    trace: dict, regions: set[str] | Sequence[str], names: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The capture-order annotations of every graph captured in a profiled capture.

    Args:
        trace: Chrome trace dict of a profiled block containing the captures.
        regions: the region names (``record_function`` ranges that are regions; other ranges
            are ignored).
        names: optional names of the graphs, in capture order.

    Returns:
        ``[{"name": ..., "ops": [[kind, label], ...]}, ...]``, one per
        ``cudaStreamBeginCapture``/``cudaStreamEndCapture`` pair. A graph's ops are the launch
        API events between the pair that produced no device activity (launches on a capturing
        stream do not run), in time order.

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict or has a malformed slice
            (:func:`~attn_gym_lite.profiling.trace.check_trace`,
            :func:`~attn_gym_lite.profiling.trace.check_slices`).
        TypeError: ``regions`` is a str or not a collection of str; ``names`` is not a list of str.
        ValueError: unpaired capture begin/end events, or ``names`` of the wrong length.
    """
    check_trace(trace, "graphs_from_capture_trace")
    check_slices(trace, None, "graphs_from_capture_trace")
    if isinstance(regions, str) or not isinstance(regions, Collection) or not all(isinstance(r, str) for r in regions):
        raise TypeError(f"graphs_from_capture_trace: regions must be a set or list of region names (str), "
                        f"got {regions!r:.80}")
    _check_names("graphs_from_capture_trace", names)
    regions = set(regions)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    windows = []  # (begin, end) of each capture, paired on the thread that made it
    for thread in {e.get("tid") for e in events if e.get("name") == "cudaStreamBeginCapture"} | {
        e.get("tid") for e in events if e.get("name") == "cudaStreamEndCapture"
    }:
        begins = sorted(e["ts"] for e in events if e.get("name") == "cudaStreamBeginCapture" and e.get("tid") == thread)
        ends = sorted(e["ts"] for e in events if e.get("name") == "cudaStreamEndCapture" and e.get("tid") == thread)
        if len(begins) != len(ends) or any(b > e for b, e in zip(begins, ends)):
            raise ValueError(
                f"graphs_from_capture_trace: on thread {thread}, {len(begins)} cudaStreamBeginCapture and "
                f"{len(ends)} cudaStreamEndCapture events do not pair up"
            )
        windows += list(zip(begins, ends))
    windows.sort()
    if any(later[0] < earlier[1] for earlier, later in zip(windows, windows[1:])):
        raise ValueError(
            "graphs_from_capture_trace: captures overlap in time (several threads capturing at once); "
            "their launches cannot be told apart: capture one graph at a time inside record_annotations"
        )
    begins, ends = [w[0] for w in windows], [w[1] for w in windows]
    if names is not None and len(names) != len(begins):
        raise ValueError(
            f"graphs_from_capture_trace: names has {len(names)} entries but {len(begins)} graphs "
            f"were captured"
        )
    ran = {(e.get("args") or {}).get("correlation") for e in events if e.get("cat") in DEVICE_CATEGORIES}
    ran.discard(None)
    launches = [
        e for e in events
        if launch_kind(e) and (e.get("args") or {}).get("correlation") not in ran
        and any(b <= e["ts"] <= end for b, end in zip(begins, ends))
    ]
    labels = launch_labels(events, launches, regions)
    graphs = []
    for index, (begin, end) in enumerate(zip(begins, ends)):
        ops = []
        for launch in sorted((e for e in launches if begin <= e["ts"] <= end), key=lambda e: e["ts"]):
            ops.append([launch_kind(launch), labels[id(launch)]])
        graphs.append({"name": names[index] if names else f"graph {index}", "ops": ops})
    return graphs


def launch_labels(events: list[dict], launches: list[dict], regions: set[str]) -> dict[int, str | None]:
    """``id(launch) -> label`` for launch API events of a trace: the innermost enclosing region
    on the launching thread; inside autograd's ``evaluate_function`` ranges, ``"<region>
    backward"`` where the node's sequence number belongs to a forward op in ``<region>``, else
    ``"backward"``; ``None`` outside every region."""
    stacks = enclosing_ranges(events, launches)
    # Forward ops carry a sequence number: the one of the autograd node they create, or, for an
    # op that creates none, the number the next node will get. So the node's creator is the
    # *last* forward op with that number, and its region (or none) is the node's.
    sequence_region: dict[int, str | None] = {}
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    op_stacks = enclosing_ranges(events, ops)
    for op in ops:
        stack = op_stacks[id(op)]
        sequence = (op.get("args") or {}).get("Sequence number")
        if sequence is None or any(a["name"].startswith(EVALUATE_FUNCTION) for a in stack):
            continue
        sequence_region[sequence] = _innermost_region(stack, regions)
    return {id(launch): _label(stacks.get(id(launch), []), regions, sequence_region) for launch in launches}


def _label(stack: list[dict], regions: set[str], sequence_region: dict[int, str]) -> str | None:
    for ancestor in reversed(stack):  # innermost evaluate_function first
        if ancestor["name"].startswith(EVALUATE_FUNCTION):
            region = sequence_region.get((ancestor.get("args") or {}).get("Sequence number"))
            return "backward" if region is None else f"{region} backward"
    return _innermost_region(stack, regions)


def _innermost_region(stack: list[dict], regions: set[str]) -> str | None:
    for ancestor in reversed(stack):
        if ancestor.get("cat") == "user_annotation" and ancestor["name"] in regions:
            return ancestor["name"]
    return None


def enclosing_ranges(events: list[dict], targets: list[dict]) -> dict[int, list[dict]]:
    """``id(target) -> [enclosing CPU ranges on its thread, outermost first]``, by one sweep per
    thread over ranges sorted by start (longer first on ties)."""
    ranges = defaultdict(list)
    for event in events:
        if (event.get("cat") in ("cpu_op", "user_annotation") and event.get("ph") == "X" and "dur" in event
                and "ts" in event and isinstance(event.get("name"), str)):
            ranges[(event.get("pid"), event.get("tid"))].append(event)
    wanted = defaultdict(list)
    for target in targets:
        wanted[(target.get("pid"), target.get("tid"))].append(target)
    result: dict[int, list[dict]] = {}
    for thread, items in wanted.items():
        # Ranges before targets at equal start, so a range starting with its first launch encloses it.
        timeline = sorted(
            [(r["ts"], 0, -r["dur"], i, r) for i, r in enumerate(ranges.get(thread, []))]
            + [(t["ts"], 1, -t.get("dur", 0), i, t) for i, t in enumerate(items)],
            key=lambda row: row[:4],
        )
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
