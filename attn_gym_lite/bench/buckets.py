"""Benchmark suite ``buckets``: memory and compute of graph buckets versus one graph.

Parts, each in a fresh process: ``memory`` (allocated, reserved and graph-private MiB after
capture, per configuration), ``compute`` (replay time of one graph at ``T`` versus the bucket that
fits ``L``), ``lifetime`` (an output kept across another bucket's replay, and the debug guard),
``optimizer_boundary`` (eager fused Adam versus a captured Adam step) and its memory, and
``training`` (a :class:`PackedLM` trained from one graph and from planned buckets, same batches).
"""

from __future__ import annotations

import gc
import time
from itertools import islice

import torch
from torch import nn

from ..data import InOrder, PackedLoader, load_tokenizer
from ..data.capacity import plan_buckets, select_bucket
from ..graph.buckets import GraphBuckets, private_pool_bytes
from ..graph.capture import capture_graph
from ..isolation import run_isolated
from ..models import PackedLM
from ..profiling.memory import allocation_sites, allocation_timeline, find_blocks, record_memory_history
from .harness import device_us, error_text, isolated, run_parts
from .timing import host_call_us, wall_clock_us

MIB = 2**20
CONFIGS = ("one graph", "shared buckets", "independent graphs", "torch.compile reduce-overhead")


