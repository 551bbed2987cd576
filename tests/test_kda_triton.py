"""``kda_triton`` (the chunked Triton KDA kernels) against the float64 recurrence ``kda_recurrent``.

On CPU the kernels run in Triton's interpreter in float32 on small ragged layouts (empty and
length-1 sequences, lengths not multiples of C, NaN in the inactive rows, unused tail slots).
Tolerance: every quantity is a sum of at most C * K products of O(1) terms formed in a few stages,
so float32 rounding accumulates to ~1e-5; 2e-4 leaves a 10x margin, while a wrong mask, a missed
decay or a state leaking between sequences moves results by O(0.1 - 1).
"""

from __future__ import annotations

import pytest
import torch
from helpers import kda_bounds

from attn_gym_lite.bench.linear_attention import TOLERANCE as SUITE_TOLERANCE
from attn_gym_lite.bench.linear_attention import kda_inputs
from attn_gym_lite.ops.kda import kda_chunked, kda_recurrent, kda_triton
from attn_gym_lite.ops.masking import uninitialized_memory_as_nan
from attn_gym_lite.testing.exactness import error_stats

F64 = torch.float64
TOLERANCE = 2e-4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DECAY = -1.0  # g uniform in [DECAY, 0]: milder than the references' tests, as the kernel runs in float32
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta")
cu = kda_bounds


def kda_on_device(*args, **kwargs):
    """``kda_triton`` on ``DEVICE`` (CUDA, else the CPU under the interpreter), outputs back on the
    CPU. The copies are differentiable: inputs, references and leaves stay on the CPU."""
    def to_device(x):
        return x.to(DEVICE) if isinstance(x, torch.Tensor) else x

    o, state = kda_triton(*map(to_device, args), **{name: to_device(x) for name, x in kwargs.items()})
    return o.cpu(), None if state is None else state.cpu()


