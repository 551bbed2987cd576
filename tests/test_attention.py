"""varlen_attention, the one entry point: the reference path against a naive float64 loop, the
dispatch, the checks every implementation shares, and torch's and our CUDA kernels against the
reference (GPU)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ops.attention import needs_max_seqlen, resolve_impl, varlen_attention, varlen_attention_reference
from attn_gym_lite.ops.kernels import INTERPRETED
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
    out = varlen_attention(q, k, v, cu, impl="reference", causal=causal)
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


def test_auto_picks_the_kernels_where_they_run_and_the_reference_elsewhere():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernel_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    runs_here = (device == "cuda") != INTERPRETED
    assert resolve_impl("auto", torch.zeros(4, 2, 16, device=device, dtype=kernel_dtype)) == (
        "triton" if runs_here else "reference")
    assert resolve_impl("auto", torch.zeros(4, 2, 16, dtype=torch.float64)) == "reference"
    # The kernels take CUDA tensors compiled and CPU ones interpreted; a meta tensor neither
    # (before, the interpreter was chosen for every non-CUDA device).
    assert resolve_impl("auto", torch.zeros(4, 2, 16, device="meta", dtype=torch.bfloat16)) == "reference"
    assert resolve_impl("auto", torch.zeros(4, 2, 24, device=device, dtype=kernel_dtype)) == "reference"  # D
    assert resolve_impl("varlen_attn", torch.zeros(4, 2, 16)) == "varlen_attn"
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'triton', 'varlen_attn', 'reference', 'sdpa'\), got 'fa3'"):
        resolve_impl("fa3", torch.zeros(4, 2, 16))
    assert needs_max_seqlen("varlen_attn") and needs_max_seqlen("triton", "rect")
    assert not needs_max_seqlen("triton") and not needs_max_seqlen("triton", "dynamic") and not needs_max_seqlen("reference")


def test_needs_max_seqlen_refuses_an_unknown_impl_or_schedule():
    assert not needs_max_seqlen("auto", "auto")
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'triton', .*\), got 'nope'"):
        needs_max_seqlen("nope")
    with pytest.raises(ValueError, match=r"schedule must be one of \('rect', .*\), got 'nope'"):
        needs_max_seqlen("triton", "nope")


@pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(), reason="the kernels run neither compiled nor interpreted")
@pytest.mark.parametrize("causal", [False, True])
def test_every_implementation_here_computes_the_same_attention(causal):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([9, 0, 1, 14]), 6).to(device)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(30, 2, 16, generator=g).to(device, dtype) for _ in range(3))
    expected = naive_attention(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), causal)
    impls = ["triton", "reference"] + (["varlen_attn"] if device == "cuda" else [])
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for impl in impls:
        out = varlen_attention(q, k, v, cu, impl=impl, causal=causal, max_seqlen=14)
        torch.testing.assert_close(out[:24].double().cpu(), expected[:24], atol=tolerance, rtol=tolerance)


# The reliability issue's examples, through every implementation available here: each gives the
# same ValueError/TypeError, naming the argument, before dispatching. q, k, v are [12, 2, 4].
BAD_METADATA = [
    (torch.tensor([0, 5, 9, 9]), TypeError, "cu_seqlens must have dtype torch.int32"),  # int64
    (torch.tensor([0, 5, 3, 9], dtype=torch.int32), ValueError,
     r"cu_seqlens must be non-decreasing, but cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 5"),
    (torch.tensor([0, 5, 9, 14], dtype=torch.int32), ValueError,
     r"cu_seqlens\[-1\] \(active tokens L\) must be <= token_capacity T = 12, got L = 14"),
    (torch.tensor([1, 5, 9, 9], dtype=torch.int32), ValueError, r"cu_seqlens\[0\] must be 0, got 1"),
    (torch.tensor([[0, 7], [5, 7], [9, 7]], dtype=torch.int32)[:, 0], ValueError, "cu_seqlens must be contiguous"),
    (torch.tensor([0, 5, 9], dtype=torch.int32, device="meta"), ValueError, "cu_seqlens must be on device cpu, got meta"),
    ([0, 5, 9], TypeError, "cu_seqlens must be a torch.Tensor of int32 prefix sums, got list"),
]


@pytest.mark.parametrize("cu, error, match", BAD_METADATA, ids=[m[:30] for _, _, m in BAD_METADATA])
def test_bad_metadata_is_refused_before_dispatch(cu, error, match):
    q, k, v = (torch.randn(12, 2, 4, dtype=torch.float64) for _ in range(3))
    with pytest.raises(error, match=match):
        varlen_attention(q, k, v, cu, impl="reference")


def test_bad_tensors_and_options_name_themselves():
    q = torch.randn(4, 2, 8)
    cu = cu_seqlens_from_lengths([4])
    with pytest.raises(ValueError, match=r"q, k, v must have one shape \[T, H, D\]"):
        varlen_attention(q, q, torch.randn(5, 2, 8), cu)
    with pytest.raises(ValueError, match=r"k must have shape \[T, H, D\], got shape \(4, 16\)"):
        varlen_attention(q, q.view(4, 16), q, cu)
    with pytest.raises(TypeError, match="causal must be a bool, got 1"):
        varlen_attention(q, q, q, cu, causal=1)
    with pytest.raises(ValueError, match="max_seqlen must be an int >= 1 for impl='varlen_attn', got None"):
        varlen_attention(q, q, q, cu, impl="varlen_attn")
    with pytest.raises(ValueError, match="impl='varlen_attn' needs CUDA bfloat16/float16 tensors, got torch.float32 on cpu"):
        varlen_attention(q, q, q, cu, impl="varlen_attn", max_seqlen=4)
    with pytest.raises(ValueError, match=r"schedule must be one of .*got 'grid'"):
        varlen_attention(q, q, q, cu, schedule="grid")
    with pytest.raises(ValueError, match="max_seqlen must be an int >= 1, got 0"):
        varlen_attention(q, q, q, cu, impl="reference", max_seqlen=0)


@pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(), reason="the kernels run neither compiled nor interpreted")
def test_a_max_seqlen_below_the_longest_sequence_is_refused_outside_a_capture():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cu = torch.tensor([0, 40, 48, 48], dtype=torch.int32, device=device)
    q = torch.randn(48, 2, 16, device=device, dtype=dtype)
    message = "max_seqlen must be >= the longest sequence, got max_seqlen = 13 but sequence 0 has length 40"
    with pytest.raises(ValueError, match=message):
        varlen_attention(q, q, q, cu, impl="triton", schedule="rect", max_seqlen=13)
    if device == "cuda":
        with pytest.raises(ValueError, match=message):
            varlen_attention(q, q, q, cu, impl="varlen_attn", max_seqlen=13)
    # A bound the schedule does not use is checked where the values are read anyway (a CPU
    # cu_seqlens, the interpreter), and not on CUDA, where reading them would cost a sync.
    if device == "cuda":
        varlen_attention(q, q, q, cu, impl="triton", max_seqlen=13)
    else:
        with pytest.raises(ValueError, match=message):
            varlen_attention(q, q, q, cu, impl="triton", max_seqlen=13)


def test_the_reference_checks_a_max_seqlen_it_is_given():
    """Reliability tail, round 2. Before: the reference (and "auto"'s fallback to it on CPU)
    ignored max_seqlen, so a bound too short for the batch passed in CPU tests and was refused
    only on the GPU paths that use it."""
    cu = torch.tensor([0, 40, 48, 48], dtype=torch.int32)
    q = torch.randn(48, 2, 16, dtype=torch.float64)
    message = r"^max_seqlen must be >= the longest sequence, got max_seqlen = 13 but sequence 0 has length 40$"
    for impl in ("reference", "auto"):
        with pytest.raises(ValueError, match=message):
            varlen_attention(q, q, q, cu, impl=impl, max_seqlen=13)
    # A sufficient bound changes nothing: the output is the reference's without one.
    assert torch.equal(varlen_attention(q, q, q, cu, impl="reference", max_seqlen=40),
                       varlen_attention(q, q, q, cu, impl="reference"))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("impl", ["varlen_attn", "triton"])
def test_cuda_implementations_match_reference(impl, causal, head_dim):
    torch.manual_seed(0)
    lengths = [1, 300, 17, 1024, 0, 129]
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 8).cuda()
    L = sum(lengths)
    q, k, v = (torch.randn(L, 4, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = varlen_attention(q, k, v, cu, impl=impl, max_seqlen=max(lengths), causal=causal)
    ref_inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = varlen_attention_reference(*ref_inputs, cu, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(ref)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad)
    for fast, slow in zip((dq, dk, dv), ref_grads):
        torch.testing.assert_close(fast.float(), slow, atol=5e-2, rtol=5e-2)


def test_sdpa_on_a_padded_batch_equals_packed_attention_on_the_real_tokens():
    # Two documents of 5 and 3 tokens, right-padded to rows of 5: causal SDPA on the rows gives
    # every real token exactly its packed attention.
    g = torch.Generator().manual_seed(7)
    packed = [torch.randn(8, 2, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    cu = cu_seqlens_from_lengths([5, 3])
    expected = naive_attention(*packed, cu, causal=True)
    padded = [torch.cat((x[:5], x[5:8], torch.full((2, 2, 4), 1e4, dtype=torch.float64))) for x in packed]
    rows = torch.tensor([0, 5, 10], dtype=torch.int32)
    out = varlen_attention(*padded, rows, impl="sdpa", causal=True, max_seqlen=5)
    torch.testing.assert_close(out[:5], expected[:5])
    torch.testing.assert_close(out[5:8], expected[5:8])
    with pytest.raises(ValueError, match=r"cu_seqlens must be \[0, S, 2S, ..., T\] with S = max_seqlen = 5"):
        varlen_attention(*padded, torch.tensor([0, 5, 8, 10], dtype=torch.int32), impl="sdpa", causal=True, max_seqlen=5)
    with pytest.raises(ValueError, match="impl='sdpa' needs T = B \\* max_seqlen rows, got T = 10 and max_seqlen = 4"):
        varlen_attention(*padded, rows, impl="sdpa", causal=True, max_seqlen=4, validate=False)


def test_sdpa_without_max_seqlen_names_impl_sdpa():
    """Before: the message blamed schedule='rect', a Triton schedule sdpa has nothing to do with."""
    rows = torch.tensor([0, 5, 10], dtype=torch.int32)
    x = torch.randn(10, 2, 4)
    with pytest.raises(ValueError, match=r"^max_seqlen must be an int >= 1 for impl='sdpa', got None$"):
        varlen_attention(x, x, x, rows, impl="sdpa")


def test_the_docstrings_list_every_implementation():
    """Before: the module docstring said 'three implementations' over four bullets and 'auto', and
    varlen_attention's (and VarLenAttention's) impl argument left out "sdpa"."""
    import re

    from attn_gym_lite.models.attention import VarLenAttention
    from attn_gym_lite.ops import attention

    every = ("auto", *attention.IMPLEMENTATIONS)
    assert set(every) == {"auto", "triton", "varlen_attn", "reference", "sdpa"}
    for impl in every:  # each one the dispatcher accepts, and nothing else
        assert resolve_impl(impl, torch.zeros(1, 1, 16)) in attention.IMPLEMENTATIONS
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'triton', 'varlen_attn', 'reference', "
                                         r"'sdpa'\), got 'flash'"):
        resolve_impl("flash", torch.zeros(1, 1, 16))
    module = attention.__doc__
    counts = {3: "three", 4: "four", 5: "five", 6: "six"}
    assert module.splitlines()[0].endswith(f"{counts[len(attention.IMPLEMENTATIONS)]} implementations and ``\"auto\"``.")
    bullets = re.findall(r'^\* ``"(\w+)"``:', module, flags=re.MULTILINE)
    assert sorted(bullets) == sorted(every)

    def impl_argument(doc):
        """The text of the ``impl:`` argument, up to the next argument."""
        return re.search(r"^ {8}impl: (.*?)(?=^ {8}\w+:)", doc, flags=re.MULTILINE | re.DOTALL).group(1)

    for doc in (varlen_attention.__doc__, VarLenAttention.__doc__):
        named = set(re.findall(r'``"(\w+)"``', impl_argument(doc)))
        assert named == set(every), (named, doc[:60])


def test_the_entry_point_compiles_once_for_changing_shapes():
    from torch._dynamo.utils import counters

    from attn_gym_lite.ops import attention

    torch._dynamo.reset()
    counters.clear()

    def checked(q, cu):
        return q * 2 if attention._checked_impl("varlen_attn", q, q, q, cu) == "varlen_attn" else q

    compiled = torch.compile(checked, backend="eager")
    for rows in range(100, 320, 20):
        q = torch.randn(rows, 2, 16)
        torch.testing.assert_close(compiled(q, torch.tensor([0, rows], dtype=torch.int32)), q * 2)
    # Static shapes first, then one dynamic graph: the check cache must not add a guard per shape.
    assert counters["stats"]["unique_graphs"] <= 2


def test_the_plan_cache_is_not_consulted_while_compiling():
    from attn_gym_lite.checks import SignatureCache

    cache = SignatureCache(capacity=2)
    q = torch.zeros(3, 1, 4)
    key = cache.key((q,), "x")
    assert key is not None and cache.get(key) is None
    cache.put(key, "plan")
    assert cache.get(key) == "plan"
    assert cache.key((q,), ["unhashable"]) is None and cache.key((q, 3), "x") is None
    seen = []
    torch.compile(lambda t: seen.append(cache.key((t,), "x")) or t + 1, backend="eager")(q)
    assert seen == [None]
    for i in range(3):  # bounded: a full cache starts again, so the first key is gone
        cache.put(cache.key((torch.zeros(i + 4),), "x"), i)
    assert cache.get(key) is None and len(cache._entries) <= 2


def test_reference_takes_host_cu_seqlens_for_meta_inputs():
    """The reference reads cu_seqlens on the host, so a CPU cu_seqlens serves q on any device: on
    "meta" it runs every op with real shapes (chapter 1 counts FLOPs so); a cu_seqlens on a device
    that is neither the CPU nor q's is refused, naming it."""
    from torch.utils.flop_counter import FlopCounterMode

    from attn_gym_lite.ops.attention import varlen_attention_reference

    q = k = v = torch.empty(9, 2, 4, device="meta")
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    with FlopCounterMode(display=False) as counter:
        out = varlen_attention_reference(q, k, v, cu)
    assert out.shape == (9, 2, 4) and out.device.type == "meta"
    # Two matmuls per sequence and head: 2 * (2 * S * S * D) FLOPs, S = 5 and 4, H = 2, D = 4.
    assert counter.get_total_flops() == sum(2 * 2 * 2 * s * s * 4 for s in (5, 4))
    with pytest.raises(ValueError, match="cu_seqlens must be on device cpu, got meta"):
        varlen_attention_reference(*(torch.randn(9, 2, 4) for _ in range(3)), cu.to("meta"))


