"""The reliability rules as properties, tested as kinds rather than examples.

1. Every attention implementation that runs here, every schedule, forward and backward, equals a
   float64 loop on random *valid* layouts: empty sequences anywhere, T < N, L < T, L = T, one long
   sequence.
2. Every kind of consumer of ``cu_seqlens`` refuses every malformed layout, and malformed values
   in CPU metadata, with a ``TypeError``/``ValueError`` that names ``cu_seqlens``.
3. On a GPU, captured graphs replay random layouts exactly.

Bounded for CI: a few dozen examples per property, small shapes, the Triton kernels in the
interpreter on a CPU and compiled on a GPU.
"""

import math

import pytest
import torch
from helpers import interval_attention
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from attn_gym_lite import ragged, schedule
from attn_gym_lite.models.attention import VarLenAttention
from attn_gym_lite.ops.attention import varlen_attention
from attn_gym_lite.ops.kda import kda_triton
from attn_gym_lite.ops.kernels import INTERPRETED, varlen_attention_triton
from attn_gym_lite.ops.short_conv import short_conv
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = INTERPRETED or torch.cuda.is_available()
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 3e-2 if DTYPE == torch.bfloat16 else 2e-5


@st.composite
def valid_layouts(draw):
    """(T, lengths, N): empty sequences anywhere, T > L or T = L, T < N possible, one long sequence."""
    kind = draw(st.sampled_from(["mixed", "one_long", "many_short", "all_empty"]))
    if kind == "one_long":
        lengths = [draw(st.integers(1, 48))]
    elif kind == "many_short":
        lengths = draw(st.lists(st.integers(0, 2), min_size=1, max_size=12))
    elif kind == "all_empty":
        lengths = [0] * draw(st.integers(1, 3))
    else:
        lengths = draw(st.lists(st.integers(0, 20), min_size=1, max_size=5))
    slots = len(lengths) + draw(st.integers(0, 4))
    rows = sum(lengths) + draw(st.sampled_from([0, 0, 1, 7]))  # L = T half the time
    return max(rows, 1), lengths, slots


