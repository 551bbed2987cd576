"""``varlen_attention_triton``: ragged attention with a choice of schedule, forward and backward.

The host side of the kernels: argument checks (from static metadata only), launch grids (from
:mod:`attn_gym_lite.schedule`), and the autograd Function that runs the forward kernel, then on
backward the dQ kernel and the dK/dV kernel. Everything it launches is capturable: no value of
``cu_seqlens`` is read on the host, and the per-call device work (``chunk_offsets``, the kernels,
zeroing the inactive rows) is recomputed on every replay of a captured graph.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton

from ... import checks
from ...schedule import SCHEDULES, choose_schedule, launch_grid, num_sms
from .backward import attention_backward_kernel
from .forward import attention_forward_kernel
from .inactive import zero_inactive_rows_kernel
from .mma import INTERPRETED  # Triton's interpreter: CPU tensors only (wrong results on CUDA ones)
from .offsets import launch_chunk_offsets

Tensor = torch.Tensor


_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HEAD_DIMS = (16, 32, 64, 128)
_INT32_MAX = 2**31 - 1
_ZERO_BLOCK = 8192


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tiles and launch parameters of one kernel.

    Args:
        block_m: query rows per tile (the chunk ``C`` of the forward and dQ kernels).
        block_n: key rows per tile (the chunk ``C`` of the dK/dV kernel).
        num_warps, num_stages: Triton launch parameters (ignored by the interpreter).
        ctas_per_sm: CTAs of this kernel one SM keeps resident; sizes the persistent grid
            (``num_sms * ctas_per_sm`` workers) and ``"auto"``'s choice.

    Raises:
        ValueError: ``block_m`` or ``block_n`` is not a power of two >= 16, or ``num_warps``,
            ``num_stages`` or ``ctas_per_sm`` is not an int >= 1; a value of the wrong type
            (``16.0``, ``"4"``, ``True``) raises ValueError too, not TypeError.
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    ctas_per_sm: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"KernelConfig: {name} must be a power of two >= 16, got {value!r}")
        for name in ("num_warps", "num_stages", "ctas_per_sm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KernelConfig: {name} must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """One :class:`KernelConfig` per kernel. The forward and dQ kernels need ``block_m`` to be a
    multiple of ``block_n`` and the dK/dV kernel the reverse, so that the causal diagonal starts
    on a tile boundary.

    Raises:
        TypeError: ``forward``, ``dq`` or ``dkdv`` is not a :class:`KernelConfig`.
        ValueError: ``forward.block_m`` or ``dq.block_m`` is not a multiple of its ``block_n``,
            or ``dkdv.block_n`` is not a multiple of ``dkdv.block_m``.
    """

    forward: KernelConfig
    dq: KernelConfig
    dkdv: KernelConfig

    def __post_init__(self) -> None:
        for name in ("forward", "dq", "dkdv"):
            value = getattr(self, name)
            if not isinstance(value, KernelConfig):
                raise TypeError(f"AttentionConfig: {name} must be a KernelConfig, got {value!r}")
        for name in ("forward", "dq"):
            c = getattr(self, name)
            if c.block_m % c.block_n:
                raise ValueError(
                    f"AttentionConfig: {name}.block_m must be a multiple of {name}.block_n, "
                    f"got {c.block_m} and {c.block_n}"
                )
        if self.dkdv.block_n % self.dkdv.block_m:
            raise ValueError(
                f"AttentionConfig: dkdv.block_n must be a multiple of dkdv.block_m, "
                f"got {self.dkdv.block_n} and {self.dkdv.block_m}"
            )


@functools.cache
def default_config() -> AttentionConfig:
    """Tiles used when ``config=None``.

    In the interpreter (tests, CPU notebooks): 16-row tiles, so tiny shapes still span several
    chunks. Compiled: forward ``128 x 64``, dQ ``128`` queries by ``64`` keys and dK/dV ``128``
    keys by ``64`` queries, 8 warps and 3 pipeline stages each. All use ``C = 128``, so one
    ``chunk_offsets`` serves every kernel. On an H200 (head dim 128, bfloat16, uniform and Zipf
    layouts, causal and not) these were the fastest of the alternatives probed with
    ``scripts/explore_configs.py`` (an exploration, not a recording: the schedulers suite records
    what the chosen tiles achieve): forward 128 x 128, 64 x 64, 128 x 32 and 64 x 128 tiles, 4
    warps, 2 or 4 stages; backward 64 x 64, 32 x 64, 128 x 128 and 32 x 128 pairs, 2 stages.
    Larger tiles with 4 stages exceed the H200's shared memory per block.
    """
    if INTERPRETED:
        tiny = KernelConfig(16, 16)
        return AttentionConfig(tiny, tiny, tiny)
    return AttentionConfig(
        forward=KernelConfig(128, 64, num_warps=8, num_stages=3),
        dq=KernelConfig(128, 64, num_warps=8, num_stages=3),
        dkdv=KernelConfig(64, 128, num_warps=8, num_stages=3),
    )


# -----------------------------------------------------------------------------
# Launch plans: every static decision, made once on the host.


@dataclasses.dataclass(frozen=True)
class _Launch:
    schedule: str  # "rect", "flat" or "persistent"
    grid: tuple[int, ...]
    chunk: int  # C of this kernel's chunk list
    config: KernelConfig


@dataclasses.dataclass(frozen=True)
class _Plan:
    causal: bool
    zero_inactive: bool
    forward: _Launch
    dq: _Launch
    dkdv: _Launch
    num_sms: int
    chunks: tuple[int, ...]  # chunk sizes whose chunk_offsets some kernel reads (rect reads none)


def _launch(schedule: str, chunk: int, config: KernelConfig, *, T: int, N: int, H: int,
            max_seqlen: int | None, sms: int) -> _Launch:
    if schedule == "auto":
        schedule = choose_schedule(T, N, chunk, H, sms, config.ctas_per_sm)
    grid = launch_grid(schedule, T=T, N=N, C=chunk, heads=H, max_seqlen=max_seqlen,
                       num_sms=sms, ctas_per_sm=config.ctas_per_sm)
    return _Launch(schedule, grid, chunk, config)


def largest_offset(x: Tensor) -> int:
    """The largest element offset a kernel can form into ``x``: ``sum((size - 1) * stride)``."""
    return sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()) if size > 0)


def _check_inputs(q: object, k: object, v: object, cu_seqlens: object) -> None:
    checks.check_qkv(q, k, v, _DTYPES)
    checks.check_cu_seqlens(cu_seqlens, device=q.device)
    if q.shape[2] not in _HEAD_DIMS:
        raise ValueError(f"q.shape[2] (head dim D) must be one of {_HEAD_DIMS}, got {q.shape[2]}")
    if INTERPRETED and q.is_cuda:
        raise ValueError(
            "q must be a CPU tensor while TRITON_INTERPRET=1 (the interpreter gives wrong results on "
            f"CUDA tensors), got device {q.device}"
        )
    if not INTERPRETED and not q.is_cuda:
        raise ValueError(
            f"q must be a CUDA tensor (or set TRITON_INTERPRET=1 before importing "
            f"attn_gym_lite.ops.kernels to run on CPU), got device {q.device}"
        )
    # Kernel offsets are 32-bit: every element any kernel can address (in q, k, v, and in the
    # contiguous [T, H, D] output and gradients) must lie below 2**31.
    for name, x in (("q", q), ("k", k), ("v", v)):
        if largest_offset(x) > _INT32_MAX:
            raise ValueError(
                f"{name} must have every element offset below 2**31 (the kernels' offsets are 32-bit), "
                f"got shape {tuple(x.shape)} and strides {x.stride()}: largest offset {largest_offset(x)}"
            )
    if q.numel() > _INT32_MAX:
        raise ValueError(
            f"q must have at most 2**31 - 1 elements (the output and gradients are [T, H, D] with 32-bit "
            f"offsets), got shape {tuple(q.shape)}: {q.numel()} elements"
        )


def _capturing(q: Tensor) -> bool:
    """Nothing may be read on the host: a CUDA stream is capturing, or torch.compile is tracing."""
    return torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _unit_last_stride(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def varlen_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    *,
    causal: bool = False,
    schedule: str = "auto",
    max_seqlen: int | None = None,
    zero_inactive: bool = False,
    validate: bool = True,
    config: AttentionConfig | None = None,
) -> Tensor:
    """Attention within each packed sequence, by Triton kernels with a chosen schedule.

    Args:
        q, k, v: ``[T, H, D]`` of one dtype (bfloat16 or float16; float32 too, meant for the
            interpreter, where 16-bit operands are widened before each product: :mod:`.mma`) and
            device; ``D`` in 16, 32, 64, 128. Any strides with the last one 1 (e.g. views of a
            fused QKV projection); others are made contiguous.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L]`` on ``q``'s device, ``L <= T``.
            The kernels read it on the device: with a CUDA graph, copy each batch's
            ``cu_seqlens`` into the captured buffer and replay. What is checked where:

            * CPU ``cu_seqlens`` (the interpreter) with ``validate``: every value rule
              (:func:`attn_gym_lite.checks.check_cu_seqlens_values`: starts at 0, never
              decreases, ``L <= T``, and for ``"rect"`` no sequence longer than
              ``max_seqlen``), read on the host at no device cost, before any launch.
            * CUDA ``cu_seqlens`` outside a capture: read on the host (one device sync) only for
              ``schedule="rect"`` with ``validate``, to check those rules and ``max_seqlen``;
              other schedules never read it on the host, so a malformed layout is not reported.
            * Inside a capture (or while ``torch.compile`` traces): never read on the host.
            * On the device, always: every kernel clamps each sequence into the ``T`` rows
              (``start = clamp(cu_seqlens[i], 0, T)``, ``end = clamp(cu_seqlens[i + 1], start,
              T)``; ``L`` for ``zero_inactive`` likewise), so unchecked malformed values give
              wrong results (rows covered by no clamped sequence unspecified, overlapping ones
              written by either) but never address memory outside the tensors.
        causal: each token attends to itself and earlier tokens of its sequence only.
        schedule: how chunks of work map onto the launch grid:

            * ``"rect"``: FlashAttention-2's grid ``(ceil(max_seqlen / C), N, H)``; needs
              ``max_seqlen``, and under a graph that must be the worst case.
            * ``"flat"``: ``chunk_capacity(T, N, C)`` CTAs per head; each decodes its chunk from
              ``chunk_offsets`` and exits if past the active count.
            * ``"persistent"``: ``min(capacity, SMs * ctas_per_sm)`` workers striding over the
              active tasks.
            * ``"dynamic"``: as many workers, taking tasks from a counter in device memory.
            * ``"auto"``: per kernel, ``"flat"`` if its capacity fits in one wave of resident
              CTAs, else ``"dynamic"`` (a static choice, fixed at capture).
        max_seqlen: ``>=`` the longest sequence, in tokens; only with ``schedule="rect"``. A bound
            past ``T`` is accepted and sizes the grid as ``T`` does (no sequence is longer).
        zero_inactive: write zeros to rows ``L..T-1`` of the output and of the gradients of
            ``q, k, v``, reading ``L`` on the device. The default leaves them unspecified (like
            torch's ``varlen_attn``) and saves writing ``4 (T - L) H D`` elements per step: the
            package's modules mask those rows where it matters (chapter "Masking").
        validate: outside a CUDA graph capture, check ``cu_seqlens``'s values on the host where
            that is cheap or needed (see ``cu_seqlens``): always for a CPU tensor; for a CUDA one
            only with ``schedule="rect"``, whose too-small ``max_seqlen`` would make the grid skip
            rows silently. Inside a capture the bound is the graph's key. ``False`` skips it.
        config: tiles and launch parameters; :func:`default_config` if ``None``.

    Returns:
        ``[T, H, D]`` contiguous, ``q``'s dtype; differentiable with respect to ``q, k, v``
        (deterministic backward: no atomics). Softmax scale ``1 / sqrt(D)``.

    Raises:
        TypeError: a tensor argument is not a tensor or has the wrong dtype; ``causal`` or
            ``zero_inactive`` is not a bool; ``config`` is not an :class:`AttentionConfig`.
        ValueError: shapes, devices or head dim are wrong; an element offset reaches 2**31;
            ``cu_seqlens`` is not a contiguous 1-D int32 tensor of ``N + 1 >= 2`` entries;
            ``schedule`` is unknown; ``max_seqlen`` is missing for ``"rect"``, given to another
            schedule, or (checked outside a capture) below the longest sequence; CPU tensors
            without the interpreter or CUDA tensors with it; with ``validate``, a CPU
            ``cu_seqlens`` (or a CUDA one with ``"rect"``) whose values break a rule: first entry
            not 0, a decrease, ``L > T`` (the messages of
            :func:`attn_gym_lite.checks.check_cu_seqlens_values`).

    Source: FlashAttention-2 (Dao, 2023) for the kernels; the seed article, "The anatomy of a
    ragged kernel" through "Graph overcapture", for the schedules.
    """
    for name, flag in (("causal", causal), ("zero_inactive", zero_inactive), ("validate", validate)):
        checks.check_bool(name, flag)
    checks.check_choice("schedule", schedule, SCHEDULES)
    if schedule == "rect":
        if max_seqlen is None:
            raise ValueError("max_seqlen must be an int >= 1 for schedule='rect', got None")
        max_seqlen = checks.check_int("max_seqlen", max_seqlen, minimum=1)
    plan = _plan(q, k, v, cu_seqlens, causal, schedule, max_seqlen, zero_inactive, config)
    if validate and (schedule == "rect" or not cu_seqlens.is_cuda) and not _capturing(q):
        checks.check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0], max_seqlen=max_seqlen)
    q, k, v = (_unit_last_stride(x) for x in (q, k, v))
    return _VarlenAttention.apply(q, k, v, cu_seqlens, plan)


# -----------------------------------------------------------------------------
# Launch plans, cached: in eager mode the host time of a call is part of every step, and all of
# these checks and grids depend only on metadata (shapes, strides, dtypes, devices) and flags.
# So they run once per distinct call signature; a repeated call costs one dictionary lookup.

_PLANS = checks.SignatureCache()


def _plan(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, causal: bool, schedule: str,
          max_seqlen: int | None, zero_inactive: bool, config: AttentionConfig | None) -> _Plan:
    # An unhashable config gets no key (and is refused below).
    key = _PLANS.key((q, k, v, cu_seqlens), causal, schedule, max_seqlen, zero_inactive, config)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    _check_inputs(q, k, v, cu_seqlens)  # raises on anything a key may not vouch for
    if config is None:
        config = default_config()
    elif not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig or None, got {type(config).__name__}")
    T, H, _ = q.shape
    N = cu_seqlens.numel() - 1
    sms = num_sms(q.device)
    # No sequence is longer than the T rows: a larger bound only adds CTAs that exit at once
    # (2**40 asked for a grid no GPU launches, and hung the interpreter), so the grid stops at T.
    if max_seqlen is not None:
        max_seqlen = min(max_seqlen, max(T, 1))
    sizes = dict(T=T, N=N, H=H, max_seqlen=max_seqlen, sms=sms)
    forward = _launch(schedule, config.forward.block_m, config.forward, **sizes)
    dq = _launch(schedule, config.dq.block_m, config.dq, **sizes)
    dkdv = _launch(schedule, config.dkdv.block_n, config.dkdv, **sizes)
    chunks = tuple(sorted({launch.chunk for launch in (forward, dq, dkdv) if launch.schedule != "rect"}))
    plan = _Plan(causal=causal, zero_inactive=zero_inactive, forward=forward, dq=dq, dkdv=dkdv, num_sms=sms,
                 chunks=chunks)
    _PLANS.put(key, plan)
    return plan


# -----------------------------------------------------------------------------
# The autograd Function.


def _chunk_metadata(cu_seqlens: Tensor, plan: _Plan, T: int) -> tuple[dict[int, Tensor], Tensor | None]:
    """``chunk_offsets`` for each chunk size in ``plan.chunks`` and, when the forward kernel is
    dynamic, its zeroed task counter: one int32 buffer, one launch per chunk size (usually one)."""
    slots = cu_seqlens.numel()
    counters = 1 if plan.forward.schedule == "dynamic" else 0
    work = torch.empty(len(plan.chunks) * slots + counters, dtype=torch.int32, device=cu_seqlens.device)
    counter = work[len(plan.chunks) * slots:] if counters else None
    offsets = {}
    for i, chunk in enumerate(plan.chunks):
        offsets[chunk] = work[i * slots:(i + 1) * slots]
        launch_chunk_offsets(cu_seqlens, chunk, out=offsets[chunk], counters=counter if i == 0 else None,
                             token_capacity=T)
    return offsets, counter


def _counters(launches: tuple[_Launch, ...], cu_seqlens: Tensor) -> tuple[Tensor, ...]:
    """The dynamic schedule's task counters, one int32 per launch, zeroed together by one fill
    (one memset node in a graph, so every replay starts from 0). Kernels of other schedules never
    read theirs: they get ``cu_seqlens`` as a stand-in pointer and cost nothing."""
    if not any(launch.schedule == "dynamic" for launch in launches):
        return (cu_seqlens,) * len(launches)
    counters = torch.zeros(len(launches), dtype=torch.int32, device=cu_seqlens.device)
    return tuple(counters[i:i + 1] if launch.schedule == "dynamic" else cu_seqlens for i, launch in enumerate(launches))


def _zero_inactive(x: Tensor, cu_seqlens: Tensor, sms: int) -> None:
    # A fixed grid of small workers (16 per SM, 8 warps) striding over the tail: its size does
    # not depend on L, so the launch is capturable.
    total = x.numel()
    grid = (max(1, min(triton.cdiv(total, _ZERO_BLOCK), sms * 16)),)
    rows = x.shape[0]
    zero_inactive_rows_kernel[grid](x, cu_seqlens, cu_seqlens.numel() - 1, rows, total // max(1, rows),
                                    BLOCK=_ZERO_BLOCK, num_warps=8)


def _strides(q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> tuple[int, ...]:
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1))


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, plan: _Plan) -> Tensor:
        T, H, D = q.shape
        N = cu_seqlens.numel() - 1
        out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
        lse = torch.empty((H, T), dtype=torch.float32, device=q.device)
        offsets, counter = _chunk_metadata(cu_seqlens, plan, T)
        if counter is None:
            counter = cu_seqlens  # a stand-in pointer: other schedules never read it
        sm_scale = 1.0 / math.sqrt(D)
        f = plan.forward
        attention_forward_kernel[f.grid](
            q, k, v, out, lse, cu_seqlens, offsets.get(f.chunk, cu_seqlens), counter,
            *_strides(q, k, v, out),
            N, H, T, sm_scale * math.log2(math.e),
            CAUSAL=plan.causal, HEAD_DIM=D, BLOCK_M=f.config.block_m, BLOCK_N=f.config.block_n,
            SCHEDULE=f.schedule, num_warps=f.config.num_warps, num_stages=f.config.num_stages,
        )
        if plan.zero_inactive:
            _zero_inactive(out, cu_seqlens, plan.num_sms)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, *(offsets[c] for c in plan.chunks))
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, cu_seqlens, *offset_list = ctx.saved_tensors
        offsets = dict(zip(ctx.plan.chunks, offset_list))
        plan: _Plan = ctx.plan
        T, H, D = q.shape
        N = cu_seqlens.numel() - 1
        grad_out = grad_out.contiguous()  # shares out's [T, H, D] layout in the kernels
        dq, dk, dv = (torch.empty((T, H, D), dtype=q.dtype, device=q.device) for _ in range(3))
        delta = torch.empty((H, T), dtype=torch.float32, device=q.device)
        sm_scale = 1.0 / math.sqrt(D)
        scalars = (N, H, T, sm_scale * math.log2(math.e), sm_scale)
        dq_counter, dkdv_counter = _counters((plan.dq, plan.dkdv), cu_seqlens)
        for launch, name, counter in ((plan.dq, "dq", dq_counter), (plan.dkdv, "dkdv", dkdv_counter)):
            c = launch.config
            attention_backward_kernel[launch.grid](
                q, k, v, out, grad_out, dq, dk, dv, lse, delta,
                cu_seqlens, offsets.get(launch.chunk, cu_seqlens), counter,
                *_strides(q, k, v, out),
                *scalars, PASS=name, CAUSAL=plan.causal, HEAD_DIM=D, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                SCHEDULE=launch.schedule, num_warps=c.num_warps, num_stages=c.num_stages,
            )
        if plan.zero_inactive:
            for grad in (dq, dk, dv):
                _zero_inactive(grad, cu_seqlens, plan.num_sms)
        return dq, dk, dv, None, None
