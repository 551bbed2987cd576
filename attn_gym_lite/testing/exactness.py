"""Is training at padded capacity exact? Gradients at capacity ``T`` versus on the ``L`` real rows.

The "Masking" chapter's claim: with the masks in place, one step at capacity ``T`` gives the loss
and gradients of the same step on the ``L`` real rows, whatever the inactive rows hold. For any
``module(x [T, D_in], cu_seqlens, max_seqlen) -> [T, D_out]``, with the loss ``Σ_{t<L} ⟨y_t, target_t⟩``
(a stand-in for any per-token loss).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.masking import active_token_mask, mask_inactive_tokens
from ..ragged import max_seqlen as longest_sequence
from ..ragged import validate_cu_seqlens

Tensor = torch.Tensor

__all__ = ["capacity_loss", "compare_gradients", "error_stats", "exact_gradients", "gradients_at_capacity"]


def capacity_loss(y: Tensor, target: Tensor, active: Tensor) -> Tensor:
    """``Σ_{t active} ⟨y_t, target_t⟩`` in at least float32. Both factors are value-masked first
    (a sum is a reduction and ``NaN * 0`` is NaN), so ``y``'s inactive rows get exactly 0 gradient."""
    accumulate = torch.promote_types(y.dtype, torch.float32)
    y, target = mask_inactive_tokens(y, active), mask_inactive_tokens(target, active)
    return (y.to(accumulate) * target.to(accumulate)).sum()


def gradients_at_capacity(module: nn.Module, x: Tensor, target: Tensor, cu_seqlens: Tensor,
                          max_seqlen: int) -> tuple[Tensor, dict[str, Tensor]]:
    """``(loss, {"input": ∇x, parameter name: ∇p})`` of one step on all ``T`` rows (zero for a parameter
    the loss does not reach). No host reads: a CUDA graph of this call replays with new batches."""
    leaf = x.detach().requires_grad_()
    named = list(module.named_parameters())
    parameters = [p for _, p in named]
    loss = capacity_loss(module(leaf, cu_seqlens, max_seqlen), target, active_token_mask(leaf, cu_seqlens))
    grads = torch.autograd.grad(loss, [leaf, *parameters], allow_unused=True, materialize_grads=True)
    return loss, dict(zip(["input", *(n for n, _ in named)], grads))


def exact_gradients(module: nn.Module, x: Tensor, target: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The same step on exactly the ``L`` real rows (``cu_seqlens`` cut after its first ``L``,
    ``max_seqlen`` the longest sequence); ``L = 0`` gives zeros. Eager: reads ``cu_seqlens``."""
    validate_cu_seqlens(cu_seqlens, x.shape[0])
    bounds = cu_seqlens.tolist()
    L = bounds[-1]
    if L == 0:  # a sum over no tokens
        zeros = {"input": torch.zeros_like(x), **{n: torch.zeros_like(p) for n, p in module.named_parameters()}}
        return x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32)), zeros
    exact_cu = cu_seqlens[: bounds.index(L) + 1]
    loss, grads = gradients_at_capacity(module, x[:L], target[:L], exact_cu, longest_sequence(exact_cu))
    grad_x = torch.zeros_like(x)
    grad_x[:L] = grads.pop("input")
    return loss, {"input": grad_x, **grads}


def error_stats(ours: Tensor, reference: Tensor) -> dict:
    """How far ``ours`` is from ``reference``, JSON-ready (``None`` where a number is not finite):
    ``{"nonfinite": count in ours, "max_abs_diff", "max_abs_ref", "rel_err": diff / max(ref, 1e-12)}``.

    Compared in float64 (complex128 for complex inputs). Eager.
    """
    if ours.shape != reference.shape:  # broadcasting would compare other entries
        raise ValueError(f"error_stats: ours and reference must have one shape, got {tuple(ours.shape)} and "
                         f"{tuple(reference.shape)}")
    wide = torch.complex128 if ours.is_complex() or reference.is_complex() else torch.float64
    ours, reference = ours.detach().to(wide), reference.detach().to(wide)

    def largest(t: Tensor) -> float | None:
        value = float(t.abs().max()) if t.numel() else 0.0
        return value if math.isfinite(value) else None

    diff = largest(ours - reference)  # max propagates NaN: any non-finite entry gives None
    max_ref = largest(reference)
    rel_err = None if diff is None or max_ref is None else diff / max(max_ref, 1e-12)
    return {"nonfinite": int((~torch.isfinite(ours)).sum()), "max_abs_diff": diff, "max_abs_ref": max_ref,
            "rel_err": rel_err}


def compare_gradients(at_capacity: tuple[Tensor, dict[str, Tensor]], exact: tuple[Tensor, dict[str, Tensor]]) -> dict:
    """Per gradient, :func:`error_stats` at capacity against the exact one, JSON-ready:
    ``{"loss_at_capacity", "loss_exact", "gradients": {name: {"nonfinite", "max_abs_diff", "max_abs_exact"}}}``."""
    (loss, grads), (exact_loss, exact_grads) = at_capacity, exact
    report = {}
    for name, grad in grads.items():
        stats = error_stats(grad.cpu(), exact_grads[name].cpu())
        report[name] = {"nonfinite": stats["nonfinite"], "max_abs_diff": stats["max_abs_diff"],
                        "max_abs_exact": stats["max_abs_ref"]}
    loss_value, exact_value = float(loss.detach()), float(exact_loss.detach())
    return {"loss_at_capacity": loss_value if math.isfinite(loss_value) else None,
            "loss_exact": exact_value if math.isfinite(exact_value) else None, "gradients": report}