def _projections(dim: int) -> nn.Module:
    """The seed's two-projection bf16 core."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)).to("cuda", torch.bfloat16)


def memory_point(config: str, token_capacity: int, dim: int, k: int) -> dict:
    """Capture ``config`` (the seed's two projections, forward) in this process, a fresh one, and
    report its memory in MiB; the graph configurations differ only in graph count and pool sharing."""
    core = _projections(dim)
    capacities = [token_capacity >> i for i in range(k)][::-1]
    x = torch.zeros(token_capacity, dim, device="cuda", dtype=torch.bfloat16)

    def fn(inputs):
        return core(inputs["x"])

    def compiled() -> list:
        step = torch.compile(core, mode="reduce-overhead", dynamic=False)
        # CUDA Graph Trees record on the third call of a shape.
        return [step(x[:c]).clone() for c in reversed(capacities) for _ in range(3)]

    builders = {
        "one graph": lambda: [GraphBuckets(fn, [token_capacity], token_inputs={"x": x})],
        "shared buckets": lambda: [GraphBuckets(fn, capacities, token_inputs={"x": x})],
        "independent graphs": lambda: [GraphBuckets(fn, [c], token_inputs={"x": x[:c]}) for c in reversed(capacities)],
        "torch.compile reduce-overhead": compiled,
    }
    with torch.no_grad():
        keep = builders[config]()
    pools = [b.pool for b in keep if isinstance(b, GraphBuckets)]
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory_snapshot()
    if pools:
        private = sum(private_pool_bytes(pool) for pool in pools)
        owned = {tuple(pool) for pool in pools}
        segments = [s for s in snapshot if tuple(s.get("segment_pool_id", ())) in owned]
    else:  # CUDA Graph Trees own their pool: count every segment that is not the default pool's
        segments = [s for s in snapshot if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)]
        private = sum(s["total_size"] for s in segments)
    return {
        "config": config, "T": token_capacity, "dim": dim, "capacities": capacities,
        "allocated_mib": torch.cuda.memory_allocated() / MIB,
        "reserved_mib": torch.cuda.memory_reserved() / MIB,
        "private_pool_mib": private / MIB,
        # The caching allocator serves blocks <= 1 MiB from 2 MiB "small" segments and larger
        # ones from "large" segments: the pool's segments show which kind each graph needed.
        "private_segments": sorted([s.get("segment_type", "?"), s["total_size"] / MIB] for s in segments),
    }


def memory(token_capacity: int, dim: int, k: int = 4, configs: tuple[str, ...] = CONFIGS) -> list[dict]:
    """Each configuration (default: all of :data:`CONFIGS`) in a fresh Python process."""
    return [run_isolated(memory_point, config, token_capacity, dim, k) for config in configs]


def compute(token_capacity: int = 8192, dim: int = 4096, iters: int = 30) -> list[dict]:
    """Forward + backward replay µs of a block from one graph at ``T`` and from the bucket for ``L``
    (buckets ``T, T/2, ..., T/16``)."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.GELU(), nn.Linear(4 * dim, dim, bias=False))
    block = block.to("cuda", torch.bfloat16)
    params = tuple(block.parameters())

    def step(inputs):
        y = block(inputs["x"])
        return torch.autograd.grad(y.float().square().mean(), params)

    capacities = [token_capacity >> i for i in range(5)][::-1]
    x = torch.randn(token_capacity, dim, device="cuda", dtype=torch.bfloat16)
    buckets = GraphBuckets(step, capacities, token_inputs={"x": x})
    one = GraphBuckets(step, [token_capacity], token_inputs={"x": x})
    batch = {"x": x}
    points = []
    for active in capacities[::-1]:
        bucket_us = device_us(lambda: buckets.replay(batch, active), iters)
        one_us = device_us(lambda: one.replay(batch, active), iters)
        points.append({"L": active, "bucket": select_bucket(buckets.capacities, active),
                       "bucket_us": bucket_us, "one_graph_us": one_us})
    return points


def training(token_capacity: int = 4096, sequence_capacity: int = 32, dim: int = 1024, num_heads: int = 8,
             steps: int = 200, k: int = 4, lr: float = 1e-3) -> dict:
    """One graph versus buckets planned from the loader's own ``L``, on the same batches."""
    tokenizer = load_tokenizer()
    loader = PackedLoader(token_capacity, sequence_capacity, tokenizer=tokenizer, policy=InOrder(), max_piece_tokens=1024)
    batches = list(islice(loader, steps))
    plan = plan_buckets([b.active_tokens for b in batches], k, align=256)
    runs = {}
    for name, capacities in (("one graph", [token_capacity]), ("buckets", list(plan.capacities))):
        if capacities[-1] != token_capacity:  # the top bucket must hold a full batch
            capacities = [*capacities[:-1], token_capacity]
        torch.manual_seed(0)
        model = PackedLM(tokenizer.vocab_size, dim, num_heads, device="cuda", dtype=torch.bfloat16)
        params = tuple(model.parameters())
        optimizer = torch.optim.Adam(params, lr=lr, fused=True)

        def step(inputs, model=model, params=params):
            capacity = inputs["input_ids"].shape[0]
            # Every bucket is warmed up and captured on the first batch, whose sequences run past
            # a small bucket's capacity: clamped boundaries keep attention inside the prefix. A
            # batch that fits the bucket (every replayed one) is left unchanged by the clamp.
            cu_seqlens = inputs["cu_seqlens"].clamp(max=capacity)
            loss = model.loss(inputs["input_ids"], inputs["labels"], inputs["loss_mask"], cu_seqlens, capacity)
            return (loss, *torch.autograd.grad(loss, params))

        first = batches[0]
        graphs = GraphBuckets(
            step, capacities,
            token_inputs={"input_ids": first.input_ids, "labels": first.labels, "loss_mask": first.loss_mask},
            fixed_inputs={"cu_seqlens": first.cu_seqlens},
            token_outputs=[False] * (1 + len(params)),
        )
        losses, times = [], []
        for batch in batches:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            loss, *grads = graphs.replay(
                {"input_ids": batch.input_ids, "labels": batch.labels, "loss_mask": batch.loss_mask,
                 "cu_seqlens": batch.cu_seqlens}, batch.active_tokens)
            for p, g in zip(params, grads):
                p.grad = g
            optimizer.step()
            end.record()
            losses.append(loss.clone())
            times.append((start, end))
        torch.cuda.synchronize()
        runs[name] = {"capacities": capacities, "losses": torch.stack(losses).tolist(),
                      "step_us": [s.elapsed_time(e) * 1e3 for s, e in times[5:]]}
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "dim": dim, "num_heads": num_heads,
                   "steps": steps, "k": k, "tokenizer": tokenizer.name},
        "active_tokens": [b.active_tokens for b in batches],
        "plan": {"capacities": list(plan.capacities), "expected_padded_rows": plan.expected_padded_rows,
                 "expected_fill": plan.expected_fill},
        **runs,
    }


