"""Variable-length (packed) attention: one entry point, four implementations.

``q, k, v`` are ``[T, H, D]``; token ``t`` attends only to tokens of its own sequence, given by
``cu_seqlens`` ``[N + 1]``. :func:`varlen_attention` dispatches on ``impl``:

* ``"triton"``: this package's kernels (:mod:`attn_gym_lite.ops.kernels`), which read the work
  from ``cu_seqlens`` on the device and need no ``max_seqlen`` (except the ``"rect"`` schedule);
* ``"varlen_attn"``: torch's ``varlen_attn`` (FlashAttention-2), its grid sized by a host
  ``max_seqlen`` that a CUDA graph bakes in at capture;
* ``"reference"``: one sequence at a time with SDPA, any dtype and device; the tests' ground
  truth. It reads ``cu_seqlens`` on the host: eager only;
* ``"sdpa"``: dense SDPA over a *padded* batch of ``B`` rows of ``max_seqlen`` tokens, the layout
  packing replaces;
* ``"auto"``: ``"triton"`` wherever the kernels run, else ``"reference"``.

Causal is ``is_causal=True`` for torch 2.10/2.11's ``varlen_attn`` and ``window_size=(-1, 0)`` from
2.12 on; this module absorbs the difference.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from ..checks import check_cu_seqlens, check_cu_seqlens_values
from .triton_support import kernels_take, missing_triton, triton_available

Tensor = torch.Tensor

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover
    _varlen_attn = None
_TAKES_WINDOW = _varlen_attn is not None and "window_size" in inspect.signature(_varlen_attn).parameters

IMPLEMENTATIONS = ("triton", "varlen_attn", "reference", "sdpa")
#: The head dims ``D`` the Triton kernels support.
TRITON_HEAD_DIMS = (16, 32, 64, 128)
_INT32_MAX = 2**31 - 1


def needs_max_seqlen(impl: str, schedule: str = "auto") -> bool:
    """Whether ``impl`` sizes its work by a host ``max_seqlen``, which a captured graph bakes in."""
    return impl in ("varlen_attn", "sdpa") or (impl == "triton" and schedule == "rect")


def resolve_impl(impl: str, q: Tensor) -> str:
    """``"auto"`` resolved: ``"triton"`` where the kernels run on ``q`` (Triton installed; CUDA
    bf16/fp16, or CPU bf16/fp16/fp32 under ``TRITON_INTERPRET=1``; a supported head dim), else
    ``"reference"``."""
    if impl != "auto":
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be 'auto' or one of {IMPLEMENTATIONS}, got {impl!r}")
        return impl
    if not triton_available():
        return "reference"
    from .kernels import INTERPRETED  # imports Triton: only once it is known to be there

    dtypes = (torch.bfloat16, torch.float16, torch.float32) if INTERPRETED else (torch.bfloat16, torch.float16)
    return "triton" if kernels_take(q, INTERPRETED, dtypes) and q.shape[-1] in TRITON_HEAD_DIMS else "reference"


def _capturing(q: Tensor) -> bool:
    """Nothing may be read on the host: torch.compile is tracing or a CUDA stream is capturing."""
    return torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing())


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, impl: str = "auto",
                     causal: bool = False, max_seqlen: int | None = None, schedule: str = "auto",
                     zero_inactive: bool = False, validate: bool = True, config=None) -> Tensor:
    """Attention within each packed sequence, softmax scale ``1/sqrt(D)``.

    Args:
        q, k, v: ``[T, H, D]``, one dtype and device. ``"triton"``: CUDA bf16/fp16 (fp32 too in
            the interpreter), ``D`` in 16, 32, 64, 128. ``"varlen_attn"``: CUDA bf16/fp16.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L]`` on ``q``'s device, ``L <= T``.
        impl: ``"auto"``, ``"triton"``, ``"varlen_attn"``, ``"reference"`` or ``"sdpa"``.
        causal: each token attends to itself and earlier tokens of its sequence.
        max_seqlen: a bound on the longest sequence, for the implementations that size their grid
            by it (``"varlen_attn"``, ``schedule="rect"``; ``"sdpa"``'s row length). Under a graph
            pass the worst case, ``T``.
        schedule: the Triton schedule, one of :data:`attn_gym_lite.schedule.SCHEDULES`.
        zero_inactive: zero rows ``L..T-1`` of the output and the q/k/v gradients (Triton only).
            By default they are unspecified, as with ``varlen_attn``: the package's modules mask
            those rows instead (chapter "Masking").
        validate: check ``cu_seqlens``'s values (starts at 0, non-decreasing, ``L <= T``, no
            sequence past ``max_seqlen``) wherever that reads nothing from the device or is needed:
            a CPU ``cu_seqlens``, the reference, or an implementation that uses ``max_seqlen``
            (a too-small bound makes a rectangular grid skip rows silently). Never while
            ``torch.compile`` traces or a graph captures.
        config: Triton tiles (:class:`~attn_gym_lite.ops.kernels.AttentionConfig`).

    Returns:
        ``[T, H, D]`` in ``q``'s dtype, differentiable in ``q, k, v``. Rows past ``L``: zero for
        ``"reference"``, unspecified for ``"varlen_attn"`` and ``"triton"`` (unless ``zero_inactive``).
    """
    impl = resolve_impl(impl, q)
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must share one shape [T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    check_cu_seqlens(cu_seqlens, device=None if impl == "reference" and not cu_seqlens.is_cuda else q.device)
    bounded = needs_max_seqlen(impl, schedule)
    if bounded and max_seqlen is None:
        raise ValueError(f"max_seqlen must be given for impl={impl!r}, schedule={schedule!r}")
    host_read = validate and not _capturing(q)
    if impl == "reference":
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("varlen_attention: the reference implementation reads cu_seqlens on the host and "
                               "cannot be captured; use impl='triton' (bf16/fp16, head dim in "
                               f"{TRITON_HEAD_DIMS}) under a CUDA graph")
        return _reference(q, k, v, cu_seqlens, causal, max_seqlen if host_read else None)
    if host_read and (bounded or not cu_seqlens.is_cuda):
        check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0], max_seqlen=max_seqlen)
    if impl == "sdpa":
        return _padded_sdpa(q, k, v, max_seqlen, causal)
    if impl == "triton":
        return _triton(q, k, v, cu_seqlens, causal, schedule, max_seqlen, zero_inactive, config)
    if _varlen_attn is None:
        raise RuntimeError("impl='varlen_attn' needs torch.nn.attention.varlen (torch >= 2.10)")
    window = {"window_size": (-1, 0) if causal else (-1, -1)} if _TAKES_WINDOW else {"is_causal": causal}
    return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **window)


def _triton(q, k, v, cu_seqlens, causal, schedule, max_seqlen, zero_inactive, config) -> Tensor:
    if not triton_available():
        raise missing_triton("impl='triton'", "use impl='auto' (the reference implementation without Triton)")
    from .kernels import INTERPRETED, varlen_attention_triton

    if q.is_cuda == INTERPRETED:  # the interpreter gives wrong results on CUDA tensors, and needs CPU ones
        raise ValueError(f"impl='triton' needs {'CPU' if INTERPRETED else 'CUDA'} tensors here "
                         f"(TRITON_INTERPRET={int(INTERPRETED)}), got q on {q.device}")
    if q.shape[-1] not in TRITON_HEAD_DIMS:
        raise ValueError(f"impl='triton' needs a head dim D = q.shape[-1] in {TRITON_HEAD_DIMS}, got {q.shape[-1]}")
    # The kernels' offsets are 32-bit: every element they address must lie below 2**31.
    if max(q.numel(), *(sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if n) for x in (q, k, v))) > _INT32_MAX:
        raise ValueError(f"q, k, v: the kernels' offsets are 32-bit, got shape {tuple(q.shape)}, strides {q.stride()}")
    return varlen_attention_triton(q, k, v, cu_seqlens, causal=causal, schedule=schedule, max_seqlen=max_seqlen,
                                   zero_inactive=zero_inactive, config=config)


def _padded_sdpa(q: Tensor, k: Tensor, v: Tensor, width: int, causal: bool) -> Tensor:
    tokens, heads, head_dim = q.shape
    if tokens % width:
        raise ValueError(f"impl='sdpa' needs T = B * max_seqlen rows, got T = {tokens}, max_seqlen = {width}")
    # [B * S, H, D] -> [B, H, S, D], the layout dense attention wants.
    q, k, v = (x.reshape(tokens // width, width, heads, head_dim).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / math.sqrt(head_dim))
    return out.transpose(1, 2).reshape(tokens, heads, head_dim)


def varlen_attention_reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, causal: bool = False) -> Tensor:
    """Packed attention one sequence at a time with SDPA: any dtype and device, differentiable,
    zero on rows ``L..T-1``. Reads ``cu_seqlens`` on the host (eager only)."""
    return _reference(q, k, v, cu_seqlens, causal, None)


def _reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, causal: bool, max_seqlen: int | None) -> Tensor:
    bounds = check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0], max_seqlen=max_seqlen).tolist()
    out = torch.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, tokens, D]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=1 / math.sqrt(q.shape[-1]))
            out[start:end] = o.transpose(0, 1)
    return out