def naive(q, k, v, bounds, causal):
    """Float64 softmax attention, one query at a time."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        for t in range(start, end):
            keys = slice(start, t + 1 if causal else end)
            scores = torch.einsum("hd,shd->hs", q[t], k[keys]) / math.sqrt(q.shape[-1])
            out[t] = torch.einsum("hs,shd->hd", scores.softmax(-1), v[keys])
    return out


def per_sequence(q, k, v, bounds, causal):
    """:func:`naive` in a few operations per sequence rather than several per row (checked below)."""
    out = torch.zeros_like(q, dtype=torch.float64)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out = out.index_put((torch.arange(start, end),), interval_attention(q, k, v, start, end, causal))
    return out


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_the_per_sequence_reference_equals_the_loop(lengths, causal, seed):
    assume(sum(lengths) > 0)  # no sequence: no output depends on the inputs, nothing to compare
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(sum(lengths) + 2, 2, 8, generator=g, dtype=torch.float64) for _ in range(4))
    bounds = cu_seqlens_from_lengths(lengths).tolist()
    values = []
    for reference in (naive, per_sequence):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = reference(*inputs, bounds, causal)
        values.append((out, *torch.autograd.grad(out, inputs, grad)))
    for mine, loop in zip(*values):
        torch.testing.assert_close(mine, loop, rtol=1e-12, atol=1e-12)


IMPLEMENTATIONS = [("reference", None)] + (
    [("triton", s) for s in ("rect", "flat", "persistent", "dynamic", "auto")] if KERNELS_RUN else []
) + ([("varlen_attn", None)] if torch.cuda.is_available() else [])


@settings(max_examples=12, deadline=None)
@given(layout=valid_layouts(), causal=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("impl, schedule_name", IMPLEMENTATIONS, ids=[f"{i}-{s}" for i, s in IMPLEMENTATIONS])
def test_every_implementation_matches_a_float64_loop_on_valid_layouts(impl, schedule_name, layout, causal, seed):
    rows, lengths, slots = layout
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), slots).to(DEVICE)
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if impl == "reference" else DTYPE
    q, k, v, grad = (torch.randn(rows, 2, 16, generator=g).to(DEVICE, dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    options = {"schedule": schedule_name} if schedule_name else {}
    out = varlen_attention(q, k, v, cu, impl=impl, causal=causal, max_seqlen=max(max(lengths), 1), **options)
    active = sum(lengths)
    bounds = cu.tolist()
    reference_inputs = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    expected = naive(*reference_inputs, bounds, causal)
    tolerance = 1e-10 if impl == "reference" else TOLERANCE
    scale = max(expected.abs().max().item(), 1.0)
    assert (out[:active].double().cpu() - expected[:active]).abs().max().item() <= tolerance * scale if active else True
    if active:
        # Gradients through the active rows only: what a masked loss sends back.
        mask = (torch.arange(rows) < active)[:, None, None].to(DEVICE)
        grads = torch.autograd.grad(out, (q, k, v), torch.where(mask, grad, 0))
        expected_grads = torch.autograd.grad(expected, reference_inputs, torch.where(mask.cpu(), grad.double().cpu(), 0))
        for name, mine, ref in zip("qkv", grads, expected_grads):
            scale = max(ref.abs().max().item(), 1.0)
            error = (mine[:active].double().cpu() - ref[:active]).abs().max().item()
            assert error <= tolerance * scale, f"d{name}: {error:.3g}"


# ---------------------------------------------------------------------------------------------
# 2. Malformed metadata: each rule, one consumer of each kind.

LAYOUT_RULES = {  # metadata alone shows these: every consumer refuses them, capture-safe or not
    "int64": torch.tensor([0, 3, 5], dtype=torch.int64),
    "2-D": torch.tensor([[0, 3], [3, 5]], dtype=torch.int32),
    "one entry": torch.tensor([0], dtype=torch.int32),
    "strided": torch.tensor([[0, 9], [3, 9], [5, 9]], dtype=torch.int32)[:, 0],
}
VALUE_RULES = {  # a read of the values shows these: every consumer refuses them in CPU metadata
    "first not 0": torch.tensor([1, 3, 5], dtype=torch.int32),
    "decreasing": torch.tensor([0, 5, 3], dtype=torch.int32),
    "past T": torch.tensor([0, 3, 9], dtype=torch.int32),
}
T = 6


def _qkv():
    return [torch.randn(T, 2, 16, dtype=DTYPE).to(DEVICE) for _ in range(3)]


def _on_device(cu):
    """``cu`` on the kernels' device with its strides kept (``.to`` would make it contiguous)."""
    return torch.empty_strided(cu.shape, cu.stride(), dtype=cu.dtype, device=DEVICE).copy_(cu)


CONSUMERS = {  # kind -> call with cu_seqlens
    "eager ragged helper": lambda cu: ragged.validate_cu_seqlens(cu, T),
    "capture-safe ragged helper": lambda cu: ragged.active_token_mask(T, cu),
    "capture-safe schedule helper": lambda cu: schedule.chunk_offsets(cu, 4),
    "reference op": lambda cu: varlen_attention(*[torch.randn(T, 2, 4) for _ in range(3)], cu, impl="reference"),
    "short conv": lambda cu: short_conv(torch.randn(T, 4), torch.randn(4, 3), cu),
    "module": lambda cu: VarLenAttention(8, 2, causal=True, impl="reference")(torch.randn(T, 8), cu),
}
if KERNELS_RUN:
    CONSUMERS["attention kernels"] = lambda cu: varlen_attention(*_qkv(), _on_device(cu), impl="triton")
    CONSUMERS["KDA kernels"] = lambda cu: kda_triton(
        *[torch.randn(T, 2, 16, device=DEVICE, dtype=DTYPE) for _ in range(4)],
        torch.rand(T, 2, device=DEVICE, dtype=DTYPE), _on_device(cu))


