"""Malformed ``cu_seqlens`` values that nothing checked (CUDA metadata the host never reads, or a
kernel called below the checks) give wrong numbers, never an access outside the tensors.

Every kernel clamps each sequence into the ``T`` rows (``start = clamp(cu[i], 0, T)``, ``end =
clamp(cu[i + 1], start, T)``), and ``chunk_offsets`` is built from the same clamped lengths, so the
kernels compute over those clamped intervals; these tests hold them to exactly that against a
float64 computation. Each call runs in a fresh process: an out-of-bounds access corrupts the heap
in the interpreter and is an illegal memory access on a GPU, and must fail one test only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import interval_attention

from attn_gym_lite.isolation import run_isolated

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
RTOL = 3e-2 if DTYPE == torch.bfloat16 else 2e-5
INT32_MAX = 2**31 - 1

# name -> (cu_seqlens values, T): none of them valid.
MALFORMED = {
    "L past T": ([0, 8, 20], 10),  # q[:10] with a batch of 20 tokens
    "decreasing": ([0, 12, 8, 20], 20),
    "negative": ([-5, 4, -3, 6], 12),
    "huge": ([0, INT32_MAX, INT32_MAX, 3], 24),
    "all past T": ([30, 40, 50], 16),
}


def _inputs(rows, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, 2, width, generator=g) for _ in range(4)]


def clamped_intervals(values, rows):
    """The kernels' reading of ``values``: sequence ``i`` is rows ``[start, end)``."""
    intervals = []
    for a, b in zip(values[:-1], values[1:]):
        start = min(max(a, 0), rows)
        intervals.append((start, min(max(b, start), rows)))
    return intervals


SCHEDULES = ("rect", "flat", "persistent", "dynamic")


def attention_child(values, rows):
    """In the child: ``varlen_attention_triton`` (which reads no values) on ``values``, every
    schedule, causal and not; ``{"<schedule>-<causal>": [out, dq, dk, dv]}`` as nested lists."""
    from attn_gym_lite.ops.kernels import varlen_attention_triton

    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    q, k, v, do = (x.to(DEVICE, DTYPE) for x in _inputs(rows, 16))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    results = {}
    for schedule in SCHEDULES:
        for causal in (False, True):
            options = {"max_seqlen": rows} if schedule == "rect" else {}
            out = varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule, **options)
            grads = torch.autograd.grad(out, (q, k, v), do)
            if DEVICE == "cuda":
                torch.cuda.synchronize()  # an illegal access surfaces here, in the child
            results[f"{schedule}-{causal}"] = [x.float().cpu().tolist() for x in (out, *grads)]
    return results