# The new-user trial's layouts: with impl="triton" or "auto" (default schedule) they used to run the
# kernels on them unchecked (L > T corrupted the interpreter's heap; the others gave wrong numbers).
MALFORMED_HOST_LAYOUTS = {
    "L past T": ([0, 8, 20], r"cu_seqlens\[-1\] \(active tokens L\) must be <= token_capacity T = 10, got L = 20"),
    "first not 0": ([1, 8, 10], r"cu_seqlens\[0\] must be 0, got 1"),
    "decreasing": ([0, 6, 4, 10], r"cu_seqlens must be non-decreasing, but cu_seqlens\[2\] = 4 < cu_seqlens\[1\] = 6"),
}


@pytest.mark.skipif(not INTERPRETED, reason="host (CPU) metadata reaches the kernels only in the interpreter")
@pytest.mark.parametrize("impl", ["triton", "auto", "reference"])
@pytest.mark.parametrize("layout", MALFORMED_HOST_LAYOUTS)
def test_malformed_host_cu_seqlens_gets_the_reference_paths_message_on_every_path(layout, impl):
    values, message = MALFORMED_HOST_LAYOUTS[layout]
    q = torch.randn(20, 2, 16)[:10]
    cu = torch.tensor(values, dtype=torch.int32)
    assert resolve_impl(impl, q) == ("reference" if impl == "reference" else "triton")
    with pytest.raises(ValueError, match=message):
        varlen_attention(q, q, q, cu, impl=impl)
    if impl != "reference":
        from attn_gym_lite.ops.kernels import varlen_attention_triton

        for schedule in ("auto", "flat", "dynamic"):
            with pytest.raises(ValueError, match=message):
                varlen_attention_triton(q, q, q, cu, schedule=schedule)
    # The same batch, valid, runs and matches the float64 loop (nothing was lost to the check).
    good = torch.tensor([0, 8, 10], dtype=torch.int32)
    out = varlen_attention(q, q, q, good, impl=impl)
    assert (out.double() - naive_attention(q, q, q, good, False)).abs().max() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(("impl", "head_dim", "dtype", "why"), [
    ("auto", 8, torch.bfloat16, r"impl='auto' fell back to it because head dim D = q.shape\[-1\] = 8 is not one of"),
    ("auto", 64, torch.float32, r"impl='auto' fell back to it because dtype torch.float32 is not bfloat16/float16"),
    ("reference", 64, torch.bfloat16, r"impl='reference' was asked for"),
])
def test_the_reference_path_in_a_capture_says_it_was_chosen_and_why(impl, head_dim, dtype, why):
    """Before: the generic "cu_seqlens's values are read on the host ... during CUDA graph capture",
    which did not say that attention had fallen back from Triton to the reference path."""
    from attn_gym_lite.graph.capture import capture_graph

    q = torch.randn(16, 2, head_dim, device="cuda", dtype=dtype)
    cu = torch.tensor([0, 10, 16], dtype=torch.int32, device="cuda")
    assert resolve_impl(impl, q) == "reference"
    calls = []

    def step():
        calls.append(torch.cuda.is_current_stream_capturing())
        return varlen_attention(q, q, q, cu, impl=impl, validate=False)

    with pytest.raises(RuntimeError, match=r"varlen_attention chose the reference implementation \(" + why):
        capture_graph(step, warmup=1)
    assert calls == [False, True]  # eager warm-up ran; the capture is what was refused


