"""varlen_attention, the one entry point: every implementation against a float64 per-sequence loop,
the dispatch, and the rules it refuses (cu_seqlens's layout and values, max_seqlen, the kernels'
limits, the reference under capture)."""

import pytest
import torch
from helpers import interval_attention
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ops.attention import needs_max_seqlen, resolve_impl, varlen_attention, varlen_attention_reference
from attn_gym_lite.ops.kernels import INTERPRETED
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # what the kernels take here
KERNELS_HERE = pytest.mark.skipif(not INTERPRETED and DEVICE == "cpu", reason="the kernels run neither compiled "
                                                                              "nor interpreted")


def loop_reference(q, k, v, cu_seqlens, causal):
    """Float64 softmax attention, one sequence at a time; zero rows past L."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        out[start:end] = interval_attention(q.cpu(), k.cpu(), v.cpu(), start, end, causal)
    return out


IMPLEMENTATIONS_HERE = ["reference"] + (["triton"] if INTERPRETED or DEVICE == "cuda" else []) + (
    ["varlen_attn"] if DEVICE == "cuda" else [])


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(0, 20), min_size=1, max_size=4), spare_slots=st.integers(0, 2),
       spare_rows=st.integers(0, 3), causal=st.booleans())
def test_every_implementation_here_matches_the_loop(lengths, spare_slots, spare_rows, causal):
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + spare_slots).to(DEVICE)
    g = torch.Generator().manual_seed(len(lengths) * 31 + spare_rows)
    q, k, v = (torch.randn(max(sum(lengths) + spare_rows, 1), 2, 16, generator=g).to(DEVICE, DTYPE) for _ in range(3))
    expected, active = loop_reference(q, k, v, cu.cpu(), causal), sum(lengths)
    tolerance = 2e-2 if DTYPE == torch.bfloat16 else 1e-5
    for impl in IMPLEMENTATIONS_HERE:
        out = varlen_attention(q, k, v, cu, impl=impl, causal=causal, max_seqlen=max(max(lengths), 1))
        torch.testing.assert_close(out[:active].double().cpu(), expected[:active], atol=tolerance, rtol=tolerance)


def test_auto_picks_the_kernels_where_they_run_and_the_reference_elsewhere():
    runs_here = (DEVICE == "cuda") != INTERPRETED
    assert resolve_impl("auto", torch.zeros(4, 2, 16, device=DEVICE, dtype=DTYPE)) == (
        "triton" if runs_here else "reference")
    assert resolve_impl("auto", torch.zeros(4, 2, 16, dtype=torch.float64)) == "reference"
    assert resolve_impl("auto", torch.zeros(4, 2, 16, device="meta", dtype=torch.bfloat16)) == "reference"
    assert resolve_impl("auto", torch.zeros(4, 2, 24, device=DEVICE, dtype=DTYPE)) == "reference"  # head dim
    assert resolve_impl("varlen_attn", torch.zeros(4, 2, 16)) == "varlen_attn"
    assert needs_max_seqlen("varlen_attn") and needs_max_seqlen("sdpa") and needs_max_seqlen("triton", "rect")
    assert not needs_max_seqlen("triton") and not needs_max_seqlen("triton", "dynamic")
    assert not needs_max_seqlen("reference")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("impl", ["varlen_attn", "triton"])
def test_cuda_implementations_match_reference(impl, causal, head_dim):
    torch.manual_seed(0)
    lengths = [1, 300, 17, 1024, 0, 129]
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 8).cuda()
    q, k, v = (torch.randn(sum(lengths), 4, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = varlen_attention(q, k, v, cu, impl=impl, max_seqlen=max(lengths), causal=causal)
    ref_inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = varlen_attention_reference(*ref_inputs, cu, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(ref)
    for fast, slow in zip(torch.autograd.grad(out, (q, k, v), grad.bfloat16()), torch.autograd.grad(ref, ref_inputs, grad)):
        torch.testing.assert_close(fast.float(), slow, atol=5e-2, rtol=5e-2)


def test_sdpa_on_a_padded_batch_equals_packed_attention_on_the_real_tokens():
    # Two documents of 5 and 3 tokens, right-padded to rows of 5: causal SDPA on the rows gives
    # every real token exactly its packed attention, whatever the padding holds.
    g = torch.Generator().manual_seed(7)
    packed = [torch.randn(8, 2, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    expected = loop_reference(*packed, cu_seqlens_from_lengths([5, 3]), causal=True)
    padded = [torch.cat((x, torch.full((2, 2, 4), 1e4, dtype=torch.float64))) for x in packed]
    out = varlen_attention(*padded, torch.tensor([0, 5, 10], dtype=torch.int32), impl="sdpa", causal=True,
                           max_seqlen=5)
    torch.testing.assert_close(out[:8], expected)


def test_reference_counts_flops_on_meta_inputs():
    """The reference reads a CPU cu_seqlens on the host, so q may live on "meta": every op runs with
    real shapes (chapter 1 counts FLOPs so)."""
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.empty(9, 2, 4, device="meta")
    with FlopCounterMode(display=False) as counter:
        out = varlen_attention_reference(q, q, q, torch.tensor([0, 5, 9], dtype=torch.int32))
    assert out.shape == (9, 2, 4) and out.device.type == "meta"
    # Two matmuls per sequence and head: 2 * (2 * S * S * D) FLOPs, S = 5 and 4, H = 2, D = 4.
    assert counter.get_total_flops() == sum(2 * 2 * 2 * s * s * 4 for s in (5, 4))


def _attend(q=None, cu=(0, 5, 9, 9), head_dim=16, **options):
    q = torch.randn(12, 2, head_dim, device=DEVICE, dtype=DTYPE) if q is None else q
    cu = cu if isinstance(cu, torch.Tensor) else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    return varlen_attention(q, q, q, cu, **options)


REFUSED = {
    "cu_seqlens int64": (lambda: _attend(cu=torch.tensor([0, 5, 9, 9], device=DEVICE)), TypeError, "cu_seqlens"),
    "cu_seqlens strided": (lambda: _attend(cu=torch.tensor([0, 5, 9, 9], dtype=torch.int32, device=DEVICE)
                                                   .repeat_interleave(2)[::2]),
                           ValueError, "cu_seqlens"),
    "cu_seqlens on another device": (lambda: _attend(cu=torch.tensor([0, 12], dtype=torch.int32, device="meta"),
                                                     impl="triton"), ValueError, "cu_seqlens"),
    "cu_seqlens[0] not 0": (lambda: _attend(cu=(1, 5, 9, 9), impl="reference"), ValueError, "cu_seqlens"),
    "cu_seqlens decreasing": (lambda: _attend(cu=(0, 5, 3, 9), impl="triton", schedule="rect", max_seqlen=12),
                              ValueError, "cu_seqlens"),  # a bounded grid reads the values on any device
    "L > T": (lambda: _attend(cu=(0, 5, 9, 14), impl="reference"), ValueError, "cu_seqlens"),
    "max_seqlen too small": (lambda: _attend(impl="reference", max_seqlen=4), ValueError, "max_seqlen"),
    "q, k, v shapes": (lambda: varlen_attention(*(torch.randn(n, 2, 16) for n in (12, 12, 11)),
                                                torch.tensor([0, 5, 9, 9], dtype=torch.int32)), ValueError, "q, k and v"),
    "varlen_attn without max_seqlen": (lambda: _attend(impl="varlen_attn"), ValueError, "max_seqlen"),
    "rect without max_seqlen": (lambda: _attend(impl="triton", schedule="rect"), ValueError, "max_seqlen"),
    "sdpa without max_seqlen": (lambda: _attend(impl="sdpa"), ValueError, "max_seqlen"),
    "triton head dim": (lambda: _attend(head_dim=24, impl="triton"), ValueError, "head dim"),
    # Head-major storage viewed as [T, H, D]: head 15's offset 15 * T * D passes 2**31 (reserved, never touched).
    "32-bit offsets": (lambda: _attend(q=torch.empty(16, 8947849, 16, dtype=torch.bfloat16, device=DEVICE)
                                       .transpose(0, 1), cu=(0, 16), impl="triton"), ValueError, "32-bit"),
}


def _capture(impl, head_dim):
    from attn_gym_lite.graph.capture import capture_graph

    q = torch.randn(16, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 10, 16], dtype=torch.int32, device="cuda")
    capture_graph(lambda: varlen_attention(q, q, q, cu, impl=impl, validate=False), warmup=1)


if DEVICE == "cuda":  # the reference reads cu_seqlens on the host; "auto" falls back to it at head dim 8
    REFUSED["reference under capture"] = (lambda: _capture("reference", 64), RuntimeError, "reference")
    REFUSED["auto's fallback under capture"] = (lambda: _capture("auto", 8), RuntimeError, "reference")
if not INTERPRETED:  # compiled kernels: the interpreter's CPU tensors are refused
    REFUSED["CPU tensors"] = (lambda: _attend(q=torch.randn(12, 2, 16, dtype=torch.bfloat16),
                                              cu=torch.tensor([0, 12], dtype=torch.int32), impl="triton"),
                              ValueError, "TRITON_INTERPRET")


@KERNELS_HERE
@pytest.mark.parametrize("case", REFUSED)
def test_varlen_attention_refuses_what_would_be_silently_wrong(case):
    build, error, match = REFUSED[case]
    with pytest.raises(error, match=match):
        build()
