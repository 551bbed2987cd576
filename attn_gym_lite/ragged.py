"""Packed ("ragged") tensors and their ``cu_seqlens`` metadata.

A batch of variable-length sequences is one packed tensor of shape ``[T, ...]`` plus an int32
prefix sum ``cu_seqlens`` of shape ``[N + 1]``::

    sequences   a a a | b b | c c c c          (M = 3 active sequences)
    packed      a a a b b c c c c . . .        (L = 9 active tokens, T = 12 rows)
    cu_seqlens  [0, 3, 5, 9, 9, 9]             (N = 5 sequence slots)

Sequence ``i`` is ``packed[cu_seqlens[i]:cu_seqlens[i + 1]]``. Rows past ``L = cu_seqlens[-1]``
are capacity, and the tail of ``cu_seqlens`` repeats ``L`` (empty slots): keeping ``T`` and ``N``
fixed while ``L`` and ``M`` vary lets one captured CUDA graph serve every batch.

Packing helpers read lengths on the host and run eagerly. ``active_token_mask``,
``lengths_from_cu_seqlens``, ``pad_cu_seqlens`` and ``positions_in_sequence`` only launch device
ops, so they may run inside a captured region and are recomputed on every replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checks import INT32_MAX, check_cu_seqlens, check_cu_seqlens_values, check_host_cu_seqlens_values, host_values

Tensor = torch.Tensor

__all__ = [
    "active_token_mask",
    "cu_seqlens_from_lengths",
    "lengths_from_cu_seqlens",
    "max_seqlen",
    "pack_sequences",
    "packed_to_padded",
    "pad_cu_seqlens",
    "positions_in_sequence",
    "padded_to_packed",
    "unpack_sequences",
    "validate_cu_seqlens",
    "zipf_lengths",
]


def cu_seqlens_from_lengths(lengths: Tensor | Sequence[int], *, device: torch.device | str | None = None) -> Tensor:
    """Prefix-sum sequence lengths into ``cu_seqlens``.

    Args:
        lengths: ``M`` sequence lengths in tokens, each ``>= 0``: ints or a 1-D integer tensor.
        device: device of the result; defaults to ``lengths``'s device (the CPU for ints).

    Returns:
        int32 tensor ``[0, s_0, s_0 + s_1, ..., L]`` of shape ``[M + 1]``.

    Eager: reads the lengths on the host. FlashAttention's varlen convention.
    """
    if device is None:
        device = lengths.device if isinstance(lengths, Tensor) else "cpu"
    lengths = host_values("lengths", torch.as_tensor(lengths))
    cu_seqlens = torch.cat((lengths.new_zeros(1), lengths.cumsum(0)))
    # Each length within int32 before its sum is trusted: lengths near 2**62 wrap the int64 sum.
    if (lengths < 0).any() or (lengths > INT32_MAX).any() or cu_seqlens[-1] > INT32_MAX:
        raise ValueError(f"lengths must be >= 0 with a sum that fits in int32, got {lengths.tolist()[:16]}")
    return cu_seqlens.to(device=device, dtype=torch.int32)


def lengths_from_cu_seqlens(cu_seqlens: Tensor) -> Tensor:
    """int32 lengths ``[N]``, ``cu_seqlens[1:] - cu_seqlens[:-1]`` (tail slots give 0). Capture-safe."""
    return check_cu_seqlens(cu_seqlens).diff()


def pad_cu_seqlens(cu_seqlens: Tensor, sequence_capacity: int) -> Tensor:
    """``cu_seqlens`` extended to ``sequence_capacity + 1`` entries by repeating ``L``: the layout a
    graph captured for ``N`` slots takes on every replay. Capture-safe (``L`` is never read)."""
    check_cu_seqlens(cu_seqlens)
    return torch.cat((cu_seqlens, cu_seqlens[-1:].repeat(sequence_capacity + 1 - cu_seqlens.numel())))


def validate_cu_seqlens(cu_seqlens: Tensor, token_capacity: int | None = None, *, max_seqlen: int | None = None) -> None:
    """Check the layout and value rules of ``cu_seqlens``: int32, 1-D, contiguous, starts at 0,
    never decreases, ``L <= token_capacity`` and no sequence longer than ``max_seqlen``.

    Eager only: reads ``cu_seqlens`` on the host (refused during CUDA graph capture), so check a
    batch before copying it into a graph's static buffers.
    """
    check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen)


def max_seqlen(cu_seqlens: Tensor) -> int:
    """``S_max``, the longest sequence in tokens. Eager: under CUDA graphs pass a capacity bound instead."""
    return int(check_cu_seqlens_values(cu_seqlens).diff().max())


def zipf_lengths(total_tokens: int, num_sequences: int, *, exponent: float = 1.2,
                 generator: torch.Generator | None = None) -> Tensor:
    """Split ``total_tokens`` into ``num_sequences`` heavy-tailed lengths, as real documents are.

    Sequence ranks are a random permutation of ``1..num_sequences``; each sequence gets 1 token
    plus the floor of its ``rank ** -exponent`` share of the rest, and the tokens lost to flooring
    go one each to the largest fractional parts. Returns int32 CPU lengths, each ``>= 1``, summing
    to exactly ``total_tokens``; the same ``generator`` seed gives the same lengths. The seed
    article's ``get_zipf_tokens``.
    """
    n, total = num_sequences, total_tokens
    if not 1 <= n <= total <= INT32_MAX:
        raise ValueError(f"need 1 <= num_sequences <= total_tokens <= 2**31 - 1, got {n} and {total}")
    ranks = torch.randperm(n, generator=generator).add(1).to(torch.float64)
    weights = ranks.pow(-float(exponent))
    spare = total - n
    shares = weights * (spare / weights.sum())
    extra = shares.floor()
    # The floors are exact in float64, so `remainder` is an exact count: a sum of n fractional
    # parts, < n, so no sequence gets more than one extra token.
    remainder = spare - int(extra.sum())
    by_fraction = torch.argsort(shares - extra, descending=True, stable=True)
    extra[by_fraction[:remainder]] += 1
    return (extra + 1).to(torch.int32)


def pack_sequences(sequences: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Concatenate ``M`` tensors ``[s_i, ...]`` along dim 0: ``(packed [L, ...], cu_seqlens [M + 1])``."""
    packed = torch.cat(tuple(sequences))
    return packed, cu_seqlens_from_lengths([len(seq) for seq in sequences], device=packed.device)


