"""Malformed input to the profiling reductions (compact_timeline, host_phases, trace_summary,
replay_idle, find_blocks, allocation_timeline, allocation_sites, record_memory_history): each
raises a TypeError or ValueError that names the argument (or the event / entry), the expectation
and the value, instead of an AttributeError, KeyError or comparison error from deep inside."""

import pytest
import torch

from attn_gym_lite.profiling import CAPTURE_ORDER, GraphAnnotations, annotate_trace, split_overlapping_lanes
from attn_gym_lite.profiling.compact import compact_timeline, host_phases
from attn_gym_lite.profiling.memory import allocation_sites, allocation_timeline, find_blocks, record_memory_history
from attn_gym_lite.profiling.summary import device_events, replay_idle, trace_summary


def kernel(**fields):
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 2.0,
            "args": {"correlation": 1, "stream": 7}, **fields}


def host_op(**fields):
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5.0, "dur": 3.0, **fields}


def launch():
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 8.0, "dur": 1.0,
            "args": {"correlation": 1}}


def phase():
    return {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0}


def trace_with(*events):
    return {"traceEvents": [host_op(), launch(), phase(), kernel(), *events]}


# ---------------------------------------------------------------------------------------------
# Traces.

READERS = {
    "compact_timeline": compact_timeline,
    "host_phases": lambda trace: host_phases(trace, ["step"]),
    "trace_summary": trace_summary,
    "replay_idle": replay_idle,
    "device_events": device_events,
    # Break-it round 8: these two read every slice; before, an event that is not a dict raised
    # AttributeError, a string dur a TypeError from a sort key, and a NaN dur opened a lane.
    "split_overlapping_lanes": split_overlapping_lanes,
    "annotate_trace": lambda trace: annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER)),
}

BAD_TRACES = [
    ("a path", "trace.json", TypeError, r"trace must be a Chrome trace dict .*got str \(a path\? load it"),
    ("None", None, TypeError, "trace must be a Chrome trace dict with a 'traceEvents' list, got NoneType"),
    ("a list", [kernel()], TypeError, "trace must be a Chrome trace dict with a 'traceEvents' list, got list"),
    ("no traceEvents", {"events": []}, ValueError,
     r"trace must be a Chrome trace dict with a 'traceEvents' list, got a dict without 'traceEvents' \(keys \['events'\]\)"),
    ("an empty dict", {}, ValueError, r"got a dict without 'traceEvents' \(no keys\)"),
    ("traceEvents a dict", {"traceEvents": {}}, TypeError, r"trace\['traceEvents'\] must be a list of trace events, got dict"),
    ("an event not a dict", trace_with(3), TypeError, r"trace\['traceEvents'\]\[4\] must be a dict \(a trace event\), got int 3"),
    ("ts a string", trace_with(kernel(ts="12")), TypeError,
     r"trace\['traceEvents'\]\[4\]\['ts'\] must be a finite real number, got '12'"),
    ("ts a bool", trace_with(kernel(ts=True)), TypeError, r"\['ts'\] must be a finite real number, got True"),
    ("ts NaN", trace_with(kernel(ts=float("nan"))), ValueError, r"\[4\]\['ts'\] must be a finite real number, got nan"),
    ("dur None", trace_with(kernel(dur=None)), TypeError,
     r"trace\['traceEvents'\]\[4\]\['dur'\] must be a finite real number >= 0.0, got None"),
    ("dur negative", trace_with(kernel(dur=-2)), ValueError, r"\[4\]\['dur'\] must be a finite real number >= 0.0, got -2.0"),
    ("dur infinite", trace_with(kernel(dur=float("inf"))), ValueError, r"\['dur'\] must be a finite real number >= 0.0, got inf"),
    ("args a string", trace_with(kernel(args="stream 7")), TypeError, r"\[4\]\['args'\] must be a dict, got str 'stream 7'"),
    # Reliability tail, round 2: a list cat or ph raised "unhashable type: 'list'" in every reader.
    ("cat a list", trace_with(kernel(cat=["kernel"])), TypeError, r"\[4\]\['cat'\] must be a str, got list \['kernel'\]"),
    ("ph a list", trace_with(kernel(ph=["X"])), TypeError, r"\[4\]\['ph'\] must be a str, got list \['X'\]"),
]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("label, trace, error, message", BAD_TRACES, ids=[case[0] for case in BAD_TRACES])
def test_trace_readers_name_what_is_malformed(reader, label, trace, error, message):
    with pytest.raises(error, match=message) as caught:
        READERS[reader](trace)
    assert str(caught.value).startswith(f"{reader}: ")