def test_empty_heads_and_head_dims_are_refused_by_name():
    # D = 0 raised a bare ZeroDivisionError (the scale 1 / sqrt(D)); H = 0 a message about "heads".
    cu = cu_seqlens_from_lengths([4])
    for shape in ((4, 2, 0), (4, 0, 16)):
        x = torch.randn(shape)
        for fn in (varlen_attention, varlen_attention_reference):
            with pytest.raises(ValueError, match=rf"q, k, v must have shape \[T, H, D\] with H >= 1 heads and head "
                                                 rf"dim D >= 1, got \({shape[0]}, {shape[1]}, {shape[2]}\)"):
                fn(x, x, x, cu)
    # T = 0 (an empty batch) is still computed: nothing to attend to.
    empty = torch.randn(0, 2, 16)
    assert varlen_attention_reference(empty, empty, empty, cu_seqlens_from_lengths([0])).shape == (0, 2, 16)


def test_options_are_checked_for_every_impl():
    q = torch.randn(4, 2, 8)
    cu = cu_seqlens_from_lengths([4])
    # The reference path handed causal to SDPA unchecked (torch's message named 'is_causal'), and
    # took any config although config is checked where "triton" reads it.
    for bad in ("no", None, 1):
        with pytest.raises(TypeError, match=f"causal must be a bool, got {bad!r}"):
            varlen_attention_reference(q, q, q, cu, causal=bad)
    for impl in ("reference", "sdpa", "auto"):
        with pytest.raises(TypeError, match="config must be an AttentionConfig or None, got dict"):
            varlen_attention(q, q, q, cu, impl=impl, max_seqlen=4, config={})
