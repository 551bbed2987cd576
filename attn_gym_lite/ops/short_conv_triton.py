"""The ragged short convolution as Triton kernels: one launch forward, one backward (plus a sum).

:func:`attn_gym_lite.ops.short_conv.short_conv` builds the same convolution from tensor ops:
about ``3 W`` elementwise passes over ``[T, D]`` each way, each one a kernel that reads and writes
the whole float32 activation. In a KDA layer at T = 4096 (D = 12288 channels) that was 30 kernels
forward and 52 backward, 43% of the layer's replay on the H200 (``linear_attention.json``, trace
part, at eb753bd). Here each direction is one pass over ``x`` (and ``dy``) with the ``W`` taps read
from cache, the SiLU that every linear-attention layer applies next fused in.

The math, for row ``t`` at position ``p_t`` in its sequence and ``W`` taps (``w[c, W-1]`` multiplies
the current row)::

    z[t, c] = Σ_{j < W, j <= p_t} w[c, W-1-j] · x[t-j, c]        (pre-activation)
    y[t, c] = silu(z[t, c])  or  z[t, c]
    g[t, c] = dy[t, c] · silu'(z[t, c])  or  dy[t, c]             (gradient of z)
    dx[u, c] = Σ_{j < W, j <= p_{u+j}, u+j < L} w[c, W-1-j] · g[u+j, c]
    dw[c, W-1-j] = Σ_{t < L, j <= p_t} g[t, c] · x[t-j, c]

Grid: row blocks of ``BT`` rows by channel blocks of ``BD``. ``L`` is read on the device from
``cu_seqlens[N]`` (clamped into ``[0, T]``) and row blocks past it return at once, so the launch
sizes nothing by the layout (capturable, as chapter 4's flat grid). The backward recomputes ``z``
where it needs it (``W`` rows past its block as well), rather than saving it: ``W x W`` loads of
rows already in cache instead of a float32 ``[T, D]`` tensor written and read back. Each row block
writes its part of ``dw`` to a ``[row blocks, D, W]`` float32 buffer that one ``sum(0)`` reduces:
deterministic, unlike atomics.

Every load is masked: rows ``>= L`` read nothing (their ``dy`` or ``x`` may be NaN), a tap reads row
``t - j`` only when ``j <= p_t`` and ``t - j >= 0``; so a malformed device ``cu_seqlens`` gives
wrong numbers, never an access outside the tensors. Rows ``L..T-1`` of ``y`` and ``dx`` are never
written (undefined, as the tensor-op version's contract says).

Source: the short convolution of Mamba (Gu & Dao, 2023) and flash-linear-attention's
``ShortConvolution`` (activation fused); the kernels are this package's own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ragged import positions_in_sequence

Tensor = torch.Tensor

# Row and channel block sizes: a memory-bound stencil, so blocks only need to be wide enough for
# 128-byte loads along the channels and tall enough that the W - 1 halo rows are a small overhead.
BLOCK_T = 32
BLOCK_D = 128


@triton.jit
def _pre_activation(x, w, position, rows, cols, row_ok, col_ok, stride_x,
                    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """``z`` for ``rows x cols`` in float32: the taps ``j`` rows back within each row's sequence."""
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):
        # Tap j lies in the row's own sequence iff position >= j; rows >= j keeps a malformed
        # layout (positions larger than the row index) inside the tensor.
        tap_ok = row_ok & (position >= j) & (rows >= j)
        xj = tl.load(x + (rows - j)[:, None] * stride_x + cols[None, :], mask=tap_ok[:, None] & col_ok[None, :],
                     other=0.0)
        wj = tl.load(w + cols * W + (W - 1 - j), mask=col_ok, other=0.0)
        acc += xj.to(tl.float32) * wj.to(tl.float32)[None, :]
    return acc


@triton.jit
def _active_rows(cu_seqlens, num_seqs, T):
    """``L = cu_seqlens[N]`` clamped into ``[0, T]`` (a malformed value stays inside the tensors)."""
    return tl.minimum(tl.maximum(tl.load(cu_seqlens + num_seqs), 0), T)


