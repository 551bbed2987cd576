"""The masks of attn_gym_lite.ops.masking, and the proof that each masked op is exact at capacity:
with NaN, +Inf or huge values in the inactive rows, the loss and every gradient at capacity T equal
those on the L real rows alone (attn_gym_lite.testing.exactness); without the masks the test asserts
the contamination. Layouts are random (hypothesis), with L = T, L = 0 and M < N among them.
"""

import json
import math
from unittest import mock

import pytest
import torch
from helpers import (
    EDGE_LAYOUTS,
    FAST,
    FILLS,
    assert_exact,
    attention_with_undefined_capacity,
    calling,
    contaminated,
    fill_inactive,
    filled_input_and_target,
    padded_and_exact,
    ragged_layouts,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from attn_gym_lite.models import VarLenAttention
from attn_gym_lite.ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens, uninitialized_memory_as_nan
from attn_gym_lite.ops.short_conv import ShortConv
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.testing.exactness import capacity_loss, compare_gradients, error_stats, gradients_at_capacity


@FAST
@given(layout=ragged_layouts(), fill=st.sampled_from(FILLS), width=st.integers(1, 3))
def test_mask_inactive_tokens_selects_values_and_gradients(layout, fill, width):
    tokens, cu = layout
    active_tokens = int(cu[-1])
    x = fill_inactive(torch.randn(tokens, width, 2, dtype=torch.float64), cu, fill).requires_grad_()
    active = active_token_mask(x, cu)
    out = mask_inactive_tokens(x, active)
    assert torch.equal(out[:active_tokens], x[:active_tokens])  # bit for bit
    assert torch.equal(out[active_tokens:], torch.zeros_like(out[active_tokens:]))  # not NaN * 0
    upstream = fill_inactive(torch.randn_like(x), cu, fill)
    (grad,) = torch.autograd.grad(out, x, upstream)
    assert torch.equal(grad[:active_tokens], upstream[:active_tokens])
    assert torch.equal(grad[active_tokens:], torch.zeros_like(grad[active_tokens:]))


@FAST
@given(layout=ragged_layouts(), fill=st.sampled_from(FILLS))
def test_gradient_barrier_is_identity_forward_and_selects_in_backward(layout, fill):
    tokens, cu = layout
    active_tokens = int(cu[-1])
    x = fill_inactive(torch.randn(tokens, 3, dtype=torch.float64), cu, fill).requires_grad_()
    out = mask_inactive_token_gradients(x, active_token_mask(x, cu))
    assert out.data_ptr() == x.data_ptr(), "the barrier must not copy in the forward pass"
    torch.testing.assert_close(out, x, rtol=0, atol=0, equal_nan=True)  # inactive rows untouched
    upstream = fill_inactive(torch.randn_like(x), cu, fill)
    (grad,) = torch.autograd.grad(out, x, upstream)
    assert torch.equal(grad[:active_tokens], upstream[:active_tokens])
    assert torch.equal(grad[active_tokens:], torch.zeros_like(grad[active_tokens:]))


@pytest.mark.parametrize("enabled", [False, True])
@pytest.mark.parametrize("warn_only", [False, True])
@pytest.mark.parametrize("filling", [False, True])
def test_uninitialized_memory_as_nan_reveals_and_restores(enabled, warn_only, filling):
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = filling
    try:
        with uninitialized_memory_as_nan():
            assert torch.empty(64).isnan().all()
            assert torch.empty_like(torch.zeros(3, dtype=torch.bfloat16)).isnan().all()
            assert torch.empty(2, dtype=torch.int32).eq(torch.iinfo(torch.int32).max).all()
        assert torch.are_deterministic_algorithms_enabled() is enabled
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
        assert torch.utils.deterministic.fill_uninitialized_memory is filling
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True


class _Projection(nn.Module):
    """``Y = X W``, optionally behind a value mask: its weight gradient reduces over every row."""

    def __init__(self, masked):
        super().__init__()
        self.masked = masked
        self.proj = nn.Linear(4, 3, bias=False, dtype=torch.float64)

    def forward(self, x, cu_seqlens, max_seqlen):
        if self.masked:
            x = mask_inactive_tokens(x, active_token_mask(x, cu_seqlens))
        return self.proj(x)


@FAST
@given(layout=ragged_layouts(), fill=st.sampled_from(FILLS))
def test_value_mask_makes_a_projection_exact_at_capacity(layout, fill):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 4, 3, seed=0)
    module = _Projection(masked=True)
    assert_exact(padded_and_exact(module, x, target, cu, tokens), rtol=1e-12)
    # Without the mask ∇W = Xᵀ∇Y sums the inactive rows: ∇Y is 0 there, but NaN * 0 and Inf * 0 are
    # NaN (a huge finite value times 0 is 0: it hurts only where its gradient is not 0).
    module.masked = False
    if fill != "huge" and int(cu[-1]) < tokens:
        assert "proj.weight" in contaminated(padded_and_exact(module, x, target, cu, tokens), 1e-12)


