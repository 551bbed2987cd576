"""Benchmark suite ``masking``: what the inactive rows do without masks, and what masks cost.

* ``varlen_attn_repro``: ``VarLenAttention`` (torch's ``varlen_attn``, bf16) at padded capacity,
  with and without masks, against the exact computation on the ``L`` real rows;
* ``block_ablation``: the short-conv attention block with NaN in the inactive rows, with all
  masks, none, and each one left out: which gradients go wrong;
* ``mask_cost``: forward + backward replay time of the block with and without masks.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..graph.capture import capture_graph
from ..models import VarLenAttention
from ..models.block import MASK_SITES, ShortConvAttentionBlock
from ..ops.masking import uninitialized_memory_as_nan
from ..ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths
from ..testing.exactness import compare_gradients, exact_gradients, gradients_at_capacity
from .harness import device_us

MEMORY_MODES = ("as allocated", "uninitialized as NaN")


def _packed_batch(
    token_capacity: int, sequence_capacity: int, active_tokens: int, active_sequences: int, dim: int, seed: int,
    device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``, ``target`` ``[T, dim]`` (random in every row) and ``cu_seqlens`` (Zipf lengths)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = zipf_lengths(active_tokens, active_sequences, generator=generator)
    cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), sequence_capacity)
    x, target = (torch.randn(token_capacity, dim, generator=generator) for _ in range(2))
    return x.to(device, dtype), target.to(device, dtype), cu_seqlens.to(device)


def varlen_attn_repro(
    token_capacity: int = 4096, sequence_capacity: int = 32, active_tokens: int = 3000,
    active_sequences: int = 16, dim: int = 1024, num_heads: int = 8, seed: int = 0,
) -> dict:
    """``VarLenAttention`` (causal, bf16) with and without ``mask_inactive_capacity`` against the
    exact computation, with memory as allocated and with uninitialized memory read as NaN. The
    inputs are finite everywhere: any NaN comes from ``varlen_attn`` leaving rows past ``L``
    undefined (pytorch#176793)."""
    x, target, cu_seqlens = _packed_batch(token_capacity, sequence_capacity, active_tokens, active_sequences, dim, seed)
    runs = []
    for memory in MEMORY_MODES:
        for masks in (False, True):
            torch.manual_seed(seed)
            module = VarLenAttention(dim, num_heads, causal=True, mask_inactive_capacity=masks, impl="varlen_attn",
                                     device="cuda", dtype=torch.bfloat16)
            with uninitialized_memory_as_nan() if memory == "uninitialized as NaN" else nullcontext():
                report = compare_gradients(
                    gradients_at_capacity(module, x, target, cu_seqlens, token_capacity),
                    exact_gradients(module, x, target, cu_seqlens),
                )
            runs.append({"memory": memory, "masks": masks, **report})
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "L": active_tokens, "M": active_sequences,
                   "dim": dim, "num_heads": num_heads, "causal": True, "dtype": "bfloat16", "seed": seed},
        "runs": runs,
    }


def block_ablation(
    token_capacity: int = 2048, sequence_capacity: int = 32, active_tokens: int = 1500,
    active_sequences: int = 16, dim: int = 512, num_heads: int = 4, seed: int = 0,
    *, impl: str = "varlen_attn", device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """The block with NaN in the inactive rows of its input and target, undefined memory read as NaN,
    and each set of masks: all, none, all but one. ``impl="reference"``, ``device="cpu"`` and float64
    run it on a CPU (the "Masking" chapter does). One run per variant, each with
    ``compare_gradients``' report."""
    x, target, cu_seqlens = _packed_batch(token_capacity, sequence_capacity, active_tokens, active_sequences, dim, seed,
                                          device, dtype)
    x[active_tokens:] = float("nan")
    target[active_tokens:] = float("nan")
    variants = [("all", MASK_SITES), ("none", ())]
    variants += [(f"without {site}", tuple(s for s in MASK_SITES if s != site)) for site in MASK_SITES]
    runs = []
    for name, masks in variants:
        torch.manual_seed(seed)
        module = ShortConvAttentionBlock(dim, num_heads, masks=masks, impl=impl, device=device, dtype=dtype)
        with uninitialized_memory_as_nan():
            report = compare_gradients(
                gradients_at_capacity(module, x, target, cu_seqlens, token_capacity),
                exact_gradients(module, x, target, cu_seqlens),
            )
        runs.append({"variant": name, "masks": list(masks), **report})
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "L": active_tokens, "M": active_sequences,
                   "dim": dim, "num_heads": num_heads, "dtype": str(dtype).removeprefix("torch."), "fill": "nan",
                   "seed": seed, "impl": impl, "device": str(torch.device(device))},
        "runs": runs,
    }