@pytest.mark.parametrize("rule", [*LAYOUT_RULES, *VALUE_RULES])
@pytest.mark.parametrize("consumer", CONSUMERS)
def test_every_kind_of_consumer_refuses_every_malformed_layout(consumer, rule):
    if rule in VALUE_RULES and DEVICE == "cuda" and "kernels" in consumer:
        pytest.skip("CUDA metadata is not read on the host (the kernels clamp instead)")
    if rule == "past T" and consumer == "capture-safe schedule helper":
        pytest.skip("takes no token capacity: L > T cannot be told")
    with pytest.raises((TypeError, ValueError), match="cu_seqlens"):
        CONSUMERS[consumer]({**LAYOUT_RULES, **VALUE_RULES}[rule])


# ---------------------------------------------------------------------------------------------
# 3. On the GPU: the same kind of layouts inside captured graphs. One graph per (schedule, causal)
#    is captured once at a fixed capacity (T, N) and replayed after copying each random layout into
#    its static cu_seqlens, the way a training loop uses it; forward and backward against float64.

GRAPH_T, GRAPH_N = 96, 8


@st.composite
def layouts_within(draw, token_capacity, sequence_capacity):
    """At most ``sequence_capacity`` lengths (empty ones anywhere) summing to at most ``token_capacity``."""
    count = draw(st.integers(1, sequence_capacity))
    lengths = []
    for _ in range(count):
        room = token_capacity - sum(lengths)
        lengths.append(draw(st.integers(0, room)) if draw(st.booleans()) else draw(st.integers(0, min(room, 3))))
    if draw(st.booleans()):  # fill to L = T half the time
        lengths[-1] += token_capacity - sum(lengths)
    return lengths


_GRAPHS = {}


def _captured(schedule_name, causal):
    """(graph, static tensors, outputs), captured on first use and kept for the session."""
    from attn_gym_lite.graph.capture import capture_graph

    key = (schedule_name, causal)
    if key not in _GRAPHS:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, grad = (torch.randn(GRAPH_T, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        cu = pad_cu_seqlens(cu_seqlens_from_lengths([GRAPH_T], device="cuda"), GRAPH_N)
        mask = torch.ones(GRAPH_T, 1, 1, device="cuda", dtype=torch.bfloat16)  # rows < L, set per replay
        options = {"max_seqlen": GRAPH_T} if schedule_name == "rect" else {}  # rect's bound: the capacity

        def step():
            out = varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule_name, **options)
            return (out, *torch.autograd.grad(out, (q, k, v), grad * mask))

        graph, outputs = capture_graph(step)
        _GRAPHS[key] = graph, (q, k, v, grad, cu, mask), outputs
    return _GRAPHS[key]


@pytest.mark.gpu
# No shrinking: a failure is reported with its first example at once, within a CI lane's time limit.
@settings(max_examples=25, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(lengths=layouts_within(GRAPH_T, GRAPH_N), causal=st.booleans())
@pytest.mark.parametrize("schedule_name", ["rect", "flat", "persistent", "dynamic"])
def test_captured_graphs_replay_random_layouts_exactly(schedule_name, lengths, causal):
    graph, (q, k, v, grad, cu, mask), outputs = _captured(schedule_name, causal)
    active = sum(lengths)
    cu.copy_(pad_cu_seqlens(cu_seqlens_from_lengths(lengths, device="cuda"), GRAPH_N))
    mask.copy_((torch.arange(GRAPH_T, device="cuda") < active)[:, None, None])
    graph.replay()
    torch.cuda.synchronize()
    if active == 0:
        return  # nothing is defined: rows past L are unspecified by contract
    reference_inputs = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    expected = per_sequence(*reference_inputs, cu.tolist(), causal)
    expected_grads = torch.autograd.grad(expected, reference_inputs, (grad * mask).double().cpu())
    for name, mine, ref in zip(("out", "dq", "dk", "dv"), outputs, (expected, *expected_grads)):
        scale = max(ref[:active].abs().max().item(), 1.0)
        error = (mine[:active].double().cpu() - ref[:active]).abs().max().item()
        assert error <= 3e-2 * scale, f"{schedule_name} causal={causal} {lengths}: {name} max error {error:.3g}"
