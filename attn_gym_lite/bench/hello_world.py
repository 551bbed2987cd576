"""Benchmark suite ``hello-world``: the seed's first measurement, eager versus one graph replay."""

from __future__ import annotations

import torch

from ..graph.capture import capture_graph
from ..models import VarLenAttention
from ..ragged import cu_seqlens_from_lengths, zipf_lengths
from .timing import cuda_event_us, median, wall_clock_us


def hello_world(
    dim: int = 512, num_heads: int = 8, token_capacity: int = 4096, sequence_capacity: int = 32,
    iters: int = 200, seed: int = 0,
) -> dict:
    """The seed's hello world: ``VarLenAttention`` forward + backward (parameter gradients) on a
    Zipf-packed bf16 batch, eager versus one CUDA-graph replay; µs per iteration."""
    generator = torch.Generator().manual_seed(seed)
    lengths = zipf_lengths(token_capacity, sequence_capacity, generator=generator)
    cu_seqlens = cu_seqlens_from_lengths(lengths, device="cuda")
    max_seqlen = int(lengths.max())
    torch.manual_seed(seed)
    # The seed's experiment: torch's varlen_attn with the batch's own max_seqlen.
    model = VarLenAttention(dim, num_heads, impl="varlen_attn", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(token_capacity, dim, device="cuda", dtype=torch.bfloat16)
    parameters = tuple(model.parameters())
    grad_output = torch.ones_like(x)

    def forward_backward() -> torch.Tensor:
        out = model(x, cu_seqlens, max_seqlen)
        torch.autograd.grad(out, parameters, grad_output)
        return out

    eager_wall = wall_clock_us(forward_backward, iters)
    eager_events = cuda_event_us(forward_backward, iters)
    graph, _ = capture_graph(forward_backward)
    replay_wall = wall_clock_us(graph.replay, iters)
    replay_events = cuda_event_us(graph.replay, iters)
    return {
        "config": {"dim": dim, "num_heads": num_heads, "T": token_capacity, "N": sequence_capacity,
                   "max_seqlen": max_seqlen, "dtype": "bfloat16", "iters": iters, "seed": seed},
        "eager_wall_us": eager_wall,
        "replay_wall_us": replay_wall,
        "eager_event_us_median": median(eager_events),
        "replay_event_us_median": median(replay_events),
        "speedup_wall": eager_wall / replay_wall,
    }


def hello_world_suite() -> dict:
    """The seed's two sizes: dim 512 / 8 heads (launch-bound) and dim 4096 / 32 heads."""
    return {"runs": [hello_world(512, 8), hello_world(4096, 32)]}
