"""Variable-length (packed) attention: one entry point, four implementations and ``"auto"``.

Packed attention takes ``q, k, v`` of shape ``[T, H, D]`` and ``cu_seqlens`` of shape ``[N + 1]``:
token ``t`` attends only to tokens of its own sequence. :func:`varlen_attention` dispatches on
``impl`` (:data:`IMPLEMENTATIONS`, or ``"auto"``):

* ``"triton"``: this package's kernels (:mod:`attn_gym_lite.ops.kernels`), any schedule. The
  default ones read the work from ``cu_seqlens`` on the device, need no ``max_seqlen``, and stay
  close to an exact-shape graph when a graph is captured for the worst case (chapter
  "Schedulers"). The package's main path.
* ``"varlen_attn"``: torch's ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 kernels).
  Its grid is sized by ``max_seqlen``, a host int: under a CUDA graph it is baked in at capture.
* ``"reference"``: ordinary attention one sequence at a time (any dtype and device, float64
  included); the ground truth of the tests. It reads ``cu_seqlens`` on the host: eager only.
* ``"sdpa"``: torch's dense ``scaled_dot_product_attention`` for a *padded* batch, ``B`` rows of
  ``max_seqlen`` tokens each (every sequence exactly ``max_seqlen`` long, ``T = B * max_seqlen``):
  the layout packing replaces, kept as the baseline it is measured against. With right padding
  and ``causal=True`` each row's real tokens never see its padding.
* ``"auto"``: ``"triton"`` where the kernels can run (Triton installed, and CUDA tensors; CPU
  tensors under Triton's interpreter, ``TRITON_INTERPRET=1``), else ``"reference"``.

Triton is needed by ``"triton"`` only: the package's dependencies leave it out (a CPU build of
torch does not bring it), and without it ``"auto"`` picks ``"reference"``.

Two API facts this module absorbs (see the book's "Graph capture" chapter): causal masking is
``is_causal=True`` in torch 2.10/2.11 and ``window_size=(-1, 0)`` from 2.12; and a ``max_seqlen``
below the longest sequence makes FlashAttention-2 (and a rectangular grid) silently skip rows.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from .. import checks
from ..schedule import SCHEDULES
from .triton_support import kernels_take, missing_triton, triton_available

Tensor = torch.Tensor

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover - older torch has no varlen attention API
    _varlen_attn = None

# torch 2.12 replaced `is_causal` with a sliding `window_size`; detect which one we have.
_TAKES_WINDOW = _varlen_attn is not None and "window_size" in inspect.signature(_varlen_attn).parameters

#: The implementations :func:`varlen_attention` dispatches to (plus ``"auto"``).
IMPLEMENTATIONS = ("triton", "varlen_attn", "reference", "sdpa")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: The head dims ``D`` the Triton kernels support (``"auto"`` falls back to the reference for others).
TRITON_HEAD_DIMS = (16, 32, 64, 128)


def needs_max_seqlen(impl: str, schedule: str = "auto") -> bool:
    """Whether ``impl`` (with the Triton ``schedule``) sizes its work by a host ``max_seqlen``:
    then a captured graph bakes the bound in, and every batch replayed on it must respect it.

    ``"auto"`` (either argument) answers False: it resolves to ``"triton"`` or ``"reference"``,
    and its schedule to ``"flat"`` or ``"dynamic"``, none of which reads the bound.

    Raises:
        ValueError: ``impl`` is not ``"auto"`` or one of :data:`IMPLEMENTATIONS`, or ``schedule``
            is not one of :data:`~attn_gym_lite.schedule.SCHEDULES`.
    """
    checks.check_choice("impl", impl, ("auto", *IMPLEMENTATIONS))
    checks.check_choice("schedule", schedule, SCHEDULES)
    return impl in ("varlen_attn", "sdpa") or (impl == "triton" and schedule == "rect")


def _require_triton() -> None:
    if not triton_available():
        raise missing_triton("impl='triton'", "use impl='auto' (the reference implementation without Triton)")


def resolve_impl(impl: str, q: Tensor) -> str:
    """``impl`` with ``"auto"`` resolved for queries ``q [T, H, D]``: ``"triton"`` where the
    kernels run (Triton installed, and CUDA bf16/fp16 compiled or CPU bf16/fp16/fp32 under
    ``TRITON_INTERPRET=1``) and support the head dim (16, 32, 64, 128), else ``"reference"``
    (no Triton, float64, other devices).

    Raises:
        ValueError: ``impl`` is not ``"auto"`` or one of :data:`IMPLEMENTATIONS`.
    """
    checks.check_choice("impl", impl, ("auto", *IMPLEMENTATIONS))
    if impl != "auto":
        return impl
    if not triton_available():
        return "reference"
    from .kernels import INTERPRETED  # the kernels are defined (and Triton imported) on first use

    dtypes = (torch.bfloat16, torch.float16, torch.float32) if INTERPRETED else (torch.bfloat16, torch.float16)
    runs = kernels_take(q, INTERPRETED, dtypes) and q.shape[-1] in TRITON_HEAD_DIMS
    return "triton" if runs else "reference"


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    *,
    impl: str = "auto",
    causal: bool = False,
    max_seqlen: int | None = None,
    schedule: str = "auto",
    zero_inactive: bool = False,
    validate: bool = True,
    config=None,
) -> Tensor:
    """Attention within each packed sequence (softmax scale ``1/sqrt(D)``).

    Args:
        q, k, v: ``[T, H, D]`` of one dtype and device (``T`` token capacity, ``H`` heads, ``D``
            head dim). ``"varlen_attn"`` needs CUDA bf16/fp16; ``"triton"`` CUDA bf16/fp16 (in the
            interpreter bf16/fp16/fp32, fp32 meant for tests) and ``D`` in 16, 32, 64, 128;
            ``"reference"`` and ``"sdpa"`` anything (``"sdpa"``: ``T = B * max_seqlen``, a padded batch).
        cu_seqlens: int32 ``[N + 1]`` contiguous prefix sums ``[0, ..., L, L, L]`` on ``q``'s device;
            for ``"sdpa"`` exactly ``[0, S, 2S, ..., T]`` with ``S = max_seqlen``.
        impl: one of the module docstring's five: ``"auto"`` (``"triton"`` where the kernels run,
            else ``"reference"``, as without Triton installed), ``"triton"``, ``"varlen_attn"``,
            ``"reference"`` or ``"sdpa"``.
        causal: each token attends to itself and earlier tokens of its sequence only.
        max_seqlen: an upper bound on the longest sequence (tokens). Required by
            ``"varlen_attn"`` and the Triton ``schedule="rect"`` (they size their grid by it; under
            a graph it is fixed at capture, so pass the worst case, e.g. ``T``), and by ``"sdpa"``
            (the padded rows' length ``S``); not needed by the other Triton schedules and by
            ``"reference"``, which find the work in ``cu_seqlens``, but checked against the longest
            sequence there too when given and the values are read anyway (``"reference"``, a CPU
            ``cu_seqlens``).
        schedule: the Triton kernels' schedule (one of :data:`attn_gym_lite.schedule.SCHEDULES`);
            ignored by ``"reference"`` and ``"sdpa"``, refused by ``"varlen_attn"`` unless ``"auto"``.
        zero_inactive: write zeros to rows ``L..T-1`` of the output and of the q/k/v gradients
            (Triton only). The default leaves them unspecified, like torch's ``varlen_attn``: a
            module that masks inactive rows (``VarLenAttention(mask_inactive_capacity=True)``, as the
            "Masking" chapter proves) needs no zeros, and writing them costs memory traffic that
            grows with ``T - L``.
        validate: outside a CUDA graph capture (and outside ``torch.compile``), read ``cu_seqlens``
            on the host to check its value rules (starts at 0, never decreases, ``L <= T``) and
            ``max_seqlen`` (when the implementation uses it): always for ``"reference"`` and for a
            CPU ``cu_seqlens`` (free: no device sync); for a CUDA one only where a ``max_seqlen``
            is used, since that read synchronises with the device. Pass ``False`` where the batch
            was validated on the host already (``FixedCapacityTrainer`` does). Inside a capture
            nothing is read: the bound is the graph's key. Unchecked values reach the Triton
            kernels, which clamp every sequence into the ``T`` rows: wrong results, no access
            outside the tensors (see :func:`~attn_gym_lite.ops.kernels.varlen_attention_triton`).
        config: Triton tiles and launch parameters (:class:`~attn_gym_lite.ops.kernels.AttentionConfig`).

    Returns:
        ``[T, H, D]`` in ``q``'s dtype, differentiable with respect to ``q, k, v``. Rows past ``L``:
        zero for ``"reference"``; unspecified for ``"varlen_attn"`` and for ``"triton"`` unless
        ``zero_inactive``; none for ``"sdpa"`` (its ``L`` is ``T``).

    Raises:
        TypeError: a tensor argument is not a tensor or has the wrong dtype; a flag is not a bool;
            ``config`` is not an :class:`~attn_gym_lite.ops.kernels.AttentionConfig` or ``None``
            (for every ``impl``, not only ``"triton"``).
        ValueError: shapes or devices disagree, or ``H`` or ``D`` is zero; ``cu_seqlens`` breaks a layout rule (1-D, int32,
            contiguous, ``N + 1 >= 2``), or (validated: for ``"reference"``, for a CPU
            ``cu_seqlens``, and where ``max_seqlen`` is used) a value rule (starts at 0, never
            decreases, ``L <= T``); ``max_seqlen`` is missing where needed, given where refused, or
            (checked outside a capture) shorter than the longest sequence; ``impl`` or ``schedule``
            unknown; ``"varlen_attn"`` on CPU tensors or in another dtype than bf16/fp16;
            ``"sdpa"`` with ``T`` not a multiple of ``max_seqlen``, or (validated) a ``cu_seqlens``
            that is not ``[0, S, 2S, ..., T]``.
        ImportError: ``"triton"`` without the ``triton`` package installed (``"auto"`` then picks
            ``"reference"``).
        RuntimeError: ``"varlen_attn"`` on a torch without ``torch.nn.attention.varlen``; the
            reference implementation reached (asked for, or ``"auto"``'s fallback for a head dim
            outside :data:`TRITON_HEAD_DIMS`, a dtype other than bf16/fp16 or no Triton) with CUDA tensors
            while the stream is capturing: the message says it was chosen and why.

    Source: the FlashAttention varlen convention (``cu_seqlens``); torch's ``varlen_attn`` docs;
    the seed article for the schedules.
    """
    checks.check_bool("causal", causal)
    checks.check_bool("zero_inactive", zero_inactive)
    checks.check_bool("validate", validate)
    checks.check_choice("schedule", schedule, SCHEDULES)
    if config is not None:  # checked for every impl, as the flags are, though only "triton" reads it
        from .kernels import AttentionConfig

        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig or None, got {type(config).__name__}")
    requested = impl
    impl = _checked_impl(impl, q, k, v, cu_seqlens)
    if max_seqlen is not None:
        max_seqlen = checks.check_int("max_seqlen", max_seqlen, minimum=1)
    # Under torch.compile nothing is read on the host (a query would break the traced graph).
    capturing = torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing())
    reads_bound = needs_max_seqlen(impl, schedule)
    if reads_bound and max_seqlen is None:
        where = "schedule='rect'" if impl == "triton" else f"impl={impl!r}"
        raise ValueError(f"max_seqlen must be an int >= 1 for {where}, got None")
    if impl == "reference":
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise _reference_in_capture(requested, q)
        # It reads cu_seqlens on the host and checks every value rule itself. A max_seqlen it does
        # not need is still checked when given, in that same read (one comparison): a bound too
        # short for the batch is the caller's bug, refused here as it is on the GPU paths, not
        # found only when the same code reaches a kernel that uses it.
        bound = max_seqlen if validate and not capturing else None
        return _reference(q, k, v, cu_seqlens, causal, bound)
    # A CPU cu_seqlens (the interpreter) costs no device sync to read: check every value rule there,
    # as the reference path does, and a given max_seqlen with them; a CUDA one only where a bound
    # must be checked (one sync).
    if validate and (reads_bound or not cu_seqlens.is_cuda) and not capturing:
        checks.check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0], max_seqlen=max_seqlen)
    if impl == "sdpa":
        return _padded_sdpa(q, k, v, cu_seqlens, max_seqlen, causal, validate and not capturing)
    if impl == "triton":
        _require_triton()
        from .kernels import varlen_attention_triton

        # Validated above already (the kernels clamp what was not checked): no second host read.
        return varlen_attention_triton(q, k, v, cu_seqlens, causal=causal, schedule=schedule,
                                       max_seqlen=max_seqlen if reads_bound else None,
                                       zero_inactive=zero_inactive, validate=False, config=config)
    if schedule != "auto":
        raise ValueError(f"schedule is for impl='triton' only; impl='varlen_attn' got schedule={schedule!r}")
    if _varlen_attn is None:
        raise RuntimeError("impl='varlen_attn' needs torch.nn.attention.varlen (torch >= 2.10)")
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"impl='varlen_attn' needs CUDA bfloat16/float16 tensors, got {q.dtype} on {q.device}")
    if _TAKES_WINDOW:
        window = (-1, 0) if causal else (-1, -1)
        return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, window_size=window)
    return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal=causal)


def _reference_in_capture(requested: str, q: Tensor) -> RuntimeError:
    """The error for the reference path reached while a CUDA stream captures, saying why it was
    chosen (instead of the generic host-read refusal it would meet inside)."""
    if requested == "reference":
        why = "impl='reference' was asked for"
    else:
        reasons = [] if triton_available() else ["Triton is not installed"]
        if q.shape[-1] not in TRITON_HEAD_DIMS:
            reasons.append(f"head dim D = q.shape[-1] = {q.shape[-1]} is not one of {TRITON_HEAD_DIMS}")
        if q.dtype not in (torch.bfloat16, torch.float16):
            reasons.append(f"dtype {q.dtype} is not bfloat16/float16 (the compiled kernels' dtypes)")
        why = f"impl={requested!r} fell back to it because " + (" and ".join(reasons) or "the kernels cannot run here")
    return RuntimeError(
        f"varlen_attention chose the reference implementation ({why}; q dtype {q.dtype}, head dim "
        f"{q.shape[-1]}), which reads cu_seqlens on the host and cannot be captured in a CUDA graph; use "
        f"impl='triton' with bfloat16/float16 and a head dim in {TRITON_HEAD_DIMS}, or run this step eagerly"
    )


# The static checks (shapes, dtypes, devices, layout of cu_seqlens) and the choice of "auto" depend
# on metadata only: run them once per call signature, so a repeated eager call costs a lookup.
_CHECKED = checks.SignatureCache()


def _checked_impl(impl: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> str:
    key = _CHECKED.key((q, k, v, cu_seqlens), impl)
    resolved = _CHECKED.get(key)
    if resolved is not None:
        return resolved
    checks.check_qkv(q, k, v, _DTYPES)
    checks.check_cu_seqlens(cu_seqlens, device=q.device)
    resolved = resolve_impl(impl, q)
    _CHECKED.put(key, resolved)
    return resolved


def _padded_sdpa(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, width: int, causal: bool,
                 validate: bool) -> Tensor:
    tokens, heads, head_dim = q.shape
    if tokens % width:
        raise ValueError(f"impl='sdpa' needs T = B * max_seqlen rows, got T = {tokens} and max_seqlen = {width}")
    rows = tokens // width
    if validate:
        expected = torch.arange(0, tokens + 1, width, dtype=torch.int32)
        if cu_seqlens.numel() != rows + 1 or not torch.equal(cu_seqlens.cpu(), expected):
            raise ValueError(
                f"cu_seqlens must be [0, S, 2S, ..., T] with S = max_seqlen = {width} for impl='sdpa' (a padded "
                f"batch), got {cu_seqlens.tolist()[:8]}{'...' if cu_seqlens.numel() > 8 else ''}"
            )
    # [B * S, H, D] -> [B, H, S, D], the layout dense attention wants.
    q, k, v = (x.reshape(rows, width, heads, head_dim).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / math.sqrt(head_dim))
    return out.transpose(1, 2).reshape(tokens, heads, head_dim)


def varlen_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, causal: bool = False
) -> Tensor:
    """Packed attention computed one sequence at a time with ``scaled_dot_product_attention``.

    Same contract as :func:`varlen_attention` (softmax scale ``1/sqrt(D)``), any dtype and device,
    differentiable. Inactive rows ``L..T-1`` of the output are zero and receive zero gradient. It
    reads ``cu_seqlens`` on the host, so it cannot run inside a CUDA graph capture.

    Raises:
        TypeError / ValueError: ``q, k, v`` not ``[T, H, D]`` tensors of one floating dtype and
            device, ``H`` or ``D`` zero (:func:`attn_gym_lite.checks.check_qkv`); ``causal`` not a
            bool (TypeError); ``cu_seqlens`` breaking the layout
            or value rules (:func:`attn_gym_lite.checks.check_cu_seqlens_values`, with ``T``), or
            on a device other than the CPU and ``q``'s.
        RuntimeError: called while a CUDA stream is capturing.

    Source: the FlashAttention varlen convention (``cu_seqlens`` prefix sums).
    """
    return _reference(q, k, v, cu_seqlens, causal, None)


def _reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, causal: bool, max_seqlen: int | None) -> Tensor:
    """:func:`varlen_attention_reference`, with a ``max_seqlen`` to check in the same host read
    (``None``: none given)."""
    checks.check_bool("causal", causal)
    checks.check_qkv(q, k, v, _DTYPES)
    # cu_seqlens is read on the host, so the CPU is as good as q's device (and lets q live on the
    # "meta" device, e.g. to count FLOPs).
    on_host = isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type == "cpu"
    checks.check_cu_seqlens(cu_seqlens, device=None if on_host else q.device)
    # One host read: the checked int64 host copy gives the bounds too.
    bounds = checks.check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0], max_seqlen=max_seqlen).tolist()
    out = torch.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:  # empty slot, e.g. the repeated-L tail
            continue
        # SDPA wants [heads, tokens, head_dim].
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=1 / math.sqrt(q.shape[-1]))
        out[start:end] = o.transpose(0, 1)
    return out
