"""The three step pictures of issue #16 (hello-world timelines, host phases with Python stacks,
memory at the optimizer boundary): the reductions run on real CPU profiler output and are
checked against the raw events, the figures draw what the reductions kept; on a GPU, the suite
functions that record them."""

from collections import defaultdict

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

from attn_gym_lite.book.plots import (
    MIB,
    boundary_memory_bands,
    plot_boundary_memory,
    plot_compact_timeline,
    plot_hello_world_timelines,
    plot_host_phases,
)
from attn_gym_lite.profiling import profile
from attn_gym_lite.profiling.compact import compact_timeline, host_phases
from attn_gym_lite.profiling.memory import allocation_sites, allocation_timeline, find_blocks
from attn_gym_lite.profiling.trace import LANE_TID_BASE

matplotlib.use("Agg")

PHASES = ("next batch", "copy to static buffers", "graph replay", "optimizer step")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def _forward_backward(model, x):
    loss = model(x).square().mean()
    return torch.autograd.grad(loss, tuple(model.parameters()))


def _eager_trace():
    model, x = _model(), torch.randn(16, 32)
    with profile(None, warmup=1) as recording:
        for _ in range(2):
            _forward_backward(model, x)
            recording.step()
    return recording.trace


def _host_events(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
            and not str(e.get("name", "")).startswith("ProfilerStep#")]


def _reference_depth(event, events):
    """How many other slices on the event's thread hold it (naive: every pair)."""
    end = event["ts"] + event["dur"]
    return sum(1 for other in events if other is not event and other["tid"] % LANE_TID_BASE == event["tid"] % LANE_TID_BASE
               and other["ts"] <= event["ts"] and end <= other["ts"] + other["dur"]
               and (other["ts"], -other["dur"]) < (event["ts"], -event["dur"]))


def test_compact_timeline_keeps_every_host_op_at_its_depth():
    trace = _eager_trace()
    raw = _host_events(trace)
    timeline = compact_timeline(trace, max_depth=50, max_events=10**6, name_chars=10**4)
    assert timeline["counts"]["host_ops"] == len(raw) > 10
    assert timeline["counts"]["device_events"] == 0 and timeline["dropped"] == 0
    origin = min(e["ts"] for e in raw)
    expected = sorted((e["name"], _reference_depth(e, raw), round(e["ts"] - origin, 3), round(e["dur"], 3)) for e in raw)
    assert sorted((n, d, s, t) for n, _, d, s, t in timeline["events"]) == expected
    assert timeline["tracks"] == ["CPU thread 0"]
    assert timeline["span_us"] == pytest.approx(max(e["ts"] + e["dur"] for e in raw) - origin, abs=1e-2)
    # limits: depth first, then the latest events
    shallow = compact_timeline(trace, max_depth=0)
    assert [e[2] for e in shallow["events"]] == [0] * len(shallow["events"])
    assert len(shallow["events"]) == sum(_reference_depth(e, raw) == 0 for e in raw)
    assert shallow["dropped"] == len(raw) - len(shallow["events"])
    few = compact_timeline(trace, max_depth=50, max_events=3)
    assert len(few["events"]) == 3 and few["dropped"] == len(raw) - 3
    assert all(len(e[0]) <= 80 for e in compact_timeline(trace, name_chars=80)["events"])


def test_compact_timeline_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_depth"):
        compact_timeline(_eager_trace(), max_depth=-1)
    with pytest.raises(ValueError, match="no host op"):
        compact_timeline({"traceEvents": []})
    with pytest.raises(TypeError, match="trace"):
        compact_timeline("trace.json")


def _make_batch(depth=12):
    """Host work with a Python stack worth seeing: a recursion and many small tensors."""
    if depth:
        return _make_batch(depth - 1)
    return torch.stack([torch.arange(64, dtype=torch.float32) * i for i in range(400)])[:16, :32].contiguous()


