"""Variable-length (packed) attention: torch's FlashAttention path and a reference.

Packed attention takes ``q, k, v`` of shape ``[T, H, D]`` and ``cu_seqlens`` of shape
``[N + 1]``: token ``t`` attends only to tokens of its own sequence. On CUDA the fast path is
``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 kernels, forward and backward).
Everywhere else, and as the ground truth in tests, ``varlen_attention_reference`` runs ordinary
attention one sequence at a time.

Two API facts this module absorbs (see the book's "Graph capture" chapter):

* Causal masking is ``is_causal=True`` in torch 2.10/2.11 and ``window_size=(-1, 0)`` from 2.12.
* ``max_seqlen`` sizes FlashAttention-2's grid, ``ceil(max_seqlen / BLOCK_M) x N x H``. Under a
  CUDA graph it is a Python int baked in at capture: too small silently drops work, ``T`` is
  always safe but launches the worst-case grid on every replay.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover - older torch has no varlen attention API
    _varlen_attn = None

# torch 2.12 replaced `is_causal` with a sliding `window_size`; detect which one we have.
_TAKES_WINDOW = _varlen_attn is not None and "window_size" in inspect.signature(
    _varlen_attn
).parameters


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    *,
    causal: bool = False,
) -> Tensor:
    """Attention within each packed sequence; rows past ``cu_seqlens[-1]`` are undefined.

    Args:
        q, k, v: ``[T, H, D]`` tensors of one dtype and device (``T`` token capacity, ``H`` heads,
            ``D`` head dim).
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L, L]`` on the same device.
        max_seqlen: an upper bound on the longest sequence (tokens). Only the CUDA path uses it.
        causal: each token attends to itself and earlier tokens of its sequence only.

    Returns:
        ``[T, H, D]`` in ``q``'s dtype. Rows ``L..T-1`` (inactive capacity) are unspecified on the
        CUDA path and zero on the reference path: mask them before they reach anything that mixes
        rows (see ``VarLenAttention(mask_inactive_capacity=True)``).

    Dispatch: CUDA tensors in bf16/fp16 go to ``torch.nn.attention.varlen.varlen_attn``
    (capturable with a fixed ``max_seqlen``); anything else to :func:`varlen_attention_reference`
    (eager only: it reads ``cu_seqlens`` on the host).

    Raises:
        ValueError: shapes of ``q, k, v`` differ or are not 3-D.
    """
    if q.dim() != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "varlen_attention: q, k, v must all be [T, H, D] of one shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    fast = q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _varlen_attn is not None
    if not fast:
        return varlen_attention_reference(q, k, v, cu_seqlens, causal=causal)
    if _TAKES_WINDOW:
        window = (-1, 0) if causal else (-1, -1)
        return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, window_size=window)
    return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal=causal)


def varlen_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, causal: bool = False
) -> Tensor:
    """Packed attention computed one sequence at a time with ``scaled_dot_product_attention``.

    Same contract as :func:`varlen_attention` (softmax scale ``1/sqrt(D)``), any dtype and
    device, differentiable. Inactive rows ``L..T-1`` of the output are zero and receive zero
    gradient. It reads ``cu_seqlens`` on the host, so it cannot run inside a CUDA graph capture.

    Source: the FlashAttention varlen convention (``cu_seqlens`` prefix sums).
    """
    bounds = cu_seqlens.tolist()
    out = torch.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:  # empty slot, e.g. the repeated-L tail
            continue
        # SDPA wants [heads, tokens, head_dim].
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=1 / math.sqrt(q.shape[-1]))
        out[start:end] = o.transpose(0, 1)
    return out
