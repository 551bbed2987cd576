"""Graph buckets: plan_buckets against brute force, selection, the lifetime guard; on the GPU,
every bucket against eager and the shared pool's memory."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.data.capacity import BucketPlan, plan_buckets, select_bucket
from attn_gym_lite.graph.buckets import GraphBuckets, StaleOutputError, _Guarded, private_pool_bytes


def brute_force(samples, k, align):
    """Try every set of at most k aligned capacities that covers the largest sample."""
    top = max(-(-max(samples) // align) * align, align)
    grid = range(align, top + 1, align)
    best = None
    for size in range(1, k + 1):
        for chosen in itertools.combinations(grid, size):
            if chosen[-1] != top:
                continue
            padding = sum(min(c for c in chosen if c >= s) - s for s in samples)
            best = padding if best is None else min(best, padding)
    return best


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    k=st.integers(1, 4),
    align=st.sampled_from([1, 4, 8]),
)
def test_plan_buckets_is_optimal(samples, k, align):
    plan = plan_buckets(samples, k, align=align)
    assert all(c % align == 0 for c in plan.capacities)
    assert list(plan.capacities) == sorted(set(plan.capacities)) and len(plan.capacities) <= k
    assert plan.capacities[-1] >= max(samples)
    padding = sum(select_bucket(plan.capacities, s) - s for s in samples)
    assert padding == pytest.approx(plan.expected_padded_rows * len(samples))
    assert padding == brute_force(samples, k, align)


def test_plan_buckets_hand_example():
    # L in {100, 200, 900, 1000}, align 128: one bucket at 1024 pads 924+824+124+24 = 1896;
    # two buckets {256, 1024} pad 156+56+124+24 = 360.
    one = plan_buckets([100, 200, 900, 1000], 1)
    two = plan_buckets([100, 200, 900, 1000], 2)
    assert one.capacities == (1024,) and one.expected_padded_rows == 1896 / 4
    assert two.capacities == (256, 1024) and two.expected_padded_rows == 360 / 4
    assert two.expected_fill == pytest.approx(2200 / 2560)


def test_plan_buckets_errors():
    with pytest.raises(ValueError, match="active_token_samples must hold at least one int, got none"):
        plan_buckets([], 2)
    with pytest.raises(ValueError, match=r"active_token_samples\[1\] must be an int in \[0, 2147483647\], got -3"):
        plan_buckets([4, -3], 2)
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        plan_buckets([4], 0)
    with pytest.raises(ValueError, match=r"align must be an int in \[1, 2147483647\], got 0"):
        plan_buckets([4], 1, align=0)
    # Never truncated, parsed or coerced (the reliability issue's examples).
    with pytest.raises(TypeError, match=r"active_token_samples\[0\] must be an int in \[0, 2147483647\], got 100.9"):
        plan_buckets([100.9, 250.7], 2)
    with pytest.raises(TypeError, match=r"active_token_samples\[0\] must be an int in \[0, 2147483647\], got '100'"):
        plan_buckets(["100", "300"], 2)
    with pytest.raises(TypeError, match="k must be an int >= 1, got True"):
        plan_buckets([100, 300], True)
    with pytest.raises(TypeError, match="active_token_samples must be a sequence of ints, got the string '100'"):
        plan_buckets("100", 1)
    # A set of samples is refused (repeats weigh the plan); a set of sizes, where a caller sorts
    # and de-duplicates, is taken (recommend's buffer_sizes, the trainer's capacities).
    with pytest.raises(TypeError, match=r"^active_token_samples must be a sequence of ints, got a set"):
        plan_buckets({100, 300}, 2)
    from attn_gym_lite.data.study import study_policies
    assert len(study_policies({8, 32})) == len(study_policies([8, 32]))
    # A dict is refused, not read as its keys (reliability tail: {100: 1, 200: 2} planned for 100, 200).
    with pytest.raises(TypeError, match=r"^active_token_samples must be a sequence of ints, got a dict: \{100: 1, 200: 2\}"):
        plan_buckets({100: 1, 200: 2}, 2)
    # Reliability tail. Before: 2**63 raised numpy's bare OverflowError; 2**63 - 1 overflowed in the
    # rounding and was refused as "expected_padded_rows must be ... >= 0, got -9.2e18", a field the
    # caller never passed. A sample near int32's largest no longer rounds past what cu_seqlens holds.
    for sample in (2**63, 2**63 - 1, 2**31):
        with pytest.raises(ValueError, match=rf"^active_token_samples\[0\] must be an int in \[0, 2147483647\], got {sample}$"):
            plan_buckets([sample], 1)
    with pytest.raises(ValueError, match=r"^align must be an int in \[1, 2147483647\], got 9223372036854775808$"):
        plan_buckets([5], 1, align=2**63)
    assert plan_buckets([2**31 - 1, 5], 2).capacities == (128, 2**31 - 1)
    # A tensor of samples and a generator are fine.
    assert plan_buckets(torch.tensor([100, 300]), 2) == plan_buckets((s for s in [100, 300]), 2)


def test_plan_buckets_caps_capacities_at_token_capacity():
    """Before: plan_buckets had no bound, so recommend's plan for T = 16 was (128,), past T."""
    # L in {100, 200, 900, 1000} of batches of T = 1000: the top capacity is 1000 (not 1024),
    # the rest multiples of 128; T = 960 refuses the sample 1000.
    plan = plan_buckets([100, 200, 900, 1000], 2, token_capacity=1000)
    assert plan.capacities == (256, 1000) and plan.expected_padded_rows == (156 + 56 + 100 + 0) / 4
    assert plan_buckets([3, 5, 0], 3, token_capacity=16).capacities == (16,)  # align 128 >= T: one candidate
    assert plan_buckets([3, 5, 0], 3, align=4, token_capacity=16).capacities == (4, 8)
    with pytest.raises(ValueError, match=r"active_token_samples\[3\] must be at most token_capacity T = 960 "
                                         r"\(a batch holds at most T tokens\), got 1000"):
        plan_buckets([100, 200, 900, 1000], 2, token_capacity=960)
    with pytest.raises(ValueError, match="token_capacity must be an int in \\[1, 2147483647\\], got 0"):
        plan_buckets([0], 1, token_capacity=0)
    with pytest.raises(TypeError, match=r"token_capacity must be an int in \[1, 2147483647\], got 16.0"):
        plan_buckets([1], 1, token_capacity=16.0)


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    k=st.integers(1, 4),
    align=st.sampled_from([1, 4, 8, 64]),
    extra=st.integers(0, 30),
)
def test_plan_buckets_never_exceeds_token_capacity(samples, k, align, extra):
    token_capacity = max(max(samples), 1) + extra
    plan = plan_buckets(samples, k, align=align, token_capacity=token_capacity)
    assert plan.capacities[-1] <= token_capacity and plan.capacities[-1] >= max(samples)
    assert all(c % align == 0 or c == token_capacity for c in plan.capacities)
    padding = sum(select_bucket(plan.capacities, s) - s for s in samples)
    assert padding == pytest.approx(plan.expected_padded_rows * len(samples))


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.integers(0, 5000), min_size=1, max_size=20),
    k=st.integers(1, 6),
    align=st.sampled_from([1, 7, 64, 128]),
)
def test_plan_buckets_outputs_are_valid_plans(samples, k, align):
    # plan_buckets builds its result through the checks; the edges: all L = 0 (fill 0, a whole
    # tile of padding per batch), one bucket, align 1 (no padding possible for distinct samples).
    plan = plan_buckets(samples, k, align=align)
    assert BucketPlan(plan.capacities, plan.expected_padded_rows, plan.expected_fill) == plan
    assert all(type(c) is int for c in plan.capacities)
    assert type(plan.expected_padded_rows) is float and type(plan.expected_fill) is float
    zeros = plan_buckets([0, 0], k, align=align)
    assert zeros == BucketPlan((align,), float(align), 0.0)