def gradients(fn, inputs, cu_seqlens, weights, **kwargs):
    """(o, final_state, d/d(q, k, v, g, beta) of <o[:L], w_o> + <S, w_S>), unwritten memory read as NaN."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    L = int(cu_seqlens[-1])
    with uninitialized_memory_as_nan():
        o, state = fn(*leaves, cu_seqlens, output_final_state=True, **kwargs)
        loss = (o[:L].to(F64) * weights[0][:L]).sum() + (state.to(F64) * weights[1]).sum()
        if not loss.requires_grad:  # L = 0: nothing depends on the inputs
            return o, state, [torch.zeros_like(x) for x in leaves]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return o, state, [torch.zeros_like(x) if d is None else d for x, d in zip(leaves, grads)]


def against_the_recurrence(inputs, bounds, T, H, K, V, seed, **kwargs):
    """The kernels in float32 against the float64 recurrence: outputs, final states, five gradients."""
    gen = torch.Generator().manual_seed(seed)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64), torch.randn(len(bounds) - 1, H, K, V, generator=gen,
                                                                           dtype=F64))
    expected = gradients(kda_recurrent, inputs, cu(*bounds), weights)
    o, s, d = gradients(kda_on_device, [x.float() for x in inputs], cu(*bounds), weights, **kwargs)
    L = bounds[-1]
    assert o.dtype == s.dtype == torch.float32
    for name, x, x_ref in zip(NAMES, (o, s, *d), (*expected[:2], *expected[2])):
        x, x_ref = (x, x_ref) if name == "final_state" else (x[:L], x_ref[:L])  # NaN past L must not leak
        torch.testing.assert_close(x.to(F64), x_ref, rtol=TOLERANCE, atol=TOLERANCE, msg=lambda m, n=name: f"{n}: {m}")


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
    *inputs, _ = kda_inputs(T, 2, K, V, dtype=F64, device="cpu", seed=sum(bounds) + T, active_tokens=bounds[-1],
                            min_log_decay=DECAY).values()
    against_the_recurrence(inputs, bounds, T, 2, K, V, seed=T, chunk_size=C)


def test_strong_decay_stays_finite():
    """g down to -40 per step over 32-token chunks (cumulative decays near exp(-1280)): every
    exponent the kernels form, forward and backward, is <= 0."""
    *inputs, _ = kda_inputs(45, 2, 16, 16, dtype=F64, device="cpu", seed=3, min_log_decay=-40.0).values()
    against_the_recurrence(inputs, (0, 45), 45, 2, 16, 16, seed=4, chunk_size=32)


@pytest.mark.parametrize(("bounds", "T", "strong"), [((0, 64), 64, (20,)), ((0, 23, 23, 87), 90, (10, 50)),
                                                     ((0, 64), 64, (5, 6, 40))])
@pytest.mark.parametrize("strength", [-1e5, -1e7, -float("inf")])
def test_exact_under_strong_and_infinite_decay(bounds, T, strong, strength):
    """g = -0.05 but for tokens at -1e5, -1e7 or -inf (a full reset): without the log-decay floor,
    float32 cancellation moved outputs by 0.045 (-1e5) to 1.6 (-1e7), and -inf made the chunk NaN."""
    *inputs, _ = kda_inputs(T, 1, 16, 16, dtype=F64, device="cpu", seed=T, active_tokens=bounds[-1]).values()
    inputs[3] = torch.full_like(inputs[3], -0.05)
    inputs[3][list(strong)] = strength
    against_the_recurrence(inputs, bounds, T, 1, 16, 16, seed=2)


def test_g_and_beta_outside_their_ranges_are_computed_as_the_recurrence_says():
    """The values of g and beta are not checked: mild g > 0 and beta up to 1.5 are still the same
    function as the float64 recurrence."""
    q, k, v, g, beta, _ = kda_inputs(20, 1, 16, 16, dtype=F64, device="cpu", seed=11, min_log_decay=DECAY).values()
    gen = torch.Generator().manual_seed(12)
    g = g + 0.05 * torch.rand(g.shape, generator=gen, dtype=F64)  # some entries > 0
    beta = 1.5 * torch.rand(beta.shape, generator=gen, dtype=F64)
    assert (g > 0).any() and (beta > 1).any()
    against_the_recurrence([q, k, v, g, beta], (0, 7, 20), 20, 1, 16, 16, seed=13, chunk_size=16)


@pytest.mark.parametrize(("used", "output_final_state"), [("o", False), ("o", True), ("final_state", True)])
def test_gradient_of_one_output_alone(used, output_final_state):
    """Only one output reaches the loss, so the backward gets None for the other and must treat it
    as zero: against the recurrence, and bit for bit the gradient with an explicit zero."""
    cu_seqlens = cu(0, 20, 37)
    *inputs, _ = kda_inputs(40, 2, 16, 16, dtype=F64, device="cpu", seed=9, active_tokens=37, min_log_decay=DECAY).values()
    other = "final_state" if used == "o" else "o"

    def grads(fn, leaves, final_state=True, zero_other=False):
        outputs = dict(zip(("o", "final_state"), fn(*leaves, cu_seqlens, output_final_state=final_state)))
        loss = outputs[used].to(F64).sum() + (outputs[other] * 0).sum() if zero_other else outputs[used].to(F64).sum()
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    expected = grads(kda_recurrent, [x.clone().requires_grad_() for x in inputs])
    alone = grads(kda_on_device, [x.float().requires_grad_() for x in inputs], output_final_state)
    with_zero = grads(kda_on_device, [x.float().requires_grad_() for x in inputs], zero_other=True)
    for name, dx, dx_ref, dx_zero in zip(("q", "k", "v", "g", "beta"), alone, expected, with_zero):
        dx_ref = torch.zeros_like(inputs[0]) if dx_ref is None else dx_ref  # the final state ignores q
        torch.testing.assert_close(dx[:37].to(F64), dx_ref[:37], rtol=TOLERANCE, atol=TOLERANCE, msg=name)
        assert torch.equal(dx[:37], dx_zero[:37]), name  # rows past L = 37 are undefined


def test_defaults_and_contract():
    """No final state unless asked, scale K ** -0.5; the one refusal the kernels need (they tile
    chunks by 16-row sub-blocks); cu_seqlens values checked where reading them is free (a CPU
    tensor) or asked for (validate=True)."""
    q, k, v, g, beta, _ = kda_inputs(20, 2, 16, 16, dtype=torch.float32, device="cpu", seed=5, min_log_decay=DECAY).values()
    o, s = kda_on_device(q, k, v, g, beta, cu(0, 20), chunk_size=16)
    o_one, _ = kda_on_device(q, k, v, g, beta, cu(0, 20), chunk_size=16, scale=1.0)
    assert s is None
    torch.testing.assert_close(o, o_one / 4.0, rtol=1e-6, atol=1e-6)
    q, k, v, g, beta = (x.to(DEVICE) for x in (q, k, v, g, beta))
    with pytest.raises(ValueError, match="chunk_size"):
        kda_triton(q, k, v, g, beta, cu(0, 2, 20, device=DEVICE), chunk_size=8)
    for bounds in ((0, 2, 26), (0, 3, 2), (1, 2, 20)):
        with pytest.raises(ValueError, match="cu_seqlens"):
            kda_triton(q, k, v, g, beta, cu(*bounds, device=DEVICE), validate=True if DEVICE == "cuda" else None)


@pytest.mark.parametrize(("bounds", "T", "C", "K", "V"), [((0, 0, 1, 40, 40, 97, 130), 140, 64, 32, 32),
                                                          ((0, 5, 5, 6, 39, 60), 64, 16, 32, 16)])
@pytest.mark.parametrize(("dtype", "bound"), [(torch.bfloat16, SUITE_TOLERANCE["bfloat16"]), (torch.float16, 1e-2)])
def test_low_precision_matches_float64_reference(bounds, T, C, K, V, dtype, bound):
    """Operands that only feed products kept in the inputs' dtype, against float64 on the same rounded
    inputs by the suite's measure: bfloat16 measured up to ~2e-2, held to 5e-2; float16 to 1e-2."""
    L, N = bounds[-1], len(bounds) - 1
    *inputs, _ = kda_inputs(T, 2, K, V, dtype=F64, device="cpu", seed=sum(bounds), active_tokens=L, min_log_decay=DECAY).values()
    inputs = [x.to(dtype) for x in inputs]
    gen = torch.Generator().manual_seed(L)
    weights = (torch.randn(T, 2, V, generator=gen, dtype=F64), torch.randn(N, 2, K, V, generator=gen, dtype=F64))
    o_ref, s_ref, d_ref = gradients(kda_chunked, [x.to(F64) for x in inputs], cu(*bounds), weights, chunk_size=C)
    o, s, d = gradients(kda_on_device, inputs, cu(*bounds), weights, chunk_size=C)
    assert o.dtype == dtype and s.dtype == torch.float32
    for name, x, x_ref in zip(NAMES, (o, s, *d), (o_ref, s_ref, *d_ref)):
        x, x_ref = (x, x_ref) if name == "final_state" else (x[:L], x_ref[:L])
        stats = error_stats(x, x_ref)
        assert stats["nonfinite"] == 0 and stats["rel_err"] <= bound, (name, stats)


