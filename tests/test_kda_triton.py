"""``kda_triton`` (the chunked Triton KDA kernels) against the float64 recurrence ``kda_recurrent``.

On CPU the kernels run in Triton's interpreter in float32 (tests/conftest.py sets TRITON_INTERPRET=1
without CUDA) on small ragged layouts: empty sequences first, in the middle and last, length-1
sequences, lengths that are not multiples of C, inactive rows past L filled with NaN, unused tail
slots of cu_seqlens. Outputs, final states and the gradients of all five inputs are compared with
the float64 reference. The ``gpu`` tests (skipped here) check bfloat16 at K = V = 128, C = 64 and
a replay of one captured CUDA graph over two layouts of the same capacity.

Tolerance (float32 kernel vs float64 reference): every quantity is a sum of at most C * K (or
C * V) products of O(1) terms, formed in a few stages (WY factors, the state, the output), so
float32 rounding (eps = 1.2e-7) accumulates to ~1e-5 at these sizes; 2e-4 leaves a margin of
~10x, while a wrong mask, a missed decay or a state that leaks between sequences moves results by
O(0.1 - 1).
"""

from __future__ import annotations

import pytest
import torch
from helpers import kda_bounds
from torch.utils._python_dispatch import TorchDispatchMode

from attn_gym_lite.bench.linear_attention import TOLERANCE as SUITE_TOLERANCE
from attn_gym_lite.bench.linear_attention import kda_inputs
from attn_gym_lite.ops.kda import kda_chunked, kda_recurrent, kda_triton
from attn_gym_lite.testing.exactness import error_stats

F64 = torch.float64
TOLERANCE = 2e-4
BF16_TOLERANCE = SUITE_TOLERANCE["bfloat16"]  # 5e-2 of the reference's largest magnitude
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Inputs come from the suite's kda_inputs (its last entry, grad_o, unused here), NaN in rows
# L .. T - 1, with g uniform in [DECAY, 0]: milder than the references' tests, as the kernel runs
# in float32.
DECAY = -1.0


cu = kda_bounds


def kda_on_device(*args, **kwargs):
    """``kda_triton`` on ``DEVICE`` (CUDA, else the CPU under the interpreter), outputs back on the
    CPU. The copies are differentiable: inputs, references and leaves stay on the CPU."""
    def to_device(x):
        return x.to(DEVICE) if isinstance(x, torch.Tensor) else x

    o, state = kda_triton(*map(to_device, args), **{name: to_device(x) for name, x in kwargs.items()})
    return o.cpu(), None if state is None else state.cpu()