def ablation_verdicts(result: dict, rtol: float = 5e-2) -> dict[str, dict[str, str]]:
    """Per variant and gradient of a :func:`block_ablation` result: ``"<n> non-finite"``, ``"WRONG"``
    (off the exact gradient by more than ``rtol`` times its largest magnitude, floored at 1e-3) or ``"ok"``."""
    verdicts = {}
    for run in result["runs"]:
        row = {}
        for name, g in run["gradients"].items():
            if g["nonfinite"]:
                row[name] = f"{g['nonfinite']} non-finite"
            else:
                row[name] = "WRONG" if g["max_abs_diff"] > rtol * max(g["max_abs_exact"], 1e-3) else "ok"
        verdicts[run["variant"]] = row
    return verdicts


def mask_cost(
    token_capacity: int = 8192, sequence_capacity: int = 64, dim: int = 2048, num_heads: int = 16,
    active_tokens: tuple[int, ...] = (8192, 4096, 1024), iters: int = 50, seed: int = 0,
) -> dict:
    """Block forward + backward replayed from one graph per variant, captured at ``T``; each ``L``'s
    Zipf layout is copied into the static buffers. Median µs of ``iters`` CUDA-event timings."""
    generator = torch.Generator().manual_seed(seed)
    static_x = torch.randn(token_capacity, dim, generator=generator).to("cuda", torch.bfloat16)
    static_target = torch.randn(token_capacity, dim, generator=generator).to("cuda", torch.bfloat16)
    static_cu = torch.zeros(sequence_capacity + 1, dtype=torch.int32, device="cuda")
    static_cu[1:] = token_capacity  # capture with one full sequence; replays bring their own
    graphs = {}
    for name, masks in (("masked", MASK_SITES), ("unmasked", ())):
        torch.manual_seed(seed)
        module = ShortConvAttentionBlock(dim, num_heads, masks=masks, impl="varlen_attn", device="cuda",
                                         dtype=torch.bfloat16)
        graphs[name] = capture_graph(
            lambda module=module: gradients_at_capacity(module, static_x, static_target, static_cu, token_capacity)
        )[0]
    points = []
    for active in active_tokens:
        lengths = zipf_lengths(active, min(sequence_capacity, active), generator=generator)
        static_cu.copy_(pad_cu_seqlens(cu_seqlens_from_lengths(lengths), sequence_capacity))
        timings = {name: device_us(graph.replay, iters) for name, graph in graphs.items()}
        points.append({"L": active, "M": len(lengths), "masked_us": timings["masked"],
                       "unmasked_us": timings["unmasked"], "ratio": timings["masked"] / timings["unmasked"]})
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "dim": dim, "num_heads": num_heads,
                   "kernel_size": 4, "max_seqlen": token_capacity, "dtype": "bfloat16", "iters": iters,
                   "seed": seed, "lengths": "Zipf(1.2)"},
        "points": points,
    }


def masking_suite() -> dict:
    """All three parts; under a minute on an H200."""
    return {"varlen_attn_repro": varlen_attn_repro(), "block_ablation": block_ablation(), "mask_cost": mask_cost()}
