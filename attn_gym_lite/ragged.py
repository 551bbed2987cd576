"""Packed ("ragged") tensors: one ``[T, ...]`` tensor plus an int32 prefix sum ``cu_seqlens``::

    sequences   a a a | b b | c c c c          (M = 3 active sequences)
    packed      a a a b b c c c c . . .        (L = 9 active tokens, T = 12 rows)
    cu_seqlens  [0, 3, 5, 9, 9, 9]             (N = 5 sequence slots)

Rows past ``L`` are capacity and the tail of ``cu_seqlens`` repeats ``L``, so fixed ``T`` and ``N``
let one captured CUDA graph serve every batch.
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
    """int32 ``[0, s_0, s_0 + s_1, ..., L]`` (shape ``[M + 1]``) from ``M`` lengths ``>= 0`` (ints or
    a 1-D integer tensor), on ``device`` (default: the lengths' device). Eager: reads the lengths."""
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
    """Check ``cu_seqlens``'s layout and values; eager (it reads them), so call it outside capture."""
    check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen)


def max_seqlen(cu_seqlens: Tensor) -> int:
    """``S_max``, the longest sequence in tokens. Eager: under CUDA graphs pass a capacity bound instead."""
    return int(check_cu_seqlens_values(cu_seqlens).diff().max())


def zipf_lengths(total_tokens: int, num_sequences: int, *, exponent: float = 1.2,
                 generator: torch.Generator | None = None) -> Tensor:
    """int32 lengths ``>= 1`` summing to ``total_tokens``, heavy-tailed like real documents: each
    sequence gets 1 token plus its Zipf share (``rank ** -exponent``, random ranks) of the rest."""
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
    """A padded ``[B, max_seqlen, ...]`` batch (default width: the longest sequence). Eager."""
    bounds = check_cu_seqlens_values(cu_seqlens, token_capacity=packed.shape[0], max_seqlen=max_seqlen)
    lengths = bounds.diff()
    # The active cells, read in row-major order, are exactly packed[:L]: one masked index_put.
    width = int(lengths.max()) if max_seqlen is None else max_seqlen
    valid = torch.arange(width)[None, :] < lengths[:, None]
    padded = packed.new_full((lengths.numel(), width, *packed.shape[1:]), padding_value)
    return padded.index_put((valid.to(packed.device),), packed[: int(bounds[-1])])


def padded_to_packed(padded: Tensor, lengths: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
    """``(packed, cu_seqlens)`` from the first ``lengths[b]`` positions of each padded row."""
    cu_seqlens = cu_seqlens_from_lengths(lengths, device=padded.device)
    row_lengths = cu_seqlens.diff()
    if (row_lengths > padded.shape[1]).any():  # the mask would stop at S and cu_seqlens would not
        raise ValueError(f"lengths must be <= padded.shape[1] = {padded.shape[1]}, got {row_lengths.tolist()}")
    valid = torch.arange(padded.shape[1], device=padded.device)[None, :] < row_lengths[:, None]
    return padded[valid], cu_seqlens


def active_token_mask(x_or_token_capacity: Tensor | int, cu_seqlens: Tensor) -> Tensor:
    """bool ``[T]``, True for the first ``L`` rows (``T`` from a ``[T, ...]`` tensor or an int).
    ``L`` stays on the device as ``cu_seqlens[-1]``: a captured graph rebuilds the mask per replay."""
    T = x_or_token_capacity.shape[0] if isinstance(x_or_token_capacity, Tensor) else x_or_token_capacity
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=T)
    return torch.arange(T, device=cu_seqlens.device, dtype=cu_seqlens.dtype) < cu_seqlens[-1]


def positions_in_sequence(cu_seqlens: Tensor, token_capacity: int) -> Tensor:
    """int32 ``[T]``, each row's position in its own sequence (rows past ``L`` count on). Capture-safe."""
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity)
    rows = torch.arange(token_capacity, device=cu_seqlens.device, dtype=torch.int32)
    # right=True: the last boundary <= t, stepping over empty sequences.
    return rows - cu_seqlens[torch.searchsorted(cu_seqlens, rows, right=True) - 1]