def gradients(fn, inputs, cu_seqlens, weights, **kwargs):
    """(o, final_state, d/d(q, k, v, g, beta) of <o, w_o> + <S, w_S>), inputs as leaves."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    o, state = fn(*leaves, cu_seqlens, output_final_state=True, **kwargs)
    loss = (o.to(F64) * weights[0]).sum() + (state.to(F64) * weights[1]).sum()
    if not loss.requires_grad:  # L = 0: nothing depends on the inputs
        return o, state, [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return o, state, [torch.zeros_like(x) if d is None else d for x, d in zip(leaves, grads)]


# (cu_seqlens, T, C, K, V): the layout features that break ragged kernels, at interpreter-sized shapes.
LAYOUTS = [
    ((0, 0, 5, 6, 6, 23), 26, 16, 16, 16),  # empty first and in the middle, length 1, 17 = C + 1, L < T
    ((0, 16, 17, 17, 50), 50, 16, 16, 32),  # exactly C, length 1, empty, 33 = 2C + 1, L = T
    ((0, 40, 41, 41, 41), 44, 32, 32, 16),  # C = 32 (off-diagonal sub-blocks), unused tail slots
    ((0, 1, 2, 3), 5, 16, 16, 16),  # only length-1 sequences
    ((0, 0, 0), 3, 16, 16, 16),  # nothing active: L = 0
    ((0, 70, 100), 100, 64, 32, 16),  # C = 64: four sub-blocks, a 30-row last chunk
]


@pytest.mark.parametrize(("bounds", "T", "C", "K", "V"), LAYOUTS)
def test_matches_recurrence_forward_and_gradients(bounds, T, C, K, V):
    H = 2
    cu_seqlens = cu(*bounds)
    L, N = bounds[-1], len(bounds) - 1
    seed = sum(bounds) + T
    *inputs, _ = kda_inputs(T, H, K, V, dtype=F64, device="cpu", seed=seed, active_tokens=L,
                            min_log_decay=DECAY).values()
    gen = torch.Generator().manual_seed(seed + 1)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64), torch.randn(N, H, K, V, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = gradients(kda_recurrent, inputs, cu_seqlens, weights)
    o, s, d = gradients(kda_on_device, [x.float() for x in inputs], cu_seqlens, weights, chunk_size=C)
    assert o.dtype == torch.float32 and o.shape == (T, H, V)
    assert s.dtype == torch.float32 and s.shape == (N, H, K, V)
    assert torch.equal(o[L:], torch.zeros_like(o[L:]))  # inactive rows zero, no NaN leaked
    torch.testing.assert_close(o.to(F64), o_ref, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(s.to(F64), s_ref, rtol=TOLERANCE, atol=TOLERANCE)
    for name, dx, dx_ref in zip(("q", "k", "v", "g", "beta"), d, d_ref):
        assert dx.dtype == torch.float32, name
        assert torch.equal(dx[L:], torch.zeros_like(dx[L:])), name  # NaN rows get zero gradients
        torch.testing.assert_close(dx.to(F64), dx_ref, rtol=TOLERANCE, atol=TOLERANCE,
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize(("used", "output_final_state"), [("o", False), ("o", True), ("final_state", True)])
def test_gradient_of_one_output_alone(used, output_final_state):
    """Only one output reaches the loss, so the backward gets None for the other (the Function does
    not materialise zero gradients) and must treat it as zero: against the float64 recurrence, and
    bit for bit what it computes when handed an explicit zero (the loss plus 0 * the other output)."""
    cu_seqlens = cu(0, 20, 37)
    *inputs, _ = kda_inputs(40, 2, 16, 16, dtype=F64, device="cpu", seed=9, active_tokens=37,
                            min_log_decay=DECAY).values()
    gen = torch.Generator().manual_seed(10)
    weights = {"o": torch.randn(40, 2, 16, generator=gen, dtype=F64),
               "final_state": torch.randn(2, 2, 16, 16, generator=gen, dtype=F64)}
    other = "final_state" if used == "o" else "o"
    ref_leaves = [x.clone().requires_grad_() for x in inputs]
    o_ref, s_ref = kda_recurrent(*ref_leaves, cu_seqlens, output_final_state=True)
    expected = torch.autograd.grad(({"o": o_ref, "final_state": s_ref}[used] * weights[used]).sum(), ref_leaves,
                                   allow_unused=True)  # the final state does not depend on q
    expected = [torch.zeros_like(x) if d is None else d for x, d in zip(ref_leaves, expected)]

    def triton_gradients(final_state: bool, zero_other: bool):
        leaves = [x.detach().float().requires_grad_() for x in inputs]
        o, s = kda_on_device(*leaves, cu_seqlens, chunk_size=16, output_final_state=final_state)
        assert (s is None) == (not final_state)
        outputs = {"o": o, "final_state": s}
        loss = (outputs[used].to(F64) * weights[used]).sum()
        if zero_other:
            loss = loss + (outputs[other] * 0).sum()
        return torch.autograd.grad(loss, leaves)

    got = triton_gradients(output_final_state, zero_other=False)
    with_zero = triton_gradients(True, zero_other=True)
    for name, dx, dx_ref, dx_zero in zip(("q", "k", "v", "g", "beta"), got, expected, with_zero):
        torch.testing.assert_close(dx.to(F64), dx_ref, rtol=TOLERANCE, atol=TOLERANCE,
                                   msg=lambda m, name=name: f"d{name}: {m}")
        assert torch.equal(dx, dx_zero), name


class _ProducedShapes(TorchDispatchMode):
    """Records the shape of every tensor an operator returns while active (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])
                        if isinstance(t, torch.Tensor)]
        return out