def test_bucket_plan_checks_its_fields():
    plan = BucketPlan((256, 1024), 90, 0.5)  # ints are real numbers; stored as floats
    assert plan.expected_padded_rows == 90.0 and type(plan.expected_padded_rows) is float
    numpy_ints = BucketPlan((np.int64(8), np.int32(16)), np.float32(0.5), 1)  # stored as Python numbers
    assert numpy_ints.capacities == (8, 16) and {type(c) for c in numpy_ints.capacities} == {int}
    assert type(numpy_ints.expected_fill) is float
    with pytest.raises(TypeError, match=r"capacities must be a tuple of ints .*got list: \[256, 1024\]"):
        BucketPlan([256, 1024], 90.0, 0.5)
    with pytest.raises(ValueError, match="capacities must hold at least one int, got none"):
        BucketPlan((), 0.0, 1.0)
    with pytest.raises(ValueError, match=r"capacities\[0\] must be an int >= 1, got 0"):
        BucketPlan((0, 8), 0.0, 1.0)
    with pytest.raises(TypeError, match=r"capacities\[1\] must be an int >= 1, got 8.0"):
        BucketPlan((4, 8.0), 0.0, 1.0)
    with pytest.raises(TypeError, match=r"capacities\[0\] must be an int >= 1, got True"):
        BucketPlan((True,), 0.0, 1.0)
    # select_bucket's binary search needs ascending capacities; a repeat is refused too.
    with pytest.raises(ValueError, match=r"capacities must be strictly ascending, got \[1024, 256\]"):
        BucketPlan((1024, 256), 90.0, 0.5)
    with pytest.raises(ValueError, match=r"capacities must be strictly ascending, got \[256, 256\]"):
        BucketPlan((256, 256), 90.0, 0.5)
    with pytest.raises(TypeError, match="expected_padded_rows must be a finite real number >= 0, got '90'"):
        BucketPlan((256,), "90", 0.5)
    with pytest.raises(ValueError, match="expected_padded_rows must be a finite real number >= 0, got -1.0"):
        BucketPlan((256,), -1.0, 0.5)
    with pytest.raises(ValueError, match="expected_padded_rows must be a finite real number >= 0, got nan"):
        BucketPlan((256,), float("nan"), 0.5)
    with pytest.raises(ValueError, match=r"expected_padded_rows must be at most the largest capacity, 256 tokens .*got 300.0"):
        BucketPlan((128, 256), 300.0, 0.5)
    with pytest.raises(TypeError, match="expected_fill must be a finite real number >= 0 <= 1, got None"):
        BucketPlan((256,), 0.0, None)
    with pytest.raises(TypeError, match="expected_fill must be a finite real number >= 0 <= 1, got False"):
        BucketPlan((256,), 0.0, False)
    with pytest.raises(ValueError, match="expected_fill must be a finite real number >= 0 <= 1, got 1.5"):
        BucketPlan((256,), 0.0, 1.5)
    with pytest.raises(ValueError, match="expected_fill must be a finite real number >= 0 <= 1, got inf"):
        BucketPlan((256,), 0.0, float("inf"))


