"""A ragged causal depthwise short convolution: each sequence starts from a blank history.

Linear-attention layers (Mamba, DeltaNet, KDA) convolve each channel over the last ``W`` tokens; on
a packed batch the window stops at the start ``s_t`` of the token's own sequence::

    y[t, c] = Σ_{k=0}^{W-1} w[c, k] · x[t - (W-1) + k, c]      over the taps with t - (W-1) + k >= s_t

Like a ragged kernel launched over the ``L`` active rows, it leaves rows ``L..T-1`` of the output
and of the input gradient *undefined* (hence the blocks' gradient barrier before it). ``"torch"``
selects crossing taps away with ``torch.where`` (exact when other rows hold NaN); ``"triton"`` runs
:mod:`attn_gym_lite.ops.short_conv_triton`. Both are capturable. Source: Mamba; fla's ``ShortConvolution``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import checks
from ..ragged import positions_in_sequence
from .triton_support import kernels_take, missing_triton, triton_available

Tensor = torch.Tensor

__all__ = ["ShortConv", "resolve_short_conv_impl", "short_conv"]

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # float64 stays with the tensor ops


def _shift_down(x: Tensor, rows: int) -> Tensor:
    return F.pad(x, (0, 0, rows, 0))[: x.shape[0]]  # out[t] = x[t - rows], zero for t < rows


def _shift_up(x: Tensor, rows: int) -> Tensor:
    return F.pad(x, (0, 0, 0, rows))[rows:]  # out[t] = x[t + rows], zero for t >= T - rows


class _RaggedShortConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cu_seqlens: Tensor) -> Tensor:
        tokens, width = x.shape[0], weight.shape[1]
        position = positions_in_sequence(cu_seqlens, tokens)
        active = torch.arange(tokens, device=x.device, dtype=torch.int32) < cu_seqlens[-1]
        w = weight.to(torch.promote_types(x.dtype, torch.float32))  # accumulate as a kernel would
        y = x * w[:, width - 1]
        for lag in range(1, width):
            # Tap `lag` rows back, only where that row is in the same sequence.
            y = y + torch.where((position >= lag)[:, None], _shift_down(x, lag), 0) * w[:, width - 1 - lag]
        ctx.save_for_backward(x, weight, position, active)
        # A ragged kernel writes only the active rows; the rest is whatever memory it was given.
        return torch.where(active[:, None], y.to(x.dtype), torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, position, active = ctx.saved_tensors
        width = weight.shape[1]
        accumulate = torch.promote_types(x.dtype, torch.float32)
        w = weight.to(accumulate)
        # Select the inactive rows away before any product (NaN * 0 is NaN), so that neither this
        # backward nor its derivative in a double backward ever sees them.
        rows = active[:, None]
        x_active = torch.where(rows, x, 0)
        grad_y = torch.where(rows, grad_y.to(accumulate), 0)
        grad_x = grad_y * w[:, width - 1]
        grad_w = [None] * width
        grad_w[width - 1] = (grad_y * x_active).sum(0)
        for lag in range(1, width):
            # Input row u feeds output row u + lag iff that row is `lag` or more into the same
            # sequence; for an active u that output row is active too.
            same_sequence = (position >= lag)[:, None]
            feeds = _shift_up(same_sequence, lag)
            grad_x = grad_x + torch.where(feeds, _shift_up(grad_y, lag), 0) * w[:, width - 1 - lag]
            grad_w[width - 1 - lag] = torch.where(same_sequence, grad_y * _shift_down(x_active, lag), 0).sum(0)
        grad_weight = torch.stack(grad_w, dim=1).to(weight.dtype)
        # As a kernel launched over the active rows: inactive input-gradient rows are never written.
        return torch.where(rows, grad_x.to(x.dtype), torch.empty_like(x)), grad_weight, None


def resolve_short_conv_impl(impl: str, x: Tensor) -> str:
    """``impl`` with ``"auto"`` resolved: ``"triton"`` where the kernels run on ``x``, else ``"torch"``."""
    if impl != "auto":
        return impl
    if not triton_available():
        return "torch"
    from .kernels.mma import INTERPRETED  # imports Triton: only once it is known to be there

    return "triton" if kernels_take(x, INTERPRETED, _KERNEL_DTYPES) else "torch"


def short_conv(x: Tensor, weight: Tensor, cu_seqlens: Tensor, *, activation: str | None = None,
               impl: str = "auto") -> Tensor:
    """Causal depthwise convolution within each packed sequence, restarting at every boundary.

    Args:
        x: ``[T, D]`` floating.
        weight: ``[D, W]``; ``weight[:, W-1-j]`` multiplies the token ``j`` rows back.
        cu_seqlens: int32 ``[N + 1]`` on ``x``'s device; a CPU one is checked on the host, a CUDA
            one never read (capturable: the kernels clamp).
        activation: ``None`` or ``"silu"`` (fused into the kernel).
        impl: ``"auto"`` (the Triton kernels where they run), ``"torch"`` or ``"triton"``.

    Returns:
        ``[T, D]`` in ``x``'s dtype, rows past ``L`` undefined, as are those of ``∇x`` (stop them with
        :func:`attn_gym_lite.ops.masking.mask_inactive_token_gradients`); ``∇weight`` sums active
        rows in float32. ``"torch"`` can be differentiated twice, ``"triton"`` once.
    """
    if weight.shape[0] != x.shape[-1]:  # the kernels would read past the weight
        raise ValueError(f"weight must have shape [D, W] = [{x.shape[-1]}, W], got {tuple(weight.shape)}")
    checks.check_cu_seqlens(cu_seqlens, device=x.device)
    checks.check_host_cu_seqlens_values(cu_seqlens, token_capacity=x.shape[0])
    if impl == "triton" and resolve_short_conv_impl("auto", x) != "triton":
        if not triton_available():
            raise missing_triton("short_conv(impl='triton')", "use impl='auto' or 'torch'")
        raise ValueError(f"short_conv(impl='triton') needs x as a CUDA tensor (a CPU one under TRITON_INTERPRET=1) "
                         f"in bfloat16, float16 or float32, got {x.device.type} {x.dtype}: use impl='auto' or 'torch'")
    if resolve_short_conv_impl(impl, x) == "triton":
        from .short_conv_triton import short_conv_forward

        return short_conv_forward(x, weight, cu_seqlens, activation == "silu")
    y = _RaggedShortConv.apply(x, weight, cu_seqlens)
    return F.silu(y) if activation == "silu" else y


class ShortConv(nn.Module):
    """:func:`short_conv` with its own ``[dim, kernel_size]`` weight, initialised like
    ``nn.Conv1d(dim, dim, kernel_size, groups=dim)``'s: ``forward(x [T, dim], cu_seqlens) -> [T, dim]``."""

    def __init__(self, dim: int, kernel_size: int = 4, *, activation: str | None = None, impl: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.activation, self.impl = activation, impl
        self.weight = nn.Parameter(torch.empty(dim, kernel_size, device=device, dtype=dtype))
        nn.init.uniform_(self.weight, -kernel_size**-0.5, kernel_size**-0.5)

    def forward(self, x: Tensor, cu_seqlens: Tensor) -> Tensor:
        return short_conv(x, self.weight, cu_seqlens, activation=self.activation, impl=self.impl)

    def extra_repr(self) -> str:
        dim, width = self.weight.shape
        return f"dim={dim}, kernel_size={width}, activation={self.activation!r}, impl={self.impl!r}"
