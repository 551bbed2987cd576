"""The ragged short convolution (tensor ops and Triton kernels) against a float64 token loop."""

import math

import pytest
import torch
from helpers import EDGE_LAYOUTS, FAST, FILLS, fill_inactive, naive_short_conv, ragged_layouts
from hypothesis import given
from hypothesis import strategies as st

from attn_gym_lite.ops.masking import uninitialized_memory_as_nan
from attn_gym_lite.ops.short_conv import ShortConv, resolve_short_conv_impl, short_conv
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

# The kernels run compiled on a GPU, or on CPU tensors in Triton's interpreter (conftest.py sets
# TRITON_INTERPRET=1 without a GPU), in float32 at most.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON_RUNS = resolve_short_conv_impl("auto", torch.zeros(1, 1, device=DEVICE)) == "triton"
needs_triton = pytest.mark.skipif(not TRITON_RUNS, reason="the Triton kernels need Triton, and a GPU or TRITON_INTERPRET=1")
IMPLS = ["torch", pytest.param("triton", marks=needs_triton)]


def silu_then(y, activation):
    return y * torch.sigmoid(y) if activation == "silu" else y


def against_the_loop(impl, tokens, cu, channels, width, fill, activation, seed):
    """``short_conv`` (``fill`` in the inactive rows of x and of dy) against the float64 loop: the
    output, the input gradient and the weight gradient on the active rows. The tensor ops run in
    float64, the kernels in float32."""
    active = int(cu[-1])
    dtype, device, tolerance = (torch.float64, "cpu", 1e-12) if impl == "torch" else (torch.float32, DEVICE, 1e-5)
    g = torch.Generator().manual_seed(seed)
    x = fill_inactive(torch.randn(tokens, channels, generator=g, dtype=dtype), cu, fill).to(device).requires_grad_()
    weight = torch.randn(channels, width, generator=g, dtype=dtype).to(device).requires_grad_()
    upstream = fill_inactive(torch.randn(tokens, channels, generator=g, dtype=dtype), cu, fill).to(device)
    y = short_conv(x, weight, cu.to(device), activation=activation, impl=impl)
    grad_x, grad_weight = torch.autograd.grad(y, (x, weight), upstream)
    if active == 0:  # no real token: nothing to learn
        assert torch.equal(grad_weight, torch.zeros_like(grad_weight))
        return
    clean_x = x.detach().cpu()[:active].double().requires_grad_()
    weight64 = weight.detach().cpu().double().requires_grad_()
    expected = silu_then(naive_short_conv(clean_x, weight64, cu), activation)
    expected_grads = torch.autograd.grad(expected, (clean_x, weight64), upstream.cpu()[:active].double())
    close = dict(rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(y[:active].cpu().double(), expected, **close)
    torch.testing.assert_close(grad_x[:active].cpu().double(), expected_grads[0], **close)
    torch.testing.assert_close(grad_weight.cpu().double(), expected_grads[1], rtol=tolerance, atol=tolerance * active)


@pytest.mark.parametrize("impl", IMPLS)
@FAST
@given(layout=ragged_layouts(max_tokens=40), fill=st.sampled_from(FILLS), width=st.integers(1, 5),
       channels=st.integers(1, 140), activation=st.sampled_from([None, "silu"]), seed=st.integers(0, 2**16))
def test_equals_the_float64_token_loop(impl, layout, fill, width, channels, activation, seed):
    # NaN/Inf in the inactive rows of x and of dy; up to 140 channels (three 64-wide blocks) and 40
    # rows (two 32-row blocks) cross the kernels' tiles.
    against_the_loop(impl, *layout, channels, width, fill, activation, seed)


@needs_triton
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("lengths", [[64, 64, 21], [63, 2, 70, 1], [3, 0, 150], [200]],
                         ids=["start at a block edge", "start one row before it", "empty, long", "one"])
def test_the_kernels_carry_the_halo_and_sum_dw_across_row_and_channel_blocks(lengths, activation):
    # Taps read up to W-1 rows of the block before (the halo), each row block writes its part of dw:
    # seven row blocks, three channel blocks, sequence starts at and one row before a block edge.
    from attn_gym_lite.ops import short_conv_triton as kernels

    assert 64 % kernels.BLOCK_T == 0 and 130 > 2 * kernels.BLOCK_D  # the layouts rely on the tile
    cu = cu_seqlens_from_lengths(lengths)
    against_the_loop("triton", int(cu[-1]) + 10, cu, 130, 4, "nan", activation, len(lengths))


def test_auto_resolves_to_the_kernels_where_they_run_and_refuses_what_they_cannot_do():
    x = torch.zeros(4, 3, dtype=torch.float64)
    assert resolve_short_conv_impl("auto", x) == "torch"  # float64: the tensor ops
    assert resolve_short_conv_impl("auto", x.float().to(DEVICE)) == ("triton" if TRITON_RUNS else "torch")
    assert resolve_short_conv_impl("auto", torch.empty(6, 2, device="meta")) == "torch"
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="weight"):  # the kernels would read past the weight
        short_conv(x, torch.zeros(2, 2, dtype=torch.float64), cu)
    if TRITON_RUNS:
        with pytest.raises(ValueError, match="impl='triton'"):
            short_conv(x.to(DEVICE), torch.zeros(3, 2, dtype=torch.float64, device=DEVICE), cu.to(DEVICE), impl="triton")
        x = torch.randn(6, 2, device=DEVICE, requires_grad=True)
        y = short_conv(x, torch.randn(2, 3, device=DEVICE), cu.to(DEVICE), impl="triton")
        (gx,) = torch.autograd.grad(y[:4].pow(2).sum(), (x,), create_graph=True)
        with pytest.raises(RuntimeError, match="no autograd formula"):  # not a silent zero second derivative
            gx.sum().backward()


