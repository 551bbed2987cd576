"""Masking the inactive capacity of a packed batch, in values and in gradients.

A graph captured at token capacity ``T`` computes on all ``T`` physical rows while only the first
``L = cu_seqlens[-1]`` hold real tokens. The suffix ``L..T-1`` is not harmless:

* It may hold anything: stale data from the previous batch, or NaN / Inf. Multiplying by zero
  does not clean it, because ``NaN * 0 = NaN`` and ``Inf * 0 = NaN``.
* Token-parallel ops still *reduce over rows* in the backward pass. A projection ``Y = X W`` has
  the weight gradient ``∇W = Xᵀ ∇Y = Σ_t X_tᵀ ∇Y_t``, a sum over every physical row; an RMSNorm
  gain's gradient is such a sum too. One non-finite inactive row in ``X`` poisons ``∇W`` even when
  ``∇Y`` is zero there.
* Ragged kernels only compute the rows ``cu_seqlens`` describes. Rows past ``L`` of their
  outputs, or of the input gradients they return, are left undefined: whatever the memory held,
  finite but wrong when it held stale numbers, NaN only when it held NaN (torch's ``varlen_attn``
  included).

The rule this module serves: **mask where inactive rows can mix, reduce, or become undefined,
and nowhere else.** Two kinds of mask do it:

* a *value mask*, :func:`mask_inactive_tokens`, sets the inactive rows to zero before an op can
  read them or save them for a reduction in backward (and zeroes their gradient);
* a *gradient barrier*, :func:`mask_inactive_token_gradients`, leaves the forward values alone and
  zeroes the inactive rows of the gradient flowing back through it, so undefined input gradients
  of a ragged op cannot reach a weight-gradient reduction upstream.

Both *select* with ``torch.where`` rather than multiply by a 0/1 mask, so they are exact for any
value, NaN included. :func:`active_token_mask` builds the ``[T]`` mask on the device from
``cu_seqlens[-1]`` without reading it on the host; all three launch only device work and may run
inside CUDA graph capture, where replay rebuilds the mask from the current ``cu_seqlens``.

:func:`uninitialized_memory_as_nan` makes "undefined" visible: while it is active, memory that an
op leaves uninitialized reads as NaN, so a missing mask shows up as NaN instead of as silently
wrong (stale but finite) numbers.

Source: the seed article, section "Correctness tangent"; torch ``varlen_attn`` undefined gradients
at padded capacity: pytorch/pytorch issue #176793.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from ..ragged import active_token_mask

Tensor = torch.Tensor

__all__ = [
    "active_token_mask",
    "mask_inactive_token_gradients",
    "mask_inactive_tokens",
    "uninitialized_memory_as_nan",
]


def _check_mask_arguments(function: str, x: object, active: object) -> None:
    """Raise unless ``x`` is a ``[T, ...]`` tensor and ``active`` a bool ``[T]`` on its device.

    Looks only at metadata, never at values, so it is safe inside graph capture.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{function}: x must be a torch.Tensor of shape [T, ...], got {type(x).__name__}")
    if x.ndim == 0:
        raise ValueError(f"{function}: x must have a token dimension (shape [T, ...]), got a 0-d tensor")
    if not isinstance(active, Tensor):
        raise TypeError(
            f"{function}: active must be a bool torch.Tensor of shape [T] (see active_token_mask), "
            f"got {type(active).__name__}"
        )
    if active.dtype != torch.bool:
        raise TypeError(f"{function}: active must have dtype torch.bool, got {active.dtype}")
    if active.shape != x.shape[:1]:
        raise ValueError(
            f"{function}: active must have shape [T] = [{x.shape[0]}] (x's token dimension), "
            f"got {tuple(active.shape)}"
        )
    if active.device != x.device:
        raise ValueError(f"{function}: active must be on x's device {x.device}, got {active.device}")


def _rows(active: Tensor, x: Tensor) -> Tensor:
    """``active`` viewed as ``[T, 1, ..., 1]`` so that it broadcasts over ``x``'s row."""
    return active.view(-1, *(1,) * (x.ndim - 1))


