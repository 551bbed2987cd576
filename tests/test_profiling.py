"""Profiling: the capture-trace reader and the replay post-processor on hand-made traces with
exact expected labels and boxes; lane splitting; the summary against a hand computation; on the
GPU, a captured graph with three regions replayed twice, against the eager trace of the same
function."""

import copy
import gzip
import json

import pytest
import torch

from attn_gym_lite.book.figures.ch03_profiling import plot_timeline
from attn_gym_lite.profiling import (
    CAPTURE_ORDER,
    GRAPH_NODE_ID,
    GraphAnnotations,
    annotate_trace,
    graphs_from_capture_trace,
    load_trace,
    mark_kernels,
    profile,
    record_annotations,
    save_trace,
    split_overlapping_lanes,
    trace_summary,
)
from attn_gym_lite.profiling.annotate import REGION_CATEGORY, REGION_TRACK_OFFSET
from attn_gym_lite.profiling.summary import replay_idle
from attn_gym_lite.profiling.trace import LANE_TID_BASE

MAIN, AUTOGRAD, GPU, STREAM = 10, 11, 0, 7


def cpu(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def region(name, ts, dur, tid=MAIN):
    return cpu(name, ts, dur, tid, cat="user_annotation")


def api(name, ts, correlation, tid=MAIN, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1,
            "args": {"correlation": correlation}}


def device(cat, name, ts, dur, correlation, tid=STREAM, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": GPU, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "stream": tid, **args}}


def capture_trace():
    """Two captures. Graph 0: region "a" (a kernel, and a memset whose op is seq 1), region "b"
    (a driver-API kernel, seq 2), an unmarked kernel, then a backward on the autograd thread:
    node seq 2 (-> "b backward"), seq 9 (created outside any region -> "backward"), and one
    launch that ran on the device (not captured). A launch between the captures is eager work.
    Graph 1: one memcpy in region "b"."""
    events = [
        cpu("warmup op", 0, 5, **{"Sequence number": 0}),
        api("cudaLaunchKernel", 1, 100),                      # eager warm-up: ran, outside captures
        device("kernel", "warm", 50, 2, 100),
        api("cudaStreamBeginCapture", 10, 101),
        region("a", 11, 20),
        cpu("aten::fill_", 12, 5, **{"Sequence number": 1}),
        api("cudaLaunchKernel", 13, 102),
        api("cudaMemsetAsync", 15, 103),
        region("b", 32, 20),
        cpu("aten::mm", 33, 10, **{"Sequence number": 2}),
        api("cuLaunchKernelEx", 34, 104, cat="cuda_driver"),
        api("cudaLaunchKernel", 55, 105),                     # no region
        cpu("autograd::engine::evaluate_function: MmBackward0", 60, 10, AUTOGRAD, **{"Sequence number": 2}),
        cpu("MmBackward0", 61, 8, AUTOGRAD, **{"Sequence number": 2}),
        api("cuLaunchKernelEx", 62, 106, AUTOGRAD, cat="cuda_driver"),
        cpu("autograd::engine::evaluate_function: CloneBackward0", 72, 5, AUTOGRAD, **{"Sequence number": 9}),
        api("cudaLaunchKernel", 73, 107, AUTOGRAD),
        api("cudaLaunchKernel", 80, 108),                     # ran: not a graph node
        device("kernel", "ran", 81, 1, 108),
        api("cudaStreamEndCapture", 90, 109),
        api("cudaLaunchKernel", 95, 110),                     # between captures
        api("cudaStreamBeginCapture", 100, 111),
        region("b", 101, 10),
        api("cudaMemcpyAsync", 102, 112),
        api("cudaStreamEndCapture", 120, 113),
    ]
    return {"traceEvents": events}


def test_graphs_from_capture_trace_labels_each_node_in_capture_order():
    graphs = graphs_from_capture_trace(capture_trace(), {"a", "b"}, ["step", "copy"])
    assert graphs == [
        {"name": "step", "ops": [["kernel", "a"], ["memset", "a"], ["kernel", "b"], ["kernel", None],
                                 ["kernel", "b backward"], ["kernel", "backward"]]},
        {"name": "copy", "ops": [["memcpy", "b"]]},
    ]


def test_graphs_from_capture_trace_default_names_and_regions_filter_other_ranges():
    """A record_function range that is not a region does not label anything."""
    graphs = graphs_from_capture_trace(capture_trace(), {"a"})
    assert [g["name"] for g in graphs] == ["graph 0", "graph 1"]
    assert [op[1] for op in graphs[0]["ops"]] == ["a", "a", None, None, "backward", "backward"]


@pytest.mark.parametrize("events, names, message", [
    ([api("cudaStreamBeginCapture", 1, 1)], None, "do not pair up"),
    ([api("cudaStreamBeginCapture", 10, 1), api("cudaStreamBeginCapture", 20, 2, tid=20),  # two threads at once
      api("cudaStreamEndCapture", 40, 3, tid=20), api("cudaStreamEndCapture", 80, 4)], None, "do not pair up"),
    (capture_trace()["traceEvents"], ["only one"], "names has 1 entries but 2 graphs"),
])
def test_graphs_from_capture_trace_refuses_captures_it_cannot_tell_apart(events, names, message):
    with pytest.raises(ValueError, match=message):
        graphs_from_capture_trace({"traceEvents": events}, {"a"}, names)


# ---- the replay post-processor, capture-order route ------------------------------------------

STEP = {"name": "step", "ops": [["kernel", "embed"], ["memset", "attn"], ["kernel", "attn"], ["kernel", None]]}
OPTIM = {"name": "optim", "ops": [["kernel", "adam"], ["memcpy", "adam"]]}


def launch(ts, correlation, tid=MAIN):
    return api("cudaGraphLaunch", ts, correlation, tid)


def replay_trace():
    """STEP replayed twice (correlations 1, 3) around OPTIM (2), plus an eager kernel (9)."""
    events = [launch(0, 1), launch(5, 2), launch(8, 3), api("cudaLaunchKernel", 9, 9),
              {"ph": "M", "name": "thread_name", "pid": GPU, "tid": STREAM, "args": {"name": "stream 7"}}]
    for correlation, start in ((1, 100), (3, 300)):
        events += [device("kernel", "gather", start, 10, correlation),
                   device("gpu_memset", "Memset", start + 10, 2, correlation),
                   device("kernel", "flash", start + 12, 30, correlation),
                   device("kernel", "misc", start + 42, 5, correlation)]
    events += [device("kernel", "adam", 200, 20, 2), device("gpu_memcpy", "Memcpy DtoD", 220, 4, 2),
               device("kernel", "eager", 400, 3, 9)]
    return {"traceEvents": events}


def regions_of(trace):
    return [(e["name"], e["ts"], e["args"].get("region")) for e in trace["traceEvents"]
            if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]


def boxes_of(trace):
    return sorted((e["name"], e["ts"], e["dur"], e["tid"]) for e in trace["traceEvents"]
                  if e.get("cat") == REGION_CATEGORY)


def test_annotate_trace_capture_order_labels_every_replay_and_leaves_the_rest():
    original = replay_trace()
    before = copy.deepcopy(original)
    annotated = annotate_trace(original, GraphAnnotations(CAPTURE_ORDER, [STEP, OPTIM]))
    assert original == before  # the input is not modified
    assert regions_of(annotated) == [
        ("gather", 100, "embed"), ("Memset", 110, "attn"), ("flash", 112, "attn"), ("misc", 142, None),
        ("gather", 300, "embed"), ("Memset", 310, "attn"), ("flash", 312, "attn"), ("misc", 342, None),
        ("adam", 200, "adam"), ("Memcpy DtoD", 220, "adam"), ("eager", 400, None),
    ]
    eager = [e for e in annotated["traceEvents"] if e.get("name") == "eager"][0]
    assert eager == [e for e in before["traceEvents"] if e.get("name") == "eager"][0]
    track = REGION_TRACK_OFFSET + STREAM
    # One box per region per replay: two for each region of STEP, one for OPTIM's.
    assert boxes_of(annotated) == sorted([
        ("embed", 100, 10, track), ("attn", 110, 32, track),
        ("embed", 300, 10, track), ("attn", 310, 32, track),
        ("adam", 200, 24, track),
    ])
    names = {e["tid"]: e["args"]["name"] for e in annotated["traceEvents"] if e.get("name") == "thread_name"}
    assert names[track] == "stream 7 regions"
    assert annotated["attn_gym_lite"] == {"route": CAPTURE_ORDER, "labelled_events": 8, "replays": 3,
                                          "unmatched_replays": [], "labelled_eager_events": 0}


def test_annotate_trace_ambiguous_graphs_are_chosen_by_the_range_around_the_replay():
    other = {"name": "other", "ops": [["kernel", "x"], ["memset", "y"], ["kernel", "y"], ["kernel", "z"]]}
    trace = replay_trace()
    unresolved = annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER, [STEP, other, OPTIM]))
    report = unresolved["attn_gym_lite"]
    assert [u["correlation"] for u in report["unmatched_replays"]] == [1, 3]
    assert "ambiguous" in report["unmatched_replays"][0]["reason"]
    assert regions_of(unresolved)[0] == ("gather", 100, None)
    # Replay 1 inside record_function("other"), replay 3 inside record_function("step").
    trace["traceEvents"] += [region("other", -1, 3), region("step", 7, 3)]
    resolved = annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER, [STEP, other, OPTIM]))
    labels = [r[2] for r in regions_of(resolved)]
    assert labels[:8] == ["x", "y", "y", "z", "embed", "attn", "attn", None]