def test_final_state_buffer_only_when_asked_and_no_zero_gradient_for_it():
    """T = 40, C = 16 and N = 4 sequence slots (G_cap = 6 chunks, so the saved entering states are
    [6, H, K, V]): a [4, H, K, V] tensor can only be the final state or its gradient. Without
    output_final_state the forward makes none; with it but a loss on o alone, the backward makes
    none."""
    cu_seqlens = cu(0, 20, 37, 37, 37, device=DEVICE)
    T, H, K, V = 40, 2, 16, 16
    state_shape = (4, H, K, V)
    *inputs, _ = kda_inputs(T, H, K, V, dtype=torch.float32, device=DEVICE, seed=4, active_tokens=37,
                            min_log_decay=DECAY).values()
    for final_state in (False, True):
        leaves = [x.detach().requires_grad_() for x in inputs]
        with _ProducedShapes() as forward:
            o, s = kda_triton(*leaves, cu_seqlens, chunk_size=16, output_final_state=final_state)
        with _ProducedShapes() as backward:
            torch.autograd.grad(o.sum(), leaves)
        assert (state_shape in forward.shapes) == final_state, final_state  # the mode sees allocations
        assert (6, H, K, V) in forward.shapes and (6, H, K, V) in backward.shapes  # states, d_states
        assert state_shape not in backward.shapes, final_state


