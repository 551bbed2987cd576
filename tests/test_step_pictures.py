"""The three step pictures (hello-world timelines, host phases, memory at the optimizer boundary):
the reductions on real CPU profiler output against the raw events, the figures of what they kept,
and what the GPU recordings of them show."""

import json
from collections import defaultdict

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

from attn_gym_lite.book.figures.ch02_capture import plot_hello_world_timelines
from attn_gym_lite.book.figures.ch03_profiling import plot_host_phases
from attn_gym_lite.book.figures.ch06_buckets import MIB, boundary_memory_bands, plot_boundary_memory
from attn_gym_lite.book.results import load_result
from attn_gym_lite.profiling import profile
from attn_gym_lite.profiling.compact import compact_timeline, host_phases
from attn_gym_lite.profiling.memory import allocation_timeline, find_blocks
from attn_gym_lite.profiling.trace import LANE_TID_BASE

matplotlib.use("Agg")

PHASES = ("next batch", "copy to static buffers", "graph replay", "optimizer step")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def _forward_backward(model, x):
    return torch.autograd.grad(model(x).square().mean(), tuple(model.parameters()))


def _bar_count(ax):
    return sum(len(c.get_paths()) for c in ax.collections)


def _holds(outer, inner):  # on the same thread (any lane), from start to end
    return (outer["tid"] % LANE_TID_BASE == inner["tid"] % LANE_TID_BASE and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])


def _make_batch(depth=12):
    """Host work with a Python stack worth seeing: a recursion and many small tensors."""
    if depth:
        return _make_batch(depth - 1)
    return torch.stack([torch.arange(64, dtype=torch.float32) * i for i in range(400)])[:16, :32].contiguous()


def test_compact_timeline_keeps_every_host_op_at_its_depth_and_the_figure_draws_them():
    model, x = _model(), torch.randn(16, 32)
    with profile(None, warmup=1) as recording:
        for _ in range(2):
            _forward_backward(model, x)
            recording.step()
    trace = recording.trace
    raw = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
           and not str(e.get("name", "")).startswith("ProfilerStep#")]
    # naive depth: how many other slices on the event's thread hold it (of two equal ones, the first holds)
    depth = {id(e): sum(1 for o in raw if o is not e and _holds(o, e)
                        and (o["ts"], -o["dur"]) < (e["ts"], -e["dur"])) for e in raw}
    timeline = compact_timeline(trace, max_depth=50, max_events=10**6, name_chars=10**4)
    assert timeline["counts"]["host_ops"] == len(raw) > 10
    assert timeline["counts"]["device_events"] == 0 and timeline["dropped"] == 0
    origin = min(e["ts"] for e in raw)
    expected = sorted((e["name"], depth[id(e)], round(e["ts"] - origin, 3), round(e["dur"], 3)) for e in raw)
    assert sorted((n, d, s, t) for n, _, d, s, t in timeline["events"]) == expected
    assert timeline["tracks"] == ["CPU thread 0"]
    assert timeline["span_us"] == pytest.approx(max(e["ts"] + e["dur"] for e in raw) - origin, abs=1e-2)
    shallow = compact_timeline(trace, max_depth=0)  # the outermost ops only
    assert [e[2] for e in shallow["events"]] == [0] * sum(d == 0 for d in depth.values()) == [0] * (len(raw) - shallow["dropped"])
    # the figure: a bar per kept event, a panel per mode
    eager_ax, replay_ax = plot_hello_world_timelines({"timelines": {"eager": timeline, "replay": shallow}}).axes
    assert _bar_count(eager_ax) == len(timeline["events"]) and _bar_count(replay_ax) == len(shallow["events"])
    assert eager_ax.get_title().startswith("eager: 0 launches")
    assert [t.get_text() for t in eager_ax.get_yticklabels()] == timeline["tracks"][::-1]


