"""Benchmark suite ``hello-world``: the seed's first measurement, eager versus one graph replay.

Beside the timings, the seed's first two pictures as data: a compact timeline of one eager step
and of one replay, profiled in a fresh process so the profiler never touches the timed one.
"""

from __future__ import annotations

import torch

from ..graph.capture import capture_graph
from ..isolation import run_isolated
from ..models import VarLenAttention
from ..profiling import profile
from ..profiling.compact import compact_timeline
from ..ragged import cu_seqlens_from_lengths, zipf_lengths
from .harness import device_us, error_text
from .timing import wall_clock_us


def _workload(dim: int, num_heads: int, token_capacity: int, sequence_capacity: int, seed: int):
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

    return forward_backward, max_seqlen


def hello_world(
    dim: int = 512, num_heads: int = 8, token_capacity: int = 4096, sequence_capacity: int = 32,
    iters: int = 200, seed: int = 0,
) -> dict:
    """The seed's hello world: ``VarLenAttention`` forward + backward (parameter gradients) on a
    Zipf-packed bf16 batch, eager versus one CUDA-graph replay; µs per iteration."""
    forward_backward, max_seqlen = _workload(dim, num_heads, token_capacity, sequence_capacity, seed)
    eager_wall = wall_clock_us(forward_backward, iters)
    eager_events = device_us(forward_backward, iters)
    graph, _ = capture_graph(forward_backward)
    replay_wall = wall_clock_us(graph.replay, iters)
    replay_events = device_us(graph.replay, iters)
    return {
        "config": {"dim": dim, "num_heads": num_heads, "T": token_capacity, "N": sequence_capacity,
                   "max_seqlen": max_seqlen, "dtype": "bfloat16", "iters": iters, "seed": seed},
        "eager_wall_us": eager_wall,
        "replay_wall_us": replay_wall,
        "eager_event_us_median": eager_events,
        "replay_event_us_median": replay_events,
        "speedup_wall": eager_wall / replay_wall,
    }


def hello_world_timelines(
    dim: int = 512, num_heads: int = 8, token_capacity: int = 4096, sequence_capacity: int = 32, seed: int = 0,
) -> dict:
    """One eager step and one replay, each profiled after a discarded warm-up step and reduced by
    :func:`~attn_gym_lite.profiling.compact.compact_timeline`. Run it in a fresh process: a profiler
    slows later launches in the process it ran in."""
    forward_backward, max_seqlen = _workload(dim, num_heads, token_capacity, sequence_capacity, seed)
    for _ in range(3):  # lazy library state, as before the timings
        forward_backward()
    graph, _ = capture_graph(forward_backward)
    graph.replay()
    torch.cuda.synchronize()
    timelines = {}
    for name, step in (("eager", forward_backward), ("replay", graph.replay)):
        with profile(None, warmup=1) as recording:
            for _ in range(2):  # the warm-up step (discarded), then the recorded one
                step()
                torch.cuda.synchronize()
                recording.step()
        timelines[name] = compact_timeline(recording.trace, name_chars=60)
    return {"config": {"dim": dim, "num_heads": num_heads, "T": token_capacity, "N": sequence_capacity,
                       "max_seqlen": max_seqlen, "dtype": "bfloat16", "seed": seed},
            **timelines}


def hello_world_suite() -> dict:
    """The seed's two sizes, dim 512 / 8 heads (launch-bound) and 4096 / 32, and the timelines of
    the first (or the error under ``"timelines_error"``)."""
    record: dict = {"runs": [hello_world(512, 8), hello_world(4096, 32)]}
    try:
        record["timelines"] = run_isolated(hello_world_timelines, 512, 8)
    except Exception as error:  # recorded: the timings stand without the pictures
        record["timelines_error"] = error_text(error, 4000)
    return record
