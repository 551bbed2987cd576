"""Benchmark suite ``profiling``: the "Graph capture" chapter's training step, eager and replayed,
as traces (gzipped beside the JSON; the replay also labelled), their summaries, the profiler's
inflation against wall clocks, the cost of labels, and one step phase by phase (``host_phases``).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from itertools import islice
from pathlib import Path

import torch

from ..data import InOrder, PackedLoader, load_tokenizer
from ..graph.training import FixedCapacityTrainer
from ..isolation import run_isolated
from ..models import PackedLM
from ..profiling import annotate_trace, device_events, profile, record_annotations, save_trace, trace_summary
from ..profiling.compact import compact_timeline, host_phases
from ..regions import native_annotations_available
from .timing import cuda_event_us, host_call_us, median

TRACE_FOLDER = "profiling_traces"


def _trainer(tokenizer, first_batch, use_graph: bool, dim: int, num_heads: int) -> FixedCapacityTrainer:
    torch.manual_seed(0)
    model = PackedLM(tokenizer.vocab_size, dim, num_heads, device="cuda", dtype=torch.bfloat16)
    return FixedCapacityTrainer(model, first_batch, use_graph=use_graph)


def _step_durations_us(trace: dict) -> list[float]:
    """Host duration of each non-empty ``ProfilerStep#`` range."""
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    return [s["dur"] for s in sorted(steps, key=lambda e: e["ts"])][:-1]  # the last is the empty one left open


def _api_durations_us(trace: dict, name: str) -> list[float]:
    return [e["dur"] for e in trace["traceEvents"] if e.get("name") == name and e.get("ph") == "X"]


def _wall_step_us(trainer: FixedCapacityTrainer, batches: list, repeats: int, sync_each_step: bool) -> float:
    """Mean host time per step; ``sync_each_step`` ends each in a synchronize, as profiled steps do."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        for batch in batches:
            trainer.step(batch)
            if sync_each_step:
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (repeats * len(batches)) * 1e6


def _graph_spans_us(trace: dict) -> list[float]:
    """GPU span (first start to last end) of each ``cudaGraphLaunch``'s device events."""
    launches = {e["args"]["correlation"] for e in trace["traceEvents"] if e.get("name") == "cudaGraphLaunch"}
    replays = defaultdict(list)
    for event in device_events(trace):
        if event["args"].get("correlation") in launches:
            replays[event["args"]["correlation"]].append(event)
    return [max(e["ts"] + e["dur"] for e in es) - min(e["ts"] for e in es) for es in replays.values()]


def _profiled_steps(trainer: FixedCapacityTrainer, warm: list, profiled: list) -> dict:
    """The warm-up steps, then a trace of the profiled ones (the first of them the profiler's warm-up)."""
    for batch in warm:
        trainer.step(batch)
    with profile(None, warmup=1) as recording:
        for batch in profiled:
            trainer.step(batch)
            torch.cuda.synchronize()  # one step per ProfilerStep on the GPU side too
            recording.step()
    return recording.trace


def _batches(token_capacity: int, sequence_capacity: int, steps: int):
    tokenizer = load_tokenizer()
    loader = PackedLoader(token_capacity, sequence_capacity, tokenizer=tokenizer, policy=InOrder(), max_piece_tokens=1024)
    batches = list(islice(loader, 4 + steps))
    return tokenizer, batches[:3], batches[3:]  # warm-up; profiled: 1 warm-up step for the profiler + steps


PHASES = ("next batch", "copy to static buffers", "graph replay", "optimizer step")


def _phased_step(trainer: FixedCapacityTrainer, batches) -> None:
    """``FixedCapacityTrainer.step`` written out with one ``record_function`` range per phase."""
    with torch.profiler.record_function(PHASES[0]):
        batch = next(batches)
    with torch.profiler.record_function(PHASES[1]):
        trainer.static.copy_(batch)
    with torch.profiler.record_function(PHASES[2]):
        trainer.graph.replay()
    with torch.profiler.record_function(PHASES[3]):
        # The graph's gradient outputs (fixed addresses), attached as trainer.step does.
        for parameter, grad in zip(trainer.parameters, trainer.graph_gradients):
            parameter.grad = grad
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)


def host_phase_trace(trainer: FixedCapacityTrainer, token_capacity: int, sequence_capacity: int) -> dict:
    """One step of the captured ``trainer``, batch loading included, profiled with Python stacks:
    :func:`host_phases` and the step's :func:`compact_timeline` (host ops one deep)."""
    loader = PackedLoader(token_capacity, sequence_capacity, tokenizer=load_tokenizer(), policy=InOrder(),
                          max_piece_tokens=1024)
    batches = iter(loader)
    for _ in range(2):  # the loader's first batch reads the corpus; the step's lazy state
        _phased_step(trainer, batches)
    torch.cuda.synchronize()
    with profile(None, warmup=1, with_stack=True) as recording:
        for _ in range(2):  # the warm-up step (discarded), then the recorded one
            _phased_step(trainer, batches)
            torch.cuda.synchronize()
            recording.step()
    timeline = compact_timeline(recording.trace, max_depth=1, max_events=1500, name_chars=60)
    return {**host_phases(recording.trace, PHASES), "timeline": timeline}


