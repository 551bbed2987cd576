"""Is training at padded capacity exact? Gradients at capacity ``T`` versus on the ``L`` real rows.

The claim the "Masking" chapter proves: with the masks in the right places, one training step on
a packed batch padded to capacity ``T`` gives *the same* loss and gradients as the same step on
exactly the ``L = cu_seqlens[-1]`` real rows, with no capacity at all, whatever the ``T - L``
inactive rows hold. Three functions make the comparison, for any module called as
``module(x [T, D_in], cu_seqlens, max_seqlen) -> [T, D_out]`` (``VarLenAttention``,
``ShortConvAttentionBlock``):

* :func:`gradients_at_capacity`: loss and gradients at capacity; device work only, so it can be
  captured in a CUDA graph and replayed with new batches;
* :func:`exact_gradients`: the same on ``x[:L]`` with the unpadded ``cu_seqlens``;
* :func:`compare_gradients`: per gradient, the non-finite entries at capacity and the largest
  difference to the exact one, as a JSON-ready dict.

The loss is the inner product of the output with a target, over the active rows:
``Σ_{t<L} ⟨y_t, target_t⟩`` (a stand-in for any per-token loss; its gradient with respect to
``y`` is the target). Gradients are taken for every parameter and for the input; the exact input
gradient is extended with zeros to ``T`` rows, since a row that does not exist gets no gradient.

Source: seed article, section "Correctness tangent"; the test layout follows the chapter's
"proof" (``tests/test_block.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..checks import FLOATING_DTYPES, check_int, check_tensor
from ..ops.masking import active_token_mask, mask_inactive_tokens
from ..ragged import max_seqlen as longest_sequence
from ..ragged import validate_cu_seqlens

Tensor = torch.Tensor

__all__ = ["capacity_loss", "compare_gradients", "error_stats", "exact_gradients", "gradients_at_capacity"]


def capacity_loss(y: Tensor, target: Tensor, active: Tensor) -> Tensor:
    """``Σ_{t active} ⟨y_t, target_t⟩``: a loss that selects the active rows, in float32 or wider.

    Both factors are value-masked first (:func:`~attn_gym_lite.ops.masking.mask_inactive_tokens`):
    a sum over rows is a reduction, and ``y * 0`` is NaN where ``y`` is NaN. The gradient it sends
    back to ``y``'s inactive rows is exactly 0. A zero gradient into an inactive row is all a loss
    mask can do: it does not clean the gradients of the parameters that produced the row.

    Args:
        y: ``[T, D]`` output, floating.
        target: ``[T, D]`` on ``y``'s device, floating (any of the four dtypes); its inactive rows
            may hold anything.
        active: bool ``[T]`` (:func:`~attn_gym_lite.ragged.active_token_mask`).

    Returns:
        0-d tensor in ``promote(y.dtype, float32)``. Capturable.

    Raises:
        TypeError: ``y`` or ``target`` is not a tensor, or not float16/bfloat16/float32/float64.
        ValueError: ``y`` or ``target`` is not 2-D, or ``target``'s shape or device differs from ``y``'s;
            and the errors of :func:`~attn_gym_lite.ops.masking.mask_inactive_tokens` (``active``).
    """
    # Floating both (an integer or complex y would give a loss with no gradient, or a complex
    # "loss"), 2-D, before y.dtype is read.
    check_tensor("capacity_loss: y", y, ndim=2, shape="[T, D]", dtypes=FLOATING_DTYPES)
    check_tensor("capacity_loss: target", target, ndim=2, shape="[T, D]", dtypes=FLOATING_DTYPES, device=y.device)
    if target.shape != y.shape:
        raise ValueError(f"capacity_loss: target must have y's shape {tuple(y.shape)}, got {tuple(target.shape)}")
    accumulate = torch.promote_types(y.dtype, torch.float32)
    y, target = mask_inactive_tokens(y, active), mask_inactive_tokens(target, active)
    return (y.to(accumulate) * target.to(accumulate)).sum()


def _differentiable_inputs(
    function: str, module: nn.Module, x: Tensor
) -> tuple[Tensor, list[str], list[Tensor]]:
    """A fresh leaf for ``x``, the gradient names (``"input"``, then parameters) and parameters."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{function}: module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(x, Tensor):
        raise TypeError(f"{function}: x must be a floating torch.Tensor of shape [T, D], got {type(x).__name__}")
    # The package's rule: a wrong dtype is a TypeError, a wrong shape a ValueError.
    if not x.dtype.is_floating_point:
        raise TypeError(
            f"{function}: x must be a floating tensor of shape [T, D], got {x.dtype} of shape {tuple(x.shape)}"
        )
    if x.ndim != 2:
        raise ValueError(
            f"{function}: x must be a floating tensor of shape [T, D], got {x.dtype} of shape {tuple(x.shape)}"
        )
    named = list(module.named_parameters())
    return x.detach().requires_grad_(), ["input", *(n for n, _ in named)], [p for _, p in named]


