"""Profiling captured graphs: traces whose replayed kernels are labelled by region.

* :func:`profile` records a trace (Chrome JSON, gzipped JSON or Perfetto protobuf);
* :func:`mark_kernels` names a region inside the function being captured;
* :func:`record_annotations` records, while graphs are captured, which region each graph node
  came from (torch's graph annotations where available, a profiled capture elsewhere);
* :func:`annotate_trace` joins those labels to a replay trace;
* :func:`trace_summary` and :func:`plot_timeline` read a trace as numbers and as a picture.
"""

from .annotate import annotate_trace
from .regions import (
    CAPTURE_ORDER,
    GRAPH_NODE_ID,
    GraphAnnotations,
    graphs_from_capture_trace,
    mark_kernels,
    native_annotations_available,
    record_annotations,
)
from .summary import device_events, plot_timeline, trace_summary
from .trace import load_trace, profile, save_trace, split_overlapping_lanes

__all__ = [
    "CAPTURE_ORDER", "GRAPH_NODE_ID", "GraphAnnotations", "annotate_trace", "device_events",
    "graphs_from_capture_trace", "load_trace", "mark_kernels", "native_annotations_available",
    "plot_timeline", "profile", "record_annotations", "save_trace", "split_overlapping_lanes",
    "trace_summary",
]