def test_host_phases_on_a_cpu_step_with_python_stacks_and_their_figure():
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    static = torch.zeros(16, 32)
    with profile(None, warmup=1, with_stack=True) as recording:
        for _ in range(2):
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
            recording.step()
    trace = recording.trace
    result = host_phases(trace, PHASES, name_chars=10**4)
    ranges = {e["name"]: e for e in sorted(trace["traceEvents"], key=lambda e: e.get("ts", 0))
              if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") in PHASES}  # the last step's
    origin = min(e["ts"] for e in ranges.values())
    for name in PHASES:
        span = result["phases"][name]
        assert span["dur_us"] == pytest.approx(ranges[name]["dur"], abs=1e-3)
        assert span["start_us"] == pytest.approx(ranges[name]["ts"] - origin, abs=1e-3)
        assert span["gpu_start_us"] is None and span["device_events"] == 0  # no GPU here
    assert result["longest"] == max(PHASES, key=lambda p: ranges[p]["dur"])
    assert result["stacks"] and result["top_frames"]
    # top frames against a naive sum over the outermost raw Python slices of the longest phase
    phase = ranges[result["longest"]]
    by_name = defaultdict(list)
    for e in sorted(trace["traceEvents"], key=lambda e: (e.get("ts", 0), -e.get("dur", 0))):
        if e.get("ph") == "X" and e.get("cat") == "python_function" and _holds(phase, e):
            by_name[e["name"]].append(e)
    for name, total, calls in result["top_frames"]:
        same = by_name[name]
        outer = [e for i, e in enumerate(same) if not any(j != i and _holds(o, e) and (o["ts"], -o["dur"], j) < (e["ts"], -e["dur"], i)
                                                          for j, o in enumerate(same))]
        assert (total, calls) == (pytest.approx(sum(e["dur"] for e in outer), abs=1e-2), len(outer))
    totals = [t for _, t, _ in result["top_frames"]]
    assert totals == sorted(totals, reverse=True)
    if result["longest"] == PHASES[0]:  # the recursion is where "next batch" spends its time
        assert any("_make_batch" in name for name, _, _ in result["top_frames"])
    longest = result["phases"][result["longest"]]["dur_us"]
    assert all(0 <= start and start + length <= longest + 1e-2 for _, _, start, length in result["flame"])
    phase_ax, flame_ax = plot_host_phases(result).axes
    assert _bar_count(phase_ax) == len(PHASES)  # host spans only: no GPU on this machine
    assert [t.get_text() for t in phase_ax.get_yticklabels()] == list(PHASES)[::-1]
    assert _bar_count(flame_ax) == len(result["flame"]) and result["longest"] in flame_ax.get_title()


def test_allocation_timeline_follows_the_cpu_allocator_and_the_figure_stacks_to_its_total(tmp_path):
    model, x = _model(), torch.randn(16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        grads = _forward_backward(model, x)
        with torch.profiler.record_function("mark"):
            pass
        pointers, grad_bytes = [g.data_ptr() for g in grads], sum(g.untyped_storage().nbytes() for g in grads)
        del grads
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    memory = sorted((e for e in trace["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["ts"])
    mark_ts = next(e["ts"] for e in trace["traceEvents"] if e.get("name") == "mark" and e.get("ph") == "X")
    entries = []  # the profiler's memory events as allocator trace entries (torch.cuda.memory._snapshot's form)
    for e in memory:
        size, addr, ts = e["args"]["Bytes"], e["args"]["Addr"], e["ts"]
        actions = ["alloc"] if size > 0 else ["free_requested", "free_completed"]
        entries += [{"action": a, "addr": addr, "size": abs(size), "time_us": ts, "frames": []} for a in actions]
    mark = sum(e["time_us"] < mark_ts for e in entries)
    blocks = find_blocks(entries, pointers, mark)
    assert len(blocks) == len(pointers)
    timeline = allocation_timeline(entries, {"fresh gradients": blocks}, max_points=10**6)
    start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]  # the profiler's own running total
    assert timeline["allocated_bytes"] == [e["args"]["Total Allocated"] - start for e in memory]
    assert timeline["allocs"] == sum(e["args"]["Bytes"] > 0 for e in memory)
    before_mark = max(i for i, entry in enumerate(timeline["entry"]) if entry < mark)  # every gradient alive
    assert timeline["tags"]["fresh gradients"][before_mark] == grad_bytes == timeline["tag_bytes"]["fresh gradients"]
    assert timeline["tags"]["fresh gradients"][-1] == 0
    # the figure: bands that stack to the allocated total
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = {"allocated_bytes": 10 * parameter_bytes, "parameter_bytes": parameter_bytes,
              "optimizer_state_bytes": 2 * parameter_bytes, "captured_gradient_bytes": parameter_bytes}
    mode = {"before": before, "timeline": timeline, "marked_entry": mark, "gradient_bytes": grad_bytes,
            "peak_allocated_bytes": before["allocated_bytes"] + timeline["peak"]["allocated_bytes"]}
    bands = boundary_memory_bands(mode)
    total = before["allocated_bytes"] + np.asarray(timeline["allocated_bytes"])
    assert np.allclose(sum(bands.values()), total)
    assert list(bands["fresh gradients"]) == timeline["tags"]["fresh gradients"]
    axes = plot_boundary_memory({"optimizer_boundary_memory": {"config": {}, "copy": mode, "attach": mode}}).axes
    assert len(axes) == 2 and axes[0].get_title().startswith("copy")
    assert axes[0].collections[len(bands) - 1].get_paths()[0].vertices[:, 1].max() == pytest.approx(total.max() / MIB)


def test_the_recorded_step_pictures_show_what_the_chapters_say():
    # What the suites recorded on the GPU: one launch per replay, every fresh gradient found by
    # address (a block may be rounded up) and freed by the end of the step, one graph per replay phase.
    timelines = load_result("hello-world")["timelines"]
    eager, replay = timelines["eager"]["counts"], timelines["replay"]["counts"]
    assert replay["launches"] == 1 < 5 < eager["launches"] and eager["device_events"] >= replay["device_events"] > 1
    modes = [m for m in load_result("buckets")["optimizer_boundary_memory"].values() if isinstance(m, dict) and "timeline" in m]
    for mode in modes:
        assert mode["timeline"]["tag_bytes"]["fresh gradients"] >= mode["gradient_bytes"] == mode["before"]["parameter_bytes"]
        assert mode["timeline"]["tags"]["fresh gradients"][-1] == 0
    assert sorted(m["before"]["captured_gradient_bytes"] for m in modes) == [0, modes[0]["before"]["parameter_bytes"]]  # copy, attach
    phases = load_result("profiling")["host_phases"]
    assert phases["stacks"] and phases["phases"]["graph replay"]["launches"] == 1 and phases["phases"]["next batch"]["device_events"] == 0