def test_strong_decay_stays_finite():
    """g down to -40 per step over 32-token chunks: the cumulative decay inside a chunk reaches
    exp(-1280), far below float32's range; every exponent the kernels form (forward and backward)
    is <= 0, so nothing overflows and the result still matches the recurrence."""
    cu_seqlens = cu(0, 45)
    *inputs, _ = kda_inputs(45, 2, 16, 16, dtype=F64, device="cpu", seed=3, min_log_decay=-40.0).values()
    weights = (torch.ones(45, 2, 16, dtype=F64), torch.ones(1, 2, 16, 16, dtype=F64))
    o_ref, s_ref, d_ref = gradients(kda_recurrent, inputs, cu_seqlens, weights)
    o, s, d = gradients(kda_on_device, [x.float() for x in inputs], cu_seqlens, weights, chunk_size=32)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o.to(F64), o_ref, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(s.to(F64), s_ref, rtol=TOLERANCE, atol=TOLERANCE)
    for name, dx, dx_ref in zip(("q", "k", "v", "g", "beta"), d, d_ref):
        assert torch.isfinite(dx).all(), name
        torch.testing.assert_close(dx.to(F64), dx_ref, rtol=TOLERANCE, atol=TOLERANCE,
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize(("bounds", "T", "strong"), [((0, 64), 64, (20,)), ((0, 23, 23, 87), 90, (10, 50)),
                                               ((0, 64), 64, (5, 6, 40))])
@pytest.mark.parametrize("strength", [-1e5, -1e7, -float("inf")])
def test_exact_under_strong_and_infinite_decay(bounds, T, strong, strength):
    """g = -0.05 but for one or a few tokens at -1e5, -1e7 or -inf (a full reset of the state):
    before the log-decay floor, float32 cancellation of large cumulative decays moved outputs by
    0.045 (-1e5) to 1.6 (-1e7), and -inf made the whole chunk NaN."""
    *inputs, _ = kda_inputs(T, 1, 16, 16, dtype=F64, device="cpu", seed=T, active_tokens=bounds[-1]).values()
    inputs[3] = torch.full_like(inputs[3], -0.05)
    inputs[3][list(strong)] = strength
    gen = torch.Generator().manual_seed(2)
    weights = (torch.randn(T, 1, 16, generator=gen, dtype=F64),
               torch.randn(len(bounds) - 1, 1, 16, 16, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = gradients(kda_recurrent, inputs, cu(*bounds), weights)
    o, s, d = gradients(kda_on_device, [x.float() for x in inputs], cu(*bounds), weights)
    for name, x, x_ref in zip(("o", "state", "dq", "dk", "dv", "dg", "dbeta"), (o, s, *d), (o_ref, s_ref, *d_ref)):
        torch.testing.assert_close(x.to(F64), x_ref, rtol=TOLERANCE, atol=TOLERANCE,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_final_state_optional_and_default_scale():
    *inputs, _ = kda_inputs(20, 2, 16, 16, dtype=torch.float32, device="cpu", seed=5, min_log_decay=DECAY).values()
    o, s = kda_on_device(*inputs, cu(0, 20), chunk_size=16)
    assert s is None
    o_one, _ = kda_on_device(*inputs, cu(0, 20), chunk_size=16, scale=1.0)
    torch.testing.assert_close(o, o_one / 4.0, rtol=1e-6, atol=1e-6)  # K ** -0.5 = 1/4


def test_contract_chunk_size_and_cu_seqlens_values():
    """The one refusal the kernels need (they tile chunks by 16-row sub-blocks), and the values of
    cu_seqlens checked where reading them is free (a CPU tensor) or asked for (validate=True)."""
    q, k, v, g, beta, _ = kda_inputs(5, 2, 16, 16, dtype=torch.float32, device=DEVICE, seed=0).values()
    with pytest.raises(ValueError, match="chunk_size"):
        kda_triton(q, k, v, g, beta, cu(0, 2, 5, device=DEVICE), chunk_size=8)
    for bounds in ((0, 2, 6), (0, 3, 2), (1, 2, 5)):
        with pytest.raises(ValueError, match="cu_seqlens"):
            kda_triton(q, k, v, g, beta, cu(*bounds, device=DEVICE), validate=True if DEVICE == "cuda" else None)


def test_g_and_beta_outside_their_ranges_are_computed_as_the_recurrence_says():
    """The values of g and beta are not checked: mild g > 0 and beta up to 1.5 are still the same
    function as the float64 recurrence."""
    q, k, v, g, beta, _ = kda_inputs(20, 1, 16, 16, dtype=F64, device="cpu", seed=11, min_log_decay=DECAY).values()
    gen = torch.Generator().manual_seed(12)
    g = g + 0.05 * torch.rand(g.shape, generator=gen, dtype=F64)  # some entries > 0
    beta = 1.5 * torch.rand(beta.shape, generator=gen, dtype=F64)
    assert (g > 0).any() and (beta > 1).any()
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, cu(0, 7, 20), output_final_state=True)
    o, s = kda_on_device(*(x.float() for x in (q, k, v, g, beta)), cu(0, 7, 20), chunk_size=16,
                      output_final_state=True)
    torch.testing.assert_close(o.to(F64), o_ref, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(s.to(F64), s_ref, rtol=TOLERANCE, atol=TOLERANCE)



# -----------------------------------------------------------------------------
# bfloat16 / float16 in the interpreter: the saved operands and the matrix products in that dtype.

# (cu_seqlens, T, C, K, V): empty first and in the middle, length 1, lengths not multiples of C
# (a 33-row chunk after a full one), L < T; and C = 16 with one value block of 16.
LOW_PRECISION_LAYOUTS = [
    ((0, 0, 1, 40, 40, 97, 130), 140, 64, 32, 32),
    ((0, 5, 5, 6, 39, 60), 64, 16, 32, 16),
]


@pytest.mark.parametrize(("bounds", "T", "C", "K", "V"), LOW_PRECISION_LAYOUTS)
@pytest.mark.parametrize(("dtype", "bound"), [(torch.bfloat16, BF16_TOLERANCE), (torch.float16, 1e-2)])
def test_low_precision_matches_float64_reference(bounds, T, C, K, V, dtype, bound):
    """Low-precision inputs keep states, W, U, P, Q_g, K_e, dU and dS in their dtype and multiply
    them there with float32 accumulation (the interpreter widens the operands exactly, so it sees
    the same roundings a GPU does). Output, final state and all five gradients, compared with the
    float64 reference on the same rounded inputs by the benchmark suite's measure: the largest
    error over the reference's largest magnitude. Bounds: bfloat16, the suite's 5e-2 (measured
    here: up to ~2e-2, about 3x the float32-storage path, the roundings of P and U dominating,
    as in fla's kernels, which round the same operands); float16 rounds 8x finer, 1e-2."""
    H = 2
    cu_seqlens = cu(*bounds)
    L, N = bounds[-1], len(bounds) - 1
    *inputs, _ = kda_inputs(T, H, K, V, dtype=F64, device="cpu", seed=sum(bounds), active_tokens=L,
                            min_log_decay=DECAY).values()
    inputs = [x.to(dtype) for x in inputs]
    gen = torch.Generator().manual_seed(L)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64), torch.randn(N, H, K, V, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = gradients(kda_chunked, [x.to(F64) for x in inputs], cu_seqlens, weights, chunk_size=C)
    o, s, d = gradients(kda_on_device, inputs, cu_seqlens, weights, chunk_size=C)
    assert o.dtype == dtype and s.dtype == torch.float32
    for name, x, x_ref in zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta"), (o, s, *d), (o_ref, s_ref, *d_ref)):
        if name != "final_state":
            assert torch.equal(x[L:], torch.zeros_like(x[L:])), name  # NaN rows past L: zero
            x, x_ref = x[:L], x_ref[:L]
        stats = error_stats(x, x_ref)
        assert stats["nonfinite"] == 0 and stats["rel_err"] <= bound, (name, stats)


# -----------------------------------------------------------------------------
# GPU (skipped without CUDA): bfloat16 at the production shape, and a captured graph.


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.to(F64) - ref).norm() / ref.norm().clamp_min(1e-30))


def leaves_and_weights(inputs, N, seed):
    T, H, K = inputs[0].shape
    V = inputs[2].shape[2]
    gen = torch.Generator().manual_seed(seed)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64).to(inputs[0].device),
               torch.randn(N, H, K, V, generator=gen, dtype=F64).to(inputs[0].device))
    return [x.detach().requires_grad_() for x in inputs], weights


