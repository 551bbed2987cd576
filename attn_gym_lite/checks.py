"""The checks that prevent silently wrong results: ``cu_seqlens``'s layout and values, and no host
read during CUDA graph capture. The bottom layer: it imports nothing from the package."""

from __future__ import annotations

import math
import operator

import torch

Tensor = torch.Tensor

INT32_MAX = torch.iinfo(torch.int32).max  # cu_seqlens is int32: no batch holds more tokens


def host_values(argument: str, value: Tensor) -> Tensor:
    """An int64 CPU copy of ``value``, refused during CUDA graph capture (the read would sync)."""
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{argument}'s values are read on the host, which cannot happen during CUDA graph "
                           "capture; validate the batch before capturing or replaying")
    return value.detach().cpu().to(torch.int64)


def _same_device(expected: torch.device | str, actual: torch.device) -> bool:
    expected = torch.device(expected)  # "cuda" carries no index and matches any GPU
    return actual.type == expected.type and expected.index in (None, actual.index)


def check_cu_seqlens(cu_seqlens: Tensor, *, device: torch.device | str | None = None,
                     sequence_capacity: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The layout rules, from metadata only: contiguous 1-D int32 with ``N + 1 >= 2`` entries."""
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{argument} must have dtype torch.int32 (FlashAttention varlen convention), "
                        f"got {cu_seqlens.dtype}")
    if device is not None and not _same_device(device, cu_seqlens.device):
        raise ValueError(f"{argument} must be on device {torch.device(device)}, got {cu_seqlens.device}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2 or sequence_capacity not in (None, cu_seqlens.numel() - 1):
        entries = "at least 2" if sequence_capacity is None else f"N + 1 = {sequence_capacity + 1}"
        raise ValueError(f"{argument} must have {entries} entries in shape [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if not cu_seqlens.is_contiguous():
        # Kernels read it through its data pointer: a strided view would be read as if it were dense.
        raise ValueError(f"{argument} must be contiguous (kernels read it through its data pointer), "
                         f"got stride {cu_seqlens.stride()}")
    return cu_seqlens


def check_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                            max_seqlen: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """Layout, then values: starts at 0, never decreases, ``L <= token_capacity``, no sequence
    longer than ``max_seqlen``. Eager: returns the int64 host copy it read and checked."""
    check_cu_seqlens(cu_seqlens, argument=argument)
    host = host_values(argument, cu_seqlens)
    steps = host.diff()
    if host[0] != 0:
        raise ValueError(f"{argument}[0] must be 0, got {int(host[0])}")
    if (steps < 0).any():
        i = int(torch.nonzero(steps < 0)[0]) + 1
        raise ValueError(f"{argument} must be non-decreasing, but {argument}[{i}] = {int(host[i])} "
                         f"< {argument}[{i - 1}] = {int(host[i - 1])}")
    if token_capacity is not None and host[-1] > token_capacity:
        raise ValueError(f"{argument}[-1] (active tokens L) must be <= token_capacity T = {token_capacity}, "
                         f"got L = {int(host[-1])}")
    if max_seqlen is not None and steps.max() > max_seqlen:
        raise ValueError(f"max_seqlen must be >= the longest sequence, got max_seqlen = {max_seqlen} "
                         f"but sequence {int(steps.argmax())} has length {int(steps.max())}")
    return host


def check_host_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                                 max_seqlen: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """Layout; values only for a CPU tensor outside ``torch.compile`` (a CUDA one is not read: capture-safe)."""
    check_cu_seqlens(cu_seqlens, argument=argument)
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen, argument=argument)
    return cu_seqlens


def check_int_sequence(argument: str, values: object, *, minimum: int | None = None, maximum: int | None = None) -> list[int]:
    """``values`` (ints, or a 1-D integer tensor or array) as a list of ints within ``[minimum, maximum]``."""
    values = [operator.index(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    low, high = -math.inf if minimum is None else minimum, math.inf if maximum is None else maximum
    for i, v in enumerate(values):
        if not low <= v <= high:
            raise ValueError(f"{argument}[{i}] must be an int in [{low}, {high}], got {v}")
    return values
