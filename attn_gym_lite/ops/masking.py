"""Masking the inactive capacity of a packed batch, in values and in gradients.

At capacity ``T`` only the first ``L = cu_seqlens[-1]`` rows are real; the others may hold NaN,
backward passes reduce over every row (``∇W = Xᵀ∇Y``), and ragged kernels leave rows past ``L``
undefined. The rule: mask where inactive rows can mix, reduce, or become undefined, and nowhere
else. Both masks *select* with ``torch.where`` (``NaN * 0`` is NaN) and are capturable.
Source: the seed article, "Correctness tangent"; pytorch/pytorch issue #176793.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from ..ragged import active_token_mask

Tensor = torch.Tensor

__all__ = ["active_token_mask", "mask_inactive_token_gradients", "mask_inactive_tokens", "uninitialized_memory_as_nan"]


def _rows(active: Tensor, x: Tensor) -> Tensor:
    return active.view(-1, *(1,) * (x.ndim - 1))  # [T] -> [T, 1, ..., 1], to broadcast over a row


def mask_inactive_tokens(x: Tensor, active: Tensor) -> Tensor:
    """Value mask: zero the inactive rows of ``x [T, ...]`` and of its gradient (``active``: bool ``[T]``).

    Put it before an op that mixes rows or saves them for a reduction in backward, and after an
    op that leaves its inactive output rows undefined. A select, so NaN or Inf there gives exactly 0.
    """
    return torch.where(_rows(active, x), x, 0)


class _InactiveGradientBarrier(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, active: Tensor) -> Tensor:
        ctx.save_for_backward(active)
        return x.view_as(x)  # a view: the barrier costs nothing in the forward pass

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (active,) = ctx.saved_tensors
        return torch.where(_rows(active, grad), grad, 0), None


def mask_inactive_token_gradients(x: Tensor, active: Tensor) -> Tensor:
    """Gradient barrier: identity forward, zero inactive rows of the gradient in backward.

    Put it between an op whose weight gradient reduces over rows (a projection) and a ragged op
    whose backward leaves inactive input-gradient rows undefined. It does not clean values.
    """
    return _InactiveGradientBarrier.apply(x, active)


@contextlib.contextmanager
def uninitialized_memory_as_nan() -> Iterator[None]:
    """Within the block, uninitialized memory reads as NaN (ints: their max), so a missing mask shows
    as NaN, not stale finite numbers. torch's ``fill_uninitialized_memory`` acts only under
    deterministic algorithms, turned on here in ``warn_only`` mode; settings restored on exit."""
    was_enabled = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    try:
        with warnings.catch_warnings():
            # Only deterministic mode's own alerts; every other warning still shows.
            warnings.filterwarnings("ignore", message=r"(?s).*deterministic", category=UserWarning)
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = True
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
        torch.use_deterministic_algorithms(was_enabled, warn_only=was_warn_only)