def gradients_at_capacity(
    module: nn.Module, x: Tensor, target: Tensor, cu_seqlens: Tensor, max_seqlen: int
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss and gradients of one step at token capacity ``T``.

    Args:
        module: called as ``module(x, cu_seqlens, max_seqlen)``, returning ``[T, D_out]``.
        x: ``[T, D_in]`` floating input; all ``T`` rows are fed to the module.
        target: ``[T, D_out]`` (:func:`capacity_loss`).
        cu_seqlens: int32 ``[N + 1]``, ``[0, ..., L, L, L]``.
        max_seqlen: the bound passed to the module (under a graph: ``T``).

    Returns:
        ``(loss, gradients)``: the 0-d :func:`capacity_loss`, and ``{"input": ∇x [T, D_in],
        parameter name: ∇p}`` in ``module.named_parameters()`` order. Parameters the loss does not
        reach get a zero gradient.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``; ``x`` is not a tensor or not floating;
            ``max_seqlen`` is not an integer (a bool included).
        ValueError: ``x`` is not 2-D; ``max_seqlen`` < 0; the errors of
            :func:`capacity_loss`.

    Capturable: no host reads (the loss selects rows with a device mask), so a CUDA graph of this
    call can be replayed with new batches copied into ``x``, ``target`` and ``cu_seqlens``.
    """
    leaf, names, parameters = _differentiable_inputs("gradients_at_capacity", module, x)
    max_seqlen = check_int("gradients_at_capacity: max_seqlen", max_seqlen, minimum=0)  # host only
    active = active_token_mask(leaf, cu_seqlens)
    loss = capacity_loss(module(leaf, cu_seqlens, max_seqlen), target, active)
    grads = torch.autograd.grad(loss, [leaf, *parameters], allow_unused=True, materialize_grads=True)
    return loss, dict(zip(names, grads))


def exact_gradients(
    module: nn.Module, x: Tensor, target: Tensor, cu_seqlens: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The same step as :func:`gradients_at_capacity` on exactly the ``L`` real rows.

    The module sees ``x[:L]`` and ``cu_seqlens`` cut after its first ``L`` entry (no empty tail
    slots), with ``max_seqlen`` the exact longest sequence. With ``L = 0`` there is nothing to run:
    the loss is a sum over no tokens, so it and every gradient are 0.

    Args:
        module, x, target, cu_seqlens: as for :func:`gradients_at_capacity` (``x`` and ``target``
            still at capacity ``T``; only their first ``L`` rows are read).

    Returns:
        ``(loss, gradients)`` keyed like :func:`gradients_at_capacity`; ``gradients["input"]``
        has ``T`` rows, zero past ``L``.

    Raises:
        The errors of :func:`~attn_gym_lite.ragged.validate_cu_seqlens` (with ``T = x.shape[0]``)
        and of :func:`gradients_at_capacity`; TypeError if ``target`` is not a tensor,
        ValueError if it does not have ``T`` rows (as :func:`gradients_at_capacity` refuses).

    Eager only: reads ``cu_seqlens`` on the host.
    """
    leaf, names, parameters = _differentiable_inputs("exact_gradients", module, x)
    # Only target[:L] is read, but a target of another capacity is a mismatched batch: refused
    # here as gradients_at_capacity refuses it, not only when L < its rows.
    check_tensor("exact_gradients: target", target, shape="[T, D_out]")
    if target.ndim == 0 or target.shape[0] != leaf.shape[0]:
        raise ValueError(f"exact_gradients: target must have x's T = {leaf.shape[0]} rows, got shape {tuple(target.shape)}")
    validate_cu_seqlens(cu_seqlens, leaf.shape[0])
    bounds = cu_seqlens.tolist()
    active_tokens = bounds[-1]
    zeros = [torch.zeros_like(t) for t in (leaf, *parameters)]
    if active_tokens == 0:
        return leaf.new_zeros((), dtype=torch.promote_types(leaf.dtype, torch.float32)), dict(zip(names, zeros))
    exact_cu = cu_seqlens[: bounds.index(active_tokens) + 1]
    loss, grads = gradients_at_capacity(
        module, leaf[:active_tokens], target[:active_tokens], exact_cu, longest_sequence(exact_cu)
    )
    zeros[0][:active_tokens] = grads.pop("input")
    return loss, {"input": zeros[0], **grads}


def error_stats(ours: Tensor, reference: Tensor) -> dict:
    """How far ``ours`` is from ``reference``, as JSON-ready numbers (JSON has no NaN).

    Args:
        ours, reference: tensors of one shape on one device, any dtypes; compared in float64 on
            that device (complex128 if either is complex: its imaginary part counts), only the
            four numbers are read back.

    Returns:
        ``{"nonfinite": int, "max_abs_diff": float | None, "max_abs_ref": float | None,
        "rel_err": float | None}``: the count of non-finite entries of ``ours``; the largest
        ``|ours - reference|``, ``None`` when it is not a number (a non-finite entry on either
        side); the largest ``|reference|``, ``None`` if not finite; ``max_abs_diff`` over
        ``max(max_abs_ref, 1e-12)``, ``None`` when either is. Empty tensors give 0 and 0.0s.

    Raises:
        TypeError: an argument is not a tensor.
        ValueError: the shapes differ (broadcasting would compare other entries); the devices
            differ, or the tensors are meta (no values to compare).

    Integer inputs are subtracted in int64 before widening, so ids past 2**53 still differ by 1
    (exact while the values and their difference fit in int64: uint64 values past 2**63 wrap).
    Eager only (reads values on the host).
    """
    for name, x in (("ours", ours), ("reference", reference)):
        if not isinstance(x, Tensor):
            raise TypeError(f"error_stats: {name} must be a torch.Tensor, got {type(x).__name__}")
    if ours.shape != reference.shape:
        raise ValueError(f"error_stats: ours and reference must have one shape, got {tuple(ours.shape)} and "
                         f"{tuple(reference.shape)}")
    if ours.device != reference.device or ours.device.type == "meta":
        raise ValueError(f"error_stats: ours and reference must be on one device with values (not meta), got "
                         f"{ours.device} and {reference.device}")
    # Integers past 2**53 lose their low bits in float64 (2**62 + 1 and 2**62 compared equal):
    # their difference is taken exactly in int64 first, where the inputs allow it.
    if not (ours.is_floating_point() or ours.is_complex() or reference.is_floating_point() or reference.is_complex()):
        exact = ours.detach().to(torch.int64) - reference.detach().to(torch.int64)
        diff = float(exact.abs().max()) if exact.numel() else 0.0
        max_ref = float(reference.detach().to(torch.float64).abs().max()) if reference.numel() else 0.0
        return {"nonfinite": 0, "max_abs_diff": diff, "max_abs_ref": max_ref,
                "rel_err": diff / max(max_ref, 1e-12)}
    # .double() of a complex tensor drops the imaginary part: |1 - 1j| came out as 1, not sqrt(2).
    wide = torch.complex128 if ours.is_complex() or reference.is_complex() else torch.float64
    ours, reference = ours.detach().to(wide), reference.detach().to(wide)

    def largest(t: Tensor) -> float | None:
        value = float(t.abs().max()) if t.numel() else 0.0
        return value if math.isfinite(value) else None

    nonfinite = int((~torch.isfinite(ours)).sum())
    diff = largest(ours - reference)  # max propagates NaN: any non-finite entry gives None
    max_ref = largest(reference)
    rel_err = None if diff is None or max_ref is None else diff / max(max_ref, 1e-12)
    return {"nonfinite": nonfinite, "max_abs_diff": diff, "max_abs_ref": max_ref, "rel_err": rel_err}


def compare_gradients(
    at_capacity: tuple[Tensor, dict[str, Tensor]], exact: tuple[Tensor, dict[str, Tensor]]
) -> dict:
    """Per gradient: non-finite entries at capacity and the largest difference to the exact one.

    Args:
        at_capacity: the result of :func:`gradients_at_capacity`.
        exact: the result of :func:`exact_gradients` for the same module and batch.

    Returns:
        JSON-ready ``{"loss_at_capacity": float | None, "loss_exact": float | None, "gradients": {name:
        {"nonfinite": int, "max_abs_diff": float | None, "max_abs_exact": float | None}}}``:
        :func:`error_stats` of each gradient at capacity against the exact one, on the CPU
        (``max_abs_exact`` is its ``max_abs_ref``). ``max_abs_diff`` is ``None`` when either gradient
        has non-finite entries (the difference is then not a number), ``max_abs_exact`` when the
        exact one has. A loss that is not finite is ``None`` (JSON has no NaN).

    Raises:
        TypeError: ``at_capacity`` or ``exact`` is not a ``(loss, gradients)`` pair of a
            one-element tensor and a dict of str -> tensor.
        ValueError: the two results do not name the same gradients with the same shapes.

    Eager only (reads values on the host).
    """
    (loss, grads), (exact_loss, exact_grads) = _check_result("at_capacity", at_capacity), _check_result("exact", exact)
    shapes = {k: tuple(v.shape) for k, v in grads.items()}
    exact_shapes = {k: tuple(v.shape) for k, v in exact_grads.items()}
    if shapes != exact_shapes:
        raise ValueError(
            "compare_gradients: at_capacity and exact must have the same gradient names and shapes, "
            f"got {shapes} and {exact_shapes}"
        )
    report = {}
    for name, grad in grads.items():
        stats = error_stats(grad.cpu(), exact_grads[name].cpu())
        report[name] = {key: stats[key] for key in ("nonfinite", "max_abs_diff")}
        report[name]["max_abs_exact"] = stats["max_abs_ref"]
    loss_value, exact_value = float(loss.detach()), float(exact_loss.detach())
    return {
        "loss_at_capacity": loss_value if math.isfinite(loss_value) else None,
        "loss_exact": exact_value if math.isfinite(exact_value) else None,
        "gradients": report,
    }


def _check_result(argument: str, value: object) -> tuple[Tensor, dict[str, Tensor]]:
    """``value`` as the ``(loss, gradients)`` pair :func:`gradients_at_capacity` returns."""
    expected = "a (loss, gradients) pair: a one-element loss tensor and a dict of name -> gradient tensor"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"compare_gradients: {argument} must be {expected}, got {type(value).__name__} {value!r:.60}")
    loss, grads = value
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        shown = f"shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
        raise TypeError(f"compare_gradients: {argument}[0] must be a one-element loss tensor, got {shown}")
    if not isinstance(grads, dict):
        raise TypeError(f"compare_gradients: {argument}[1] must be a dict of name -> gradient tensor, got {type(grads).__name__}")
    for name, grad in grads.items():
        if not isinstance(name, str) or not isinstance(grad, Tensor):
            raise TypeError(f"compare_gradients: {argument}[1] must be a dict of name -> gradient tensor, got "
                            f"{name!r}: {type(grad).__name__}")
    return loss, grads
