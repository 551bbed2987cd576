"""The two KDA references of :mod:`attn_gym_lite.ops.kda` against each other and against a hand
computation: forward, final states and gradients on random ragged layouts, the state reset at
sequence boundaries, strong and infinite decays."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import kda_bounds, ragged_layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.bench.linear_attention import kda_inputs
from attn_gym_lite.ops.kda import kda_chunked, kda_recurrent

F64 = torch.float64
TOLERANCE = 1e-10
DECAY = -2.0  # g uniform in [DECAY, 0]: decays strong enough that a missed or misplaced one shows


cu = kda_bounds


def leaves(inputs) -> list[torch.Tensor]:
    """``q, k, v, g, beta`` (of a :func:`kda_inputs` dict or a list) as fresh leaves that require grad."""
    tensors = list(inputs.values())[:5] if isinstance(inputs, dict) else inputs
    return [x.detach().clone().requires_grad_() for x in tensors]


def run_with_gradients(fn, inputs, cu_seqlens, weights, **kwargs):
    """(o, final_state, gradients of <o, w_o> + <S, w_S> w.r.t. q, k, v, g, beta)."""
    o, state = fn(*inputs, cu_seqlens, output_final_state=True, **kwargs)
    loss = (o * weights[0]).sum() + (state * weights[1]).sum()
    if not loss.requires_grad:  # L = 0: the output does not depend on the inputs at all
        return o, state, [torch.zeros_like(x) for x in inputs]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return o, state, [torch.zeros_like(x) if dx is None else dx for x, dx in zip(inputs, grads)]


@settings(max_examples=100, deadline=None)
@given(layout=ragged_layouts(max_tokens=40), H=st.integers(1, 2), K=st.integers(1, 4), V=st.integers(1, 3),
       C=st.sampled_from([1, 3, 4, 16, 64]), seed=st.integers(0, 2**16))
def test_chunked_equals_recurrent_forward_and_gradients(layout, H, K, V, C, seed):
    T, cu_seqlens = layout
    L, N = int(cu_seqlens[-1]), cu_seqlens.numel() - 1
    inputs = leaves(kda_inputs(T, H, K, V, dtype=F64, device="cpu", seed=seed, active_tokens=L, min_log_decay=DECAY))
    gen = torch.Generator().manual_seed(seed + 1)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64), torch.randn(N, H, K, V, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = run_with_gradients(kda_recurrent, inputs, cu_seqlens, weights)
    o, s, d = run_with_gradients(kda_chunked, inputs, cu_seqlens, weights, chunk_size=C)
    assert o.shape == (T, H, V) and s.shape == (N, H, K, V)
    assert torch.equal(o[L:], torch.zeros_like(o[L:])) and torch.equal(o_ref[L:], torch.zeros_like(o_ref[L:]))
    torch.testing.assert_close(o, o_ref, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=TOLERANCE)
    for name, dx, dx_ref in zip("q k v g beta".split(), d, d_ref):
        assert torch.isfinite(dx_ref).all() and torch.equal(dx_ref[L:], torch.zeros_like(dx_ref[L:])), name
        assert torch.equal(dx[L:], torch.zeros_like(dx[L:])), name  # the NaN rows get zero gradients
        torch.testing.assert_close(dx, dx_ref, rtol=0, atol=TOLERANCE, msg=lambda m, name=name: f"d{name}: {m}")


def test_hand_computed_case():
    """T = 4, H = 1, K = V = 2, scale = 1, cu_seqlens = [0, 2, 3]: two sequences, one inactive row.

    Sequence 0, token 0 (state zero, so its decay changes nothing):
        k0 = [1, 0], v0 = [1, 2], beta0 = 1/2
        S = beta0 k0 v0^T = [[1/2, 1], [0, 0]]
        o0 = S^T q0, q0 = [1, 1]  ->  [1/2, 1]
    Token 1: g1 = [ln 1/2, ln 1/4], so the decay first scales row 0 by 1/2 and row 1 by 1/4:
        S' = [[1/4, 1/2], [0, 0]]
        k1 = [1, 1]: S'^T k1 = [1/4, 1/2]; v1 = [1, 0] -> v1 - S'^T k1 = [3/4, -1/2]
        beta1 = 1/2 -> correction [3/8, -1/4], added to both rows (k1 = [1, 1]):
        S = [[5/8, 1/4], [3/8, -1/4]]
        o1 = S^T q1, q1 = [1, 2] -> [5/8 + 3/4, 1/4 - 1/2] = [11/8, -1/4]
    Sequence 1, token 2: the state restarts at zero:
        k2 = [0, 1], v2 = [4, -2], beta2 = 1/4 -> S = [[0, 0], [1, -1/2]]
        o2 = S^T q2, q2 = [3, 1] -> [1, -1/2]
    Row 3 is past L = 3: zero.
    (Had the update come before the decay, token 1 would give S = [[3/8, 1/4], [1/16, -1/8]] and
    o1 = [1/2, 0]; had the state not been reset, o2 would carry sequence 0's memory.)
    """
    q = torch.tensor([[1.0, 1.0], [1.0, 2.0], [3.0, 1.0], [9.0, 9.0]], dtype=F64)[:, None]
    k = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [9.0, 9.0]], dtype=F64)[:, None]
    v = torch.tensor([[1.0, 2.0], [1.0, 0.0], [4.0, -2.0], [9.0, 9.0]], dtype=F64)[:, None]
    g = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.25], [0.5, 0.5], [0.5, 0.5]], dtype=F64))[:, None]
    beta = torch.tensor([[0.5], [0.5], [0.25], [0.5]], dtype=F64)
    expected_o = torch.tensor([[0.5, 1.0], [11 / 8, -0.25], [1.0, -0.5], [0.0, 0.0]], dtype=F64)[:, None]
    expected_s = torch.tensor([[[0.625, 0.25], [0.375, -0.25]], [[0.0, 0.0], [1.0, -0.5]]], dtype=F64)[:, None]
    for fn, kwargs in ((kda_recurrent, {}), (kda_chunked, {"chunk_size": 1}), (kda_chunked, {"chunk_size": 2}),
                       (kda_chunked, {"chunk_size": 64})):
        o, s = fn(q, k, v, g, beta, cu(0, 2, 3), scale=1.0, output_final_state=True, **kwargs)
        torch.testing.assert_close(o, expected_o, rtol=0, atol=1e-14, msg=lambda m, fn=fn: f"{fn.__name__}: {m}")
        torch.testing.assert_close(s, expected_s, rtol=0, atol=1e-14, msg=lambda m, fn=fn: f"{fn.__name__}: {m}")


@settings(max_examples=25, deadline=None)
@given(layout=ragged_layouts(max_tokens=30), C=st.sampled_from([4, 16]), seed=st.integers(0, 2**16))
def test_packed_batch_equals_each_sequence_alone(layout, C, seed):
    T, cu_seqlens = layout
    bounds = cu_seqlens.tolist()
    *inputs, _ = kda_inputs(T, 2, 3, 2, dtype=F64, device="cpu", seed=seed, active_tokens=bounds[-1],
                            min_log_decay=DECAY).values()
    for fn, kwargs in ((kda_recurrent, {}), (kda_chunked, {"chunk_size": C})):
        o, s = fn(*inputs, cu_seqlens, output_final_state=True, **kwargs)
        for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            if end == start:
                assert torch.equal(s[n], torch.zeros_like(s[n]))
                continue
            alone = [x[start:end] for x in inputs]
            o_n, s_n = fn(*alone, cu(0, end - start), output_final_state=True, **kwargs)
            torch.testing.assert_close(o[start:end], o_n, rtol=0, atol=1e-12)
            torch.testing.assert_close(s[n], s_n[0], rtol=0, atol=1e-12)


def test_chunked_gradients_match_finite_differences():
    """An autograd-independent check of the chunked backward (torch.autograd.gradcheck)."""
    inputs = leaves(kda_inputs(6, 1, 2, 2, dtype=F64, device="cpu", seed=11, active_tokens=5, fill=0.0,
                               min_log_decay=DECAY))
    cu_seqlens = cu(0, 2, 5)
    assert torch.autograd.gradcheck(
        lambda *x: kda_chunked(*x, cu_seqlens, chunk_size=2, output_final_state=True), inputs
    )


def test_malformed_cu_seqlens_is_refused_by_name():
    *inputs, _ = kda_inputs(5, 2, 3, 4, dtype=F64, device="cpu", seed=0).values()
    for fn in (kda_recurrent, kda_chunked):
        with pytest.raises(ValueError, match="cu_seqlens"):
            fn(*inputs, cu(0, 2, 6))  # L = 6 > T = 5


# (bounds, T, strong tokens): one 64-token chunk, a ragged layout whose 64-row sequence is one chunk
# too, several strong tokens in one chunk; g = -0.05 on every other token.
@pytest.mark.parametrize(("bounds", "T", "strong"), [((0, 64), 64, (20,)), ((0, 23, 23, 87), 90, (10, 50)),
                                                     ((0, 64), 64, (5, 6, 40))])
@pytest.mark.parametrize("strength", [-1e5, -1e7, -math.inf])
def test_float32_chunked_is_exact_under_strong_and_infinite_decay(bounds, T, strong, strength):
    """Differences of large cumulative log-decays in float32 lose the small decays (-1e5 was off by
    0.045, -1e7 by 1.6) and -inf - (-inf) is NaN: the log-decay floor keeps the chunked form exact."""
    *inputs, _ = kda_inputs(T, 2, 4, 3, dtype=F64, device="cpu", seed=T, active_tokens=bounds[-1]).values()
    inputs[3] = torch.full_like(inputs[3], -0.05)
    inputs[3][list(strong)] = strength
    gen = torch.Generator().manual_seed(1)
    weights = (torch.randn(T, 2, 3, generator=gen, dtype=F64),
               torch.randn(len(bounds) - 1, 2, 4, 3, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = run_with_gradients(kda_recurrent, leaves(inputs), cu(*bounds), weights)
    o, s, d = run_with_gradients(kda_chunked, leaves([x.float() for x in inputs]), cu(*bounds), weights)
    for name, x, x_ref in zip(("o", "state", "dq", "dk", "dv", "dg", "dbeta"), (o, s, *d), (o_ref, s_ref, *d_ref)):
        torch.testing.assert_close(x.to(F64), x_ref, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