@pytest.mark.gpu
def test_gpu_graph_replays_two_layouts():
    """One capture of forward and backward, replayed for two layouts: each replay equals an eager call
    bit for bit (no atomics), and the float64 reference up to bfloat16 rounding."""
    T, N, H, K, V = 512, 4, 2, 128, 128
    layouts = [(0, 100, 100, 101, 400), (0, 0, 250, 330, 331)]
    *inputs, _ = kda_inputs(T, H, K, V, dtype=F64, device="cuda", seed=23, min_log_decay=DECAY).values()
    inputs = [x.to(torch.bfloat16) for x in inputs]
    leaves = [x.detach().requires_grad_() for x in inputs]
    gen = torch.Generator().manual_seed(24)
    weights = (torch.randn(T, H, V, generator=gen, dtype=F64).cuda(), torch.randn(N, H, K, V, generator=gen, dtype=F64).cuda())
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
        static_cu.copy_(cu(*bounds, device="cuda"))
        graph.replay()
        eager = step(cu(*bounds, device="cuda"))
        L = bounds[-1]  # rows past it are undefined
        for name, replayed, expected in zip(NAMES, static_out, eager):
            rows = slice(None) if name == "final_state" else slice(L)
            torch.testing.assert_close(replayed[rows], expected[rows], rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
        o_ref, _ = kda_chunked(*(x.to(F64) for x in inputs), cu(*bounds, device="cuda"))
        assert float((static_out[0][:L].to(F64) - o_ref[:L]).norm() / o_ref[:L].norm()) < 2e-2
