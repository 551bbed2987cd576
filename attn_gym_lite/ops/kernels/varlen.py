"""``varlen_attention_triton``: the ragged attention kernels as two torch ops, forward and backward.

Each op launches its kernels eagerly, so the same code runs in three settings:

* eager PyTorch, through autograd (``register_autograd`` ties the backward op to the forward);
* ``torch.compile``: the ops are ``torch.library.custom_op`` s with fake implementations, so
  dynamo puts each in the graph as one node and inductor fuses the code around it, with no graph
  break and no recompile when ``cu_seqlens`` changes (its *values* never reach the host);
* a CUDA graph capture: nothing here reads ``cu_seqlens`` on the host, so a replay recomputes
  ``chunk_offsets`` from the captured buffer and the kernels find the new batch's work.

Source: FlashAttention-2 (Dao, 2023) for the kernels; the seed article for the schedules;
``torch.library.custom_op`` for the registration.
"""

import dataclasses
import functools
import math

import torch
import triton

from ...schedule import choose_schedule, launch_grid, num_sms
from .backward import attention_backward_kernel
from .forward import attention_forward_kernel
from .inactive import zero_inactive_rows_kernel
from .mma import INTERPRETED  # Triton's interpreter: CPU tensors only (wrong results on CUDA ones)
from .offsets import launch_chunk_offsets

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tiles and launch parameters of one kernel. ``ctas_per_sm`` sizes the persistent grids."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    ctas_per_sm: int = 1


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """One :class:`KernelConfig` per kernel. The causal diagonal must start on a tile boundary:
    ``block_m`` a multiple of ``block_n`` for the forward and dQ kernels, the reverse for dK/dV."""

    forward: KernelConfig
    dq: KernelConfig
    dkdv: KernelConfig

    def __post_init__(self) -> None:
        if self.forward.block_m % self.forward.block_n or self.dq.block_m % self.dq.block_n \
                or self.dkdv.block_n % self.dkdv.block_m:
            raise ValueError(f"AttentionConfig: the causal diagonal needs nested tiles, got {self}")

    def flat(self) -> list[int]:
        """The config as ints, the form a torch op takes."""
        return [x for c in (self.forward, self.dq, self.dkdv) for x in dataclasses.astuple(c)]


def default_config() -> AttentionConfig:
    """16-row tiles in the interpreter (tiny test shapes still span several chunks); on a GPU the
    tiles ``scripts/explore_configs.py`` found fastest on an H200 (head dim 128, bf16, uniform and
    Zipf layouts, causal or not), all with ``C = 128`` so one ``chunk_offsets`` serves every kernel."""
    return _DEFAULT


_DEFAULT = AttentionConfig(*[KernelConfig(16, 16)] * 3) if INTERPRETED else AttentionConfig(
    forward=KernelConfig(128, 64, num_warps=8, num_stages=3),
    dq=KernelConfig(128, 64, num_warps=8, num_stages=3),
    dkdv=KernelConfig(64, 128, num_warps=8, num_stages=3))


@dataclasses.dataclass(frozen=True)
class _Launch:
    schedule: str  # resolved: never "auto"
    grid: tuple[int, ...]
    chunk: int
    config: KernelConfig


@functools.lru_cache(maxsize=256)  # pure arithmetic on ints: an eager call pays it once per shape
def _plan(T: int, N: int, H: int, schedule: str, max_seqlen: int | None, config: tuple[int, ...],
          sms: int) -> tuple[_Launch, _Launch, _Launch]:
    fwd, dq, dkdv = (KernelConfig(*config[i:i + 5]) for i in (0, 5, 10))
    max_seqlen = None if max_seqlen is None else min(max_seqlen, max(T, 1))  # no sequence is longer than T

    def launch(c: KernelConfig, chunk: int) -> _Launch:
        s = choose_schedule(T, N, chunk, H, sms, c.ctas_per_sm) if schedule == "auto" else schedule
        grid = launch_grid(s, T=T, N=N, C=chunk, heads=H, max_seqlen=max_seqlen, num_sms=sms, ctas_per_sm=c.ctas_per_sm)
        return _Launch(s, grid, chunk, c)

    return launch(fwd, fwd.block_m), launch(dq, dq.block_m), launch(dkdv, dkdv.block_n)


def _offsets(cu_seqlens: Tensor, launches: tuple[_Launch, ...], T: int) -> tuple[list[Tensor], list[Tensor]]:
    """Per launch, its ``chunk_offsets`` (one launch per chunk size) and its task counter (zeroed
    by that same launch for the dynamic schedule; ``cu_seqlens`` as a stand-in pointer otherwise)."""
    chunks = sorted({launch.chunk for launch in launches})
    dynamic = [i for i, launch in enumerate(launches) if launch.schedule == "dynamic"]
    slots = cu_seqlens.numel()
    work = torch.empty(len(chunks) * slots + len(dynamic), dtype=torch.int32, device=cu_seqlens.device)
    counters = work[len(chunks) * slots:]
    by_chunk = {}
    for i, chunk in enumerate(chunks):
        by_chunk[chunk] = launch_chunk_offsets(cu_seqlens, chunk, out=work[i * slots:(i + 1) * slots],
                                               counters=counters if i == 0 and dynamic else None, token_capacity=T)
    counter = [cu_seqlens] * len(launches)
    for j, i in enumerate(dynamic):
        counter[i] = counters[j:j + 1]
    return [by_chunk[launch.chunk] for launch in launches], counter