class _ProjectionIntoShortConv(nn.Module):
    """value mask -> projection -> [gradient barrier] -> ragged short convolution."""

    def __init__(self, barrier):
        super().__init__()
        self.barrier = barrier
        self.proj = nn.Linear(4, 6, bias=False, dtype=torch.float64)
        self.conv = ShortConv(6, 4, dtype=torch.float64)

    def forward(self, x, cu_seqlens, max_seqlen):
        active = active_token_mask(x, cu_seqlens)
        h = self.proj(mask_inactive_tokens(x, active))
        if self.barrier:
            h = mask_inactive_token_gradients(h, active)
        return self.conv(h, cu_seqlens)


@FAST
@given(layout=ragged_layouts(), fill=st.sampled_from(FILLS))
def test_gradient_barrier_stops_undefined_short_conv_gradients(layout, fill):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 4, 6, seed=0)
    module = _ProjectionIntoShortConv(barrier=True)
    with uninitialized_memory_as_nan():  # undefined rows read as NaN, deterministically
        assert_exact(padded_and_exact(module, x, target, cu, tokens), rtol=1e-12)
        module.barrier = False
        if int(cu[-1]) < tokens:  # the conv's undefined ∇input rows reach ∇W of the projection
            assert contaminated(padded_and_exact(module, x, target, cu, tokens), 1e-12) == {"proj.weight"}


@FAST
@given(layout=ragged_layouts(max_tokens=10), fill=st.sampled_from(FILLS), causal=st.booleans())
def test_varlen_attention_module_is_exact_at_capacity(layout, fill, causal):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 8, 8, seed=0)
    module = VarLenAttention(8, 2, causal=causal, mask_inactive_capacity=True).double()
    assert_exact(padded_and_exact(module, x, target, cu, tokens), rtol=1e-10)
    undefined = calling(attention_with_undefined_capacity)
    with mock.patch("attn_gym_lite.models.attention.varlen_attention", undefined):
        assert_exact(padded_and_exact(module, x, target, cu, tokens), rtol=1e-10)
        # Without masks, torch's contract (undefined output rows and q/k/v gradients past L)
        # reaches the output projection's weight gradient, whatever the input rows hold.
        module.mask_inactive_capacity = False
        if int(cu[-1]) < tokens:
            assert "out_proj.weight" in contaminated(padded_and_exact(module, x, target, cu, tokens), 1e-10)


@pytest.mark.parametrize("layout", EDGE_LAYOUTS.values(), ids=EDGE_LAYOUTS.keys())
@pytest.mark.parametrize("fill", FILLS)
def test_edge_layouts_through_the_projection_and_short_conv(layout, fill):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 4, 6, seed=0)
    with uninitialized_memory_as_nan():
        report = padded_and_exact(_ProjectionIntoShortConv(barrier=True), x, target, cu, tokens)
    assert_exact(report, rtol=1e-12)
    if int(cu[-1]) == 0:  # nothing is real: the loss and every gradient are exactly 0
        assert report["loss_at_capacity"] == 0 and all(g["max_abs_exact"] == 0 for g in report["gradients"].values())


def test_capacity_loss_is_the_inner_product_over_active_rows():
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([2, 1]), 3)
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [math.nan, 1.0]], requires_grad=True)
    target = torch.tensor([[1.0, 0.5], [2.0, -1.0], [0.0, 1.0], [1.0, math.inf]])
    loss = capacity_loss(y, target, active_token_mask(y, cu))
    assert loss.item() == 1 * 1 + 2 * 0.5 + 3 * 2 - 4 + 6  # = 10, by hand
    (grad,) = torch.autograd.grad(loss, y)
    assert torch.equal(grad, torch.tensor([[1.0, 0.5], [2.0, -1.0], [0.0, 1.0], [0.0, 0.0]]))
    # float16 target with a float64 y: accumulated in float64 (promote(y, float32)), same value.
    assert capacity_loss(y.double(), target.half(), active_token_mask(y, cu)).item() == 10


def test_compare_gradients_and_error_stats_stay_json_ready_and_exact():
    """A NaN loss becomes None (JSON has no NaN); complex differences keep their imaginary part."""
    module = _Projection(masked=True)
    x, target = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([2, 2]), 3)
    loss, grads = gradients_at_capacity(module, x, target, cu, 5)
    report = compare_gradients((loss, grads), (torch.tensor(math.nan), grads))
    assert report["loss_exact"] is None and report["loss_at_capacity"] == loss.item()
    json.dumps(report, allow_nan=False)
    stats = error_stats(torch.ones(2), torch.full((2,), 1j))
    assert stats["max_abs_diff"] == pytest.approx(math.sqrt(2)) and stats["max_abs_ref"] == 1.0
    stats = error_stats(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]))
    assert stats == {"nonfinite": 0, "max_abs_diff": 0.5, "max_abs_ref": 2.0, "rel_err": 0.25}
