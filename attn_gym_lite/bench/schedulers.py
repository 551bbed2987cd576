"""Benchmark suite ``schedulers``: ragged attention under CUDA graphs captured for the worst case.

Each sweep point times a graph captured once at the worst case (``T``, ``N``, ``max_seqlen = T``)
and replayed with the point's ``cu_seqlens`` against a graph captured for its exact shape: the
ratio is what overcapture costs. The sweeps are the seed article's (fragmentation, token
overcapture, constant length), beside exact-shape TFLOP/s and eager host time; each
implementation runs in a process of its own.
"""

from __future__ import annotations

import dataclasses

import torch

from ..graph.capture import capture_graph
from ..ops.attention import varlen_attention
from ..ops.kernels import varlen_attention_triton
from ..ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths
from .harness import device_us, isolated, run_parts
from .timing import wall_clock_us

IMPLEMENTATIONS = ("varlen_attn", "rect", "flat", "persistent", "dynamic", "default", "persistent+zero")
#: Dense attention on the uniform layout, one row per SDPA backend: the bar a packed kernel is measured against.
DENSE_BACKENDS = ("flash", "cudnn", "efficient")
DENSE_IMPLEMENTATIONS = tuple(f"sdpa_{backend}" for backend in DENSE_BACKENDS)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Heads, head dim, dtype and masking shared by every point of the suite."""

    heads: int = 16
    head_dim: int = 128
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False


def attention_fn(implementation: str, causal: bool, max_seqlen: int):
    """``(q, k, v, cu_seqlens) -> out`` for one implementation; ``max_seqlen`` sizes the grid of
    ``varlen_attn`` and ``rect`` only. ``"default"``: ``varlen_attention`` with every default."""
    if implementation == "varlen_attn":
        return lambda q, k, v, cu: varlen_attention(q, k, v, cu, impl="varlen_attn", max_seqlen=max_seqlen,
                                                    causal=causal, validate=False)
    if implementation == "default":
        return lambda q, k, v, cu: varlen_attention(q, k, v, cu, causal=causal)
    if implementation in DENSE_IMPLEMENTATIONS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[implementation.removeprefix("sdpa_")]

        def dense(q, k, v, cu):
            # Only this backend may run (torch raises if it cannot): a row per backend, no fallback.
            with sdpa_kernel(backend):
                return varlen_attention(q, k, v, cu, impl="sdpa", max_seqlen=max_seqlen, causal=causal, validate=False)

        return dense
    schedule = implementation.removesuffix("+zero")
    options = {"max_seqlen": max_seqlen} if schedule == "rect" else {}
    zero = implementation.endswith("+zero")
    return lambda q, k, v, cu: varlen_attention_triton(
        q, k, v, cu, causal=causal, schedule=schedule, zero_inactive=zero, **options)


class AttentionGraph:
    """One captured attention call (``backward=True``: forward and ``dq, dk, dv``) at a fixed
    token capacity ``T`` and sequence capacity ``N``, replayed for any layout that fits."""

    def __init__(self, implementation: str, T: int, N: int, max_seqlen: int, shapes: Shapes,
                 *, backward: bool = True, seed: int = 0) -> None:
        generator = torch.Generator(device="cuda").manual_seed(seed)
        size = (T, shapes.heads, shapes.head_dim)
        q, k, v, grad_out = (torch.randn(size, device="cuda", dtype=shapes.dtype, generator=generator)
                             for _ in range(4))
        q, k, v = (x.requires_grad_(backward) for x in (q, k, v))
        # A valid layout to warm up and capture with; every replay copies its own over it.
        self.cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths([T], device="cuda"), N)
        attend = attention_fn(implementation, shapes.causal, max_seqlen)

        def step():
            out = attend(q, k, v, self.cu_seqlens)
            return torch.autograd.grad(out, (q, k, v), grad_out) if backward else out

        # The graph reads these addresses on every replay: they must live as long as it does.
        self.inputs = (q, k, v, grad_out)
        self.graph, self.outputs = capture_graph(step)

    def replay_us(self, cu_seqlens: torch.Tensor, iters: int) -> float:
        self.cu_seqlens.copy_(cu_seqlens)
        return device_us(self.graph.replay, iters)


def _layout(lengths: torch.Tensor) -> tuple[torch.Tensor, int]:
    return cu_seqlens_from_lengths(lengths, device="cuda"), int(lengths.max()) if lengths.numel() else 0


def overcapture_sweep(points: list[torch.Tensor], T: int, N: int, shapes: Shapes,
                      iters: int, implementations=IMPLEMENTATIONS) -> dict:
    """For each layout (lengths, ``sum <= T``, ``len <= N``): captured and exact replay µs."""
    series = {}
    for implementation in implementations:
        captured = AttentionGraph(implementation, T, N, T, shapes)
        rows = []
        for lengths in points:
            cu, s_max = _layout(lengths)
            L, M = int(cu[-1]), lengths.numel()
            captured_us = captured.replay_us(pad_cu_seqlens(cu, N), iters)
            exact = AttentionGraph(implementation, L, M, s_max, shapes)
            exact_us = exact.replay_us(cu, iters)
            del exact
            rows.append({"L": L, "M": M, "S_max": s_max, "captured_us": captured_us, "exact_us": exact_us,
                         "ratio": captured_us / exact_us})
        del captured
        torch.cuda.empty_cache()
        series[implementation] = rows
    return series


def attention_flops(lengths: torch.Tensor, heads: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs (two matmuls of 2 flops per multiply-add): ``4 H D * sum(visible pairs)``,
    visible pairs ``s^2`` or, causal, ``s (s + 1) / 2``. Backward counts 2.5 times this."""
    s = lengths.to(torch.float64)
    pairs = (s * (s + 1) / 2 if causal else s * s).sum().item()
    return 4.0 * heads * head_dim * pairs