@pytest.mark.gpu
def test_gpu_bfloat16_matches_chunked_reference():
    """bfloat16 inputs, K = V = 128, C = 64, a ragged layout with an empty and a length-1 sequence,
    forward and all five gradients. The reference runs in float64 on the same (bfloat16-rounded)
    inputs, so the error is the kernels' own: the saved operands (states, W, U, P, Q_g, K_e, dU,
    dS) rounded to bfloat16 and multiplied with float32 accumulation, tf32 products elsewhere,
    then a bfloat16 output and bfloat16 gradients (8-bit mantissa, 4e-3 relative). This layout in
    the interpreter (same roundings, other summation order) measured norm-relative errors of
    1.0e-2 for o, 5e-3 for the state, up to 1.1e-2 for the gradients: bounds 2e-2 and 3e-2."""
    bounds, T, H, K, V = (0, 300, 300, 301, 1000, 1129), 1200, 4, 128, 128
    N, L = len(bounds) - 1, bounds[-1]
    cu_seqlens = cu(*bounds, device="cuda")
    *inputs, _ = kda_inputs(T, H, K, V, dtype=F64, device="cuda", seed=17, active_tokens=L,
                            min_log_decay=DECAY).values()
    inputs = [x.to(torch.bfloat16) for x in inputs]
    _, weights = leaves_and_weights(inputs, N, seed=18)
    o_ref, s_ref, d_ref = gradients(kda_chunked, [x.to(F64) for x in inputs], cu_seqlens, weights, chunk_size=64)
    o, s, d = gradients(kda_triton, inputs, cu_seqlens, weights, chunk_size=64)
    assert o.dtype == torch.bfloat16 and torch.equal(o[L:], torch.zeros_like(o[L:]))
    assert relative_error(o, o_ref) < 2e-2 and relative_error(s, s_ref) < 2e-2
    for name, dx, dx_ref in zip(("q", "k", "v", "g", "beta"), d, d_ref):
        assert dx.dtype == torch.bfloat16 and torch.equal(dx[L:], torch.zeros_like(dx[L:])), name
        assert relative_error(dx, dx_ref) < 3e-2, (name, relative_error(dx, dx_ref))


@pytest.mark.gpu
def test_gpu_graph_replays_two_layouts():
    """One capture of forward and backward at capacity (T, N), replayed for two layouts of that
    capacity: each replay equals an eager call on the new layout bit for bit (the kernels use no
    atomics), and the float64 reference up to bfloat16 rounding."""
    T, N, H, K, V = 512, 4, 2, 128, 128
    layouts = [(0, 100, 100, 101, 400), (0, 0, 250, 330, 331)]
    *inputs, _ = kda_inputs(T, H, K, V, dtype=F64, device="cuda", seed=23, min_log_decay=DECAY).values()
    inputs = [x.to(torch.bfloat16) for x in inputs]
    leaves, weights = leaves_and_weights(inputs, N, seed=24)
    static_cu = cu(*layouts[0], device="cuda")

    def step(cu_seqlens):
        o, s = kda_triton(*leaves, cu_seqlens, output_final_state=True)
        loss = (o.to(F64) * weights[0]).sum() + (s.to(F64) * weights[1]).sum()
        return (o, s, *torch.autograd.grad(loss, leaves))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile the kernels before capture
        step(static_cu)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static_cu)
    for bounds in layouts:
        assert len(bounds) == N + 1 and bounds[-1] <= T
        static_cu.copy_(cu(*bounds, device="cuda"))
        graph.replay()
        eager = step(cu(*bounds, device="cuda"))
        for name, replayed, expected in zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta"), static_out, eager):
            torch.testing.assert_close(replayed, expected, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")
        o_ref, _ = kda_chunked(*(x.to(F64) for x in inputs), cu(*bounds, device="cuda"))
        assert relative_error(static_out[0], o_ref) < 2e-2  # as in the test above
