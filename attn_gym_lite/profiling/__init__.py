"""Profiling captured graphs: traces whose replayed kernels are labelled by region.

:func:`profile` records a trace; :func:`mark_kernels` names a region inside the function being
captured; :func:`record_annotations` records, while graphs are captured, which region each graph
node came from; :func:`annotate_trace` joins those labels to a replay trace; :func:`trace_summary`
reads a trace as numbers.
"""

from ..regions import mark_kernels, native_annotations_available
from .annotate import annotate_trace
from .record import CAPTURE_ORDER, GRAPH_NODE_ID, GraphAnnotations, graphs_from_capture_trace, record_annotations
from .summary import device_events, trace_summary
from .trace import load_trace, profile, save_trace, split_overlapping_lanes

__all__ = [
    "CAPTURE_ORDER", "GRAPH_NODE_ID", "GraphAnnotations", "annotate_trace", "device_events",
    "graphs_from_capture_trace", "load_trace", "mark_kernels", "native_annotations_available",
    "profile", "record_annotations", "save_trace", "split_overlapping_lanes", "trace_summary",
]
