"""Graph buckets: plan_buckets against brute force, selection, the lifetime guard; on the GPU,
every bucket against eager, the shared pool's memory and the max_seqlen bound."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.data.capacity import BucketPlan, plan_buckets, select_bucket
from attn_gym_lite.graph.buckets import GraphBuckets, StaleOutputError, _Guarded, private_pool_bytes


def brute_force(samples, k, align, token_capacity):
    """The least padding over every set of at most k capacities (multiples of align, or T) whose
    largest is the largest sample rounded up to align, or T."""
    top = min(max(-(-max(samples) // align) * align, align), token_capacity or 2**31 - 1)
    grid = sorted({*range(align, top + 1, align), top})
    return min(sum(min(c for c in chosen if c >= s) - s for s in samples)
               for size in range(1, k + 1) for chosen in itertools.combinations(grid, size) if chosen[-1] == top)


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(st.integers(0, 40), min_size=1, max_size=12), k=st.integers(1, 4),
       align=st.sampled_from([1, 4, 8, 64]), extra=st.one_of(st.none(), st.integers(0, 30)))
def test_plan_buckets_is_optimal(samples, k, align, extra):
    token_capacity = None if extra is None else max(max(samples), 1) + extra
    plan = plan_buckets(samples, k, align=align, token_capacity=token_capacity)
    assert list(plan.capacities) == sorted(set(plan.capacities)) and len(plan.capacities) <= k
    assert all(c % align == 0 or c == token_capacity for c in plan.capacities)
    assert max(samples) <= plan.capacities[-1] <= (token_capacity or 2**31)
    padding = sum(select_bucket(plan.capacities, s) - s for s in samples)
    assert padding == pytest.approx(plan.expected_padded_rows * len(samples))
    assert padding == brute_force(samples, k, align, token_capacity)


def test_plan_buckets_hand_example():
    # L in {100, 200, 900, 1000}, align 128: one bucket at 1024 pads 924+824+124+24 = 1896;
    # two buckets {256, 1024} pad 156+56+124+24 = 360.
    one = plan_buckets([100, 200, 900, 1000], 1)
    two = plan_buckets([100, 200, 900, 1000], 2)
    assert one.capacities == (1024,) and one.expected_padded_rows == 1896 / 4
    assert two.capacities == (256, 1024) and two.expected_padded_rows == 360 / 4
    assert two.expected_fill == pytest.approx(2200 / 2560)
    # Batches of T = 1000: the top capacity is T itself, the others multiples of 128.
    capped = plan_buckets([100, 200, 900, 1000], 2, token_capacity=1000)
    assert capped.capacities == (256, 1000) and capped.expected_padded_rows == (156 + 56 + 100 + 0) / 4
    assert plan_buckets([3, 5, 0], 3, token_capacity=16).capacities == (16,)  # align 128 >= T: one candidate
    assert plan_buckets([3, 5, 0], 3, align=4, token_capacity=16).capacities == (4, 8)
    # Batches of no tokens still need a graph: one tile, all padding.
    assert plan_buckets([0, 0], 2, align=8) == BucketPlan((8,), 8.0, 0.0)


# What the bucket layer refuses: a sample no batch can have (negative, past int32, past T), and
# token inputs of another length than the largest capacity (every bucket's view would be cut).
BUCKET_REFUSALS = {
    "negative sample": (lambda: plan_buckets([4, -3], 2), "active_token_samples"),
    "sample past int32": (lambda: plan_buckets([2**31], 2), "active_token_samples"),
    "sample past T": (lambda: plan_buckets([100, 1000], 2, token_capacity=960), "active_token_samples"),
    "token inputs not T_max": (lambda: GraphBuckets(lambda inputs: inputs["x"], [4, 8],
                                                    token_inputs={"x": torch.zeros(6, 2)}), "T_max"),
}


@pytest.mark.parametrize("case", BUCKET_REFUSALS)
def test_the_bucket_layer_refuses_what_would_plan_or_replay_wrongly(case):
    build, match = BUCKET_REFUSALS[case]
    with pytest.raises(ValueError, match=match):
        build()


def test_select_bucket_picks_the_smallest_that_fits():
    capacities = (512, 1024, 4096)
    assert [select_bucket(capacities, n) for n in (0, 512, 513, 1024, 4096)] == [512, 512, 1024, 1024, 4096]


def test_guard_raises_only_after_a_newer_replay():
    class Owner:
        generation = 1

    owner = Owner()
    out = _Guarded.wrap(torch.arange(4.0), owner, generation=1)
    assert (out * 2).sum().item() == 12.0
    owner.generation = 2
    with pytest.raises(StaleOutputError):
        out + 1


# --- GPU ---------------------------------------------------------------------------------------


def _block(dim, device="cuda"):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
    ).to(device=device, dtype=torch.bfloat16)


@pytest.mark.gpu
def test_each_bucket_matches_eager():
    dim, capacities = 256, (256, 512, 1024)
    model = _block(dim)
    params = tuple(model.parameters())

    def step(inputs):
        y = model(inputs["x"])
        loss = (y.float() * inputs["w"][: y.shape[0], None]).sum()
        return (y, loss, *torch.autograd.grad(loss, params))

    template = {"x": torch.zeros(1024, dim, dtype=torch.bfloat16)}
    buckets = GraphBuckets(step, capacities, token_inputs=template,
                           fixed_inputs={"w": torch.zeros(1024)})
    assert sorted(buckets.graphs) == list(capacities)
    for active in (100, 300, 700, 1024):
        x = torch.randn(1024, dim, dtype=torch.bfloat16).pin_memory()
        w = torch.randn(1024).pin_memory()
        outputs = buckets.replay({"x": x, "w": w}, active)
        capacity = select_bucket(capacities, active)
        expected = step({"x": x[:capacity].cuda(), "w": w.cuda()})
        assert outputs[0].shape[0] == capacity
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert buckets.replay({"x": x, "w": w}, 50)[0].shape[0] == 256


@pytest.mark.gpu
def test_shared_pool_costs_no_more_than_the_largest_graph():
    # Four buckets in one pool against the largest alone, for a forward and a forward + backward.
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
    # varlen_attn sizes its work by max_seqlen: a batch past the captured bound (or without one) is
    # refused before anything is copied into the static buffers.
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
    for max_seqlen in (200, None):
        with pytest.raises(ValueError, match="max_seqlen"):
            buckets.replay(too_long, 300, max_seqlen=max_seqlen)
    for name, buffer in {**buckets.token_inputs, **buckets.fixed_inputs}.items():
        assert torch.equal(buffer, before[name]), f"{name} changed although the batch was refused"