def test_select_bucket_refuses_what_it_cannot_search():
    with pytest.raises(ValueError, match=r"capacities must be strictly ascending, got \[2048, 1024\]"):
        select_bucket((2048, 1024), 1500)
    with pytest.raises(ValueError, match="capacities must hold at least one int, got none"):
        select_bucket((), 10)
    with pytest.raises(TypeError, match="active_tokens must be an int >= 0, got 10.0"):
        select_bucket((16,), 10.0)
    assert select_bucket((1024, 2048), 1500) == 2048


def test_select_bucket_picks_the_smallest_that_fits():
    capacities = (512, 1024, 4096)
    assert [select_bucket(capacities, n) for n in (0, 512, 513, 1024, 4096)] == [512, 512, 1024, 1024, 4096]
    with pytest.raises(ValueError, match="active_tokens = 4097 exceeds the largest captured capacity 4096"):
        select_bucket(capacities, 4097)
    with pytest.raises(ValueError, match="active_tokens must be an int >= 0, got -1"):
        select_bucket(capacities, -1)


def test_guard_raises_only_after_a_newer_replay():
    class Owner:
        generation = 1

    owner = Owner()
    out = _Guarded.wrap(torch.arange(4.0), owner, generation=1)
    assert (out * 2).sum().item() == 12.0
    owner.generation = 2
    with pytest.raises(StaleOutputError, match="came from replay #1, but replay #2 has since overwritten it"):
        out + 1


# --- GPU ---------------------------------------------------------------------------------------


