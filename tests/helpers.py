"""Helpers several test files share (no test module imports another): references, layouts, checks."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from attn_gym_lite.data import PackedBatch
from attn_gym_lite.ops.attention import varlen_attention_reference
from attn_gym_lite.ops.kernels import INTERPRETED
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.testing.exactness import compare_gradients, exact_gradients, gradients_at_capacity

CPU_KERNELS = pytest.mark.skipif(not INTERPRETED, reason="CPU tensors reach the Triton kernels only in the interpreter")

FAST = settings(max_examples=30, deadline=None)
FILLS = ("nan", "inf", "huge")


@st.composite
def ragged_layouts(draw, max_tokens=12, max_sequences=5):
    """``(T, cu_seqlens)``: N slots, L <= T tokens in M <= N sequences (empty ones included),
    drawn so that L = T, L = 0 and partial fills all come up."""
    tokens = draw(st.integers(1, max_tokens))
    slots = draw(st.integers(1, max_sequences))
    fill = draw(st.sampled_from(["full", "empty", "partial"]))
    active = {"full": tokens, "empty": 0, "partial": draw(st.integers(0, tokens))}[fill]
    used = draw(st.integers(1, slots))
    cuts = sorted(draw(st.lists(st.integers(0, active), min_size=used - 1, max_size=used - 1)))
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, active])]
    return tokens, pad_cu_seqlens(cu_seqlens_from_lengths(lengths), slots)


#: Fixed layouts that must always be covered: L = T, L = 0, and M < N with an empty slot inside.
EDGE_LAYOUTS = {
    "L=T": (10, pad_cu_seqlens(cu_seqlens_from_lengths([6, 4]), 2)),
    "L=0": (7, pad_cu_seqlens(cu_seqlens_from_lengths([0]), 3)),
    "M<N": (12, pad_cu_seqlens(cu_seqlens_from_lengths([4, 0, 3]), 6)),
}


def fill_inactive(x, cu_seqlens, fill):
    """A copy of ``x`` with rows ``L..T-1`` set to NaN, +Inf or the dtype's largest value."""
    out = x.clone()
    out[int(cu_seqlens[-1]):] = {"nan": math.nan, "inf": math.inf, "huge": torch.finfo(x.dtype).max}[fill]
    return out


def filled_input_and_target(tokens, cu_seqlens, fill, width_in, width_out, seed):
    """Float64 ``x [T, width_in]`` and ``target [T, width_out]`` drawn after ``manual_seed(seed)``,
    their rows ``L..T-1`` set by :func:`fill_inactive`."""
    torch.manual_seed(seed)
    x = fill_inactive(torch.randn(tokens, width_in, dtype=torch.float64), cu_seqlens, fill)
    return x, fill_inactive(torch.randn(tokens, width_out, dtype=torch.float64), cu_seqlens, fill)


def padded_and_exact(module, x, target, cu_seqlens, max_seqlen):
    """``compare_gradients`` of one step at capacity against the exact step on the L real rows."""
    return compare_gradients(gradients_at_capacity(module, x, target, cu_seqlens, max_seqlen),
                             exact_gradients(module, x, target, cu_seqlens))


def assert_exact(report, rtol):
    """No non-finite gradient, and every gradient within ``rtol`` of the exact one's scale."""
    for name, g in report["gradients"].items():
        assert g["nonfinite"] == 0, f"{name}: {g['nonfinite']} non-finite entries"
        assert g["max_abs_diff"] <= rtol * max(g["max_abs_exact"], 1e-3), (name, g)
    assert report["loss_at_capacity"] == pytest.approx(report["loss_exact"], rel=rtol, abs=rtol)


def contaminated(report, rtol):
    """Names of the gradients that are non-finite or not within ``rtol`` of the exact ones."""
    return {name for name, g in report["gradients"].items()
            if g["nonfinite"] or g["max_abs_diff"] > rtol * max(g["max_abs_exact"], 1e-3)}


def attention_with_undefined_capacity(q, k, v, cu_seqlens, max_seqlen, *, causal=False):
    """torch's ``varlen_attn`` contract on the CPU: rows past L of the output and of the q/k/v
    gradients are NaN (torch leaves them undefined); active rows are exact."""
    out = varlen_attention_reference(q, k, v, cu_seqlens, causal=causal)
    inactive = torch.arange(q.shape[0]) >= cu_seqlens[-1]
    poison = (q + k + v) * torch.where(inactive, math.nan, 0.0)[:, None, None]
    return torch.where(inactive[:, None, None], out + poison, out)


def attention_and_grads(fn, q, k, v, do, dtype=None):
    """``[out, dq, dk, dv]`` of ``fn(q, k, v)`` for the output gradient ``do``, inputs cast to ``dtype``."""
    q, k, v = (x.detach().to(dtype or x.dtype).requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    if not out.requires_grad:  # the reference with L = 0 never touches its inputs
        return [out, *(torch.zeros_like(x) for x in (q, k, v))]
    return [out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype))]


