"""A synthetic loader: random token ids in Zipf-length sequences whose active size shrinks.

It stands in for a real data loader where the point is the *shape* of the batches, not their
text, as in the seed article's "A More Realistic Training Loop".
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from attn_gym_lite.ragged import zipf_lengths

from ..checks import check_capacities, check_int
from .batch import PackedBatch, assemble

__all__ = ["packed_batch_loader"]


def packed_batch_loader(
    num_batches: int,
    token_capacity: int,
    vocab_size: int,
    sequence_capacity: int,
    *,
    seed: int = 0,
) -> Iterator[PackedBatch]:
    """Yield ``num_batches`` synthetic packed batches whose active size shrinks over the run.

    Batch ``i`` has ``L_i`` active tokens, falling linearly (rounded) from ``T`` for the first
    batch to ``max(N, T // 8)`` for the last, in ``M_i = max(1, round(N * L_i / T))`` sequences
    with Zipf-distributed lengths (:func:`attn_gym_lite.ragged.zipf_lengths`, exponent 1.2).
    The first batch is at full capacity (``L = T``, ``M = N``), so a graph captured on it sees
    the largest active shapes. Token ids are uniform in ``[0, vocab_size)``; labels are the
    next token within each sequence, and the loss counts only the second half of each sequence
    (as if the first half were a prompt).

    Args:
        num_batches: batches to yield, >= 1.
        token_capacity: ``T`` (tokens), >= 1.
        vocab_size: ids are drawn from ``[0, vocab_size)``, >= 1.
        sequence_capacity: ``N``, ``1 <= N <= T``.
        seed: seed of the CPU ``torch.Generator`` (>= 0); the same seed gives the same batches.

    Yields:
        :class:`PackedBatch` on the CPU (not pinned; call :meth:`PackedBatch.pin_memory`).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range (checked when called, not at the first batch).

    Source: seed article, "A More Realistic Training Loop" (``packed_batch_loader``).
    """
    num_batches = check_int("num_batches", num_batches, minimum=1)
    token_capacity, sequence_capacity = check_capacities(token_capacity, sequence_capacity)
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)

    smallest = max(sequence_capacity, token_capacity // 8)
    steps = max(num_batches - 1, 1)
    active_token_counts = [
        round(token_capacity - (token_capacity - smallest) * i / steps) for i in range(num_batches)
    ]

    def batches() -> Iterator[PackedBatch]:
        generator = torch.Generator().manual_seed(seed)
        for active_tokens in active_token_counts:
            # L >= N and L <= T imply 1 <= M <= N <= L, so every sequence gets a token.
            active_sequences = max(1, round(sequence_capacity * active_tokens / token_capacity))
            lengths = zipf_lengths(active_tokens, active_sequences, generator=generator)
            active_ids = torch.randint(vocab_size, (active_tokens,), generator=generator)
            yield assemble(
                active_ids,
                lengths.tolist(),
                token_capacity,
                sequence_capacity,
                loss_on_second_half=True,
            )

    return batches()
