"""Exploration (not a recording): how close do the short-convolution kernels come to the H200's
memory bandwidth, and which tile does best? Run on the GPU host:

    python3 scripts/explore_short_conv.py [--budget SECONDS]

At the KDA layer's shape in the linear-attention suite (T = 4096 rows in 32 Zipf-distributed
sequences, D = 2 * 32 * 128 + 32 * 128 = 12288 channels, W = 4 taps, bfloat16, SiLU fused) it
captures one CUDA graph per variant (forward; forward and backward) and times its replays with
CUDA events (median): the tensor ops (``impl="torch"``) and the Triton kernels at several
``(BLOCK_T, BLOCK_D, NUM_WARPS)``. Each line also gives the bandwidth the least traffic implies
(forward: read x, write y; backward: read x and dy, write dx; 2 bytes each), to set beside the
H200's 4.8 TB/s. One JSON line per measurement; a failure is a line with its error, and the rest
goes on; the budget (default 100 s) stops it early. Nothing here is a recorded result: the
linear-attention suite's trace part measures the layer's short convolution, and the package keeps
the tile the module sets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback

import torch

from attn_gym_lite.ops import short_conv_triton as kernels
from attn_gym_lite.ops.short_conv import short_conv
from attn_gym_lite.ragged import cu_seqlens_from_lengths, zipf_lengths

T, M, D, W = 4096, 32, 2 * 32 * 128 + 32 * 128, 4
# The package's tile first (32 x 64 on 4 warps, picked from the first sweep of six tiles on the H200,
# 2026-12-02: the comment above BLOCK_T in short_conv_triton.py), then that sweep's other five, then
# the winner's neighbourhood (taller row blocks, narrower channel blocks, fewer warps), not yet timed.
TILES = [(32, 64, 4), (16, 128, 8), (16, 128, 4), (32, 128, 8), (8, 128, 4), (16, 256, 8),
         (64, 64, 4), (32, 64, 2), (64, 32, 4), (32, 32, 2), (64, 64, 8), (16, 64, 4), (32, 128, 4)]


def timed(step, iters: int = 30) -> float:
    """Median µs of one replay of ``step`` captured in a CUDA graph."""
    from attn_gym_lite.graph.capture import capture_graph

    graph, _ = capture_graph(step)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=100.0, help="seconds before stopping (default 100)")
    budget = parser.parse_args().budget
    began = time.monotonic()
    generator = torch.Generator().manual_seed(0)
    cu = cu_seqlens_from_lengths(zipf_lengths(T, M, generator=generator), device="cuda")
    x = torch.randn(T, D, generator=generator).to("cuda", torch.bfloat16).requires_grad_()
    weight = (torch.randn(D, W, generator=generator) / 2).to("cuda", torch.bfloat16).requires_grad_()
    dy = torch.randn(T, D, generator=generator).to("cuda", torch.bfloat16)
    element = 2  # bytes per bfloat16
    minimum = {"forward": 2 * T * D * element, "forward_backward": 5 * T * D * element}
    variants = [("torch", None)] + [("triton", tile) for tile in TILES]
    for impl, tile in variants:
        for mode in ("forward", "forward_backward"):
            if time.monotonic() - began > budget:
                print(json.dumps({"stopped": "budget", "budget_s": budget}))
                return
            row = {"impl": impl, "tile": tile, "mode": mode, "T": T, "D": D, "W": W}
            try:
                if tile is not None:
                    kernels.BLOCK_T, kernels.BLOCK_D, kernels.NUM_WARPS = tile

                def step():
                    y = short_conv(x, weight, cu, activation="silu", impl=impl)
                    return torch.autograd.grad(y, (x, weight), dy) if mode == "forward_backward" else y

                us = timed(step)
                row.update(us=us, min_traffic_tb_s=minimum[mode] / us / 1e6)
            except Exception as exc:  # one failure is one line: the rest goes on
                row["error"] = "".join(traceback.format_exception_only(exc)).strip()[:400]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