@triton.jit
def short_conv_forward_kernel(x, w, y, position, cu_seqlens, num_seqs, T, D, stride_x, stride_y,
                              W: tl.constexpr, SILU: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    L = _active_rows(cu_seqlens, num_seqs, T)
    first_row = tl.program_id(0) * BT
    if first_row >= L:
        return  # a block of inactive rows: their output stays undefined
    rows = (first_row + tl.arange(0, BT)).to(tl.int64)  # 64-bit offsets: T * D may pass 2^31
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    row_ok, col_ok = rows < L, cols < D
    pos = tl.load(position + rows, mask=row_ok, other=0)
    z = _pre_activation(x, w, pos, rows, cols, row_ok, col_ok, stride_x, W, BT, BD)
    if SILU:
        z = z * tl.sigmoid(z)
    tl.store(y + rows[:, None] * stride_y + cols[None, :], z.to(y.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _grad_pre_activation(x, w, dy, position, rows, cols, L, col_ok, stride_x, stride_dy,
                         W: tl.constexpr, SILU: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """``g = dy * silu'(z)`` (or ``dy``) for ``rows x cols``, float32, 0 on rows ``>= L``; and the rows' positions."""
    row_ok = rows < L
    pos = tl.load(position + rows, mask=row_ok, other=0)
    g = tl.load(dy + rows[:, None] * stride_dy + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                other=0.0).to(tl.float32)
    if SILU:
        z = _pre_activation(x, w, pos, rows, cols, row_ok, col_ok, stride_x, W, BT, BD)
        s = tl.sigmoid(z)
        g = g * s * (1.0 + z * (1.0 - s))
    return g, pos


@triton.jit
def short_conv_backward_kernel(x, w, dy, dx, dw_parts, position, cu_seqlens, num_seqs, T, D,
                               stride_x, stride_dy, stride_dx,
                               W: tl.constexpr, SILU: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    L = _active_rows(cu_seqlens, num_seqs, T)
    block = tl.program_id(0)
    first_row = block * BT
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    col_ok = cols < D
    parts = dw_parts + block.to(tl.int64) * D * W + cols * W  # this block's [D, W] slice of dw's partial sums
    if first_row >= L:
        for j in tl.static_range(W):  # no active row here: this block adds nothing to dw
            tl.store(parts + (W - 1 - j), tl.zeros((BD,), dtype=tl.float32), mask=col_ok)
        return
    rows = (first_row + tl.arange(0, BT)).to(tl.int64)  # 64-bit offsets: T * D may pass 2^31
    g_own, pos_own = _grad_pre_activation(x, w, dy, position, rows, cols, L, col_ok, stride_x, stride_dy,
                                          W, SILU, BT, BD)
    dx_acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):
        # dw over this block's own rows t: g[t] * x[t - j] where tap j lies in t's sequence.
        tap_ok = (rows < L) & (pos_own >= j) & (rows >= j)
        xj = tl.load(x + (rows - j)[:, None] * stride_x + cols[None, :], mask=tap_ok[:, None] & col_ok[None, :],
                     other=0.0).to(tl.float32)
        tl.store(parts + (W - 1 - j), tl.sum(tl.where(tap_ok[:, None], g_own * xj, 0.0), axis=0), mask=col_ok)
        # dx: input row u feeds output row t = u + j through tap j when t is j or more into its
        # sequence; g at rows past this block is recomputed here (it is 0 past L).
        if j == 0:
            g_t, pos_t = g_own, pos_own
        else:
            g_t, pos_t = _grad_pre_activation(x, w, dy, position, rows + j, cols, L, col_ok, stride_x, stride_dy,
                                              W, SILU, BT, BD)
        feeds = (pos_t >= j) & (rows + j < L)
        wj = tl.load(w + cols * W + (W - 1 - j), mask=col_ok, other=0.0).to(tl.float32)
        dx_acc += tl.where(feeds[:, None], g_t, 0.0) * wj[None, :]
    tl.store(dx + rows[:, None] * stride_dx + cols[None, :], dx_acc.to(dx.dtype.element_ty),
             mask=(rows < L)[:, None] & col_ok[None, :])


def _grid(tokens: int, channels: int) -> tuple[int, int]:
    return triton.cdiv(max(tokens, 1), BLOCK_T), triton.cdiv(channels, BLOCK_D)


class ShortConvTriton(torch.autograd.Function):
    """The autograd Function behind ``short_conv(..., impl="triton")``: arguments already checked
    there (``x [T, D]`` and ``weight [D, W]`` in one floating dtype on one device, int32
    ``cu_seqlens``)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cu_seqlens: Tensor, silu: bool) -> Tensor:
        x, weight = x.contiguous(), weight.contiguous()
        tokens, channels = x.shape
        position = positions_in_sequence(cu_seqlens, tokens)  # on the device: no host read
        y = torch.empty_like(x)
        if tokens and channels:
            short_conv_forward_kernel[_grid(tokens, channels)](
                x, weight, y, position, cu_seqlens, cu_seqlens.shape[0] - 1, tokens, channels, x.stride(0), y.stride(0),
                W=weight.shape[1], SILU=silu, BT=BLOCK_T, BD=BLOCK_D)
        ctx.save_for_backward(x, weight, position, cu_seqlens)
        ctx.silu = silu
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, None, None]:
        x, weight, position, cu_seqlens = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        tokens, channels = x.shape
        width = weight.shape[1]
        grid = _grid(tokens, channels)
        grad_x = torch.empty_like(x)
        parts = torch.empty(grid[0], channels, width, device=x.device, dtype=torch.float32)
        if tokens and channels:
            short_conv_backward_kernel[grid](
                x, weight, grad_y, grad_x, parts, position, cu_seqlens, cu_seqlens.shape[0] - 1, tokens, channels,
                x.stride(0), grad_y.stride(0), grad_x.stride(0), W=width, SILU=ctx.silu, BT=BLOCK_T, BD=BLOCK_D)
        else:
            parts.zero_()
        return grad_x, parts.sum(0).to(weight.dtype), None, None
