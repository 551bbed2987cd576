"""The benchmark suites. Each returns a JSON-ready dict; the CLI adds provenance and writes it.

The notebooks call these same functions for their live GPU runs, so the numbers a reader
measures and the recorded ones come from one piece of code.
"""

from __future__ import annotations

import time
from itertools import islice

import torch

from ..data import load_tokenizer, real_text_loader
from .buckets import buckets_suite
from .masking import masking_suite
from .packing import packing_study_suite
from .profiling import profiling_suite
from .schedulers import schedulers_suite
from ..graphs import capture_graph
from ..modules import PackedLM, VarLenAttention
from ..pitfalls import PITFALLS, run_pitfall
from ..ragged import cu_seqlens_from_lengths, zipf_lengths
from ..training import FixedCapacityTrainer
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
    model = VarLenAttention(dim, num_heads, device="cuda", dtype=torch.bfloat16)
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


def training_loop(
    token_capacity: int = 4096, sequence_capacity: int = 32, dim: int = 1024, num_heads: int = 8,
    steps: int = 300, lr: float = 1e-3, seed: int = 0, device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16, max_document_tokens: int = 1024,
) -> dict:
    """Train a :class:`PackedLM` on the real-text loader, eagerly and from one CUDA graph, on
    the same batches from the same initial weights; losses per step and step time. Files longer
    than ``max_document_tokens`` are cut into pieces of that length (the context length), several
    of which share each batch.

    Step time is host wall-clock over all steps after the first 10 (synchronised at the ends),
    so it includes the copies into the static buffers and the eager Adam step.
    """
    tokenizer = load_tokenizer()
    loader = real_text_loader(token_capacity, sequence_capacity, tokenizer=tokenizer,
                              max_document_tokens=min(max_document_tokens, token_capacity))
    batches = list(islice(loader, steps))
    if device == "cuda":
        batches = [b.pin_memory() for b in batches]
    runs = {}
    for mode in ("eager", "graph") if device == "cuda" else ("eager",):
        torch.manual_seed(seed)
        model = PackedLM(tokenizer.vocab_size, dim, num_heads, device=device, dtype=dtype)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=mode == "graph", lr=lr)
        losses = [trainer.step(b) for b in batches[:10]]  # warm-up (and the graph's first replays)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        losses += [trainer.step(b) for b in batches[10:]]
        if device == "cuda":
            torch.cuda.synchronize()
        step_us = (time.perf_counter() - start) / max(1, len(batches) - 10) * 1e6
        runs[mode] = {"losses": torch.stack(losses).tolist(), "step_us": step_us}
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "dim": dim, "num_heads": num_heads,
                   "vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.name, "steps": len(batches),
                   "max_document_tokens": min(max_document_tokens, token_capacity),
                   "lr": lr, "dtype": str(dtype).removeprefix("torch."), "seed": seed},
        "active_tokens": [b.active_tokens for b in batches],
        "active_sequences": [b.active_sequences for b in batches],
        **runs,
    }


def pitfalls_suite() -> dict:
    """Every pitfall of :mod:`attn_gym_lite.pitfalls`, each in a fresh process."""
    return {"pitfalls": [run_pitfall(name) for name in PITFALLS]}


SUITES = {
    "hello-world": hello_world_suite,
    "training-loop": training_loop,
    "pitfalls": pitfalls_suite,
    "buckets": buckets_suite,
    "masking": masking_suite,
    "packing-study": packing_study_suite,
    "schedulers": schedulers_suite,
    "profiling": profiling_suite,
}
