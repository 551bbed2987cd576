"""Benchmark suite ``training-loop``: a :class:`PackedLM` trained eagerly and from one graph."""

from __future__ import annotations

import time
from itertools import islice

import torch

from ..data import InOrder, PackedLoader, load_tokenizer
from ..graph.training import FixedCapacityTrainer
from ..models import PackedLM


def training_loop(
    token_capacity: int = 4096, sequence_capacity: int = 32, dim: int = 1024, num_heads: int = 8,
    steps: int = 300, lr: float = 1e-3, seed: int = 0, device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16, max_piece_tokens: int = 1024,
) -> dict:
    """A :class:`PackedLM` trained on the standard library eagerly and from one CUDA graph, same batches
    and weights: losses, and host wall-clock µs per step after the first 10. On CUDA each mode runs
    twice; ``max_loss_difference`` compares the runs and the modes."""
    tokenizer = load_tokenizer()
    loader = PackedLoader(token_capacity, sequence_capacity, tokenizer=tokenizer, policy=InOrder(),
                          max_piece_tokens=min(max_piece_tokens, token_capacity), pin_memory=device == "cuda")
    batches = list(islice(loader, steps))
    runs = {}
    # Each mode runs twice from the same seed: whether a mode repeats itself bit for bit tells a
    # non-deterministic kernel apart from two modes that simply compute differently.
    modes = ("eager", "graph", "eager_repeat", "graph_repeat") if device == "cuda" else ("eager",)
    for mode in modes:
        torch.manual_seed(seed)
        model = PackedLM(tokenizer.vocab_size, dim, num_heads, device=device, dtype=dtype)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=mode.startswith("graph"), lr=lr)
        losses = [trainer.step(b) for b in batches[:10]]  # warm-up (and the graph's first replays)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        losses += [trainer.step(b) for b in batches[10:]]
        if device == "cuda":
            torch.cuda.synchronize()
        step_us = (time.perf_counter() - start) / max(1, len(batches) - 10) * 1e6
        runs[mode] = {"losses": torch.stack(losses).tolist(), "step_us": step_us}
    differences = {}
    if device == "cuda":
        for a, b in (("eager", "eager_repeat"), ("graph", "graph_repeat"), ("eager", "graph")):
            differences[f"{a}_vs_{b}"] = max(abs(x - y) for x, y in zip(runs[a]["losses"], runs[b]["losses"]))
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "dim": dim, "num_heads": num_heads,
                   "vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.name, "steps": len(batches),
                   "max_piece_tokens": min(max_piece_tokens, token_capacity), "policy": loader.policy.label,
                   "lr": lr, "dtype": str(dtype).removeprefix("torch."), "seed": seed},
        "active_tokens": [b.active_tokens for b in batches],
        "active_sequences": [b.active_sequences for b in batches],
        **runs,
        "max_loss_difference": differences,
    }
