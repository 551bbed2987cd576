"""Batches whose *shape* is prescribed: the seed's synthetic loader, and its real-text twin.

* :func:`packed_batch_loader`: random token ids in Zipf-length sequences whose active size
  shrinks, as in the seed article's "A More Realistic Training Loop";
* :func:`fixed_count_loader`: an SFT/RL-like workload on real text: a fixed number of documents
  per batch, so the active tokens ``L`` vary widely from batch to batch, with the loss on the
  second half of each document (the "response").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..checks import check_capacities, check_int, check_real, host_values
from ..ragged import zipf_lengths
from .batch import PackedBatch, assemble

__all__ = ["fixed_count_loader", "packed_batch_loader"]


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
    # torch.randint draws below an int64 bound; a larger one failed at the first batch.
    vocab_size = check_int("vocab_size", vocab_size, minimum=1, maximum=torch.iinfo(torch.int64).max)
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


def _token_stream(tokens: object) -> torch.Tensor:
    """``tokens`` as a flat int64 CPU tensor of ids ``>= 0`` (vectorised checks: a corpus is long)."""
    expected = "a sequence, tensor or array of token ids (ints >= 0)"
    if isinstance(tokens, (str, bytes)) or tokens is None:
        raise TypeError(f"tokens must be {expected}, got {type(tokens).__name__}")
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise TypeError(f"tokens must be {expected}, got a {tokens.dtype} tensor")
        stream = host_values("tokens", tokens).flatten()
    else:
        try:
            stream = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError, OverflowError) as error:
            raise TypeError(f"tokens must be {expected}, got {type(tokens).__name__}: {error}") from None
        if stream.dtype == torch.bool or stream.is_floating_point() or stream.is_complex():
            raise TypeError(f"tokens must be {expected}, got {stream.dtype} values (from {type(tokens).__name__})")
        if stream.dtype == torch.uint64 and stream.numel():
            # Past int64's largest, the cast below would wrap a huge id into a negative one (and
            # the message would name a value the caller never gave): name the real one.
            values = stream.flatten().numpy()
            too_big = (values > np.uint64(torch.iinfo(torch.int64).max)).nonzero()[0]
            if too_big.size:
                position = int(too_big[0])
                raise ValueError(f"tokens must hold ids in [0, 2**63), got tokens[{position}] = {int(values[position])}")
        stream = stream.to(torch.int64).flatten()
    if stream.numel() and int(stream.min()) < 0:
        position = int(torch.nonzero(stream < 0)[0])
        raise ValueError(f"tokens must hold ids >= 0, got tokens[{position}] = {int(stream[position])}")
    return stream


def fixed_count_loader(
    tokens: Sequence[int] | torch.Tensor,
    num_batches: int,
    token_capacity: int,
    documents_per_batch: int,
    *,
    min_fill: float = 0.1,
    seed: int = 0,
) -> Iterator[PackedBatch]:
    """SFT/RL-like batches of real text: ``M`` documents per batch, ``L`` anywhere in ``[min_fill T, T]``.

    Fine-tuning and RL batches hold a fixed number of examples whose lengths vary, so the active
    tokens swing from batch to batch, unlike look-ahead packing of a pretraining stream (which
    fills ``L`` close to ``T``). Batch ``i`` draws ``L`` uniformly from
    ``[ceil(min_fill * T), T]``, splits it into ``M`` Zipf(1.2) lengths
    (:func:`~attn_gym_lite.ragged.zipf_lengths`), and fills each document with the next
    consecutive window of ``tokens`` (a tokenized corpus read as one stream, wrapping around), so
    every document is real text. The loss counts the second half of each document only (the
    first half plays the prompt).

    Args:
        tokens: a tokenized corpus as one stream of ids (at least ``T`` of them): ints ``>= 0``
            in a sequence, or an integer tensor or array (flattened).
        num_batches: batches to yield, >= 1.
        token_capacity: ``T`` (tokens), >= 1.
        documents_per_batch: ``M``, which is also the sequence capacity ``N``; ``1 <= M``,
            ``M <= min_fill * T`` (each document gets a token).
        min_fill: the smallest ``L / T``, a real in ``(0, 1]``.
        seed: seed of the CPU generator (>= 0); the same seed gives the same batches.

    Yields:
        :class:`PackedBatch` on the CPU with ``N = M`` slots, all of them used.

    Raises:
        TypeError / ValueError: an argument out of type or range (checked when called), or fewer
            than ``T`` tokens.
        TypeError: ``tokens`` is not a sequence, tensor or array of ints (float ids, ``True``, a
            bool or float tensor, a string).
        ValueError: ``tokens`` holds a negative id or one past int64 (a uint64 array), or is a meta
            tensor (no values).

    Source: the seed article's synthetic loader (prompt/response loss mask), on real text.
    """
    stream = _token_stream(tokens)
    num_batches = check_int("num_batches", num_batches, minimum=1)
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    min_fill = check_real("min_fill", min_fill, above=0.0, maximum=1.0)
    smallest = math.ceil(min_fill * token_capacity)
    documents = check_int("documents_per_batch", documents_per_batch, minimum=1, maximum=smallest)
    seed = check_int("seed", seed, minimum=0)
    if stream.numel() < token_capacity:
        raise ValueError(f"tokens must hold at least token_capacity = {token_capacity} ids, got {stream.numel()}")

    def batches() -> Iterator[PackedBatch]:
        generator = torch.Generator().manual_seed(seed)
        position = 0
        for _ in range(num_batches):
            active = int(torch.randint(smallest, token_capacity + 1, (1,), generator=generator))
            lengths = zipf_lengths(active, documents, generator=generator).tolist()
            window = torch.arange(position, position + active) % stream.numel()
            position = (position + active) % stream.numel()
            yield assemble(stream[window], lengths, token_capacity, documents, loss_on_second_half=True)

    return batches()