def test_annotate_trace_identical_labels_need_no_name():
    """Buckets of one function: same nodes, same labels; any of them labels the replay."""
    twin = dict(STEP, name="step 2")
    annotated = annotate_trace(replay_trace(), GraphAnnotations(CAPTURE_ORDER, [STEP, twin, OPTIM]))
    assert annotated["attn_gym_lite"]["unmatched_replays"] == []


def test_annotate_trace_reports_multi_stream_and_unknown_replays():
    trace = replay_trace()
    for event in trace["traceEvents"]:
        if event.get("name") == "flash" and event["args"]["correlation"] == 3:
            event["tid"] = event["args"]["stream"] = 8
    for event in trace["traceEvents"]:  # an event moved onto an extra lane is still on stream 7
        if event.get("name") == "misc" and event["args"]["correlation"] == 1:
            event["tid"] = LANE_TID_BASE + STREAM
    annotated = annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER, [STEP]))
    reasons = {u["correlation"]: u["reason"] for u in annotated["attn_gym_lite"]["unmatched_replays"]}
    assert set(reasons) == {2, 3}
    assert "several streams" in reasons[3] and "no captured graph" in reasons[2]
    assert annotated["attn_gym_lite"]["labelled_events"] == 3


def test_annotate_trace_labels_eager_kernels_from_the_regions_around_their_launch():
    """An eager step in a trace: forward launches inside "embed"/"attn" ranges, a backward node
    whose forward op (seq 5) ran in "attn", one (seq 6) created outside any region, and a launch
    outside every range."""
    events = [region("embed", 0, 10), api("cudaLaunchKernel", 1, 20),
              region("attn", 10, 10), cpu("aten::mm", 11, 5, **{"Sequence number": 5}), api("cuLaunchKernelEx", 12, 21, cat="cuda_driver"),
              cpu("aten::add", 30, 3, **{"Sequence number": 6}), api("cudaLaunchKernel", 31, 22),
              cpu("autograd::engine::evaluate_function: MmBackward0", 40, 5, AUTOGRAD, **{"Sequence number": 5}),
              api("cudaLaunchKernel", 41, 23, AUTOGRAD),
              cpu("autograd::engine::evaluate_function: AddBackward0", 50, 5, AUTOGRAD, **{"Sequence number": 6}),
              api("cudaMemsetAsync", 51, 24, AUTOGRAD)]
    events += [device("kernel", "gather", 100, 1, 20), device("kernel", "gemm", 110, 1, 21),
               device("kernel", "add", 120, 1, 22), device("kernel", "gemm_bwd", 130, 1, 23),
               device("gpu_memset", "Memset", 140, 1, 24)]
    annotations = GraphAnnotations(CAPTURE_ORDER, [STEP])  # regions seen in STEP: embed, attn
    annotated = annotate_trace({"traceEvents": events}, annotations)
    assert [r[2] for r in regions_of(annotated)] == ["embed", "attn", None, "attn backward", "backward"]
    assert annotated["attn_gym_lite"]["labelled_eager_events"] == 4
    assert boxes_of(annotated) == []  # region boxes are drawn per graph replay only