def throughput(lengths: torch.Tensor, shapes: Shapes, iters: int,
               implementations=("varlen_attn", "rect", "flat", "persistent", "dynamic", "default")) -> dict:
    """Exact-shape graphs, forward alone and forward + backward: µs and TFLOP/s per implementation."""
    cu, s_max = _layout(lengths)
    L = int(cu[-1])
    flops = attention_flops(lengths, shapes.heads, shapes.head_dim, shapes.causal)
    result = {}
    for implementation in implementations:
        row = {}
        for name, backward, work in (("fwd", False, flops), ("fwd_bwd", True, 3.5 * flops)):
            graph = AttentionGraph(implementation, L, lengths.numel(), s_max, shapes, backward=backward)
            us = graph.replay_us(cu, iters)
            row[f"{name}_us"] = us
            row[f"{name}_tflops"] = work / us / 1e6
            del graph
        result[implementation] = row
    return result


def zipf_points(counts: list[tuple[int, int]], seed: int) -> list[torch.Tensor]:
    """One Zipf(1.2) layout per ``(L, M)`` pair, same seed for each."""
    return [zipf_lengths(L, M, generator=torch.Generator().manual_seed(seed)) for L, M in counts]


def sweep_layouts(seed: int) -> dict[str, tuple[int, int, list[torch.Tensor]]]:
    """The seed article's three sweeps, ``name -> (T, N, layouts)``: fragmentation (``L = T``, ``M``
    from 1 to 256), overcapture (``M = 64``, ``L`` from ``T`` to ``T/16``), constant (sequences of 128)."""
    return {
        "fragmentation": (8192, 256, zipf_points([(8192, m) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256)], seed)),
        "overcapture": (16384, 256, zipf_points([(L, 64) for L in (16384, 8192, 4096, 2048, 1024)], seed)),
        "constant": (16384, 128, [torch.full((m,), 128, dtype=torch.int32) for m in (128, 64, 32, 16, 8)]),
    }


def throughput_layouts(seed: int) -> dict[str, torch.Tensor]:
    """Exact-shape layouts: Zipf ``L = 16384, M = 64``, and 16 sequences of 1024."""
    return {"zipf_16384x64": zipf_lengths(16384, 64, generator=torch.Generator().manual_seed(seed)),
            "uniform_16x1024": torch.full((16,), 1024, dtype=torch.int32)}


THROUGHPUT_IMPLEMENTATIONS = ("varlen_attn", "rect", "flat", "persistent", "dynamic", "default")

#: The eager host-time table's shape: small enough that the host, not the GPU, bounds a call.
EAGER_SHAPE = {"T": 4096, "M": 16, "heads": 8, "head_dim": 64}