def _zero_inactive(x: Tensor, cu_seqlens: Tensor) -> None:
    # A grid that does not depend on L (capturable): small workers striding over the tail.
    block = 8192
    grid = (max(1, min(triton.cdiv(x.numel(), block), num_sms(x.device) * 16)),)
    zero_inactive_rows_kernel[grid](x, cu_seqlens, cu_seqlens.numel() - 1, x.shape[0], x.numel() // max(1, x.shape[0]), BLOCK=block,
                                    num_warps=8)


def _unit_last_stride(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> tuple[int, ...]:
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1))


@torch.library.custom_op("attn_gym_lite::varlen_attention_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, causal: bool, schedule: str,
             max_seqlen: int | None, zero_inactive: bool, config: list[int]) -> tuple[Tensor, Tensor]:
    q, k, v = (_unit_last_stride(x) for x in (q, k, v))
    T, H, D = q.shape
    N = cu_seqlens.numel() - 1
    out = q.new_empty(T, H, D)
    lse = q.new_empty(H, T, dtype=torch.float32)  # base-2 log-sum-exp per row: all the backward needs
    (f, *_) = launches = _plan(T, N, H, schedule, max_seqlen, tuple(config), num_sms(q.device))
    offsets, counters = _offsets(cu_seqlens, launches[:1], T)
    c = f.config
    attention_forward_kernel[f.grid](
        q, k, v, out, lse, cu_seqlens, offsets[0], counters[0], *_strides(q, k, v, out), N, H, T,
        math.log2(math.e) / math.sqrt(D), CAUSAL=causal, HEAD_DIM=D, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        SCHEDULE=f.schedule, num_warps=c.num_warps, num_stages=c.num_stages)
    if zero_inactive:
        _zero_inactive(out, cu_seqlens)
    return out, lse


@_forward.register_fake
def _(q, k, v, cu_seqlens, causal, schedule, max_seqlen, zero_inactive, config):
    T, H, D = q.shape
    return q.new_empty(T, H, D), q.new_empty(H, T, dtype=torch.float32)


@torch.library.custom_op("attn_gym_lite::varlen_attention_backward", mutates_args=())
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens: Tensor,
              causal: bool, schedule: str, max_seqlen: int | None, zero_inactive: bool,
              config: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = (_unit_last_stride(x) for x in (q, k, v))
    grad_out = grad_out.contiguous()  # the kernels read it with out's [T, H, D] strides
    T, H, D = q.shape
    N = cu_seqlens.numel() - 1
    dq, dk, dv = (q.new_empty(T, H, D) for _ in range(3))
    delta = q.new_empty(H, T, dtype=torch.float32)  # rowsum(dO * O), written by the dQ pass
    launches = _plan(T, N, H, schedule, max_seqlen, tuple(config), num_sms(q.device))[1:]
    offsets, counters = _offsets(cu_seqlens, launches, T)
    sm_scale = 1.0 / math.sqrt(D)
    # dQ first: it also writes delta, which the dK/dV pass reads.
    for launch, name, chunk_offsets, counter in zip(launches, ("dq", "dkdv"), offsets, counters):
        c = launch.config
        attention_backward_kernel[launch.grid](
            q, k, v, out, grad_out, dq, dk, dv, lse, delta, cu_seqlens, chunk_offsets, counter,
            *_strides(q, k, v, out), N, H, T, sm_scale * math.log2(math.e), sm_scale,
            PASS=name, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=c.block_m, BLOCK_N=c.block_n, SCHEDULE=launch.schedule,
            num_warps=c.num_warps, num_stages=c.num_stages)
    if zero_inactive:
        for grad in (dq, dk, dv):
            _zero_inactive(grad, cu_seqlens)
    return dq, dk, dv


@_backward.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens, causal, schedule, max_seqlen, zero_inactive, config):
    return tuple(q.new_empty(q.shape) for _ in range(3))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, *ctx.options = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens)


def _grad(ctx, grad_out, _grad_lse):
    return (*_backward(grad_out, *ctx.saved_tensors, *ctx.options), *[None] * 6)


_forward.register_autograd(_grad, setup_context=_setup_context)


def varlen_attention_triton(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, causal: bool = False,
                            schedule: str = "auto", max_seqlen: int | None = None, zero_inactive: bool = False,
                            config: AttentionConfig | None = None) -> Tensor:
    """Attention within each packed sequence by the Triton kernels; softmax scale ``1/sqrt(D)``.

    ``q, k, v`` are ``[T, H, D]`` (bf16/fp16 on a GPU; fp32 too in the interpreter; ``D`` in 16,
    32, 64, 128; any strides with a unit last one, e.g. views of a fused QKV projection);
    ``cu_seqlens`` int32 ``[N + 1]`` on their device. ``schedule`` maps chunks of work to CTAs
    (:data:`attn_gym_lite.schedule.SCHEDULES`); only ``"rect"`` reads ``max_seqlen``, which a graph
    then bakes in. Values are never read on the host: every kernel clamps each sequence into the
    ``T`` rows, so a malformed ``cu_seqlens`` gives wrong rows but no access outside the tensors
    (:func:`attn_gym_lite.ops.attention.varlen_attention` checks them). Rows ``L..T-1`` of the
    output and gradients are unspecified unless ``zero_inactive``. Deterministic backward.
    """
    config = (config or default_config()).flat()
    return _forward(q, k, v, cu_seqlens, causal, schedule, max_seqlen if schedule == "rect" else None,
                    zero_inactive, config)[0]