# ---- graph-node-id route ------------------------------------------------------------------------

def test_annotate_trace_graph_node_id_route_handles_node_zero_and_full_ids():
    events = [launch(0, 1), launch(5, 2)]
    events += [device("kernel", "k0", 10, 5, 1, **{"graph id": 3, "graph node id": 0}),
               device("kernel", "k1", 15, 5, 1, **{"graph id": 3, "graph node id": 1}),
               device("gpu_memset", "m", 20, 1, 1, **{"graph id": 3, "graph node id": 2}),
               device("kernel", "k0", 30, 5, 2, **{"graph id": 4, "graph node id": 0}),
               device("kernel", "full", 40, 5, 2, **{"graph id": 4, "graph node id": (4 << 32) | 7}),
               device("kernel", "plain", 50, 5, 99)]
    nodes = {(3 << 32) | 0: "embed", (3 << 32) | 1: "attn", (4 << 32) | 0: "adam", (4 << 32) | 7: "adam"}
    annotated = annotate_trace({"traceEvents": events}, GraphAnnotations(GRAPH_NODE_ID, nodes=nodes))
    assert regions_of(annotated) == [("k0", 10, "embed"), ("k1", 15, "attn"), ("m", 20, None),
                                     ("k0", 30, "adam"), ("full", 40, "adam"), ("plain", 50, None)]
    track = REGION_TRACK_OFFSET + STREAM
    assert boxes_of(annotated) == sorted([("embed", 10, 5, track), ("attn", 15, 5, track), ("adam", 30, 15, track)])