def lifetime() -> dict:
    """The shared-pool hazard, then the guard: an output kept across a replay of another bucket."""
    core = _projections(256)
    x = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
    buckets = GraphBuckets(lambda inputs: core(inputs["x"]), [512, 1024], token_inputs={"x": x})
    first = buckets.replay({"x": x}, 1000)
    kept_value = first[:512].clone()
    buckets.replay({"x": torch.randn_like(x)}, 300)  # the small bucket writes the same addresses
    overwritten = (first[:512] - kept_value).abs().max().item()
    guarded = GraphBuckets(lambda inputs: core(inputs["x"]), [512, 1024], token_inputs={"x": x}, debug=True)
    old = guarded.replay({"x": x}, 1000)
    guarded.replay({"x": x}, 300)
    try:
        old.sum()
        message = None
    except RuntimeError as error:
        message = f"{type(error).__name__}: {error}"
    return {"kept_output_changed_by": overwritten, "guard_error": message}


def optimizer_boundary(token_capacity: int = 4096, dim: int = 1024, num_heads: int = 8, iters: int = 30,
                       small_dim: int = 128, small_heads: int = 2) -> dict:
    """A forward + backward graph, then eager fused Adam on its gradients versus Adam captured as a
    second graph, at ``dim`` (the GPU bounds the step) and ``small_dim`` (launches matter): device,
    wall-clock and host-issue µs per step and peak MiB."""
    tokenizer = load_tokenizer()
    batch = next(iter(PackedLoader(token_capacity, 32, tokenizer=tokenizer, policy=InOrder(), max_piece_tokens=1024)))

    def measure(width: int, heads: int) -> dict:
        results = {}
        for mode in ("eager fused Adam", "captured Adam"):
            torch.manual_seed(0)
            model = PackedLM(tokenizer.vocab_size, width, heads, device="cuda", dtype=torch.bfloat16)
            params = tuple(model.parameters())
            optimizer = torch.optim.Adam(params, lr=1e-4, fused=True, capturable=mode == "captured Adam")
            static = {k: getattr(batch, k).cuda() for k in ("input_ids", "labels", "loss_mask", "cu_seqlens")}

            def forward_backward():
                loss = model.loss(static["input_ids"], static["labels"], static["loss_mask"], static["cu_seqlens"],
                                  token_capacity)
                return (loss, *torch.autograd.grad(loss, params))

            graph, (loss, *grads) = capture_graph(forward_backward)
            for p, g in zip(params, grads):
                p.grad = g  # fixed addresses: the graph rewrites them on every replay
            if mode == "captured Adam":
                optimizer_graph, _ = capture_graph(optimizer.step)

                def train_step():
                    graph.replay()
                    optimizer_graph.replay()
            else:
                def train_step():
                    graph.replay()
                    optimizer.step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            results[mode] = {
                "step_us": device_us(train_step, iters),
                "wall_us": wall_clock_us(train_step, iters),
                "host_us": host_call_us(train_step, iters),
                "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
                "parameter_tensors": len(params),
            }
        return results

    return {"config": {"T": token_capacity, "dim": dim, "num_heads": num_heads},
            **measure(dim, num_heads),
            "small": {"config": {"T": token_capacity, "dim": small_dim, "num_heads": small_heads},
                      **measure(small_dim, small_heads)}}


