"""The Triton ragged-attention kernels on small shapes, against a float64 reference: every schedule,
causal and not, forward and gradients, on random ragged layouts and every edge case (M < N with the
repeated tail, empty sequences in the middle, L = 0, sequences of one token, one sequence of T).

Without a GPU the kernels run in Triton's interpreter on CPU tensors (conftest sets
TRITON_INTERPRET=1), in float32 with 16-row tiles; with one they run compiled, in bfloat16."""

import math

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ops.attention import varlen_attention_reference
from attn_gym_lite.ops.kernels import AttentionConfig, KernelConfig, varlen_attention_triton
from attn_gym_lite.ops.kernels.tasks import first_task, next_task, task_at
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.schedule import chunk_capacity, chunk_offsets, decode_chunk, launch_grid, num_sms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
# Max error relative to the largest reference value: float32 (interpreter) or bfloat16 (GPU).
RTOL = 2e-2 if DTYPE == torch.bfloat16 else 1e-5
SCHEDULES = ("rect", "flat", "persistent", "dynamic", "auto")
T, H, D = 64, 2, 16

EDGE_LAYOUTS = {
    "zipf_tail": ([30, 9, 4, 2, 1], 8),  # M = 5 < N = 8: the tail repeats L
    "empty_middle": ([17, 0, 0, 33, 5], 5),
    "no_tokens": ([0, 0, 0], 3),  # L = 0
    "single_tokens": ([1] * 7, 9),
    "one_sequence_of_T": ([T], 1),
    "tile_edges": ([15, 16, 17, 1], 4),  # one short of, exactly, one past a 16-row tile
}


def make_inputs(lengths, slots, seed=0, rows=T, head_dim=D, dtype=DTYPE):
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), slots).to(DEVICE)
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(rows, H, head_dim, generator=g).to(DEVICE, dtype) for _ in range(4))
    return q, k, v, do, cu


def attention_and_grads(fn, q, k, v, do, dtype=None):
    q, k, v = (x.detach().to(dtype or x.dtype).requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    if not out.requires_grad:  # the reference with L = 0 never touches its inputs
        return (out, *(torch.zeros_like(x) for x in (q, k, v)))
    return (out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype)))


def assert_matches_reference(lengths, slots, schedule, causal, seed=0, zero_inactive=True, dtype=DTYPE, rtol=RTOL):
    q, k, v, do, cu = make_inputs(lengths, slots, seed, dtype=dtype)
    kwargs = {"max_seqlen": max(max(lengths), 1)} if schedule == "rect" else {}
    ours = attention_and_grads(
        lambda q, k, v: varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule,
                                                zero_inactive=zero_inactive, **kwargs),
        q, k, v, do)
    reference = attention_and_grads(
        lambda q, k, v: varlen_attention_reference(q, k, v, cu, causal=causal), q, k, v, do, torch.float64)
    active = sum(lengths)
    for name, mine, ref in zip(("out", "dq", "dk", "dv"), ours, reference):
        scale = max(ref.abs().max().item(), 1.0)
        error = (mine[:active].double() - ref[:active]).abs().max().item() if active else 0.0
        assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol * scale:.3g}"
        if zero_inactive:  # inactive capacity rows are defined: zero output and zero gradient
            assert torch.equal(mine[active:], torch.zeros_like(mine[active:])), f"{name}: rows past L not zero"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ["rect", "flat"])