def test_graph_annotations_round_trip_through_json():
    annotations = GraphAnnotations(GRAPH_NODE_ID, [STEP], {(3 << 32) | 0: "a"}, ["a", "optimizer"])
    assert GraphAnnotations.from_dict(json.loads(json.dumps(annotations.to_dict()))) == annotations


# ---- lanes, summary, picture ---------------------------------------------------------------------

def test_split_overlapping_lanes_keeps_nesting_and_moves_partial_overlaps():
    slices = [device("kernel", "a", 0, 10, 1), device("kernel", "nested", 2, 3, 1),
              device("kernel", "overlap", 8, 10, 1), device("kernel", "overlap2", 9, 2, 1),
              device("kernel", "after", 20, 1, 1)]
    trace = {"traceEvents": slices + [{"ph": "M", "name": "thread_name", "pid": GPU, "tid": STREAM,
                                        "args": {"name": "stream 7"}}]}
    out = split_overlapping_lanes(trace)
    tids = {e["name"]: e["tid"] for e in out["traceEvents"] if e.get("ph") == "X"}
    assert tids == {"a": STREAM, "nested": STREAM, "overlap": LANE_TID_BASE + STREAM,
                    "overlap2": LANE_TID_BASE + STREAM, "after": STREAM}
    names = {e["tid"]: e["args"]["name"] for e in out["traceEvents"] if e.get("ph") == "M"}
    assert names[LANE_TID_BASE + STREAM] == "stream 7 (lane 1)"
    assert trace["traceEvents"][2]["tid"] == STREAM  # input untouched