def _child_env():
    here = Path(__file__).resolve().parent
    paths = [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


KERNELS_RUN = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not KERNELS_RUN, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("layout", MALFORMED)
def test_attention_kernels_stay_inside_the_tensors_on_malformed_layouts(layout):
    values, rows = MALFORMED[layout]
    results = run_isolated(attention_child, values, rows, timeout_s=300, env=_child_env())
    assert sorted(results) == sorted(f"{s}-{c}" for s in SCHEDULES for c in (False, True))
    for key, result in results.items():
        _assert_clamped_attention(layout, key, values, rows, key.endswith("True"),
                                  *(torch.tensor(x, dtype=torch.float64) for x in result))


def _assert_clamped_attention(layout, key, values, rows, causal, out, dq, dk, dv):
    q, k, v, do = (x.to(DTYPE).double().requires_grad_() for x in _inputs(rows, 16))
    intervals = [(s, e) for s, e in clamped_intervals(values, rows) if e > s]
    covered = [[i for i, (s, e) in enumerate(intervals) if s <= t < e] for t in range(rows)]
    overlapping = any(len(c) > 1 for c in covered)
    expected = [interval_attention(q, k, v, s, e, causal) for s, e in intervals]
    for t, owners in enumerate(covered):
        if not owners:
            continue  # a row no clamped sequence covers: unspecified, never written
        # Overlapping intervals: two programs store the row, racing element by element on a GPU,
        # so each element must equal one owner's value.
        errors = torch.stack([(out[t] - expected[i][t - intervals[i][0]].detach()).abs() for i in owners])
        error = errors.min(0).values.max().item()
        assert error <= RTOL * 4, (layout, key, t, errors.flatten(1).max(1).values.tolist())
    if overlapping or not intervals:
        return  # two tasks wrote the same rows (which gradient won is a race), or none: bounds were the test
    # Disjoint intervals: the gradients of the clamped layout, exactly.
    reference = torch.zeros_like(q)
    for (s, e), part in zip(intervals, expected):
        reference = reference.index_put((torch.arange(s, e),), part)
    mask = torch.tensor([bool(c) for c in covered])[:, None, None]
    grads = torch.autograd.grad(reference, (q, k, v), torch.where(mask, do.double(), 0))
    for name, mine, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        error = (mine[mask.flatten()] - ref[mask.flatten()]).abs().max().item()
        assert error <= RTOL * 4 * max(ref.abs().max().item(), 1.0), (layout, key, name, error)


def kda_child(values, rows):
    """In the child: ``kda_triton`` on ``values``, unchecked; ``[o, d sum(o) / dq]`` as nested lists."""
    from attn_gym_lite.ops.kda import kda_triton

    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    q, k, v, g = (x.to(DEVICE, DTYPE) for x in _inputs(rows, 16, seed=1))
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -g.abs() * 0.1
    beta = torch.rand(rows, 2, generator=torch.Generator().manual_seed(2)).to(DEVICE, DTYPE)
    q = q.requires_grad_()
    o, _ = kda_triton(q, k, v, g, beta, cu, chunk_size=16, validate=False)
    (dq,) = torch.autograd.grad(o.float().sum(), (q,))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return [o.float().cpu().tolist(), dq.float().cpu().tolist()]


@pytest.mark.skipif(not KERNELS_RUN, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("layout", MALFORMED)
def test_kda_kernels_stay_inside_the_tensors_on_malformed_layouts(layout):
    from attn_gym_lite.ops.kda import kda_recurrent

    values, rows = MALFORMED[layout]
    out, dq = (torch.tensor(x, dtype=torch.float64)
               for x in run_isolated(kda_child, values, rows, timeout_s=300, env=_child_env()))
    assert out.shape == (rows, 2, 16) and dq.shape == (rows, 2, 16)
    intervals = [(s, e) for s, e in clamped_intervals(values, rows) if e > s]
    q, k, v, g = (x.to(DTYPE).double() for x in _inputs(rows, 16, seed=1))
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -g.abs() * 0.1
    beta = torch.rand(rows, 2, generator=torch.Generator().manual_seed(2)).to(DTYPE).double()
    # Rows no interval covers are undefined (as attention's); the covered ones must be finite.
    covered = torch.tensor([any(s <= r < e for s, e in intervals) for r in range(rows)], dtype=torch.bool)
    assert torch.isfinite(out[covered]).all() and torch.isfinite(dq[covered]).all()
    tolerance = 1e-3 if DTYPE == torch.float32 else 5e-2
    if any(s1 < e2 and s2 < e1 for i, (s1, e1) in enumerate(intervals) for s2, e2 in intervals[i + 1:]):
        return  # overlapping sequences share per-row intermediates: only staying in bounds is promised
    for s, e in intervals:  # the recurrence over each interval alone, from a zero state
        piece = [x[s:e] for x in (q, k, v, g, beta)]
        expected, _ = kda_recurrent(*piece, torch.tensor([0, e - s], dtype=torch.int32))
        error = (out[s:e] - expected).abs().max().item()
        assert error <= tolerance, (layout, (s, e), error)


def malformed_short_conv_child(cu_values, positions, tokens, channels, width, silu):
    """In the child: the Triton kernels on a malformed ``cu_seqlens`` and arbitrary row positions
    (what ``positions_in_sequence`` may give for such values on a GPU); ``[y, dx, dw]`` as lists."""
    import torch

    from attn_gym_lite.ops import short_conv_triton as kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(tokens, channels, generator=g).to(device) for _ in range(2))
    w = torch.randn(channels, width, generator=g).to(device)
    cu = torch.tensor(cu_values, dtype=torch.int32, device=device)
    position = torch.tensor(positions, dtype=torch.int32, device=device)
    y, dx = torch.zeros_like(x), torch.zeros_like(x)
    grid = kernels._grid(tokens, channels)
    parts = torch.zeros(grid[0], channels, width, device=device)
    args = dict(W=width, BT=kernels.BLOCK_T, BD=kernels.BLOCK_D, num_warps=kernels.NUM_WARPS)
    layout = (position, cu, len(cu_values) - 1, tokens, channels)
    kernels.short_conv_forward_kernel[grid](x, w, y, *layout, x.stride(0), y.stride(0), SILU=silu, **args)
    grad_z = dy  # the gradient of the pre-activation: dy itself without the SiLU
    if silu:
        grad_z = torch.zeros_like(dy)
        kernels.short_conv_silu_backward_kernel[grid](x, w, dy, grad_z, *layout, x.stride(0), dy.stride(0), **args)
    kernels.short_conv_backward_kernel[grid](x, w, grad_z, dx, parts, *layout, x.stride(0), grad_z.stride(0), dx.stride(0), **args)
    if device == "cuda":
        torch.cuda.synchronize()  # an illegal access surfaces here, in the child
    return [t.cpu().double().tolist() for t in (y, dx, parts.sum(0))]


#: (cu_seqlens values, positions of the T rows): none of them a valid layout.
MALFORMED_SHORT_CONV = {
    "L past T": ([0, 8, 50], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
    "L negative": ([0, -7], [0] * 20),
    "positions past the row": ([0, 20], [9, 30, 2**30, 5, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]),
    "negative positions": ([0, 20], [-1, -5, 2, 3, -(2**31), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]),
}


@pytest.mark.skipif(not KERNELS_RUN, reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("case", MALFORMED_SHORT_CONV)
def test_short_conv_kernels_stay_inside_the_tensors_on_malformed_metadata(case, silu):
    # The kernels' masks are the whole defence on a GPU (a CUDA cu_seqlens is never read on the
    # host): every tap needs j <= position and t - j >= 0, every row t < clamp(L, 0, T). Held to a
    # float64 loop of exactly that rule; a crash or an access outside fails the child only.
    cu_values, positions = MALFORMED_SHORT_CONV[case]
    tokens, channels, width = len(positions), 5, 4
    y, dx, dw = (torch.tensor(v, dtype=torch.float64) for v in
                 run_isolated(malformed_short_conv_child, cu_values, positions, tokens, channels, width, silu,
                              timeout_s=300, env=_child_env()))
    g = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(tokens, channels, generator=g).double() for _ in range(2))
    w = torch.randn(channels, width, generator=g).double()
    x.requires_grad_(), w.requires_grad_()
    active = min(max(cu_values[-1], 0), tokens)
    rows = []
    for t in range(active):
        taps = [w[:, width - 1 - j] * x[t - j] for j in range(width) if j <= positions[t] and t - j >= 0]
        rows.append(sum(taps) if taps else x.new_zeros(channels))
    if not rows:
        assert torch.equal(y, torch.zeros_like(y)) and torch.equal(dx, torch.zeros_like(dx))
        assert torch.equal(dw, torch.zeros_like(dw))
        return
    expected = torch.stack(rows)
    expected = expected * torch.sigmoid(expected) if silu else expected
    e_dx, e_dw = torch.autograd.grad(expected, (x, w), dy[:active])
    torch.testing.assert_close(y[:active], expected.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[active:], torch.zeros_like(y[active:]))  # never written
    torch.testing.assert_close(dx[:active], e_dx[:active], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, e_dw, rtol=1e-5, atol=1e-4)