def eager_host_us(implementation: str, iters: int, seed: int) -> dict:
    """Host µs per eager call at :data:`EAGER_SHAPE`, forward and forward + backward (mean of
    ``iters`` back-to-back calls), beside the device µs of the same work replayed from a graph."""
    T, M = EAGER_SHAPE["T"], EAGER_SHAPE["M"]
    shapes = Shapes(heads=EAGER_SHAPE["heads"], head_dim=EAGER_SHAPE["head_dim"])
    lengths = zipf_lengths(T, M, generator=torch.Generator().manual_seed(seed))
    cu, s_max = _layout(lengths)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, grad_out = (torch.randn(T, shapes.heads, shapes.head_dim, device="cuda", dtype=shapes.dtype,
                                     generator=generator) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    attend = attention_fn(implementation, False, s_max)
    row = {
        "fwd_host_us": wall_clock_us(lambda: attend(q, k, v, cu), iters, warmup=20),
        "fwd_bwd_host_us": wall_clock_us(lambda: torch.autograd.grad(attend(q, k, v, cu), (q, k, v), grad_out),
                                         iters, warmup=20),
    }
    for name, backward in (("fwd", False), ("fwd_bwd", True)):
        graph = AttentionGraph(implementation, T, M, s_max, shapes, backward=backward, seed=seed)
        row[f"{name}_device_us"] = graph.replay_us(cu, iters)
        del graph
    return row


def implementation_run(implementation: str, iters: int, seed: int) -> dict:
    """Everything the suite measures for one implementation: the sweeps, throughput and eager host
    time; a dense backend only its throughput on the uniform layout (it needs one length)."""
    shapes = Shapes()
    if implementation in DENSE_IMPLEMENTATIONS:
        uniform = throughput_layouts(seed)["uniform_16x1024"]
        return {"throughput": {
            f"uniform_16x1024_{'causal' if causal else 'full'}":
                throughput(uniform, dataclasses.replace(shapes, causal=causal), iters, (implementation,))[implementation]
            for causal in (False, True)
        }}
    run = {sweep: overcapture_sweep(points, T, N, shapes, iters, (implementation,))[implementation]
           for sweep, (T, N, points) in sweep_layouts(seed).items()}
    if implementation in THROUGHPUT_IMPLEMENTATIONS:
        run["throughput"] = {
            f"{name}_{'causal' if causal else 'full'}":
                throughput(lengths, dataclasses.replace(shapes, causal=causal), iters, (implementation,))[implementation]
            for causal in (False, True) for name, lengths in throughput_layouts(seed).items()
        }
        run["eager"] = eager_host_us(implementation, 10 * iters, seed)
    return run


def schedulers_suite(iters: int = 20, seed: int = 0, timeout_s: float = 600) -> dict:
    """The sweeps and throughput tables, each implementation in a fresh process (H = 16, D = 128,
    bfloat16; median of ``iters`` CUDA-event timings per graph)."""
    runs, errors = run_parts({name: isolated(implementation_run, name, iters, seed)
                              for name in IMPLEMENTATIONS + DENSE_IMPLEMENTATIONS}, timeout_s=timeout_s)
    layouts = sweep_layouts(seed)
    tables = {}
    for implementation, run in runs.items():
        for layout, row in run.get("throughput", {}).items():
            tables.setdefault(layout, {})[implementation] = row
    sweeps = {name for name in runs if name not in DENSE_IMPLEMENTATIONS}
    return {
        "config": {"heads": Shapes.heads, "head_dim": Shapes.head_dim, "dtype": "bfloat16",
                   "causal_sweeps": Shapes.causal, "zipf_exponent": 1.2, "iters": iters, "seed": seed,
                   "timing": "median CUDA-event time of one graph replay, forward + backward (dq, dk, dv)",
                   "zero_inactive": "False for all but persistent+zero"},
        **{sweep: {"T": T, "N": N, "series": {impl: runs[impl][sweep] for impl in sweeps}}
           for sweep, (T, N, _) in layouts.items()},
        "throughput": tables,
        "eager": {"shape": {**EAGER_SHAPE, "dtype": "bfloat16", "causal": False, "iters": 10 * iters,
                            "timing": "mean host wall clock per call over back-to-back calls (synchronised at the "
                                      "ends); device time: median CUDA-event time of the same work replayed"},
                  "rows": {impl: run["eager"] for impl, run in runs.items() if "eager" in run}},
        "errors": errors,
    }


# ---------------------------------------------------------------------------------------------
# Reading a record: the two comparisons chapter 4 makes beyond FlashAttention-2.

PACKED_SCHEDULES = ("rect", "flat", "persistent", "dynamic", "default")


def dense_gap(record: dict) -> list[dict]:
    """Per uniform layout and metric, the best dense SDPA backend against ``varlen_attn`` and this
    package's best schedule (TFLOP/s of exact-shape graph replays)."""
    rows = []
    for layout, table in record["throughput"].items():
        dense = {name: row for name, row in table.items() if name in DENSE_IMPLEMENTATIONS}
        ours = {name: row for name, row in table.items() if name in PACKED_SCHEDULES}
        if not dense or not ours or "varlen_attn" not in table:
            continue
        for metric in ("fwd", "fwd_bwd"):
            key = f"{metric}_tflops"
            best_dense = max(dense, key=lambda name: dense[name][key])
            best_ours = max(ours, key=lambda name: ours[name][key])
            rows.append({
                "layout": layout, "metric": metric,
                "dense": dense[best_dense][key], "dense_backend": best_dense.removeprefix("sdpa_"),
                "varlen_attn": table["varlen_attn"][key],
                "ours": ours[best_ours][key], "ours_schedule": best_ours,
                "ours_vs_dense": ours[best_ours][key] / dense[best_dense][key],
                "ours_vs_varlen_attn": ours[best_ours][key] / table["varlen_attn"][key],
            })
    return rows


def eager_overhead(record: dict) -> list[dict]:
    """Per implementation, eager host and device µs per call, and the host time over ``varlen_attn``'s."""
    rows = record["eager"]["rows"]
    base = rows.get("varlen_attn")
    return [{
        "implementation": name, **row,
        "fwd_vs_varlen_attn": row["fwd_host_us"] / base["fwd_host_us"] if base else None,
        "fwd_bwd_vs_varlen_attn": row["fwd_bwd_host_us"] / base["fwd_bwd_host_us"] if base else None,
    } for name, row in rows.items()]
