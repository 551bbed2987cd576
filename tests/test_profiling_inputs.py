"""The profiling reductions on hand-made input: incomplete trace slices are skipped, not fatal;
the allocator-history reductions (find_blocks, allocation_timeline, allocation_sites) against
running sums; record_memory_history with CUDA faked."""

import pytest
import torch

from attn_gym_lite.profiling import CAPTURE_ORDER, GraphAnnotations, annotate_trace, split_overlapping_lanes
from attn_gym_lite.profiling.compact import compact_timeline
from attn_gym_lite.profiling.memory import allocation_sites, allocation_timeline, find_blocks, record_memory_history
from attn_gym_lite.profiling.summary import replay_idle, trace_summary


def kernel(**fields):
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 2.0,
            "args": {"correlation": 1, "stream": 7}, **fields}


def trace_with(*events):
    host_op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5.0, "dur": 3.0}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 8.0, "dur": 1.0,
              "args": {"correlation": 1}}
    phase = {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0}
    return {"traceEvents": [host_op, launch, phase, kernel(), *events]}


def test_a_slice_without_ts_or_dur_is_incomplete_and_skipped():
    """An incomplete slice cannot be placed on a timeline: every reader leaves it out."""
    assert compact_timeline(trace_with())["counts"] == {"host_ops": 2, "runtime_calls": 1, "launches": 1,
                                                        "device_events": 1, "device_busy_us": 2.0}
    trace = trace_with({"ph": "X", "cat": "kernel", "name": "no dur", "ts": 30.0},
                       {"ph": "X", "cat": "cpu_op", "name": "no ts", "dur": 4.0, "pid": 1, "tid": 1},
                       {"ph": "i", "cat": "user_annotation", "name": "instant", "ts": 1, "pid": 1, "tid": 1})
    timeline = compact_timeline(trace)
    assert timeline["counts"]["device_events"] == 1 and timeline["counts"]["host_ops"] == 2  # the op and the phase
    assert trace_summary(trace)["busy_us"] == 2.0 and replay_idle(trace)["replays"] == 1
    lanes = split_overlapping_lanes({"traceEvents": [{"ph": "X", "cat": "kernel", "dur": 1.0, "tid": 7},
                                                     kernel(ts=0.0, dur=10.0), kernel(ts=5.0, dur=10.0)]})
    assert [e.get("tid") for e in lanes["traceEvents"]] == [7, 7, 1_000_007, 1_000_007]
    assert lanes["traceEvents"][-1]["args"] == {"name": "thread 7 (lane 1)"}
    assert annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER))["attn_gym_lite"]["replays"] == 1


# ---- allocator entries -------------------------------------------------------------------------

ENTRIES = [
    {"action": "alloc", "addr": 1000, "size": 512, "time_us": 1.0},
    {"action": "free_requested", "addr": 1000, "size": 512, "time_us": 2.0},
    {"action": "free_completed", "addr": 1000, "size": 512, "time_us": 3.0},
    {"action": "alloc", "addr": 1000, "size": 1024, "time_us": 4.0},
    {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "time_us": 5.0},
]


def test_allocation_timeline_against_a_running_sum():
    timeline = allocation_timeline(ENTRIES, {"late": [3]})
    running, expected = 0, []
    for entry in ENTRIES:
        if entry["action"] in ("alloc", "free_completed"):
            running += entry["size"] if entry["action"] == "alloc" else -entry["size"]
            expected.append(running)
    assert timeline["allocated_bytes"] == expected == [512, 0, 1024]
    assert timeline["t"] == [0.0, 2.0, 3.0] and timeline["tags"]["late"] == [0, 0, 1024]
    assert timeline["reserved_bytes"] == [0, 0, 0] and timeline["peak"]["allocated_bytes"] == 1024
    # actions no reduction reads are ignored
    assert allocation_timeline([*ENTRIES, {"action": "oom", "device_free": 0}], None)["allocs"] == 2


def test_find_blocks_and_allocation_sites():
    assert find_blocks(ENTRIES, iter([1000 + 1023]), 4) == {3}  # any iterable; a view's pointer inside the block
    assert find_blocks(ENTRIES, [1000], 1) == {0} and find_blocks(ENTRIES, [1000], 3, strict=False) == set()
    frames = [{"filename": "/x/y.py", "line": 3, "name": "f"}]
    entries = [{"action": "alloc", "addr": 0, "size": 8, "frames": frames}, {"action": "alloc", "addr": 8, "size": 4}]
    assert allocation_sites(entries) == [["/x/y.py:3 f", 8, 1], ["(no Python frame)", 4, 1]]


def test_record_memory_history_keeps_this_blocks_entries(monkeypatch):
    """CUDA is faked: the allocator's trace is a list the test appends to."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    switches = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda enabled, *a, **k: switches.append(enabled))
    trace = [{"action": "alloc"}]  # left by an earlier recording
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"device_traces": [trace]})
    with record_memory_history(max_entries=3) as history:
        trace.append({"action": "free_completed"})
        assert history.mark() == 1
    assert switches == ["all", None] and history.entries == [{"action": "free_completed"}] and history.marks == [1]
    with pytest.raises(RuntimeError, match="max_entries"):  # the ring buffer overwrote the start
        with record_memory_history(max_entries=3):
            trace.append({"action": "alloc"})
    assert switches[-1] is None