def unpack_sequences(packed: Tensor, cu_seqlens: Tensor) -> list[Tensor]:
    """One view of ``packed`` per slot of ``cu_seqlens`` (tail slots give empty tensors). Eager."""
    lengths = check_cu_seqlens_values(cu_seqlens, token_capacity=packed.shape[0]).diff().tolist()
    return list(packed[: sum(lengths)].split(lengths))


def packed_to_padded(packed: Tensor, cu_seqlens: Tensor, *, max_seqlen: int | None = None,
                     padding_value: float = 0.0) -> Tensor:
    """Scatter a packed ``[T, ...]`` tensor into a padded ``[B, max_seqlen, ...]`` batch (width
    defaults to the longest sequence). Row ``b`` is sequence ``b`` then ``padding_value``.

    The active cells of the padded batch, read in row-major order, are exactly ``packed[:L]``, so
    one masked ``index_put`` places them all (differentiable). Eager: reads ``cu_seqlens``.
    """
    bounds = check_cu_seqlens_values(cu_seqlens, token_capacity=packed.shape[0], max_seqlen=max_seqlen)
    lengths = bounds.diff()
    width = int(lengths.max()) if max_seqlen is None else max_seqlen
    valid = torch.arange(width)[None, :] < lengths[:, None]
    padded = packed.new_full((lengths.numel(), width, *packed.shape[1:]), padding_value)
    return padded.index_put((valid.to(packed.device),), packed[: int(bounds[-1])])


def padded_to_packed(padded: Tensor, lengths: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
    """Gather the first ``lengths[b]`` positions of each row of a padded ``[B, S, ...]`` batch:
    ``(packed [L, ...], cu_seqlens [B + 1])``, the inverse of :func:`packed_to_padded`."""
    cu_seqlens = cu_seqlens_from_lengths(lengths, device=padded.device)
    row_lengths = cu_seqlens.diff()
    if (row_lengths > padded.shape[1]).any():  # the mask would stop at S and cu_seqlens would not
        raise ValueError(f"lengths must be <= padded.shape[1] = {padded.shape[1]}, got {row_lengths.tolist()}")
    valid = torch.arange(padded.shape[1], device=padded.device)[None, :] < row_lengths[:, None]
    return padded[valid], cu_seqlens


# Rows past L hold stale or undefined values: they must be masked wherever rows mix or reduce.


def active_token_mask(x_or_token_capacity: Tensor | int, cu_seqlens: Tensor) -> Tensor:
    """Boolean mask of the active rows: ``arange(T) < cu_seqlens[-1]``.

    Capture-safe: ``L`` is compared on the device as the 0-d tensor ``cu_seqlens[-1]``, never read
    on the host, so a captured graph rebuilds the mask from whatever ``L`` the static
    ``cu_seqlens`` holds at each replay.

    Args:
        x_or_token_capacity: a tensor of shape ``[T, ...]``, or the token capacity ``T``.
        cu_seqlens: int32 tensor of shape ``[N + 1]``.

    Returns:
        bool tensor of shape ``[T]`` on ``cu_seqlens``'s device, True for the first ``L`` rows.
    """
    T = x_or_token_capacity.shape[0] if isinstance(x_or_token_capacity, Tensor) else x_or_token_capacity
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=T)
    return torch.arange(T, device=cu_seqlens.device, dtype=cu_seqlens.dtype) < cu_seqlens[-1]


def positions_in_sequence(cu_seqlens: Tensor, token_capacity: int) -> Tensor:
    """Each row's position inside its own sequence, int32 ``[T]``: restarts at 0 at every boundary
    (RoPE, convolution taps). Rows past ``L`` count from ``L``, as one more sequence.

    Capture-safe: ``searchsorted(right=True)`` on the device finds the last boundary ``<= t``,
    stepping over empty sequences.
    """
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity)
    rows = torch.arange(token_capacity, device=cu_seqlens.device, dtype=torch.int32)
    return rows - cu_seqlens[torch.searchsorted(cu_seqlens, rows, right=True) - 1]