def test_compact_timeline_checks_the_host_slices_it_reads():
    with pytest.raises(ValueError, match=r"compact_timeline: trace\['traceEvents'\]\[4\]\['dur'\] must be .* >= 0.0, got -1.0"):
        compact_timeline(trace_with(host_op(dur=-1)))
    with pytest.raises(TypeError, match=r"\[4\]\['ts'\] must be a finite real number, got \[5\]"):
        compact_timeline(trace_with({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": [5], "dur": 1}))
    # trace_summary reads the host ops too (which ProfilerStep# ranges hold work).
    with pytest.raises(ValueError, match=r"trace_summary: trace\['traceEvents'\]\[0\]\['dur'\] must be .* >= 0.0, got -3.0"):
        trace_summary({"traceEvents": [host_op(dur=-3), kernel()]})
    # The readers only check the slices they read: a malformed flow event or instant is left alone.
    other = [{"ph": "s", "cat": "ac2g", "ts": "?", "id": 1}, {"ph": "X", "cat": "python_function", "ts": 1, "dur": -4}]
    assert compact_timeline(trace_with(*other))["counts"]["device_events"] == 1


def test_a_slice_without_ts_or_dur_is_incomplete_and_skipped():
    """As every reader of the package does (tests/test_profiling.py's malformed-events test): an
    incomplete slice cannot be placed on a timeline, so it is left out rather than fatal."""
    trace = trace_with(kernel(name="open"), {"ph": "X", "cat": "kernel", "name": "no dur", "ts": 30.0},
                       {"ph": "X", "cat": "cpu_op", "name": "no ts", "dur": 4.0, "pid": 1, "tid": 1})
    del trace["traceEvents"][4]["dur"]
    timeline = compact_timeline(trace)
    assert timeline["counts"]["device_events"] == 1 and timeline["counts"]["host_ops"] == 2  # the op and the phase
    assert trace_summary(trace)["device_events"] == 1


def test_good_traces_still_read():
    timeline = compact_timeline(trace_with())
    assert timeline["counts"] == {"host_ops": 2, "runtime_calls": 1, "launches": 1, "device_events": 1,
                                  "device_busy_us": 2.0}
    assert trace_summary(trace_with())["busy_us"] == 2.0
    assert replay_idle(trace_with())["replays"] == 1


# ---------------------------------------------------------------------------------------------
# Allocator entries.

ENTRIES = [
    {"action": "alloc", "addr": 1000, "size": 512, "time_us": 1.0},
    {"action": "free_requested", "addr": 1000, "size": 512, "time_us": 2.0},
    {"action": "free_completed", "addr": 1000, "size": 512, "time_us": 3.0},
    {"action": "alloc", "addr": 1000, "size": 1024, "time_us": 4.0},
    {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "time_us": 5.0},
]

ENTRY_READERS = {
    "find_blocks": lambda entries: find_blocks(entries, [], 0),
    "allocation_timeline": allocation_timeline,
    "allocation_sites": allocation_sites,
}


def _with(index, **fields):
    entries = [dict(e) for e in ENTRIES]
    entries[index].update(fields)
    for key, value in fields.items():
        if value is ...:
            del entries[index][key]
    return entries


BAD_ENTRIES = [
    ("None", None, TypeError, "entries must be a list of allocator trace entries .dicts with an 'action'., got NoneType"),
    ("a string", "alloc", TypeError, "entries must be a list of allocator trace entries .*got str"),
    ("a dict", ENTRIES[0], TypeError, "entries must be a list of allocator trace entries .*got dict"),
    ("an entry not a dict", [*ENTRIES, 7], TypeError,
     r"entries\[5\] must be an allocator trace entry \(a dict with an 'action'\), got int 7"),
    ("no action", _with(1, action=...), ValueError, r"entries\[1\] must have an 'action' .*got keys \['addr', 'size', 'time_us'\]"),
    ("alloc without addr", _with(0, addr=...), ValueError, r"entries\[0\] \(action 'alloc'\) must have 'addr', got keys"),
    ("alloc without size", _with(3, size=...), ValueError, r"entries\[3\] \(action 'alloc'\) must have 'size'"),
    ("free without addr", _with(2, addr=...), ValueError, r"entries\[2\] \(action 'free_completed'\) must have 'addr'"),
    ("segment without size", _with(4, size=...), ValueError, r"entries\[4\] \(action 'segment_alloc'\) must have 'size'"),
    ("size a string", _with(0, size="512"), TypeError, r"entries\[0\]\['size'\] must be an int >= 0, got '512'"),
    ("size a float", _with(4, size=2.0), TypeError, r"entries\[4\]\['size'\] must be an int >= 0, got 2.0"),
    ("size negative", _with(0, size=-512), ValueError, r"entries\[0\]\['size'\] must be an int >= 0, got -512"),
    ("addr negative", _with(1, addr=-1), ValueError, r"entries\[1\]\['addr'\] must be an int >= 0, got -1"),
    ("time_us a string", _with(2, time_us="3"), TypeError, r"entries\[2\]\['time_us'\] must be a finite real number, got '3'"),
    ("time_us NaN", _with(2, time_us=float("nan")), ValueError, r"entries\[2\]\['time_us'\] must be a finite real number, got nan"),
]


@pytest.mark.parametrize("reader", ENTRY_READERS)
@pytest.mark.parametrize("label, entries, error, message", BAD_ENTRIES, ids=[case[0] for case in BAD_ENTRIES])
def test_entry_readers_name_what_is_malformed(reader, label, entries, error, message):
    with pytest.raises(error, match=message):
        ENTRY_READERS[reader](entries)


def test_fields_no_reduction_reads_are_not_checked():
    entries = [*ENTRIES, {"action": "oom", "device_free": 0}, {"action": "snapshot", "addr": None}]
    assert allocation_timeline(entries)["allocs"] == 2
    assert find_blocks(entries, [1000], 4) == {3}


@pytest.mark.parametrize("pointers, error, message", [
    (1000, TypeError, r"pointers must be an iterable of ints \(tensor.data_ptr\(\) values\), got int 1000"),
    ("1000", TypeError, "pointers must be an iterable of ints .*got str '1000'"),
    ([1000.0], TypeError, r"pointers\[0\] must be an int >= 0, got 1000.0"),
    ([1000, True], TypeError, r"pointers\[1\] must be an int >= 0, got True"),
    ([torch.zeros(2)], TypeError, r"pointers\[0\] must be an int >= 0, got tensor"),
    ([-8], ValueError, r"pointers\[0\] must be an int >= 0, got -8"),
])
def test_find_blocks_checks_pointers(pointers, error, message):
    with pytest.raises(error, match=message):
        find_blocks(ENTRIES, pointers, 4, strict=False)


def test_find_blocks_still_finds_blocks():
    assert find_blocks(ENTRIES, iter([1000 + 1023]), 4) == {3}  # any iterable, a view's pointer inside the block
    assert find_blocks(ENTRIES, [], 4) == set()
    with pytest.raises(ValueError, match=r"alive_at must be an int in \[0, 5\], got 6"):
        find_blocks(ENTRIES, [1000], 6)
    with pytest.raises(TypeError, match="strict must be a bool, got 1"):
        find_blocks(ENTRIES, [1000], 4, strict=1)


@pytest.mark.parametrize("tags, error, message", [
    (["a"], TypeError, r"tags must be a dict of tag name -> indices of alloc entries, or None, got list \['a'\]"),
    ({1: {0}}, TypeError, "tags' names must be str, got int 1"),
    ({"a": 0}, TypeError, r"tags\['a'\] must be an iterable of alloc entry indices \(find_blocks' result\), got int 0"),
    ({"a": "0"}, TypeError, r"tags\['a'\] must be an iterable of alloc entry indices .*got str '0'"),
    ({"a": [0.0]}, TypeError, r"tags\['a'\]\[0\] must be an int, got 0.0"),
    ({"a": [0, False]}, TypeError, r"tags\['a'\]\[1\] must be an int, got False"),
    ({"a": [1]}, ValueError, r"tags\['a'\] must list indices of alloc entries, got \[1\] \(entry 1 is a 'free_requested'\)"),
    ({"a": [9]}, ValueError, r"tags\['a'\] must list indices of alloc entries, got \[9\] \(entries has 5 entries\)"),
    ({"a": [-1]}, ValueError, r"got \[-1\]"),
])
def test_allocation_timeline_checks_tags(tags, error, message):
    with pytest.raises(error, match=message):
        allocation_timeline(ENTRIES, tags)


def test_allocation_timeline_still_reads_good_entries():
    timeline = allocation_timeline(ENTRIES, {"late": [3]})
    # Independent: the running sum of +size per alloc and -size per free_completed.
    running, expected = 0, []
    for entry in ENTRIES:
        if entry["action"] in ("alloc", "free_completed"):
            running += entry["size"] if entry["action"] == "alloc" else -entry["size"]
            expected.append(running)
    assert timeline["allocated_bytes"] == expected == [512, 0, 1024]
    assert timeline["t"] == [0.0, 2.0, 3.0] and timeline["tags"]["late"] == [0, 0, 1024]
    assert allocation_timeline(ENTRIES, None)["tags"] == {}


# ---------------------------------------------------------------------------------------------
# record_memory_history(device=...): checked when it is built, before any CUDA call.

_CUDA_EXPECTATION = r"device must be a CUDA device: an index \(int >= 0\), 'cuda', 'cuda:<index>', a CUDA torch.device or None"


@pytest.mark.parametrize("device, error, message", [
    ("cpu", ValueError, _CUDA_EXPECTATION + r" \(the allocator history is CUDA's\), got 'cpu'"),
    (torch.device("cpu"), ValueError, r"\(the allocator history is CUDA's\), got device\(type='cpu'\)"),
    ("meta", ValueError, "got 'meta'"),
    ("nonsense", ValueError, _CUDA_EXPECTATION + ", got 'nonsense'"),
    ("cuda:x", ValueError, "got 'cuda:x'"),
    (1.5, TypeError, _CUDA_EXPECTATION + ", got float 1.5"),
    (True, TypeError, "got bool True"),
    ([0], TypeError, r"got list \[0\]"),
    (-1, ValueError, "device must be an int >= 0, got -1"),
])
def test_record_memory_history_refuses_a_device_that_is_not_cuda(device, error, message):
    with pytest.raises(error, match=message):
        record_memory_history(device=device)


@pytest.mark.parametrize("device, index", [(None, None), ("cuda", None), ("cuda:1", 1), (torch.device("cuda", 2), 2), (0, 0)])
def test_record_memory_history_reads_the_device_index(device, index):
    assert record_memory_history(device=device).device == index


def test_record_memory_history_refuses_an_index_past_the_last_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device must be a CUDA device index in \[0, 1\] \(this host has 2 GPUs\), got 3"):
        with record_memory_history(device="cuda:3"):
            pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_record_memory_history_needs_cuda_at_entry():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        with record_memory_history(device=0):
            pass


# ---------------------------------------------------------------------------------------------
# Break-it round 8: trace_summary's numbers, and the trace writers/rewriters.


def _naive_busy_and_gaps(intervals):
    """Busy time and gaps by marking every unit of a fine integer grid (an independent reference)."""
    if not intervals:
        return 0.0, []
    lo, hi = min(s for s, _ in intervals), max(e for _, e in intervals)
    covered = [False] * (hi - lo)
    for s, e in intervals:
        for t in range(s, e):
            covered[t - lo] = True
    gaps, run = [], 0
    for c in covered:
        if c:
            if run:
                gaps.append(float(run))
            run = 0
        else:
            run += 1
    return float(sum(covered)), gaps


def test_trace_summary_numbers_match_a_naive_sweep_and_take_numpy_arguments():
    """Before: min_gap_us=NaN was taken and counted no gap at all, True counted as 1 µs, numpy
    numbers for steps / min_gap_us were refused with a ValueError."""
    np = pytest.importorskip("numpy")
    events = [kernel(ts=0.0, dur=10.0), kernel(ts=5.0, dur=2.0), kernel(ts=20.0, dur=5.0), kernel(ts=27.0, dur=1.0),
              kernel(ts=40.0, dur=3.0)]
    busy, gaps = _naive_busy_and_gaps([(0, 10), (5, 7), (20, 25), (27, 28), (40, 43)])
    summary = trace_summary({"traceEvents": events}, steps=np.int64(2), min_gap_us=np.float32(3.0))
    assert summary["busy_us"] == busy == 19.0 and summary["window_us"] == 43.0
    counted = [g for g in gaps if g >= 3.0]
    assert summary["gaps"] == {"count": len(counted), "total_us": sum(counted), "largest_us": max(counted)}
    assert summary["kernels_per_step"] == 2.5
    for value, error, message in [
        (float("nan"), ValueError, r"trace_summary: min_gap_us must be a finite real number >= 0.0, got nan"),
        (True, TypeError, r"trace_summary: min_gap_us must be a finite real number >= 0.0, got True"),
        ("1", TypeError, r"trace_summary: min_gap_us must be a finite real number >= 0.0, got '1'"),
    ]:
        with pytest.raises(error, match=message):
            trace_summary({"traceEvents": events}, min_gap_us=value)
    with pytest.raises(TypeError, match=r"trace_summary: steps must be an int >= 1, got True"):
        trace_summary({"traceEvents": events}, steps=True)


def test_lane_splitting_skips_incomplete_slices_and_odd_metadata():
    """Before: a slice with a dur but no ts raised KeyError 'ts'; a thread_name event whose args
    are not a dict raised AttributeError."""
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "dur": 1.0, "tid": 7},
                             {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": 3},
                             kernel(ts=0.0, dur=10.0), kernel(ts=5.0, dur=10.0)]}
    out = split_overlapping_lanes(trace)
    assert [e.get("tid") for e in out["traceEvents"]] == [7, 7, 7, 1_000_007, 1_000_007]
    assert out["traceEvents"][-1]["args"] == {"name": "thread 7 (lane 1)"}
    annotated = annotate_trace(trace, GraphAnnotations(CAPTURE_ORDER))
    assert annotated["attn_gym_lite"]["replays"] == 0


def test_record_memory_history_records_one_block(monkeypatch):
    """Before: a nested entry of the same object was taken, and its exit turned the allocator
    history off under the outer block (the outer entries silently stopped); mark() before entry
    read the snapshot of whatever device. CUDA is faked: only the state machine is checked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    switches = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda enabled, *a, **k: switches.append(enabled))
    trace = [{"action": "alloc"}]
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"device_traces": [trace]})
    history = record_memory_history(device=0)
    with pytest.raises(RuntimeError, match=r"mark\(\) belongs inside the with block, but the recording is new"):
        history.mark()
    with history:
        with pytest.raises(RuntimeError, match="this recording is already on; one record_memory_history records one block"):
            history.__enter__()
        trace.append({"action": "free_completed"})
        assert history.mark() == 1
    assert switches == ["all", None] and history.entries == [{"action": "free_completed"}] and history.marks == [1]
    with pytest.raises(RuntimeError, match="this recording is done"):
        with history:
            pass
    assert switches == ["all", None]


@pytest.mark.parametrize("package", [3, "", None])
def test_allocation_sites_refuses_a_package_that_is_not_a_path_fragment(package):
    """Before: package=3 raised "'in <string>' requires string as left operand"; package='' matched
    every file and cut every site to ':<line> <name>'."""
    entries = [{"action": "alloc", "addr": 0, "size": 8, "frames": [{"filename": "/x/y.py", "line": 3, "name": "f"}]}]
    assert allocation_sites(entries) == [["/x/y.py:3 f", 8, 1]]
    with pytest.raises(TypeError, match=r"package must be a non-empty str .*got " + repr(package)):
        allocation_sites(entries, package=package)