def reference_and_grads(q, k, v, do, cu_seqlens, causal=False):
    """:func:`attention_and_grads` of the reference attention, in float64."""
    return attention_and_grads(lambda q, k, v: varlen_attention_reference(q, k, v, cu_seqlens, causal=causal),
                               q, k, v, do, torch.float64)


def assert_attention_close(ours, reference, active, rtol, zeroed=False, what=""):
    """Rows below ``active`` of out, dq, dk, dv within ``rtol`` of the largest reference value; the
    rows past it zero where ``zeroed`` (by default they are unspecified, as with torch's varlen_attn)."""
    for name, mine, ref in zip(("out", "dq", "dk", "dv"), ours, reference):
        scale = max(ref.abs().max().item(), 1.0)
        error = (mine[:active].double() - ref[:active]).abs().max().item() if active else 0.0
        assert error <= rtol * scale, f"{what} {name}: max error {error:.3g} > {rtol * scale:.3g}"
        if zeroed:
            assert not mine[active:].any(), f"{what} {name}: rows past L = {active} are not zero"


def calling(attention):
    """Patch target for a module's ``varlen_attention``: same call, another implementation."""
    return lambda q, k, v, cu_seqlens, *, causal=False, max_seqlen=None, **_: attention(q, k, v, cu_seqlens, max_seqlen,
                                                                                     causal=causal)


class ByteTokenizer:
    """One token per UTF-8 byte: token counts are len(text.encode())."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts):
        return [self.encode(text) for text in texts]

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8")


def sequences_of(batch: PackedBatch) -> list[list[int]]:
    """The active sequences' token ids, cut at cu_seqlens (empty tail slots dropped)."""
    ids = batch.input_ids.tolist()
    return [ids[start:end] for start, end in pairwise(batch.cu_seqlens.tolist()) if end > start]


def assert_batch_invariants(batch: PackedBatch, token_capacity: int, sequence_capacity: int, *, second_half_loss=False):
    """Check every documented property of a PackedBatch with plain loops."""
    T, N = token_capacity, sequence_capacity
    assert batch.input_ids.dtype == torch.int64 and batch.input_ids.shape == (T,)
    assert batch.labels.dtype == torch.int64 and batch.labels.shape == (T,)
    assert batch.loss_mask.dtype == torch.bool and batch.loss_mask.shape == (T,)
    assert batch.cu_seqlens.dtype == torch.int32 and batch.cu_seqlens.shape == (N + 1,)
    assert batch.token_capacity == T and batch.sequence_capacity == N

    cu = batch.cu_seqlens.tolist()
    L, M = batch.active_tokens, batch.active_sequences
    lengths = [end - start for start, end in pairwise(cu)]
    assert cu[0] == 0 and cu[-1] == L
    assert 1 <= L <= T and 1 <= M <= N
    # M non-empty sequences first, then empty slots whose boundary repeats L.
    assert all(length > 0 for length in lengths[:M])
    assert cu[M:] == [L] * (N + 1 - M)
    assert batch.max_seqlen == max(lengths)

    ids, labels, mask = batch.input_ids.tolist(), batch.labels.tolist(), batch.loss_mask.tolist()
    for start, end in pairwise(cu[: M + 1]):
        loss_start = start + (end - start) // 2 if second_half_loss else start
        for t in range(start, end - 1):
            assert mask[t] == (t >= loss_start), (t, start, end)
            if mask[t]:
                assert labels[t] == ids[t + 1]
        assert not mask[end - 1] and labels[end - 1] == 0
    for t in range(L, T):
        assert ids[t] == 0 and labels[t] == 0 and not mask[t]
    assert all(label == 0 for label, counted in zip(labels, mask) if not counted)


def interval_attention(q, k, v, start, end, causal):
    """Float64 softmax attention over rows ``[start, end)`` alone (scale ``1/sqrt(D)``):
    ``[end - start, H, D]``, differentiable."""
    qs, ks, vs = (x[start:end].double().transpose(0, 1) for x in (q, k, v))
    scores = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
    if causal:
        length = end - start
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ vs).transpose(0, 1)


def naive_short_conv(x, weight, cu_seqlens):
    """y[t, c] = Σ_k w[c, k] x[t - (W-1) + k, c] over the taps inside t's own sequence; rows past
    L are 0. One token at a time, in float64, differentiable through plain indexing."""
    x, weight = x.double(), weight.double()
    width = weight.shape[1]
    rows = [x.new_zeros(x.shape[1]) for _ in range(x.shape[0])]
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        for t in range(start, end):
            for k in range(width):
                source = t - (width - 1) + k
                if source >= start:
                    rows[t] = rows[t] + weight[:, k] * x[source]
    return torch.stack(rows) if rows else x.new_zeros(0, x.shape[1])


def kda_bounds(*bounds: int, device: str = "cpu") -> torch.Tensor:
    """``cu_seqlens`` from its entries (int32)."""
    return torch.tensor(bounds, dtype=torch.int32, device=device)

