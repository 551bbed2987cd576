"""Exploration (not a recording): is there one schedule, fixed at capture, within 2% of the best at
every point of the schedulers suite? Run on the GPU host:

    python3 scripts/explore_schedules.py [--budget SECONDS]

The recording at b7cdcea has ``auto`` (flat at these sizes) within 2% of the best schedule at 15 of
its 19 points; the four others are nearly empty replays (``L <= T/4``) where the persistent grid's
one wave of workers wins (up to 1.8x at ``L = T/16`` of the constant-length sweep), while flat
wins wherever the replay is nearly full (persistent loses up to 40% there: its static striding
deals uneven tasks). Between the two lies a persistent or dynamic grid of several waves:
``ctas_per_sm = w`` launches ``w`` waves of workers, so a nearly empty replay launches ``w`` times
fewer idle CTAs than flat, and a full one gives each worker only a few tasks.

For each of the suite's three sweeps it captures forward + backward (dq, dk, dv) once at the
sweep's capacity, per variant, and times a replay of every layout (median of 20 CUDA-event
timings), then prints each variant's worst ratio to the best variant over all points. The
package is not changed: variants differ only in the ``AttentionConfig`` passed in.

Its run on the H200 (worst ratio to the best variant at any of the 19 points; points within 2%):

    flat             1.846  13/19    (the nearly empty replays of the constant sweep)
    persistent x 1   1.676   6/19    persistent x 8   1.079  15/19    persistent x 16  1.190  16/19
    dynamic x 1      1.123   6/19    dynamic x 2..8   1.126 to 1.147, 4 to 6 of 19

No variant is within 2% everywhere, and no rule on static quantities picks one per sweep without
fitting the three sweeps themselves: the constant sweep wants one wave (its uniform tasks balance
under static striding), fragmentation at L = T wants flat (persistent x 8 loses 6-8% at M >= 128),
overcapture wants 8 waves. Persistent x 8 trades 2-8% on nearly full replays for a worst case of
1.08x instead of 1.85x.

``--prefetch`` (not yet run on a GPU) swaps the dynamic schedule's task functions for ones that
fetch each worker's next task one task ahead: ``next_task`` returns the task fetched at the end of
the previous one and issues the atomic for the one after, so the counter's round trip overlaps a
task's work instead of following it. Dynamic x 1 lost 4-10% to flat on replays of many small tasks
(fragmentation at M >= 128, the constant sweep at L = T, above); if that is the atomic's latency, the
prefetching dynamic grid could be the one schedule within 2% everywhere.
The task carries both indices in an int64: the current one in its low 32 bits, the next above.
Run it in a process of its own (the kernels' globals are replaced before they first compile).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import triton
import triton.language as tl

from attn_gym_lite.bench.harness import device_us
from attn_gym_lite.bench.schedulers import sweep_layouts
from attn_gym_lite.graph.capture import capture_graph
from attn_gym_lite.ops.kernels import backward, forward, tasks, varlen_attention_triton
from attn_gym_lite.ops.kernels.varlen import AttentionConfig, default_config
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

HEADS, HEAD_DIM = 16, 128
VARIANTS = [("flat", 1), ("dynamic", 1), ("dynamic", 2), ("dynamic", 4), ("dynamic", 8),
            ("persistent", 1), ("persistent", 2), ("persistent", 4), ("persistent", 8), ("persistent", 16)]


@triton.jit
def first_task_prefetch(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity,
                        CHUNK: tl.constexpr, SCHEDULE: tl.constexpr):
    if SCHEDULE == "dynamic":
        active = tl.load(chunk_offsets + num_seqs) * num_heads
        following = tl.num_programs(0) + tl.atomic_add(counter, 1)  # issued now, read after the first task
        task = tl.where(tl.program_id(0) < active, tl.program_id(0).to(tl.int64) + (following.to(tl.int64) << 32), -1)
    else:
        task = tasks.first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity, CHUNK,
                                SCHEDULE)
    return task


@triton.jit
def next_task_prefetch(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE: tl.constexpr):
    if SCHEDULE == "dynamic":
        active = tl.load(chunk_offsets + num_seqs) * num_heads
        current = (task >> 32).to(tl.int32)
        following = tl.num_programs(0) + tl.atomic_add(counter, 1)
        task = tl.where(current < active, current.to(tl.int64) + (following.to(tl.int64) << 32), -1)
    else:
        task = tasks.next_task(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE)
    return task


@triton.jit
def task_at_prefetch(task, cu_seqlens, chunk_offsets, num_seqs, token_capacity, SCHEDULE: tl.constexpr):
    if SCHEDULE == "dynamic":
        task = (task & 0xFFFFFFFF).to(tl.int32)
    return tasks.task_at(task, cu_seqlens, chunk_offsets, num_seqs, token_capacity, SCHEDULE)


def use_prefetch() -> None:
    """The attention kernels call the prefetching task functions (before any of them compiles)."""
    for module in (forward, backward):
        module.first_task, module.next_task, module.task_at = first_task_prefetch, next_task_prefetch, task_at_prefetch


def config(waves: int) -> AttentionConfig:
    c = default_config()
    return AttentionConfig(*(dataclasses.replace(k, ctas_per_sm=waves) for k in (c.forward, c.dq, c.dkdv)))


def sweep(schedule: str, waves: int, T: int, N: int, layouts, iters: int) -> list[float]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad = (torch.randn(T, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
                     for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths([T], device="cuda"), N)
    cfg = config(waves)

    def step():
        out = varlen_attention_triton(q, k, v, cu_seqlens, schedule=schedule, config=cfg)
        return torch.autograd.grad(out, (q, k, v), grad)

    graph, _ = capture_graph(step)
    times = []
    for lengths in layouts:
        cu_seqlens.copy_(pad_cu_seqlens(cu_seqlens_from_lengths(lengths, device="cuda"), N))
        times.append(device_us(graph.replay, iters))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=150.0)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--prefetch", action="store_true", help="dynamic fetches its next task one ahead")
    args = parser.parse_args()
    if args.prefetch:
        use_prefetch()
    deadline = time.monotonic() + args.budget
    table = {}  # (sweep, point index) -> {variant: µs}
    for name, (T, N, layouts) in sweep_layouts(0).items():
        for schedule, waves in VARIANTS:
            if time.monotonic() > deadline:
                print(json.dumps({"sweep": name, "variant": f"{schedule}x{waves}", "skipped": "budget"}), flush=True)
                continue
            us = sweep(schedule, waves, T, N, layouts, args.iters)
            points = [{"L": int(x.sum()), "M": x.numel()} for x in layouts]
            print(json.dumps({"sweep": name, "T": T, "N": N, "variant": f"{schedule}x{waves}",
                              "captured_us": [round(t, 1) for t in us], "points": points}), flush=True)
            for i, t in enumerate(us):
                table.setdefault((name, i), {})[f"{schedule}x{waves}"] = t
            torch.cuda.empty_cache()
    print()
    variants = [f"{s}x{w}" for s, w in VARIANTS]
    print(f"{'variant':<14} {'worst ratio to best':>20} {'points within 2%':>17}")
    for v in variants:
        ratios = [row[v] / min(row.values()) for row in table.values() if v in row]
        if ratios:
            print(f"{v:<14} {max(ratios):>20.3f} {sum(r <= 1.02 for r in ratios):>11}/{len(ratios)}")


if __name__ == "__main__":
    main()