def test_trace_summary_against_a_hand_computation():
    events = [device("kernel", "a", 100, 10, 1), device("kernel", "b", 105, 10, 1, tid=8),   # union 100..115
              device("gpu_memset", "m", 120, 5, 1),                                           # gap 5
              device("kernel", "c", 126, 4, 1, region="x"),                                   # gap 1
              device("kernel", "d", 150, 10, 1, region="x"),                                  # gap 20
              cpu("ProfilerStep#1", 0, 10), cpu("op", 1, 2), cpu("ProfilerStep#2", 10, 10), cpu("op", 11, 2),
              cpu("ProfilerStep#3", 20, 1)]  # the empty step profile() leaves open at exit
    summary = trace_summary({"traceEvents": events})
    assert summary["steps"] == 2 and summary["kernels"] == 4 and summary["kernels_per_step"] == 2
    assert summary["device_events"] == 5
    assert summary["window_us"] == 60 and summary["busy_us"] == 15 + 5 + 4 + 10
    assert summary["busy_fraction"] == pytest.approx(34 / 60)
    assert summary["gaps"] == {"count": 3, "total_us": 26, "largest_us": 20}
    assert summary["region_us"] == {"(unlabelled)": 25, "x": 14}
    assert trace_summary({"traceEvents": events}, steps=1, min_gap_us=2)["gaps"] == {
        "count": 2, "total_us": 25, "largest_us": 20}


def test_replay_idle_against_a_hand_computation():
    """Two replays of a graph and eager work between them; only gaps inside a replay count."""
    events = [api("cudaGraphLaunch", 90, 7),
              device("kernel", "a", 100, 10, 7), device("kernel", "b", 112, 5, 7),     # gap 2
              device("gpu_memset", "m", 120, 3, 7),                                     # gap 3
              device("kernel", "eager", 140, 5, 9),                                     # not a replay
              api("cudaLaunchKernel", 139, 9),
              api("cudaGraphLaunch", 180, 8),
              device("kernel", "a", 200, 10, 8), device("kernel", "b", 205, 10, 8, tid=8),  # overlap
              device("kernel", "c", 221.5, 4, 8)]                                       # gap 6.5
    idle = replay_idle({"traceEvents": events})
    assert idle["replays"] == 2 and idle["node_boundaries"] == 2 + 2
    assert idle["idle_us"] == pytest.approx(2 + 3 + 6.5)
    assert idle["idle_us_per_replay"] == pytest.approx(11.5 / 2)
    assert idle["idle_us_per_boundary"] == pytest.approx(11.5 / 4)
    # the whole window's idle time (trace_summary) also counts the gaps between replays
    summary = trace_summary({"traceEvents": events})
    assert summary["window_us"] - summary["busy_us"] > idle["idle_us"]


def test_plot_timeline_draws_one_row_per_stream_and_region_track():
    annotated = annotate_trace(replay_trace(), GraphAnnotations(CAPTURE_ORDER, [STEP, OPTIM]))
    ax = plot_timeline(annotated, title="replay")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stream 7", "stream 7 regions"]
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"embed", "attn", "adam", "(unlabelled)"}


# ---- recording --------------------------------------------------------------------------------

def test_profile_writes_every_format_and_reads_it_back(tmp_path):
    suffixes = [".json", ".json.gz"]
    try:
        import perfetto  # noqa: F401  (the optional [perfetto] extra; CI installs it)
        suffixes.append(".pftrace")
    except ImportError:
        pass
    for suffix in suffixes:
        path = tmp_path / f"t{suffix}"
        with profile(path, warmup=1) as prof:
            for _ in range(3):
                with mark_kernels("work"):
                    torch.ones(64).cumsum(0)
                prof.step()
        assert path.stat().st_size > 0
        names = [e.get("name") for e in prof.trace["traceEvents"]]
        assert names.count("work") == 2  # the warm-up step is profiled, then dropped
        if suffix != ".pftrace":
            assert load_trace(path)["traceEvents"] == prof.trace["traceEvents"]
    with profile(None) as prof:  # no warm-up: every step is a ProfilerStep range
        for _ in range(3):
            torch.ones(8).sum()
            prof.step()
    assert sum(str(e.get("name")).startswith("ProfilerStep#") for e in prof.trace["traceEvents"]) >= 3


