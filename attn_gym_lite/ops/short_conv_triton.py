"""The ragged short convolution as Triton kernels: one launch forward, one or two backward (plus a sum).

The tensor ops make about ``3 W`` passes over ``[T, D]`` each way; here the forward is one pass
with the SiLU fused in, the backward one (two with the SiLU). Row ``t`` at position ``p_t``::

    z[t, c] = Σ_{j < W, j <= p_t} w[c, W-1-j] · x[t-j, c]        (pre-activation)
    g[t, c] = dy[t, c] · silu'(z[t, c])  or  dy[t, c]             (gradient of z)
    dx[u, c] = Σ_{j < W, j <= p_{u+j}, u+j < L} w[c, W-1-j] · g[u+j, c]
    dw[c, W-1-j] = Σ_{t < L, j <= p_t} g[t, c] · x[t-j, c]

Row blocks past ``L`` (read on the device) return at once, so nothing is sized by the layout
(capturable). Each row block writes its part of ``dw``, summed after: deterministic, unlike atomics.
Every load is masked: a malformed ``cu_seqlens`` gives wrong numbers, never an access outside.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ragged import positions_in_sequence

Tensor = torch.Tensor

# Tuned on the H200 (scripts/explore_short_conv.py, KDA layer shape, bfloat16, SiLU): the fastest
# forward and backward of the tiles tried; taller row blocks mean fewer dw parts to write and sum.
BLOCK_T = 32
BLOCK_D = 64
NUM_WARPS = 4


@triton.jit
def _pre_activation(x_rows, w, position, local, rows, cols, row_ok, col_ok, stride_x,
                    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    # z in float32 for a block of rows: x_rows points at the block's first row, local numbers the
    # block's rows from 0 (32-bit offsets inside the block, one 64-bit base per program).
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):
        # Tap j lies in the row's own sequence iff position >= j; rows >= j keeps a malformed
        # layout (positions larger than the row index) inside the tensor.
        tap_ok = row_ok & (position >= j) & (rows >= j)
        xj = tl.load(x_rows + (local - j)[:, None] * stride_x + cols[None, :],
                     mask=tap_ok[:, None] & col_ok[None, :], other=0.0)
        wj = tl.load(w + cols * W + (W - 1 - j), mask=col_ok, other=0.0)
        acc += xj.to(tl.float32) * wj.to(tl.float32)[None, :]
    return acc


@triton.jit
def _active_rows(cu_seqlens, num_seqs, T):
    # L, clamped into [0, T]: a malformed value stays inside the tensors.
    return tl.minimum(tl.maximum(tl.load(cu_seqlens + num_seqs), 0), T)


@triton.jit
def short_conv_forward_kernel(x, w, y, position, cu_seqlens, num_seqs, T, D, stride_x, stride_y,
                              W: tl.constexpr, SILU: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    L = _active_rows(cu_seqlens, num_seqs, T)
    first_row = tl.program_id(0) * BT
    if first_row >= L:
        return  # a block of inactive rows: their output stays undefined
    local = tl.arange(0, BT)
    rows = first_row + local
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    row_ok, col_ok = rows < L, cols < D
    pos = tl.load(position + rows, mask=row_ok, other=0)
    # 64-bit only in the block's base (T * D may pass 2^31), 32-bit offsets within it.
    z = _pre_activation(x + first_row.to(tl.int64) * stride_x, w, pos, local, rows, cols, row_ok, col_ok, stride_x,
                        W, BT, BD)
    if SILU:
        z = z * tl.sigmoid(z)
    tl.store(y + first_row.to(tl.int64) * stride_y + local[:, None] * stride_y + cols[None, :],
             z.to(y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def short_conv_silu_backward_kernel(x, w, dy, g, position, cu_seqlens, num_seqs, T, D, stride_x, stride_dy,
                                    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    # g = dy * silu'(z) in float32 on the active rows, z recomputed.
    L = _active_rows(cu_seqlens, num_seqs, T)
    first_row = tl.program_id(0) * BT
    if first_row >= L:
        return
    local = tl.arange(0, BT)
    rows = first_row + local
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    row_ok, col_ok = rows < L, cols < D
    mask = row_ok[:, None] & col_ok[None, :]
    pos = tl.load(position + rows, mask=row_ok, other=0)
    z = _pre_activation(x + first_row.to(tl.int64) * stride_x, w, pos, local, rows, cols, row_ok, col_ok, stride_x,
                        W, BT, BD)
    s = tl.sigmoid(z)
    grad = tl.load(dy + first_row.to(tl.int64) * stride_dy + local[:, None] * stride_dy + cols[None, :], mask=mask,
                   other=0.0).to(tl.float32)
    tl.store(g + first_row.to(tl.int64) * D + local[:, None] * D + cols[None, :], grad * s * (1.0 + z * (1.0 - s)),
             mask=mask)


@triton.jit
def short_conv_backward_kernel(x, w, g, dx, dw_parts, position, cu_seqlens, num_seqs, T, D,
                               stride_x, stride_g, stride_dx,
                               W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    # dx on the active rows and this row block's part of dw, from g (dy itself without the SiLU).
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
    local = tl.arange(0, BT)
    rows = first_row + local
    row_ok = rows < L
    x_rows = x + first_row.to(tl.int64) * stride_x
    g_rows = g + first_row.to(tl.int64) * stride_g
    pos = tl.load(position + rows, mask=row_ok, other=0)
    g_own = tl.load(g_rows + local[:, None] * stride_g + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
    dx_acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):
        wj = tl.load(w + cols * W + (W - 1 - j), mask=col_ok, other=0.0).to(tl.float32)
        # dw over this block's own rows t: g[t] * x[t - j] where tap j lies in t's sequence.
        tap_ok = row_ok & (pos >= j) & (rows >= j)
        xj = tl.load(x_rows + (local - j)[:, None] * stride_x + cols[None, :], mask=tap_ok[:, None] & col_ok[None, :],
                     other=0.0).to(tl.float32)
        tl.store(parts + (W - 1 - j), tl.sum(xj * g_own, axis=0), mask=col_ok)  # 0 where a load was masked
        # dx: input row u feeds output row t = u + j through tap j when t < L and t is j or more
        # into its sequence.
        t = rows + j
        feeds = (t < L) & (tl.load(position + t, mask=t < L, other=0) >= j)
        gj = tl.load(g_rows + (local + j)[:, None] * stride_g + cols[None, :], mask=feeds[:, None] & col_ok[None, :],
                     other=0.0).to(tl.float32)
        dx_acc += gj * wj[None, :]
    tl.store(dx + first_row.to(tl.int64) * stride_dx + local[:, None] * stride_dx + cols[None, :],
             dx_acc.to(dx.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _grid(tokens: int, channels: int) -> tuple[int, int]:
    return triton.cdiv(max(tokens, 1), BLOCK_T), triton.cdiv(channels, BLOCK_D)


# The two launches as torch ops (``torch.library.custom_op`` with fake implementations): torch.compile
# traces each call as one node, with no graph break and no host read of cu_seqlens.
@torch.library.custom_op("attn_gym_lite::short_conv_forward", mutates_args=())
def short_conv_forward(x: Tensor, weight: Tensor, cu_seqlens: Tensor, silu: bool) -> Tensor:
    x, weight = x.contiguous(), weight.contiguous()
    tokens, channels = x.shape
    position = positions_in_sequence(cu_seqlens, tokens)  # on the device: no host read
    y = torch.empty_like(x)
    if tokens and channels:
        short_conv_forward_kernel[_grid(tokens, channels)](
            x, weight, y, position, cu_seqlens, cu_seqlens.shape[0] - 1, tokens, channels, x.stride(0), y.stride(0),
            W=weight.shape[1], SILU=silu, BT=BLOCK_T, BD=BLOCK_D, num_warps=NUM_WARPS)
    return y


@short_conv_forward.register_fake
def _(x, weight, cu_seqlens, silu):
    return x.new_empty(x.shape)


@torch.library.custom_op("attn_gym_lite::short_conv_backward", mutates_args=())
def short_conv_backward(grad_y: Tensor, x: Tensor, weight: Tensor, cu_seqlens: Tensor,
                        silu: bool) -> tuple[Tensor, Tensor]:
    x, weight, grad_y = x.contiguous(), weight.contiguous(), grad_y.contiguous()
    tokens, channels = x.shape
    width = weight.shape[1]
    grid = _grid(tokens, channels)
    layout = (positions_in_sequence(cu_seqlens, tokens), cu_seqlens, cu_seqlens.shape[0] - 1, tokens, channels)
    grad_x = torch.empty_like(x)
    parts = torch.zeros(grid[0], channels, width, device=x.device, dtype=torch.float32)
    if tokens and channels:
        grad_z = grad_y  # the gradient of the pre-activation: dy itself without the SiLU
        if silu:
            # Written once in float32 (rows >= L never), read back W times from cache below.
            grad_z = torch.empty(tokens, channels, device=x.device, dtype=torch.float32)
            short_conv_silu_backward_kernel[grid](x, weight, grad_y, grad_z, *layout, x.stride(0), grad_y.stride(0),
                                                  W=width, BT=BLOCK_T, BD=BLOCK_D, num_warps=NUM_WARPS)
        short_conv_backward_kernel[grid](x, weight, grad_z, grad_x, parts, *layout, x.stride(0), grad_z.stride(0),
                                         grad_x.stride(0), W=width, BT=BLOCK_T, BD=BLOCK_D, num_warps=NUM_WARPS)
    return grad_x, parts.sum(0).to(weight.dtype)


@short_conv_backward.register_fake
def _(grad_y, x, weight, cu_seqlens, silu):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, cu_seqlens, ctx.silu = inputs
    ctx.save_for_backward(x, weight, cu_seqlens)


def _grad(ctx, grad_y):
    # The backward op has no backward of its own: a double backward through the kernels raises.
    return (*short_conv_backward(grad_y, *ctx.saved_tensors, ctx.silu), None, None)


short_conv_forward.register_autograd(_grad, setup_context=_setup_context)