def _block(dim, device="cuda"):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
    ).to(device=device, dtype=torch.bfloat16)


@pytest.mark.gpu
def test_each_bucket_matches_eager_and_guards_lifetimes():
    dim, capacities = 256, (256, 512, 1024)
    model = _block(dim)
    params = tuple(model.parameters())

    def step(inputs):
        y = model(inputs["x"])
        loss = (y.float() * inputs["w"][: y.shape[0], None]).sum()
        return (y, loss, *torch.autograd.grad(loss, params))

    template = {"x": torch.zeros(1024, dim, dtype=torch.bfloat16)}
    buckets = GraphBuckets(step, capacities, token_inputs=template,
                           fixed_inputs={"w": torch.zeros(1024)}, debug=True)
    assert sorted(buckets.graphs) == list(capacities)
    for active in (100, 300, 700, 1024):
        x = torch.randn(1024, dim, dtype=torch.bfloat16).pin_memory()
        w = torch.randn(1024).pin_memory()
        outputs = buckets.replay({"x": x, "w": w}, active)
        capacity = select_bucket(capacities, active)
        expected = step({"x": x[:capacity].cuda(), "w": w.cuda()})
        assert outputs[0].shape[0] == capacity
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got.as_subclass(torch.Tensor), want, atol=2e-2, rtol=2e-2)
    stale = outputs[1]
    buckets.replay({"x": x, "w": w}, 50)
    with pytest.raises(StaleOutputError):
        stale.item()
    with pytest.raises(ValueError, match="exceeds the largest captured capacity 1024"):
        buckets.replay({"x": x, "w": w}, 1025)


@pytest.mark.gpu
def test_shared_pool_costs_no_more_than_the_largest_graph():
    """Four buckets in one pool against the same recipe with only the largest capacity: a
    forward (no_grad) and a forward + backward (gradients as outputs) workload."""
    dim = 1024
    model = _block(dim)
    params = tuple(model.parameters())
    x = torch.randn(4096, dim, device="cuda", dtype=torch.bfloat16)

    def forward(inputs):
        with torch.no_grad():
            return model(inputs["x"])

    def forward_backward(inputs):
        return torch.autograd.grad(model(inputs["x"]).float().square().mean(), params)

    for fn in (forward, forward_backward):
        single = GraphBuckets(fn, (4096,), token_inputs={"x": x})
        single_bytes = private_pool_bytes(single.pool)
        shared = GraphBuckets(fn, (512, 1024, 2048, 4096), token_inputs={"x": x})
        shared_bytes = private_pool_bytes(shared.pool)
        assert single_bytes > 0
        assert shared_bytes <= 1.05 * single_bytes, (fn.__name__, shared_bytes, single_bytes)