def test_save_trace_gzip_is_reproducible_and_load_trace_reads_the_array_form(tmp_path):
    trace = replay_trace()
    first = save_trace(trace, tmp_path / "a.json.gz").read_bytes()
    assert save_trace(trace, tmp_path / "new" / "b.json.gz").read_bytes() == first
    assert json.loads(gzip.decompress(first)) == trace
    (tmp_path / "array.json").write_text(json.dumps(trace["traceEvents"]))
    assert load_trace(tmp_path / "array.json") == trace


def test_a_profile_records_one_block_and_refuses_a_recording_with_no_step_after_warmup():
    prof = profile(None)
    with prof:
        torch.ones(4).sum()
    with pytest.raises(RuntimeError, match="one block"):  # entering torch's profiler again crashed the interpreter
        prof.__enter__()
    with pytest.raises(ValueError, match="warmup"):
        with profile(None, warmup=2) as prof:
            prof.step()
            prof.step()


def test_record_annotations_with_no_capture_and_its_names():
    with record_annotations() as annotations:
        with mark_kernels("eager"):
            torch.ones(4).sum()
    assert annotations.graphs == [] and annotations.region_names == ["eager"]
    with pytest.raises(ValueError, match="names"):
        with record_annotations(["step"]):
            pass


# ---- on the GPU -------------------------------------------------------------------------------

def _three_regions(x, w):
    with mark_kernels("project"):
        h = x @ w
    with mark_kernels("softmax"):
        p = torch.softmax(h.float(), dim=-1)
    with mark_kernels("reduce"):
        return p.cumsum(-1).sum()


@pytest.mark.gpu
def test_replayed_graph_kernels_carry_their_region_label():
    from attn_gym_lite.graph.capture import capture_graph

    torch.manual_seed(0)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        loss = _three_regions(x, w)
        return loss, torch.autograd.grad(loss, w)[0]

    # Reference labels from an eager run: each kernel's launch sits inside its region's range.
    with profile(None) as eager:
        step()
        torch.cuda.synchronize()
    events = eager.trace["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in ("project", "softmax", "reduce")]
    launch_region = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            inside = [r["name"] for r in ranges if r["tid"] == e["tid"] and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]]
            launch_region[e["args"]["correlation"]] = inside[-1] if inside else None
    eager_forward = [launch_region.get(e["args"]["correlation"]) for e in sorted(
        (e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])]
    eager_forward = [r for r in eager_forward if r is not None]

    with record_annotations(["step"]) as annotations:
        graph, _ = capture_graph(step)
    with profile(None) as replays:
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
    annotated = annotate_trace(replays.trace, annotations)
    assert annotated["attn_gym_lite"]["unmatched_replays"] == []
    kernels = [e for e in annotated["traceEvents"] if e.get("cat") == "kernel"]
    by_replay = {}
    for kernel in sorted(kernels, key=lambda e: e["ts"]):
        by_replay.setdefault(kernel["args"]["correlation"], []).append(kernel)
    assert len(by_replay) == 2
    for replay in by_replay.values():
        labels = [k["args"].get("region") for k in replay]
        forward = [label for label in labels if label in ("project", "softmax", "reduce")]
        assert forward == eager_forward  # every forward kernel carries its own region, in order
        assert set(forward) == {"project", "softmax", "reduce"}
        for kernel, label in zip(replay, labels):
            if "softmax" in kernel["name"].lower():
                assert label in ("softmax", "softmax backward"), (kernel["name"], label)
        assert "softmax backward" in labels and "project backward" in labels