def _phased_cpu_step(model, optimizer, static):
    with torch.profiler.record_function(PHASES[0]):
        batch = _make_batch()
    with torch.profiler.record_function(PHASES[1]):
        static.copy_(batch)
    with torch.profiler.record_function(PHASES[2]):
        grads = _forward_backward(model, static)
    with torch.profiler.record_function(PHASES[3]):
        for parameter, grad in zip(model.parameters(), grads):
            parameter.grad = grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_host_phases_on_a_cpu_step_with_python_stacks():
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    static = torch.zeros(16, 32)
    with profile(None, warmup=1, with_stack=True) as recording:
        for _ in range(2):
            _phased_cpu_step(model, optimizer, static)
            recording.step()
    trace = recording.trace
    result = host_phases(trace, PHASES, name_chars=10**4)
    ranges = {}
    for event in sorted(trace["traceEvents"], key=lambda e: e.get("ts", 0)):
        if event.get("ph") == "X" and event.get("cat") == "user_annotation" and event.get("name") in PHASES:
            ranges[event["name"]] = event
    origin = min(e["ts"] for e in ranges.values())
    for name in PHASES:
        span = result["phases"][name]
        assert span["dur_us"] == pytest.approx(ranges[name]["dur"], abs=1e-3)
        assert span["start_us"] == pytest.approx(ranges[name]["ts"] - origin, abs=1e-3)
        assert span["gpu_start_us"] is None and span["device_events"] == 0  # no GPU here
    assert result["longest"] == max(PHASES, key=lambda p: ranges[p]["dur"])
    assert result["stacks"] and result["top_frames"]
    # top frames against a naive sum over the raw Python slices of the longest phase (on its
    # thread, lanes that split_overlapping_lanes added included)
    phase = ranges[result["longest"]]
    frames = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "python_function"
              and e["tid"] % LANE_TID_BASE == phase["tid"] % LANE_TID_BASE
              and phase["ts"] <= e["ts"] and e["ts"] + e["dur"] <= phase["ts"] + phase["dur"]]
    by_name = defaultdict(list)
    for event in sorted(frames, key=lambda e: (e["ts"], -e["dur"])):
        by_name[event["name"]].append(event)
    for name, total, calls in result["top_frames"]:
        same = by_name[name]
        # outermost: no other call of the same frame holds it (of two equal slices, the first does)
        outer = [e for i, e in enumerate(same)
                 if not any(j != i and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
                            and (o["ts"], -o["dur"], j) < (e["ts"], -e["dur"], i) for j, o in enumerate(same))]
        assert total == pytest.approx(sum(e["dur"] for e in outer), abs=1e-2)
        assert calls == len(outer)
    totals = [t for _, t, _ in result["top_frames"]]
    assert totals == sorted(totals, reverse=True)
    if result["longest"] == PHASES[0]:  # the recursion is where "next batch" spends its time
        assert any("_make_batch" in name for name, _, _ in result["top_frames"])
    longest = result["phases"][result["longest"]]["dur_us"]
    assert all(0 <= start and start + length <= longest + 1e-2 for _, _, start, length in result["flame"])
    with pytest.raises(ValueError, match="no record_function range"):
        host_phases(trace, ["no such phase"])
    with pytest.raises(ValueError, match="phases"):
        host_phases(trace, "next batch")