def test_16_bit_inputs_match_reference_here_too(schedule, causal, dtype):
    """bfloat16 and float16 inputs, forward and gradients, against float64, on whatever runs the
    kernels here (the interpreter in CI). Triton 3.9's interpreter multiplied bfloat16 tiles as
    integers: a new user's bfloat16 attention on the CPU gave 7.9e8 where the reference gives 0.29,
    silently; the kernels' shared ``dot`` widens the operands there. 16-bit rounding of the inputs
    and of P and dS bounds the error by about 1e-2 of the largest reference value."""
    assert_matches_reference([20, 0, 13, 1], 5, schedule, causal, seed=3, dtype=dtype, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("layout", EDGE_LAYOUTS, ids=list(EDGE_LAYOUTS))
def test_edge_layouts_match_reference(layout, schedule, causal):
    lengths, slots = EDGE_LAYOUTS[layout]
    assert_matches_reference(lengths, slots, schedule, causal)


@settings(max_examples=6, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(lambda s: sum(s) <= T),
    spare_slots=st.integers(0, 3),
    schedule=st.sampled_from(SCHEDULES),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_layouts_match_reference(lengths, spare_slots, schedule, causal, seed):
    # The default leaves rows past L unspecified: only the active rows are compared.
    assert_matches_reference(lengths, len(lengths) + spare_slots, schedule, causal, seed, zero_inactive=False)


def test_head_dim_32_and_fused_qkv_strides():
    # q, k, v as views of one [T, 3, H, D] projection: row stride 3 * H * D, not H * D.
    lengths, slots = [20, 3, 25], 4
    _, _, _, do, cu = make_inputs(lengths, slots, head_dim=32)
    qkv = torch.randn(T, 3, H, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE, DTYPE)
    q, k, v = qkv.unbind(1)
    assert q.stride(0) == 3 * H * 32
    ours = attention_and_grads(lambda q, k, v: varlen_attention_triton(q, k, v, cu, causal=True), q, k, v, do)
    reference = attention_and_grads(
        lambda q, k, v: varlen_attention_reference(q, k, v, cu, causal=True), q, k, v, do, torch.float64)
    active = sum(lengths)  # rows past L are unspecified by default
    for mine, ref in zip(ours, reference):
        assert (mine[:active].double() - ref[:active]).abs().max() <= RTOL * max(ref.abs().max().item(), 1.0)


def test_unspecified_tail_when_not_zeroing_still_leaves_active_rows_right():
    lengths, slots = [10, 22], 3
    q, k, v, do, cu = make_inputs(lengths, slots)
    out = varlen_attention_triton(q, k, v, cu, schedule="persistent", zero_inactive=False)
    ref = varlen_attention_reference(q.double(), k.double(), v.double(), cu)
    assert (out[:32].double() - ref[:32]).abs().max() <= RTOL * ref.abs().max()


# -----------------------------------------------------------------------------
# The schedules' task decoding, on its own: a probe kernel records every task it is given.


@triton.jit
def record_tasks_kernel(cu_seqlens, chunk_offsets, counter, rows_written, out, num_seqs, num_heads, num_rows,
                        CHUNK: tl.constexpr, SCHEDULE: tl.constexpr):
    task = first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, num_rows, CHUNK, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, SCHEDULE)
        slot = out + tl.atomic_add(rows_written, 1) * 4
        tl.store(slot, seq_start)
        tl.store(slot + 1, seq_len)
        tl.store(slot + 2, chunk)
        tl.store(slot + 3, head)
        task = next_task(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=10),
    spare_slots=st.integers(0, 3),
    spare_tokens=st.integers(0, 20),
    C=st.sampled_from([16, 32]),
    heads=st.integers(1, 3),
    schedule=st.sampled_from(["rect", "flat", "persistent", "dynamic"]),
)
def test_every_schedule_runs_each_chunk_exactly_once(lengths, spare_slots, spare_tokens, C, heads, schedule):
    rows = sum(lengths) + spare_tokens
    slots = len(lengths) + spare_slots
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), slots)
    offsets = chunk_offsets(cu, C)
    grid = launch_grid(schedule, T=rows, N=slots, C=C, heads=heads, num_sms=num_sms(DEVICE), ctas_per_sm=1,
                       max_seqlen=max(max(lengths), 1) if schedule == "rect" else None)
    # Room for twice the capacity bound: a schedule that ran a chunk twice would show it.
    out = torch.full((2 * chunk_capacity(rows, slots, C) * heads + 1, 4), -1, dtype=torch.int32, device=DEVICE)
    counter, rows_written = (torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    record_tasks_kernel[grid](cu.to(DEVICE), offsets.to(DEVICE), counter, rows_written, out, slots, heads, rows,
                              CHUNK=C, SCHEDULE=schedule)
    recorded = sorted(tuple(row) for row in out.cpu().tolist() if row[0] >= 0)
    assert int(rows_written) == len(recorded)

    bounds = cu.tolist()
    expected = []
    for head in range(heads):
        for flat in range(int(offsets[-1])):
            seq, local, _ = decode_chunk(offsets, cu, flat, C)
            expected.append((bounds[seq], bounds[seq + 1] - bounds[seq], local, head))
    assert recorded == sorted(expected)


def clamped_chunk_offsets(values, rows, C):
    """The chunk offsets the kernels build from arbitrary int32 ``values`` (a Python model): each
    sequence clamped into ``[0, rows]``, ``ceil(length / C)`` chunks, totals capped at G_cap."""
    cap = chunk_capacity(rows, len(values) - 1, C)
    offsets, total = [0], 0
    for a, b in zip(values[:-1], values[1:]):
        start = min(max(a, 0), rows)
        total = min(total + -(-(min(max(b, start), rows) - start) // C), cap)
        offsets.append(total)
    return offsets


INT32 = st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.one_of(st.integers(-8, 80), INT32), min_size=2, max_size=9),
    rows=st.integers(0, 64),
    C=st.sampled_from([16, 32]),
    heads=st.integers(1, 2),
    schedule=st.sampled_from(["rect", "flat", "persistent", "dynamic"]),
)
def test_malformed_cu_seqlens_decode_to_tasks_inside_the_tensors(values, rows, C, heads, schedule):
    """Any int32 values (not starting at 0, decreasing, negative, past T, near 2**31): the offsets
    are the clamped model's, and every task the schedules hand out lies inside the T rows, its
    chunk inside its sequence (the invariant every kernel's addressing relies on)."""
    from attn_gym_lite.ops.kernels.offsets import launch_chunk_offsets

    slots = len(values) - 1
    cu = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    offsets = launch_chunk_offsets(cu, C, token_capacity=rows)
    expected_offsets = clamped_chunk_offsets(values, rows, C)
    assert offsets.cpu().tolist() == expected_offsets
    grid = launch_grid(schedule, T=max(rows, 1), N=slots, C=C, heads=heads, num_sms=num_sms(DEVICE), ctas_per_sm=1,
                       max_seqlen=max(rows, 1) if schedule == "rect" else None)
    # Room for every slot of the grid: rect's overlapping sequences may each fill their column.
    room = max(2 * chunk_capacity(max(rows, 1), slots, C), slots * -(-max(rows, 1) // C)) * heads + 1
    out = torch.full((room, 4), -1, dtype=torch.int32, device=DEVICE)
    counter, rows_written = (torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    record_tasks_kernel[grid](cu, offsets, counter, rows_written, out, slots, heads, rows, CHUNK=C, SCHEDULE=schedule)
    recorded = [tuple(row) for row in out.cpu().tolist()[: int(rows_written)]]
    for seq_start, seq_len, chunk, head in recorded:
        assert 0 <= seq_start <= seq_start + seq_len <= rows, (values, rows, seq_start, seq_len)
        assert 0 <= chunk and chunk * C < seq_len, (values, rows, chunk, seq_len)
        assert 0 <= head < heads
    if schedule != "rect":  # the flat list: exactly the capped chunk count, per head
        assert len(recorded) == expected_offsets[-1] * heads


# -----------------------------------------------------------------------------
# Argument checks: static metadata only, before any launch.


@pytest.mark.parametrize("warm", [False, True], ids=["first_call", "after_a_cached_plan"])
def test_bad_arguments_name_themselves(warm):
    q, k, v, _, cu = make_inputs([8, 8], 2)
    if warm:  # the static checks are cached per call signature: a cached plan must vouch for nothing else
        for schedule in ("auto", "flat"):
            varlen_attention_triton(q, k, v, cu, schedule=schedule)
    with pytest.raises(ValueError, match="max_seqlen must be an int >= 1 for schedule='rect', got None"):
        varlen_attention_triton(q, k, v, cu, schedule="rect")
    with pytest.raises(ValueError, match="max_seqlen is only used by schedule='rect'"):
        varlen_attention_triton(q, k, v, cu, schedule="flat", max_seqlen=8)
    with pytest.raises(ValueError, match="schedule must be one of .* got 'grid'"):
        varlen_attention_triton(q, k, v, cu, schedule="grid")
    with pytest.raises(ValueError, match=r"q, k, v must have one shape \[T, H, D\]"):
        varlen_attention_triton(q, k[:10], v, cu)
    with pytest.raises(TypeError, match="q must have dtype bfloat16, float16, float32, got torch.float64"):
        varlen_attention_triton(q.double(), k, v, cu)
    with pytest.raises(ValueError, match=r"head dim D\) must be one of \(16, 32, 64, 128\), got 24"):
        odd = torch.zeros(T, H, 24, dtype=DTYPE, device=DEVICE)
        varlen_attention_triton(odd, odd, odd, cu)
    with pytest.raises(TypeError, match="cu_seqlens must have dtype torch.int32"):
        varlen_attention_triton(q, k, v, cu.long())
    with pytest.raises(TypeError, match="causal must be a bool, got 1"):
        varlen_attention_triton(q, k, v, cu, causal=1)
    with pytest.raises(ValueError, match="cu_seqlens must be contiguous"):
        varlen_attention_triton(q, k, v, torch.stack([cu, cu], 1)[:, 0])
    with pytest.raises(TypeError, match="config must be an AttentionConfig or None, got dict"):
        varlen_attention_triton(q, k, v, cu, config={})
    with pytest.raises(ValueError, match="KernelConfig: block_m must be a power of two >= 16, got 24"):
        KernelConfig(24, 16)
    with pytest.raises(ValueError, match="dkdv.block_n must be a multiple of dkdv.block_m, got 16 and 32"):
        AttentionConfig(KernelConfig(32, 16), KernelConfig(32, 16), KernelConfig(32, 16))
    with pytest.raises(TypeError, match=r"AttentionConfig: dq must be a KernelConfig, got \(32, 16\)"):
        AttentionConfig(KernelConfig(32, 16), (32, 16), KernelConfig(16, 32))


def test_schedules_compute_bitwise_identical_results():
    # A schedule decides which program computes a chunk, never how: the arithmetic is the same.
    q, k, v, do, cu = make_inputs([30, 0, 1, 17, 9], 7, seed=5)
    results = {}
    for schedule in ("rect", "flat", "persistent", "dynamic"):
        options = {"max_seqlen": 30} if schedule == "rect" else {}
        results[schedule] = attention_and_grads(
            lambda q, k, v: varlen_attention_triton(q, k, v, cu, causal=True, schedule=schedule, **options),
            q, k, v, do)
    active = 57  # rows past L are unspecified by default
    for schedule in ("flat", "persistent", "dynamic"):
        for mine, rect in zip(results[schedule], results["rect"]):
            assert torch.equal(mine[:active], rect[:active]), schedule


# -----------------------------------------------------------------------------
# Inputs that used to give silently wrong results are refused (the reliability issue's examples).


def test_offsets_past_int32_are_refused_whatever_the_layout():
    from attn_gym_lite.ops.kernels.varlen import largest_offset

    # Head-major storage viewed as [T, H, D]: T * stride(0) fits in int32, but head 15's offset
    # 15 * T * D does not (it wrapped, and head 15 came out wrong by about 1.2).
    meta = torch.empty(16, 8947849, 16, device="meta").transpose(0, 1)
    assert meta.stride() == (16, 143165584, 1) and meta.shape[0] * meta.stride(0) < 2**31
    assert largest_offset(meta) == 8947848 * 16 + 15 * 143165584 + 15 > 2**31 - 1
    # The same check on a real tensor (CPU in the interpreter, 4.6 GB on a GPU), through the public
    # function (nothing is computed: the storage is reserved, never touched).
    storage = torch.empty(16, 8947849, 16, dtype=torch.bfloat16, device=DEVICE)
    q = storage.transpose(0, 1)
    cu = torch.tensor([0, 16], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"q must have every element offset below 2\*\*31 .*strides \(16, 143165584, 1\)"):
        varlen_attention_triton(q, q, q, cu, schedule="rect", max_seqlen=16)


def test_strided_cu_seqlens_is_refused():
    # values [0, 5, 17, 30] read through their data pointer would be [0, 7, 5, 7]
    # Built on DEVICE: .to("cuda") would copy it into a contiguous tensor and hide the stride.
    cu = torch.tensor([[0, 7], [5, 7], [17, 7], [30, 7]], dtype=torch.int32, device=DEVICE)[:, 0]
    q, k, v, _, _ = make_inputs([5, 12, 13], 3, rows=32)
    with pytest.raises(ValueError, match=r"cu_seqlens must be contiguous .*got stride \(2,\)"):
        varlen_attention_triton(q, k, v, cu)
    out = varlen_attention_triton(q, k, v, cu.contiguous().to(DEVICE))
    ref = varlen_attention_reference(q.double(), k.double(), v.double(), cu.contiguous().to(DEVICE))
    assert (out[:30].double() - ref[:30]).abs().max() <= RTOL * ref.abs().max()


def test_max_seqlen_below_the_longest_sequence_is_refused():
    # 24 of 48 rows were never computed with max_seqlen = 13 < 40.
    q, k, v, _, cu = make_inputs([40, 8, 0], 3, rows=48)
    with pytest.raises(ValueError, match="max_seqlen must be >= the longest sequence, got max_seqlen = 13 "
                                         "but sequence 0 has length 40"):
        varlen_attention_triton(q, k, v, cu, schedule="rect", max_seqlen=13)
    out = varlen_attention_triton(q, k, v, cu, schedule="rect", max_seqlen=40)
    ref = varlen_attention_reference(q.double(), k.double(), v.double(), cu)
    assert (out[:48].double() - ref).abs().max() <= RTOL * ref.abs().max()


def test_dynamic_counters_restart_for_every_launch():
    # The task counters must start from 0 in every launch: a second backward through the same
    # forward (retain_graph) and a second forward both see every task again.
    q, k, v, do, cu = make_inputs([30, 9, 17], 4, seed=2)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    first = varlen_attention_triton(q, k, v, cu, schedule="dynamic")
    again = varlen_attention_triton(q, k, v, cu, schedule="dynamic")
    assert torch.equal(first[:56], again[:56])
    grads = [torch.autograd.grad(first, (q, k, v), do, retain_graph=True) for _ in range(2)]
    for a, b in zip(*grads):
        assert torch.equal(a[:56], b[:56])
    ref = varlen_attention_reference(q.double(), k.double(), v.double(), cu)
    ref_grads = torch.autograd.grad(ref, (q, k, v), do.double())
    for mine, expected in zip(grads[1], ref_grads):
        assert (mine[:56].double() - expected[:56]).abs().max() <= RTOL * max(expected.abs().max().item(), 1.0)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    spare_slots=st.integers(0, 3000),  # N + 1 past the kernel's 1024-row block: the carry between blocks
    C=st.sampled_from([1, 16, 64, 128]),
    counters=st.integers(0, 3),
)
def test_chunk_offsets_kernel_matches_the_torch_definition(lengths, spare_slots, C, counters):
    from attn_gym_lite.ops.kernels.offsets import launch_chunk_offsets

    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + spare_slots).to(DEVICE)
    slots = cu.numel()
    offsets = torch.full((slots,), -7, dtype=torch.int32, device=DEVICE)
    counter = torch.full((max(counters, 1),), 99, dtype=torch.int32, device=DEVICE)
    assert launch_chunk_offsets(cu, C, out=offsets, counters=counter[:counters] if counters else None) is offsets
    # Independent reference: a Python loop over the sequences, ceil per sequence.
    expected = [0]
    for s in lengths + [0] * spare_slots:
        expected.append(expected[-1] + -(-s // C))
    assert offsets.cpu().tolist() == expected
    assert offsets.cpu().tolist() == chunk_offsets(cu, C).cpu().tolist()
    assert counter.cpu().tolist() == ([0] * counters if counters else [99])


def test_launch_chunk_offsets_allocates_by_default_and_refuses_bad_buffers():
    from attn_gym_lite.ops.kernels.offsets import launch_chunk_offsets

    cu = cu_seqlens_from_lengths([65, 63, 0, 1]).to(DEVICE)
    offsets = launch_chunk_offsets(cu, 64)
    assert offsets.dtype == torch.int32 and offsets.device == cu.device
    assert offsets.cpu().tolist() == [0, 2, 3, 3, 4]  # ceil per sequence: 2 + 1 + 0 + 1
    counters = r"counters must be a contiguous buffer of at most 4 entries on device \S+, got shape"
    with pytest.raises(ValueError, match=counters + r" \(5,\)"):
        launch_chunk_offsets(cu, 64, counters=torch.zeros(5, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=counters + r" \(2,\), stride \(2,\)"):
        launch_chunk_offsets(cu, 64, counters=torch.zeros(4, dtype=torch.int32, device=DEVICE)[::2])
    with pytest.raises(TypeError, match="counters must have dtype int32"):
        launch_chunk_offsets(cu, 64, counters=torch.zeros(1, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match=r"out must have N \+ 1 = 5 entries"):
        launch_chunk_offsets(cu, 64, out=torch.empty(4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="out must have dtype torch.int32"):
        launch_chunk_offsets(cu, 64, out=torch.empty(5, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1, got 0"):
        launch_chunk_offsets(cu, 0)


def test_a_rect_bound_past_T_sizes_the_grid_as_T_does():
    # max_seqlen = 2**40 asked for ceil(2**40 / 16) CTAs per sequence: the interpreter crashed,
    # and no GPU launches a grid dimension past 2**31 - 1. No sequence is longer than T.
    from attn_gym_lite.ops.kernels import varlen

    q, k, v, _, cu = make_inputs([40, 8, 0], 3, rows=48)
    plan = varlen._plan(q, k, v, cu, False, "rect", 2**40, False, None)
    assert plan.forward.grid == varlen._plan(q, k, v, cu, False, "rect", 48, False, None).forward.grid
    assert plan.forward.grid[0] == math.ceil(48 / plan.forward.config.block_m)
    out = varlen_attention_triton(q, k, v, cu, schedule="rect", max_seqlen=2**40)
    ref = varlen_attention_reference(q.double(), k.double(), v.double(), cu)
    assert (out[:48].double() - ref).abs().max() <= RTOL * ref.abs().max()
