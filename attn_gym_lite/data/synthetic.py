"""Batches whose shape is prescribed, the loss on the second half of each sequence (the first
half plays the prompt): the seed's synthetic loader, and its real-text twin."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from ..ragged import zipf_lengths
from .batch import PackedBatch, assemble

__all__ = ["fixed_count_loader", "packed_batch_loader"]


def packed_batch_loader(num_batches: int, token_capacity: int, vocab_size: int, sequence_capacity: int, *,
                        seed: int = 0) -> Iterator[PackedBatch]:
    """Random-id batches whose ``L`` falls linearly from ``T`` (with ``M = N``) to ``max(N, T // 8)``,
    in ``max(1, round(N L / T))`` Zipf(1.2)-length sequences. Source: seed article,
    "A More Realistic Training Loop" (``packed_batch_loader``)."""
    smallest = max(sequence_capacity, token_capacity // 8)
    steps = max(num_batches - 1, 1)
    generator = torch.Generator().manual_seed(seed)
    for i in range(num_batches):
        active_tokens = round(token_capacity - (token_capacity - smallest) * i / steps)
        # L >= N and L <= T imply 1 <= M <= N <= L, so every sequence gets a token.
        active_sequences = max(1, round(sequence_capacity * active_tokens / token_capacity))
        lengths = zipf_lengths(active_tokens, active_sequences, generator=generator)
        active_ids = torch.randint(vocab_size, (active_tokens,), generator=generator)
        yield assemble(active_ids, lengths.tolist(), token_capacity, sequence_capacity, loss_on_second_half=True)


def fixed_count_loader(tokens: Sequence[int] | torch.Tensor, num_batches: int, token_capacity: int,
                       documents_per_batch: int, *, min_fill: float = 0.1, seed: int = 0) -> Iterator[PackedBatch]:
    """SFT/RL-like batches: ``M = N`` documents each, ``L`` uniform in ``[ceil(min_fill T), T]`` and
    cut into Zipf(1.2) lengths, filled with the next window of ``tokens`` (a tokenized corpus as
    one stream, wrapping around). Needs ``M <= min_fill T``: every document gets a token."""
    stream = torch.as_tensor(tokens).to("cpu", torch.int64).flatten()
    smallest = math.ceil(min_fill * token_capacity)
    generator = torch.Generator().manual_seed(seed)
    position = 0
    for _ in range(num_batches):
        active = int(torch.randint(smallest, token_capacity + 1, (1,), generator=generator))
        lengths = zipf_lengths(active, documents_per_batch, generator=generator).tolist()
        window = torch.arange(position, position + active) % stream.numel()
        position = (position + active) % stream.numel()
        yield assemble(stream[window], lengths, token_capacity, documents_per_batch, loss_on_second_half=True)