def _cpu_allocator_entries(run):
    """Run ``run()`` under the CPU profiler with memory events, and return them as allocator
    trace entries (the form of ``torch.cuda.memory._snapshot()["device_traces"][i]``), the raw
    memory events, the start of the ``"mark"`` range and what ``run`` returned."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    import json
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        prof.export_chrome_trace(file.name)
        trace = json.load(open(file.name))
    memory = sorted((e for e in trace["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["ts"])
    mark = next(e["ts"] for e in trace["traceEvents"] if e.get("name") == "mark" and e.get("ph") == "X")
    entries = []
    for event in memory:
        size, addr = event["args"]["Bytes"], event["args"]["Addr"]
        if size > 0:
            entries.append({"action": "alloc", "addr": addr, "size": size, "time_us": event["ts"], "frames": []})
        else:
            entries += [{"action": action, "addr": addr, "size": -size, "time_us": event["ts"], "frames": []}
                        for action in ("free_requested", "free_completed")]
    return entries, memory, mark, result


def _step_with_a_mark():
    model, x = _model(), torch.randn(16, 32)
    grads = _forward_backward(model, x)
    with torch.profiler.record_function("mark"):
        pass
    pointers = [g.data_ptr() for g in grads]
    grad_bytes = sum(g.untyped_storage().nbytes() for g in grads)
    del grads
    return pointers, grad_bytes


def test_allocation_timeline_follows_the_cpu_allocator():
    entries, memory, mark_ts, (pointers, grad_bytes) = _cpu_allocator_entries(_step_with_a_mark)
    mark = sum(e["time_us"] < mark_ts for e in entries)
    blocks = find_blocks(entries, pointers, mark)
    assert len(blocks) == len(pointers)
    timeline = allocation_timeline(entries, {"gradients": blocks}, max_points=10**6)
    # the allocated bytes are the profiler's own running total, from its first event on
    start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]
    assert timeline["allocated_bytes"] == [e["args"]["Total Allocated"] - start for e in memory]
    assert timeline["peak"]["allocated_bytes"] == max(timeline["allocated_bytes"])
    assert timeline["time"] == "µs" and timeline["allocs"] == sum(e["args"]["Bytes"] > 0 for e in memory)
    # just before the mark every gradient is alive; after the step none is
    before_mark = max(i for i, entry in enumerate(timeline["entry"]) if entry < mark)
    assert timeline["tags"]["gradients"][before_mark] == grad_bytes == timeline["tag_bytes"]["gradients"]
    assert timeline["tags"]["gradients"][-1] == 0
    thin = allocation_timeline(entries, {"gradients": blocks}, max_points=5)
    assert len(thin["t"]) <= 7 and thin["peak"] == timeline["peak"]
    assert thin["allocated_bytes"][0] == timeline["allocated_bytes"][0]
    assert thin["allocated_bytes"][-1] == timeline["allocated_bytes"][-1]


def test_find_blocks_and_allocation_sites_on_hand_entries():
    frames = [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
              {"filename": "/site/attn_gym_lite/models/lm.py", "line": 88, "name": "loss"}]
    entries = [
        {"action": "alloc", "addr": 1000, "size": 512, "frames": frames},  # 0: freed before the mark
        {"action": "free_requested", "addr": 1000, "size": 512},
        {"action": "free_completed", "addr": 1000, "size": 512},
        {"action": "alloc", "addr": 1000, "size": 1024, "frames": frames},  # 3: the same address, alive
        {"action": "alloc", "addr": 4096, "size": 512, "frames": []},  # 4
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20},
    ]
    assert find_blocks(entries, [1000, 1000 + 600], 5) == {3}  # a view inside the block counts
    assert find_blocks(entries, [4096], 4, strict=False) == set()
    with pytest.raises(ValueError, match="lies in no block"):
        find_blocks(entries, [4096], 4)
    timeline = allocation_timeline(entries, {"tag": {3}})
    assert timeline["time"] == "entry" and timeline["t"] == [0, 2, 3, 4]
    assert timeline["allocated_bytes"] == [512, 0, 1024, 1536] and timeline["tags"]["tag"] == [0, 0, 1024, 1024]
    assert timeline["reserved_bytes"][-1] == 0  # the segment comes after the last allocation
    assert allocation_sites(entries) == [["attn_gym_lite/models/lm.py:88 loss", 1536, 2], ["(no Python frame)", 512, 1]]
    with pytest.raises(ValueError, match="alloc entries"):
        allocation_timeline(entries, {"tag": {1}})
    with pytest.raises(TypeError, match="entries"):
        allocation_timeline([1, 2])


def _bar_count(ax):
    return sum(len(c.get_paths()) for c in ax.collections)


def test_hello_world_timeline_figure_draws_every_kept_event():
    eager = compact_timeline(_eager_trace())
    record = {"timelines": {"eager": eager, "replay": compact_timeline(_eager_trace(), max_depth=0)}}
    fig = plot_hello_world_timelines(record)
    eager_ax, replay_ax = fig.axes
    assert _bar_count(eager_ax) == len(eager["events"])
    assert _bar_count(replay_ax) == len(record["timelines"]["replay"]["events"])
    assert eager_ax.get_title().startswith("eager: 0 launches")
    assert [t.get_text() for t in eager_ax.get_yticklabels()] == eager["tracks"][::-1]
    assert _bar_count(plot_compact_timeline(eager, max_depth=0)) == sum(e[2] == 0 for e in eager["events"])


def test_host_phase_figure_draws_each_phase_and_the_flame():
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with profile(None, warmup=1, with_stack=True) as recording:
        for _ in range(2):
            _phased_cpu_step(model, optimizer, torch.zeros(16, 32))
            recording.step()
    phases = host_phases(recording.trace, PHASES)
    fig = plot_host_phases(phases)
    phase_ax, flame_ax = fig.axes
    assert _bar_count(phase_ax) == len(PHASES)  # host spans only: no GPU on this machine
    assert [t.get_text() for t in phase_ax.get_yticklabels()] == list(PHASES)[::-1]
    assert _bar_count(flame_ax) == len(phases["flame"])
    assert phases["longest"] in flame_ax.get_title()


def test_boundary_memory_figure_stacks_to_the_allocated_total():
    entries, _, mark_ts, (pointers, grad_bytes) = _cpu_allocator_entries(_step_with_a_mark)
    mark = sum(e["time_us"] < mark_ts for e in entries)
    timeline = allocation_timeline(entries, {"fresh gradients": find_blocks(entries, pointers, mark)})
    params = list(_model().parameters())
    parameter_bytes = sum(p.numel() * p.element_size() for p in params)
    before = {"allocated_bytes": 10 * parameter_bytes, "parameter_bytes": parameter_bytes,
              "optimizer_state_bytes": 2 * parameter_bytes, "captured_gradient_bytes": parameter_bytes}
    mode = {"before": before, "timeline": timeline, "marked_entry": mark, "gradient_bytes": grad_bytes,
            "peak_allocated_bytes": before["allocated_bytes"] + timeline["peak"]["allocated_bytes"]}
    bands = boundary_memory_bands(mode)
    total = before["allocated_bytes"] + np.asarray(timeline["allocated_bytes"])
    assert np.allclose(sum(bands.values()), total)
    assert list(bands["fresh gradients"]) == timeline["tags"]["fresh gradients"]
    fig = plot_boundary_memory({"optimizer_boundary_memory": {"config": {}, "copy": mode, "attach": mode}})
    axes = fig.axes
    assert len(axes) == 2 and axes[0].get_title().startswith("copy")
    top = axes[0].collections[len(bands) - 1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(total.max() / MIB)


# --------------------------------------------------------------------------------------------
# GPU: the suite functions that record the pictures
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_hello_world_timelines_show_one_launch_per_replay():
    from attn_gym_lite.bench.hello_world import hello_world_timelines

    record = hello_world_timelines(256, 4, 1024, 8)
    eager, replay = record["eager"], record["replay"]
    assert replay["counts"]["launches"] == 1  # one cudaGraphLaunch
    assert eager["counts"]["launches"] > 5 and eager["counts"]["device_events"] >= replay["counts"]["device_events"] > 1
    assert any(t.startswith("GPU stream") for t in replay["tracks"])
    assert plot_hello_world_timelines({"timelines": record}).axes


@pytest.mark.gpu
def test_optimizer_boundary_memory_finds_every_gradient():
    from attn_gym_lite.bench.buckets import BOUNDARY_MODES, optimizer_boundary_memory

    record = optimizer_boundary_memory(1024, 128, 2)
    copy, attach = (record[m] for m in BOUNDARY_MODES)
    for mode in (copy, attach):
        tagged = mode["timeline"]["tag_bytes"]["fresh gradients"]
        # every gradient found by address (a block may be rounded up by the allocator)
        assert tagged >= mode["gradient_bytes"] == mode["before"]["parameter_bytes"]
        assert mode["timeline"]["peak"]["tags"]["fresh gradients"] >= 0
        assert mode["timeline"]["tags"]["fresh gradients"][-1] == 0  # freed by the end of the step
    assert copy["before"]["captured_gradient_bytes"] == copy["before"]["parameter_bytes"]
    assert attach["before"]["captured_gradient_bytes"] == 0
    assert plot_boundary_memory(record).axes


@pytest.mark.gpu
def test_host_phase_trace_times_every_phase_on_the_gpu():
    from attn_gym_lite.bench.profiling import PHASES as SUITE_PHASES
    from attn_gym_lite.bench.profiling import _batches, _trainer, host_phase_trace

    tokenizer, warm, _ = _batches(1024, 8, 1)
    trainer = _trainer(tokenizer, warm[0], True, 128, 2)
    result = host_phase_trace(trainer, 1024, 8)
    assert result["order"] == list(SUITE_PHASES) and result["stacks"]
    replay = result["phases"]["graph replay"]
    assert replay["launches"] == 1 and replay["gpu_start_us"] is not None
    assert result["phases"]["next batch"]["device_events"] == 0
    assert plot_host_phases(result).axes