@pytest.mark.gpu
def test_buckets_keyed_by_max_seqlen_refuse_a_longer_sequence_and_copy_nothing():
    """Buckets over torch's varlen_attn, which sizes its work by max_seqlen: a batch within the
    captured bound replays to the eager result; one past it (or without a bound) is refused
    before anything is copied into the static buffers."""
    from attn_gym_lite.ops.attention import varlen_attention
    from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

    T, N, H, D, bound = 512, 8, 2, 64, 128

    def attend(inputs):
        x = inputs["x"]
        cu = inputs["cu_seqlens"].clamp(max=x.shape[0])  # a small bucket's capture sees the template
        return varlen_attention(x, x, x, cu, impl="varlen_attn", causal=True, max_seqlen=bound, validate=False)

    def batch(lengths, seed):
        x = torch.randn(T, H, D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        return {"x": x.pin_memory(), "cu_seqlens": pad_cu_seqlens(cu_seqlens_from_lengths(lengths), N).pin_memory()}

    first = batch([100, 28], 0)
    buckets = GraphBuckets(attend, (256, 512), token_inputs={"x": first["x"]},
                           fixed_inputs={"cu_seqlens": first["cu_seqlens"]}, max_seqlen=bound, copy_out=True)
    within = batch([128, 128, 64, 3], 1)
    out = buckets.replay(within, 323, max_seqlen=128)
    x = within["x"].cuda().double()
    expected = varlen_attention(x, x, x, within["cu_seqlens"].cuda(), impl="reference", causal=True)
    torch.testing.assert_close(out[:323].double(), expected[:323], atol=3e-2, rtol=3e-2)

    before = {name: buffer.clone() for name, buffer in {**buckets.token_inputs, **buckets.fixed_inputs}.items()}
    too_long = batch([200, 100], 2)
    with pytest.raises(ValueError, match="max_seqlen must be <= the max_seqlen = 128 the buckets were captured with, got 200"):
        buckets.replay(too_long, 300, max_seqlen=200)
    with pytest.raises(ValueError, match="max_seqlen must be the batch's longest sequence"):
        buckets.replay(too_long, 300)
    for name, buffer in {**buckets.token_inputs, **buckets.fixed_inputs}.items():
        assert torch.equal(buffer, before[name]), f"{name} changed although the batch was refused"


def test_private_pool_bytes_checks_the_handle():
    with pytest.raises(TypeError, match=r"pool must be a sequence of ints, got NoneType"):
        private_pool_bytes(None)
    with pytest.raises(TypeError, match=r"pool\[1\] must be an int, got 'x'"):
        private_pool_bytes((0, "x"))
    with pytest.raises(ValueError, match=r"pool must be a graph pool handle of 2 ints, got 3 ints \(0, 1, 2\)"):
        private_pool_bytes((0, 1, 2))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"private_pool_bytes reads torch.cuda.memory_snapshot\(\), but CUDA"):
            private_pool_bytes((0, 1))


def test_graph_buckets_checks_its_arguments_before_anything_runs(monkeypatch):
    """Reliability tail, round 3. Before: copy_out="no" and debug="no" were stored as they were and
    acted as True, copy_out=True silently dropped debug=True, a list of token inputs raised
    AttributeError ('items'), and a bad warmup or token_outputs was found only after fn had run.
    The checks come after the CUDA check, so here CUDA is reported present: none of them touches
    the device, and fn must never be called."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def fn(inputs):
        raise AssertionError("fn ran before the arguments were checked")

    good = {"token_inputs": {"x": torch.zeros(8, 2)}}
    for change, error, message in [
        ({"copy_out": "no"}, TypeError, r"^copy_out must be a bool, got 'no'"),
        ({"debug": 1}, TypeError, r"^debug must be a bool, got 1"),
        ({"copy_out": True, "debug": True}, ValueError, r"^GraphBuckets: copy_out and debug are alternatives"),
        ({"token_inputs": [torch.zeros(8, 2)]}, TypeError,
         r"^GraphBuckets: token_inputs must be a non-empty mapping of name \(str\) to tensor, got list"),
        ({"token_inputs": {}}, TypeError, r"^GraphBuckets: token_inputs must be a non-empty mapping"),
        ({"token_inputs": {"x": 5}}, TypeError, r"^GraphBuckets: token_inputs must map names \(str\) to tensors, got 'x': int"),
        ({"fixed_inputs": {"w": [1.0]}}, TypeError, r"^GraphBuckets: fixed_inputs must map names \(str\) to tensors, got 'w': list"),
        ({"warmup": -1}, ValueError, r"^warmup must be an int >= 0, got -1"),
        ({"token_outputs": "yes"}, TypeError, r"^GraphBuckets: token_outputs must be None or a sequence of bools, got 'yes'"),
    ]:
        with pytest.raises(error, match=message):
            GraphBuckets(fn, [4, 8], **{**good, **change})
    with pytest.raises(TypeError, match=r"^GraphBuckets: fn must be callable, got int"):
        GraphBuckets(3, [4, 8], **good)
    # numpy's bools are bools (a false refusal in the branch's first version); 1/0 are not.
    for flags in (np.array([True, False]), [np.bool_(True)]):
        with pytest.raises(BaseException) as caught:  # past every check, the missing device (or fn) fails
            GraphBuckets(fn, [4, 8], **good, token_outputs=flags)
        assert "token_outputs" not in str(caught.value), caught.value
    with pytest.raises(TypeError, match=r"^GraphBuckets: token_outputs must be None or a sequence of bools, got \[1, 0\]"):
        GraphBuckets(fn, [4, 8], **good, token_outputs=[1, 0])