def wall_clocks(token_capacity: int, sequence_capacity: int, dim: int, num_heads: int, steps: int) -> dict:
    """The suite's steps by wall clock in a process no profiler has touched (``run_isolated``): CUPTI
    slows a process's later launches. ``graph`` is captured with labels, ``plain`` without."""
    tokenizer, warm, profiled = _batches(token_capacity, sequence_capacity, steps)
    eager = _trainer(tokenizer, warm[0], False, dim, num_heads)
    plain = _trainer(tokenizer, warm[0], True, dim, num_heads)
    with record_annotations(["train step"]):
        graph = _trainer(tokenizer, warm[0], True, dim, num_heads)
    for trainer in (eager, plain, graph):
        for batch in warm:
            trainer.step(batch)
    # Each *_synced wall clock ends every step in a synchronize, like the profiled steps, so the
    # only difference from the trace's step length is the profiler itself.
    return {
        "eager_step_us_wall_synced": _wall_step_us(eager, profiled, repeats=20, sync_each_step=True),
        "graph_step_us_wall_synced": _wall_step_us(graph, profiled, repeats=20, sync_each_step=True),
        "eager_step_us_wall": _wall_step_us(eager, profiled, repeats=20, sync_each_step=False),
        "graph_step_us_wall": _wall_step_us(graph, profiled, repeats=20, sync_each_step=False),
        "graph_launch_us_wall": host_call_us(graph.graph.replay, 200, sync_before=False),
        "graph_replay_gpu_us_events": median(cuda_event_us(graph.graph.replay, 50)),
        "plain_graph_step_us_wall": _wall_step_us(plain, profiled, repeats=20, sync_each_step=False),
    }


def profiling_suite(out: Path | None = None, token_capacity: int = 4096, sequence_capacity: int = 32,
                    dim: int = 1024, num_heads: int = 8, steps: int = 3) -> dict:
    """The suite's record (see the module docstring); traces go to ``out/profiling_traces`` unless
    ``out`` is None (a notebook's live run)."""
    # Wall clocks first, in a fresh process: this one is about to host the profiler.
    walls = run_isolated(wall_clocks, token_capacity, sequence_capacity, dim, num_heads, steps)
    tokenizer, warm, profiled = _batches(token_capacity, sequence_capacity, steps)
    folder = None if out is None else Path(out) / TRACE_FOLDER
    record: dict = {"config": {"T": token_capacity, "N": sequence_capacity, "dim": dim, "num_heads": num_heads,
                               "steps": steps, "tokenizer": tokenizer.name},
                    "route": "graph node id" if native_annotations_available() else "capture order"}

    eager_trace = _profiled_steps(_trainer(tokenizer, warm[0], False, dim, num_heads), warm, profiled)
    plain_start = time.perf_counter()
    _trainer(tokenizer, warm[0], True, dim, num_heads)
    torch.cuda.synchronize()
    plain_capture_s = time.perf_counter() - plain_start
    labelled_start = time.perf_counter()
    with record_annotations(["train step"]) as annotations:
        graph_trainer = _trainer(tokenizer, warm[0], True, dim, num_heads)
        torch.cuda.synchronize()
    labelled_capture_s = time.perf_counter() - labelled_start
    graph_trace = _profiled_steps(graph_trainer, warm, profiled)
    labelled = annotate_trace(graph_trace, annotations)

    traces = {"eager": eager_trace, "graph_stock": graph_trace, "graph_labelled": labelled}
    if folder is not None:
        for name, trace in traces.items():
            save_trace(trace, folder / f"{name}.json.gz")
    record["trace_files"] = {name: f"{TRACE_FOLDER}/{name}.json.gz" for name in traces}
    record["annotations"] = annotations.to_dict()  # what graph_labelled was labelled with
    record["summaries"] = {name: trace_summary(trace) for name, trace in traces.items()}
    record["annotation"] = {
        **labelled["attn_gym_lite"],
        "captured_nodes": [len(g["ops"]) for g in annotations.graphs],
        "regions": sorted({op[1] for g in annotations.graphs for op in g["ops"] if op[1]}),
        "capture_s_plain": plain_capture_s,
        "capture_s_with_labels": labelled_capture_s,
    }

    # The profiler's view of host time against wall clocks with no profiler running (measured
    # above, in a process the profiler never touched).
    record["overhead"] = {
        "eager_step_us_profiler": statistics.median(_step_durations_us(traces["eager"])),
        "graph_step_us_profiler": statistics.median(_step_durations_us(traces["graph_stock"])),
        "graph_launch_us_profiler": statistics.median(_api_durations_us(traces["graph_stock"], "cudaGraphLaunch")),
        "graph_replay_gpu_us_profiler": statistics.median(_graph_spans_us(traces["graph_stock"])),
        **walls,
        "wall_clocks": "measured in a fresh process before any profiler ran",
    }
    # Last, as it adds Python stacks to this process's profiler: one step phase by phase.
    try:
        record["host_phases"] = host_phase_trace(graph_trainer, token_capacity, sequence_capacity)
    except Exception as error:  # recorded in the JSON; the measurements above stand
        record["host_phases_error"] = f"{type(error).__name__}: {error}"[-4000:]
    return record