def mask_inactive_tokens(x: Tensor, active: Tensor) -> Tensor:
    """Value mask: zero the inactive rows of ``x`` and of the gradient flowing back into ``x``.

    Rule enforced: *no inactive row reaches an op where rows mix or reduce.* Put it before the
    first op that would read the inactive rows together with active ones, or save them for a
    backward reduction over rows (a projection's ``∇W = Xᵀ∇Y``, a norm's gain gradient), and
    right after an op that leaves its inactive output rows undefined.

    ``torch.where(active, x, 0)``: a select, so NaN, ±Inf or huge values in the inactive rows give
    exactly 0, and the active rows are returned bit for bit. The backward selects the same way, so
    an undefined upstream gradient in an inactive row becomes 0 too.

    Args:
        x: ``[T, ...]`` tensor, any dtype and device.
        active: bool ``[T]`` on ``x``'s device, True for the ``L`` active rows (from
            :func:`active_token_mask`).

    Returns:
        A new tensor like ``x``: active rows equal to ``x``'s, inactive rows 0.

    Raises:
        TypeError: ``x`` or ``active`` is not a tensor, or ``active`` is not bool.
        ValueError: ``x`` is 0-d, or ``active`` is not ``[T]`` on ``x``'s device.

    Capturable: one elementwise kernel, no host read. Source: seed article, section
    "Correctness tangent" (``mask_inactive_tokens``).
    """
    _check_mask_arguments("mask_inactive_tokens", x, active)
    return torch.where(_rows(active, x), x, 0)


class _InactiveGradientBarrier(torch.autograd.Function):
    """Identity forward; backward keeps only the active rows of the incoming gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, active: Tensor) -> Tensor:
        ctx.save_for_backward(active)
        # A view, not a copy: the barrier costs nothing in the forward pass.
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (active,) = ctx.saved_tensors
        return torch.where(_rows(active, grad), grad, 0), None


def mask_inactive_token_gradients(x: Tensor, active: Tensor) -> Tensor:
    """Gradient barrier: identity in the forward pass, zero inactive rows of the gradient in backward.

    Rule enforced: *an undefined input gradient of a ragged op never reaches a reduction upstream.*
    Put it right after the op whose weight gradient reduces over rows (typically a projection)
    and right before the ragged op whose backward leaves inactive-row input gradients undefined.
    Then ``∇W = Xᵀ∇Y`` sees exact zeros in ``∇Y``'s inactive rows instead of garbage. It does not
    clean the values: if ``x``'s inactive rows can be non-finite and are reduced over, use
    :func:`mask_inactive_tokens` as well (upstream of the op that reduces).

    The backward is ``torch.where(active, grad, 0)``, a select, so a NaN or Inf gradient in an
    inactive row becomes exactly 0 and active rows pass through bit for bit. The forward returns a
    view of ``x`` (no copy), including whatever its inactive rows hold.

    Args:
        x: ``[T, ...]`` tensor, any floating dtype and device.
        active: bool ``[T]`` on ``x``'s device, True for the ``L`` active rows (from
            :func:`active_token_mask`).

    Returns:
        A view of ``x`` whose gradient is masked in backward.

    Raises:
        TypeError: ``x`` or ``active`` is not a tensor, or ``active`` is not bool.
        ValueError: ``x`` is 0-d, or ``active`` is not ``[T]`` on ``x``'s device.

    Capturable: no kernel in forward, one elementwise kernel in backward, no host read. Source:
    seed article, section "Correctness tangent" (``mask_inactive_token_gradients``).
    """
    _check_mask_arguments("mask_inactive_token_gradients", x, active)
    return _InactiveGradientBarrier.apply(x, active)


@contextlib.contextmanager
def uninitialized_memory_as_nan() -> Iterator[None]:
    """Within the block, memory an op leaves uninitialized reads as NaN (ints: their max value).

    Undefined rows normally hold whatever the allocator hands back: stale activations that are
    usually finite, so a missing mask silently produces wrong gradients rather than NaN. This
    makes the failure visible and deterministic. It uses PyTorch's own switch for that,
    ``torch.utils.deterministic.fill_uninitialized_memory``, which only acts while
    ``torch.use_deterministic_algorithms`` is on; so the block turns deterministic algorithms on
    in ``warn_only`` mode (ops without a deterministic implementation still run; their warnings
    are silenced here) and restores the previous settings on exit.

    For demonstrations and tests, not for timing: filling costs one memset per allocation, and
    deterministic mode may select slower kernels.

    Yields:
        None.

    Source: PyTorch docs, ``torch.use_deterministic_algorithms`` and
    ``torch.utils.deterministic.fill_uninitialized_memory``.
    """
    was_enabled = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    try:
        with warnings.catch_warnings():
            # Only the alerts that deterministic mode itself raises ("... does not have a
            # deterministic implementation", cuBLAS workspace); every other warning still shows.
            warnings.filterwarnings("ignore", message=r"(?s).*deterministic", category=UserWarning)
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = True
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
        torch.use_deterministic_algorithms(was_enabled, warn_only=was_warn_only)