@pytest.mark.parametrize("activation", [None, "silu"])
def test_the_tensor_ops_differentiate_twice_without_nan_from_inactive_rows(activation):
    # NaN in the inactive rows of dy (or of x, with the SiLU) must not reach the second-order
    # gradients of active rows and of the weight: the backward selects before it multiplies.
    torch.manual_seed(0)
    tokens, active, channels, width = 7, 5, 2, 3
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    x, w, dy = (torch.randn(*shape, dtype=torch.float64) for shape in ((tokens, channels), (channels, width),
                                                                        (tokens, channels)))
    dirty_x, dirty_dy = x.clone(), dy.clone()
    dirty_x[active:], dirty_dy[active:] = float("nan"), float("inf")
    results = []
    for inputs, upstream, op in ((dirty_x, dirty_dy, "short_conv"), (x[:active], dy[:active], "loop")):
        xi, wi = inputs.clone().requires_grad_(), w.clone().requires_grad_()
        if op == "short_conv":
            y = short_conv(xi, wi, cu, activation=activation, impl="torch")
        else:
            y = silu_then(naive_short_conv(xi, wi, cu), activation)
        gx, gw = torch.autograd.grad(y, (xi, wi), upstream[: y.shape[0]], create_graph=True)
        hx, hw = torch.autograd.grad((gx[:active] ** 2).sum() + (gw ** 2).sum(), (xi, wi))
        results.append((hx[:active], hw))
    for mine, expected in zip(*results):
        torch.testing.assert_close(mine, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", EDGE_LAYOUTS.values(), ids=EDGE_LAYOUTS.keys())
def test_inactive_output_and_input_gradient_rows_are_left_undefined(layout, impl):
    # Why the blocks need a gradient barrier: rows L..T-1 of the output and of ∇input are never written.
    tokens, cu = layout
    active = int(cu[-1])
    x = torch.randn(tokens, 4, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    with uninitialized_memory_as_nan():
        y = short_conv(x, weight, cu.to(DEVICE), impl=impl)
        grad_x, grad_weight = torch.autograd.grad(y, (x, weight), torch.ones_like(y))
    for rows in (y, grad_x):
        assert rows[:active].isfinite().all() and rows[active:].isnan().all()
    assert grad_weight.isfinite().all()  # reduced over active rows only


def test_documents_never_see_the_previous_document_and_the_module_initialises_like_conv1d():
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([5, 3, 6]), 5)
    x = torch.randn(16, 2, dtype=torch.float64)
    weight = torch.randn(2, 4, dtype=torch.float64)
    changed = x.clone()
    changed[:8] += 100.0  # everything in documents 0 and 1
    a, b = short_conv(x, weight, cu), short_conv(changed, weight, cu)
    torch.testing.assert_close(a[8:14], b[8:14], rtol=0, atol=0)  # document 2 is untouched
    assert not torch.allclose(a[5:8], b[5:8])
    # The first token of a document is its own tap times the last weight column, nothing else.
    torch.testing.assert_close(a[[0, 5, 8]], x[[0, 5, 8]] * weight[:, 3])
    conv = ShortConv(512, 4)  # initialised like a depthwise nn.Conv1d
    assert conv.weight.shape == (512, 4) and conv.weight.abs().max() <= 1 / math.sqrt(4)
    assert conv.weight.std().item() == pytest.approx(1 / math.sqrt(4) / math.sqrt(3), rel=0.05)  # uniform


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_with_new_layouts_matches_the_loop(dtype, impl):
    from attn_gym_lite.graph.capture import capture_graph

    tokens, channels = 256, 64
    torch.manual_seed(0)
    weight = torch.randn(channels, 4, device="cuda", dtype=dtype, requires_grad=True)
    static_x = torch.zeros(tokens, channels, device="cuda", dtype=dtype, requires_grad=True)
    static_upstream = torch.zeros(tokens, channels, device="cuda", dtype=dtype)
    static_cu = torch.zeros(9, dtype=torch.int32, device="cuda")

    def step():
        y = short_conv(static_x, weight, static_cu, impl=impl)
        return (y, *torch.autograd.grad(y, (static_x, weight), static_upstream))

    graph, (y, grad_x, grad_weight) = capture_graph(step)
    tolerance = {"rtol": 2e-2, "atol": 5e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    for lengths in ([256], [100, 1, 60], [0], [3, 0, 7, 90, 2, 40, 1, 13]):
        cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 8)
        active = sum(lengths)
        with torch.no_grad():
            static_x.copy_(fill_inactive(torch.randn(tokens, channels, dtype=dtype), cu, "nan"))
            static_upstream.copy_(fill_inactive(torch.randn(tokens, channels, dtype=dtype), cu, "inf"))
        static_cu.copy_(cu)
        graph.replay()
        if active == 0:
            assert torch.equal(grad_weight, torch.zeros_like(grad_weight))
            continue
        x64 = static_x.detach().double().cpu()[:active].requires_grad_()
        w64 = weight.detach().double().cpu().requires_grad_()
        expected = naive_short_conv(x64, w64, cu)
        e_grad_x, e_grad_w = torch.autograd.grad(expected, (x64, w64), static_upstream.double().cpu()[:active])
        torch.testing.assert_close(y[:active].double().cpu(), expected, **tolerance)
        torch.testing.assert_close(grad_x[:active].double().cpu(), e_grad_x, **tolerance)
        torch.testing.assert_close(grad_weight.double().cpu(), e_grad_w, rtol=tolerance["rtol"],
                                   atol=tolerance["atol"] * max(1.0, active ** 0.5))
