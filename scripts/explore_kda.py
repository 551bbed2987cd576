"""Exploration (not a recording): where does our chunked KDA (``kda_triton``) spend its time next
to flash-linear-attention's ``chunk_kda(use_graph=True)``? Run on the GPU host:

    python3 scripts/explore_kda.py [--budget SECONDS]

At the linear-attention suite's shape (T = 8192 tokens in 32 Zipf-distributed sequences, H = 16,
K = V = 128, bfloat16) it captures one CUDA graph per implementation and mode (forward; forward
and backward), times its replays with CUDA events (median), and takes a per-kernel breakdown of
one replay with ``torch.profiler`` (device time summed per kernel name, largest first). It prints
one JSON line per measurement and a short table last. Every measurement is in its own ``try``:
a failure is printed as a JSON line with its error, and the rest goes on. When the time budget
(default 120 s) runs out it stops and prints what it has. Nothing here is a recorded result;
the package's benchmark CLI produces those.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback

import torch

from attn_gym_lite.bench.linear_attention import kda_inputs
from attn_gym_lite.ops.kda import kda_triton
from attn_gym_lite.ragged import cu_seqlens_from_lengths, zipf_lengths

T, M, H, K, V = 8192, 32, 16, 128, 128
DTYPE = torch.bfloat16
NAMES = ("q", "k", "v", "g", "beta")


def ours(q, k, v, g, beta, cu_seqlens):
    return kda_triton(q, k, v, g, beta, cu_seqlens)[0]


def fla_function():
    """fla's ``chunk_kda`` in the suite's packed form, or ``None`` when fla is not importable."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # any import failure means "not available here"
        return None

    def fla(q, k, v, g, beta, cu_seqlens):
        o, _ = chunk_kda(q[None], k[None], v[None], g[None], beta[None], cu_seqlens=cu_seqlens.long(),
                         use_graph=True, max_num_seqs=M)
        return o[0]

    return fla


def capture(fn, leaves, cu_seqlens, grad_o, backward):
    """A CUDA graph of one forward (and backward) call on static inputs, warmed up first."""

    def step():
        o = fn(*leaves, cu_seqlens)
        if backward:
            return torch.autograd.grad(o, leaves, grad_o)
        return (o,)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and autotune outside the capture
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    torch.cuda.synchronize()
    return graph, outputs


def time_replays(graph, replays=30):
    """Median of ``replays`` CUDA-event-timed replays, µs (after three untimed ones)."""
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), min(times)


def kernel_breakdown(run_once):
    """Device time (µs) per kernel name over one call of ``run_once``, largest first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_once()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:  # older torch
            us = getattr(event, "self_cuda_time_total", 0.0)
        if us and us > 0:
            totals[event.key] = totals.get(event.key, 0.0) + float(us)
    return sorted(totals.items(), key=lambda item: -item[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=120.0, help="seconds; stop and report after this")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    results = []

    def emit(record):
        results.append(record)
        print(json.dumps(record), flush=True)

    if not torch.cuda.is_available():
        emit({"error": "no CUDA device: this exploration times GPU kernels"})
        return
    lengths = zipf_lengths(T, M, generator=torch.Generator().manual_seed(0))
    cu_seqlens = cu_seqlens_from_lengths(lengths, device="cuda")
    inputs = kda_inputs(T, H, K, V, dtype=DTYPE, device="cuda", seed=0)
    grad_o = inputs["grad_o"]
    emit({"config": {"T": T, "M": M, "H": H, "K": K, "V": V, "dtype": str(DTYPE), "max_seqlen": int(lengths.max()),
                     "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "budget_s": args.budget}})

    implementations = {"ours": ours}
    fla = fla_function()
    if fla is None:
        emit({"impl": "fla", "error": "fla.ops.kda not importable"})
    else:
        implementations["fla"] = fla
    for mode, backward in (("forward", False), ("forward+backward", True)):
        for impl, fn in implementations.items():
            if time.monotonic() > deadline:
                emit({"impl": impl, "mode": mode, "skipped": "time budget spent"})
                continue
            leaves = [inputs[name].detach().clone().requires_grad_(backward) for name in NAMES]
            try:
                graph, _outputs = capture(fn, leaves, cu_seqlens, grad_o, backward)
                median_us, min_us = time_replays(graph)
                emit({"impl": impl, "mode": mode, "median_us": round(median_us, 1), "min_us": round(min_us, 1)})
            except Exception as error:  # record and go on
                emit({"impl": impl, "mode": mode, "error": f"{type(error).__name__}: {error}"[:2000],
                      "trace": traceback.format_exc()[-1500:]})
                continue
            if time.monotonic() > deadline:
                continue
            try:
                kernels = kernel_breakdown(graph.replay)
                source = "graph replay"
                if not kernels:  # a profiler that does not see kernels inside graphs: one eager call
                    kernels = kernel_breakdown(lambda: fn(*leaves, cu_seqlens) if not backward else
                                               torch.autograd.grad(fn(*leaves, cu_seqlens), leaves, grad_o))
                    source = "eager call (the profiler saw no kernels in the replay)"
                emit({"impl": impl, "mode": mode, "breakdown_source": source,
                      "kernels_us": [[name, round(us, 1)] for name, us in kernels[:25]],
                      "kernels_total_us": round(sum(us for _, us in kernels), 1)})
            except Exception as error:
                emit({"impl": impl, "mode": mode, "breakdown_error": f"{type(error).__name__}: {error}"[:2000]})
            del graph

    # The short table: medians, and ours over fla where both exist.
    medians = {(r["impl"], r["mode"]): r["median_us"] for r in results if "median_us" in r}
    print()
    print(f"{'mode':<18} {'ours µs':>10} {'fla µs':>10} {'ours/fla':>9}")
    for mode in ("forward", "forward+backward"):
        a, b = medians.get(("ours", mode)), medians.get(("fla", mode))
        ratio = f"{a / b:.2f}x" if a and b else "-"
        print(f"{mode:<18} {a if a else '-':>10} {b if b else '-':>10} {ratio:>9}")


if __name__ == "__main__":
    main()