# ---- edge cases of the readers -----------------------------------------------------------------

def _window(*events):
    return {"traceEvents": [api("cudaStreamBeginCapture", 0, 1), *events, api("cudaStreamEndCapture", 99, 2)]}


def test_backward_region_comes_from_the_op_that_created_the_node():
    """An op that creates no node carries the *next* node's number: the node belongs to the last
    forward op with that number (here aten::mm in "attn", not aten::arange in "rope")."""
    trace = _window(region("rope", 1, 10), cpu("aten::arange", 2, 3, **{"Sequence number": 5}), api("cudaLaunchKernel", 3, 10),
                    region("attn", 20, 10), cpu("aten::mm", 21, 5, **{"Sequence number": 5}), api("cudaLaunchKernel", 22, 11),
                    cpu("autograd::engine::evaluate_function: MmBackward0", 50, 5, AUTOGRAD, **{"Sequence number": 5}),
                    api("cudaLaunchKernel", 51, 12, AUTOGRAD))
    labels = [op[1] for op in graphs_from_capture_trace(trace, {"rope", "attn"})[0]["ops"]]
    assert labels == ["rope", "attn", "attn backward"]


def test_host_function_nodes_are_not_device_work():
    trace = _window(region("a", 1, 10), api("cudaLaunchKernel", 2, 10), api("cudaLaunchHostFunc", 3, 11))
    assert graphs_from_capture_trace(trace, {"a"})[0]["ops"] == [["kernel", "a"]]


def test_eager_kernels_of_regions_outside_the_graphs():
    events = [region("optimizer", 20, 10), api("cudaLaunchKernel", 21, 30), device("kernel", "adam", 40, 1, 30),
              region("backward", 50, 10), api("cudaLaunchKernel", 51, 31), device("kernel", "fill", 60, 1, 31)]
    plain = annotate_trace({"traceEvents": events}, GraphAnnotations(CAPTURE_ORDER, [STEP]))
    assert [r[2] for r in regions_of(plain)] == [None, None]
    recorded = GraphAnnotations(CAPTURE_ORDER, [STEP], region_names=["optimizer", "backward"])
    assert [r[2] for r in regions_of(annotate_trace({"traceEvents": events}, recorded))] == ["optimizer", "backward"]


def test_lanes_move_flow_arrows_and_tolerate_float_rounding():
    trace = {"traceEvents": [
        device("kernel", "A", 0, 10, 1), device("kernel", "B", 9, 5, 2),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 2, "pid": GPU, "tid": STREAM, "ts": 9, "bp": "e"},
        # Nested and touching at ~5e12 µs, where float addition is off by about 1e-3 µs.
        device("kernel", "parent", 5144119282936.71, 51.094, 3), device("kernel", "child", 5144119282965.072, 22.732, 3),
        device("kernel", "next", 5144119282987.804, 1.0, 4)]}
    out = split_overlapping_lanes(trace)
    tids = {e["name"]: e["tid"] for e in out["traceEvents"] if e.get("ph") in ("X", "f")}
    assert tids == {"A": STREAM, "B": LANE_TID_BASE + STREAM, "ac2g": LANE_TID_BASE + STREAM,
                    "parent": STREAM, "child": STREAM, "next": STREAM}


def test_malformed_events_are_skipped_not_fatal():
    events = [launch(0, 1), device("kernel", "k", 10, 5, 1), {"ph": "X", "cat": "kernel", "name": "no dur", "ts": 3},
              {"ph": "i", "cat": "user_annotation", "name": "instant", "ts": 1, "pid": 1, "tid": MAIN},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1, "pid": 1, "tid": MAIN}]
    annotated = annotate_trace({"traceEvents": events}, GraphAnnotations(CAPTURE_ORDER, [{"name": "g", "ops": [["kernel", "x"]]}]))
    assert [r[2] for r in regions_of(annotated)] == ["x", None]
    assert trace_summary({"traceEvents": events})["device_events"] == 1
