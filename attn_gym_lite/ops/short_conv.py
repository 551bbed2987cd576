"""A ragged causal depthwise short convolution: each sequence starts from a blank history.

Linear-attention layers (Mamba, DeltaNet, KDA) run a short causal convolution over their
projections before the token mixer: every channel ``c`` of token ``t`` becomes a weighted sum of
the same channel at tokens ``t - W + 1 .. t``, with a kernel width ``W`` of about 4. On a packed
batch the window must stop at the start of the token's own sequence, as if each sequence were
zero-padded on the left: the first tokens of a document must never see the end of the previous
one. With the weight stored as ``[D, W]`` (``nn.Conv1d(D, D, W, groups=D)``'s weight without its
middle dimension) and ``s_t`` the first row of token ``t``'s sequence::

    y[t, c] = Σ_{k=0}^{W-1} w[c, k] · x[t - (W-1) + k, c]      over the taps with t - (W-1) + k >= s_t

``impl="torch"`` builds it from tensor ops only, so it is capturable (``impl="triton"``, the
default on a GPU, runs the kernels of :mod:`attn_gym_lite.ops.short_conv_triton` under the same
contract): each token's position within its sequence comes from ``cu_seqlens`` on the device
(``searchsorted``), and every tap that would
cross a sequence start is *selected away* with ``torch.where``, which stays exact when the other
rows hold NaN. It then follows the contract of a real ragged kernel, which only launches work
for the ``L = cu_seqlens[-1]`` active rows:

* forward: output rows ``L..T-1`` are **undefined** (uninitialized memory);
* backward: the input-gradient rows ``L..T-1`` are **undefined** too, and the weight gradient
  sums over active rows only.

Active rows of the output and of both gradients are exact functions of the active rows of the
inputs and of the output gradient, whatever the inactive rows hold. The undefined rows are why
the block of :mod:`attn_gym_lite.models.block` needs a gradient barrier between its QKV projection and
this convolution (see the "Masking" chapter).

Source: the short convolution of Mamba (Gu & Dao, 2023) and of flash-linear-attention's
``ShortConvolution``; seed article, section "Correctness tangent".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import checks
from ..ragged import positions_in_sequence
from .triton_support import kernels_take, missing_triton, triton_available

Tensor = torch.Tensor

__all__ = ["SHORT_CONV_ACTIVATIONS", "SHORT_CONV_IMPLEMENTATIONS", "ShortConv", "resolve_short_conv_impl", "short_conv",
           "short_conv_reference"]

#: ``impl`` values of :func:`short_conv`: ``"torch"``, the tensor ops of this module (any device and
#: floating dtype); ``"triton"``, one kernel each way (:mod:`attn_gym_lite.ops.short_conv_triton`).
SHORT_CONV_IMPLEMENTATIONS = ("torch", "triton")
#: ``activation`` values of :func:`short_conv`: none, or the SiLU that linear-attention layers apply next.
SHORT_CONV_ACTIVATIONS = (None, "silu")


def _check_short_conv_arguments(x: object, weight: object, cu_seqlens: object) -> None:
    """Metadata checks only (types, dtypes, shapes, devices), so they are safe inside capture;
    ``cu_seqlens`` by the layout rules every consumer shares (:func:`attn_gym_lite.checks.check_cu_seqlens`)."""
    x = checks.check_tensor("x", x, ndim=2, shape="[T, D]", dtypes=checks.FLOATING_DTYPES)
    checks.check_tensor("weight", weight, ndim=2, shape=f"[D, W] = [{x.shape[1]}, W >= 1]", dtypes=(x.dtype,),
                        device=x.device)
    if weight.shape[0] != x.shape[1] or weight.shape[1] < 1:
        raise ValueError(f"weight must have shape [D, W] = [{x.shape[1]}, W >= 1], got {tuple(weight.shape)}")
    checks.check_cu_seqlens(cu_seqlens, device=x.device)
    # Host metadata costs nothing to read: check its values (a CUDA one is not read, see short_conv).
    checks.check_host_cu_seqlens_values(cu_seqlens, token_capacity=x.shape[0])


def _shift_down(x: Tensor, rows: int) -> Tensor:
    """``out[t] = x[t - rows]``, zero for ``t < rows``."""
    return F.pad(x, (0, 0, rows, 0))[: x.shape[0]]


def _shift_up(x: Tensor, rows: int) -> Tensor:
    """``out[t] = x[t + rows]``, zero for ``t >= T - rows``."""
    return F.pad(x, (0, 0, 0, rows))[rows:]


class _RaggedShortConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cu_seqlens: Tensor) -> Tensor:
        tokens, width = x.shape[0], weight.shape[1]
        position = positions_in_sequence(cu_seqlens, tokens)
        active = torch.arange(tokens, device=x.device, dtype=torch.int32) < cu_seqlens[-1]
        # Accumulate in at least float32, as a kernel would in registers.
        accumulate = torch.promote_types(x.dtype, torch.float32)
        w = weight.to(accumulate)
        y = x * w[:, width - 1]
        for lag in range(1, width):
            # Tap `lag` rows back, only where that row is in the same sequence.
            tap = torch.where((position >= lag)[:, None], _shift_down(x, lag), 0)
            y = y + tap * w[:, width - 1 - lag]
        ctx.save_for_backward(x, weight, position, active)
        # A ragged kernel writes only the active rows; the rest is whatever memory it was given.
        return torch.where(active[:, None], y.to(x.dtype), torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, position, active = ctx.saved_tensors
        width = weight.shape[1]
        accumulate = torch.promote_types(x.dtype, torch.float32)
        w = weight.to(accumulate)
        # Inactive rows of x and of the gradient may hold NaN: select them away before any product
        # (NaN * 0 is NaN), so that no product here, nor its derivative in a double backward,
        # ever sees them.
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
            taps = torch.where(same_sequence, grad_y * _shift_down(x_active, lag), 0)
            grad_w[width - 1 - lag] = taps.sum(0)
        grad_weight = torch.stack(grad_w, dim=1).to(weight.dtype)
        # Like a kernel launched over the active rows only: inactive input-gradient rows are never
        # written, so they hold whatever the allocator returned (see the module docstring).
        return torch.where(active[:, None], grad_x.to(x.dtype), torch.empty_like(x)), grad_weight, None


def resolve_short_conv_impl(impl: str, x: Tensor) -> str:
    """``impl`` with ``"auto"`` resolved for ``x``: ``"triton"`` where the kernels run (Triton
    installed, and a CUDA tensor compiled or a CPU one under ``TRITON_INTERPRET=1``, in bfloat16,
    float16 or float32), else ``"torch"`` (no Triton, float64, other devices).

    Raises:
        ValueError: ``impl`` is not ``"auto"`` or one of :data:`SHORT_CONV_IMPLEMENTATIONS`.
        TypeError: ``x`` is not a tensor.
    """
    checks.check_choice("impl", impl, ("auto", *SHORT_CONV_IMPLEMENTATIONS))
    checks.check_tensor("x", x)
    if impl != "auto":
        return impl
    if not triton_available():
        return "torch"
    from .kernels.mma import INTERPRETED  # imports Triton: only once it is known to be there

    return "triton" if kernels_take(x, INTERPRETED, _KERNEL_DTYPES) else "torch"


#: The dtypes the short-convolution kernels take (float64 stays with the tensor ops).
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def short_conv(x: Tensor, weight: Tensor, cu_seqlens: Tensor, *, activation: str | None = None,
               impl: str = "auto") -> Tensor:
    """Causal depthwise convolution within each packed sequence, restarting at every boundary.

    Args:
        x: ``[T, D]`` floating tensor (``T`` token capacity, ``D`` channels).
        weight: ``[D, W]`` in ``x``'s dtype and device; ``weight[:, W-1]`` multiplies the current
            token, ``weight[:, W-1-j]`` the token ``j`` rows back.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L, L]`` on ``x``'s device.
        activation: ``None`` or ``"silu"``, applied to the convolution's output (fused into the
            kernel by ``impl="triton"``).
        impl: ``"auto"`` (:func:`resolve_short_conv_impl`: the Triton kernels on a GPU), ``"torch"``
            or ``"triton"`` (:data:`SHORT_CONV_IMPLEMENTATIONS`). Same contract either way; the
            Triton kernels accumulate in float32, as the tensor ops do.

    Returns:
        ``[T, D]`` in ``x``'s dtype. Rows ``0..L-1`` are exact; rows ``L..T-1`` are undefined.

    Backward: ``∇x`` rows ``0..L-1`` are exact and rows ``L..T-1`` **undefined** (stop them with
    :func:`attn_gym_lite.ops.masking.mask_inactive_token_gradients` before they reach a weight
    gradient); ``∇weight`` sums over active rows only (accumulated in float32). ``cu_seqlens``
    gets no gradient.

    Raises:
        TypeError: an argument is not a tensor, ``x`` is not floating, ``weight``'s dtype differs
            from ``x``'s, or ``cu_seqlens`` is not int32.
        ValueError: shapes are not ``[T, D]``, ``[D, W >= 1]``, ``[N + 1 >= 2]``, or the tensors
            are on different devices; a CPU ``cu_seqlens`` (its values read without a device sync, outside
            ``torch.compile``) not starting at 0, decreasing, or with ``L > T``; ``activation`` not
            in :data:`SHORT_CONV_ACTIVATIONS`; ``impl`` not ``"auto"`` or one of
            :data:`SHORT_CONV_IMPLEMENTATIONS`; ``impl="triton"`` where the kernels do not run
            (anything but a CPU tensor under ``TRITON_INTERPRET=1``, anything but a CUDA one
            without it, float64).
        ImportError: ``impl="triton"`` without Triton installed.
        RuntimeError: (in the backward) ``impl="triton"`` differentiated with ``create_graph=True``.

    Capturable either way (no host read of a CUDA ``cu_seqlens``): ``"torch"`` runs ``W``
    elementwise passes in each direction, ``"triton"`` one kernel forward and one backward (two
    with the SiLU) plus the sum of the weight gradient's per-block parts. ``"torch"`` can be
    differentiated twice; ``"triton"`` is first-order only (its backward raises a RuntimeError under
    ``create_graph=True``). On CUDA,
    malformed ``cu_seqlens`` values (not starting at 0, decreasing, ``L > T``) are not checked and
    give undefined results, but every index stays inside the tensors: validate batches eagerly
    with :func:`attn_gym_lite.ragged.validate_cu_seqlens`.
    Source: Mamba's short convolution; flash-linear-attention's ``ShortConvolution``.
    """
    _check_short_conv_arguments(x, weight, cu_seqlens)
    checks.check_choice("activation", activation, SHORT_CONV_ACTIVATIONS)
    if impl == "triton":
        _require_kernels(x)  # asked for by name; "auto" chooses the kernels only where they run
    impl = resolve_short_conv_impl(impl, x)
    if impl == "triton":
        from .short_conv_triton import ShortConvTriton

        return ShortConvTriton.apply(x, weight, cu_seqlens, activation == "silu")
    y = _RaggedShortConv.apply(x, weight, cu_seqlens)
    return F.silu(y) if activation == "silu" else y


def _require_kernels(x: Tensor) -> None:
    """The errors for ``impl="triton"`` where the kernels cannot run on ``x``."""
    if not triton_available():
        raise missing_triton("short_conv(impl='triton')", "use impl='auto' or 'torch'")
    from .kernels.mma import INTERPRETED

    if not kernels_take(x, INTERPRETED, _KERNEL_DTYPES):
        where = "a CPU tensor with TRITON_INTERPRET=1 set" if INTERPRETED else "a CUDA tensor"
        raise ValueError(f"short_conv(impl='triton') needs x as {where} in bfloat16, float16 or float32, got "
                         f"a {x.device.type} tensor of {x.dtype}: use impl='auto' or 'torch'")


def short_conv_reference(x: Tensor, weight: Tensor, cu_seqlens: Tensor) -> Tensor:
    """:func:`short_conv` computed one sequence at a time with ``F.conv1d`` (left zero padding).

    Same ``x``, ``weight``, ``cu_seqlens`` and result as :func:`short_conv` without an activation
    (it has no ``activation`` or ``impl``), except that inactive rows ``L..T-1`` are 0
    and the backward (plain autograd) gives them a zero gradient. Eager only: it reads
    ``cu_seqlens`` on the host. Differentiable in ``x`` and ``weight``.

    Raises:
        The errors of :func:`short_conv`, and a ValueError for ``cu_seqlens`` values that break
        the layout (:func:`attn_gym_lite.checks.check_cu_seqlens_values`: first entry not 0, a
        decrease, ``L > T``).

    Source: ``torch.nn.Conv1d`` with ``groups=D`` and ``padding=W-1``, truncated to the causal part.
    """
    _check_short_conv_arguments(x, weight, cu_seqlens)
    checks.check_cu_seqlens_values(cu_seqlens, token_capacity=x.shape[0])
    channels, width = weight.shape
    out = torch.zeros_like(x)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            sequence = x[start:end].T[None]  # [1, D, length]
            full = F.conv1d(sequence, weight[:, None, :], padding=width - 1, groups=channels)
            out[start:end] = full[0, :, : end - start].T
    return out


class ShortConv(nn.Module):
    """:func:`short_conv` with its own ``[dim, kernel_size]`` weight.

    Args:
        dim: channels ``D`` (int >= 1).
        kernel_size: ``W`` (int >= 1), 4 in most linear-attention layers.
        activation: ``None`` or ``"silu"`` (:data:`SHORT_CONV_ACTIVATIONS`), applied to the output.
        impl: ``"auto"``, ``"torch"`` or ``"triton"``, as :func:`short_conv`'s.
        device, dtype: of the weight.

    The weight is initialised like ``nn.Conv1d(dim, dim, kernel_size, groups=dim)``'s: uniform in
    ``±1/sqrt(kernel_size)``.

    Shapes: ``forward(x [T, dim], cu_seqlens int32 [N + 1]) -> [T, dim]`` with rows past ``L``
    undefined, as :func:`short_conv` (whose errors it raises).

    Raises:
        TypeError: ``dim`` or ``kernel_size`` is not an int (a float, a bool).
        ValueError: ``dim`` or ``kernel_size`` is below 1; ``activation`` or ``impl`` not one of
            its choices; a ``device`` refused by
            :func:`~attn_gym_lite.checks.check_device` (``"cuda"`` without a GPU).
        TypeError: ``device`` not a str, int or ``torch.device``; ``dtype`` not a floating
            ``torch.dtype``.
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int = 4,
        *,
        activation: str | None = None,
        impl: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dim = checks.check_int("dim", dim, minimum=1)
        kernel_size = checks.check_int("kernel_size", kernel_size, minimum=1)
        self.activation = checks.check_choice("activation", activation, SHORT_CONV_ACTIVATIONS)
        self.impl = checks.check_choice("impl", impl, ("auto", *SHORT_CONV_IMPLEMENTATIONS))
        self.weight = nn.Parameter(torch.empty(dim, kernel_size, **checks.check_factory(device, dtype)))
        bound = 1 / math.sqrt(kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: Tensor, cu_seqlens: Tensor) -> Tensor:
        return short_conv(x, self.weight, cu_seqlens, activation=self.activation, impl=self.impl)

    def extra_repr(self) -> str:
        dim, width = self.weight.shape
        return f"dim={dim}, kernel_size={width}, activation={self.activation!r}, impl={self.impl!r}"