BOUNDARY_MODES = ("copy into captured optimizer's gradients", "attach to eager Adam")


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _boundary_memory(mode: str, static: dict, vocab_size: int, token_capacity: int, dim: int, num_heads: int,
                     max_entries: int) -> dict:
    """One mode of :func:`optimizer_boundary_memory`; all it allocated is garbage on return."""
    copy = mode == BOUNDARY_MODES[0]
    torch.manual_seed(0)
    model = PackedLM(vocab_size, dim, num_heads, device="cuda", dtype=torch.bfloat16)
    params = tuple(model.parameters())
    static_grads: list[torch.Tensor] = []
    optimizer_graph = None
    if copy:
        # The addresses a captured optimizer reads: allocated once, before any step.
        static_grads = [torch.zeros_like(p) for p in params]
        for p, g in zip(params, static_grads):
            p.grad = g
        optimizer = torch.optim.Adam(params, lr=1e-4, fused=True, capturable=True)
        optimizer_graph, _ = capture_graph(optimizer.step)
    else:
        optimizer = torch.optim.Adam(params, lr=1e-4, fused=True)

    def step(history: record_memory_history | None = None) -> tuple[int | None, list[int], int]:
        loss = model.loss(static["input_ids"], static["labels"], static["loss_mask"], static["cu_seqlens"],
                          token_capacity)
        grads = torch.autograd.grad(loss, params)  # fresh allocations, as in an eager backward
        if copy:
            torch._foreach_copy_(static_grads, grads)  # into the addresses the optimizer graph reads
        moment = history.mark() if history is not None else None  # every gradient complete (and copied)
        pointers, grad_bytes = [g.data_ptr() for g in grads], _tensor_bytes(grads)
        if copy:
            del grads
            optimizer_graph.replay()
        else:
            for p, g in zip(params, grads):
                p.grad = g
            del grads
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        del loss
        return moment, pointers, grad_bytes

    step()  # warm-up: Adam's state, library workspaces
    torch.cuda.synchronize()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.is_cuda]
    before = {"allocated_bytes": torch.cuda.memory_allocated(), "parameter_bytes": _tensor_bytes(params),
              "optimizer_state_bytes": _tensor_bytes(state), "captured_gradient_bytes": _tensor_bytes(static_grads)}
    del state
    with record_memory_history(max_entries) as history:
        moment, pointers, grad_bytes = step(history)
    blocks = find_blocks(history.entries, pointers, moment, strict=False)
    # 600 points (the peak always among them) draw the step and keep the recording small.
    timeline = allocation_timeline(history.entries, {"fresh gradients": blocks}, max_points=600)
    return {
        "before": before,
        "gradient_bytes": grad_bytes,
        "gradient_tensors": len(pointers),
        "marked_entry": moment,
        "entries": len(history.entries),
        "timeline": timeline,
        "sites": allocation_sites(history.entries),
        "peak_allocated_bytes": before["allocated_bytes"] + max(0, timeline["peak"]["allocated_bytes"]),
    }


def optimizer_boundary_memory(token_capacity: int = 4096, dim: int = 1024, num_heads: int = 8,
                              max_entries: int = 200_000) -> dict:
    """The allocator's history over one eager step per mode of :data:`BOUNDARY_MODES`: gradients copied
    into the buffers a captured Adam reads (every gradient then exists twice), or attached to eager Adam."""
    tokenizer = load_tokenizer()
    batch = next(iter(PackedLoader(token_capacity, 32, tokenizer=tokenizer, policy=InOrder(), max_piece_tokens=1024)))
    static = {k: getattr(batch, k).cuda() for k in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
    results = {}
    for mode in BOUNDARY_MODES:
        results[mode] = _boundary_memory(mode, static, tokenizer.vocab_size, token_capacity, dim, num_heads,
                                         max_entries)
        gc.collect()  # the previous mode's model and graph, before the next one's "before" is read
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return {"config": {"T": token_capacity, "dim": dim, "num_heads": num_heads, "max_entries": max_entries,
                       "tokenizer": tokenizer.name},
            **results}


def memory_part() -> list[dict]:
    """The memory part: the seed's size (``T = 1024``) and a larger one, dim 4096."""
    return memory(1024, 4096) + memory(8192, 4096)


PARTS = {
    "memory": memory_part,
    "compute": compute,
    "lifetime": lifetime,
    "optimizer_boundary": optimizer_boundary,
    "optimizer_boundary_memory": optimizer_boundary_memory,
    "training": training,
}


def buckets_suite() -> dict:
    """Every part, each in a fresh process (a fault in one is recorded under ``errors``)."""
    start = time.perf_counter()
    record, errors = run_parts({part: isolated(function) for part, function in PARTS.items()},
                               describe=lambda error: error_text(error, 4000))
    record["errors"] = errors
    record["suite_seconds"] = time.perf_counter() - start
    return record
