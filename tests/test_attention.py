"""varlen attention: the reference path against a naive float64 loop, and torch's CUDA kernel
against the reference (GPU)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ops.attention import varlen_attention, varlen_attention_reference
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens


def naive_attention(q, k, v, cu_seqlens, causal):
    """Softmax attention written out token by token in float64."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        for t in range(start, end):
            last = t + 1 if causal else end
            for h in range(q.shape[1]):
                scores = [float(q[t, h] @ k[s, h]) / math.sqrt(q.shape[2]) for s in range(start, last)]
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                total = sum(weights)
                out[t, h] = sum(w / total * v[s, h] for w, s in zip(weights, range(start, last)))
    return out


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    spare_slots=st.integers(0, 2),
    spare_rows=st.integers(0, 3),
    causal=st.booleans(),
)
def test_reference_matches_naive_loop(lengths, spare_slots, spare_rows, causal):
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + spare_slots)
    rows = sum(lengths) + spare_rows
    g = torch.Generator().manual_seed(len(lengths) * 31 + rows)
    q, k, v = (torch.randn(rows, 2, 4, generator=g) for _ in range(3))
    out = varlen_attention_reference(q, k, v, cu, causal=causal)
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, cu, causal), atol=1e-5, rtol=1e-5)
    # Inactive capacity rows are zero on the reference path.
    assert torch.equal(out[sum(lengths):], torch.zeros_like(out[sum(lengths):]))


def test_reference_gradients_stay_inside_sequences():
    cu = cu_seqlens_from_lengths([3, 4])
    q, k, v = (torch.randn(7, 1, 4, requires_grad=True) for _ in range(3))
    varlen_attention_reference(q, k, v, cu)[:3].sum().backward()
    # Only the first sequence's outputs were used: the second sequence gets no gradient.
    for tensor in (q, k, v):
        assert tensor.grad[3:].abs().max() == 0
        assert tensor.grad[:3].abs().max() > 0


def test_cpu_dispatches_to_reference():
    cu = cu_seqlens_from_lengths([5, 2])
    q, k, v = (torch.randn(7, 2, 8) for _ in range(3))
    torch.testing.assert_close(
        varlen_attention(q, k, v, cu, 5, causal=True), varlen_attention_reference(q, k, v, cu, causal=True)
    )


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"q, k, v must all be \[T, H, D\]"):
        varlen_attention(torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(5, 2, 8),
                         cu_seqlens_from_lengths([4]), 4)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_varlen_attn_matches_reference(causal, head_dim):
    torch.manual_seed(0)
    lengths = [1, 300, 17, 1024, 0, 129]
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 8).cuda()
    L = sum(lengths)
    q, k, v = (torch.randn(L, 4, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = varlen_attention(q, k, v, cu, max(lengths), causal=causal)
    ref_inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = varlen_attention_reference(*ref_inputs, cu, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(ref)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad)
    for fast, slow in zip((dq, dk, dv), ref_grads):
        torch.testing.assert_close(fast.float(), slow, atol=5e-2, rtol=5e-2)
