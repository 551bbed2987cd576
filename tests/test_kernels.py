"""The Triton ragged-attention kernels on small shapes against a float64 reference (every schedule,
causal or not, forward and gradients, random and edge layouts), and the schedules' task decoding.
Without a GPU they run in Triton's interpreter (float32, 16-row tiles); with one, in bfloat16."""

import pytest
import torch
import triton
import triton.language as tl
from helpers import assert_attention_close, attention_and_grads, reference_and_grads
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.bench.schedulers import IMPLEMENTATIONS, attention_fn
from attn_gym_lite.ops.kernels import varlen_attention_triton
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


def assert_matches_reference(lengths, slots, schedule, causal, seed=0, zero_inactive=True, dtype=DTYPE, rtol=RTOL):
    q, k, v, do, cu = make_inputs(lengths, slots, seed, dtype=dtype)
    kwargs = {"max_seqlen": max(max(lengths), 1)} if schedule == "rect" else {}
    ours = attention_and_grads(
        lambda q, k, v: varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule,
                                                zero_inactive=zero_inactive, **kwargs),
        q, k, v, do)
    assert_attention_close(ours, reference_and_grads(q, k, v, do, cu, causal), sum(lengths), rtol, zero_inactive)


@pytest.mark.parametrize("implementation", [i for i in IMPLEMENTATIONS if i != "varlen_attn" or DEVICE == "cuda"])
def test_every_schedulers_suite_implementation_runs_and_matches_reference(implementation):
    # The suite times each implementation in a child process and records a failure as an error
    # beside the others: here each one runs, on CPU through the interpreter.
    lengths, slots = EDGE_LAYOUTS["zipf_tail"]
    q, k, v, do, cu = make_inputs(lengths, slots)
    if implementation == "varlen_attn":
        q, k, v, do = (x.to(torch.bfloat16) for x in (q, k, v, do))
    attend = attention_fn(implementation, True, max(lengths))
    ours = attention_and_grads(lambda q, k, v: attend(q, k, v, cu), q, k, v, do)
    rtol = RTOL if q.dtype == DTYPE else 2e-2
    assert_attention_close(ours, reference_and_grads(q, k, v, do, cu, True), sum(lengths), rtol, zeroed=implementation.endswith("+zero"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ["rect", "flat"])
def test_16_bit_inputs_match_reference_here_too(schedule, causal, dtype):
    # Triton's interpreter multiplies bfloat16 tiles as integers unless the kernels' ``dot`` widens
    # them. 16-bit rounding of the inputs, P and dS bounds the error by ~1e-2 of the largest value.
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
    assert_attention_close(ours, reference_and_grads(q, k, v, do, cu, causal=True), sum(lengths), RTOL)


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


def record_tasks(cu, offsets, schedule, rows, C, heads, room, max_seqlen):
    """Every ``(seq_start, seq_len, chunk, head)`` the schedule hands out, in the order taken."""
    slots = cu.numel() - 1
    grid = launch_grid(schedule, T=max(rows, 1), N=slots, C=C, heads=heads, num_sms=num_sms(DEVICE), ctas_per_sm=1,
                       max_seqlen=max_seqlen if schedule == "rect" else None)
    out = torch.full((room, 4), -1, dtype=torch.int32, device=DEVICE)
    counter, rows_written = (torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    record_tasks_kernel[grid](cu.to(DEVICE), offsets.to(DEVICE), counter, rows_written, out, slots, heads, rows,
                              CHUNK=C, SCHEDULE=schedule)
    return [tuple(row) for row in out.cpu().tolist()[: int(rows_written)]]


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
    # Room for twice the capacity bound: a schedule that ran a chunk twice would show it.
    recorded = record_tasks(cu, offsets, schedule, rows, C, heads, 2 * chunk_capacity(rows, slots, C) * heads + 1,
                            max(max(lengths), 1))
    bounds = cu.tolist()
    expected = []
    for head in range(heads):
        for flat in range(int(offsets[-1])):
            seq, local, _ = decode_chunk(offsets, cu, flat, C)
            expected.append((bounds[seq], bounds[seq + 1] - bounds[seq], local, head))
    assert sorted(recorded) == sorted(expected)


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
    # Room for every slot of the grid: rect's overlapping sequences may each fill their column.
    room = max(2 * chunk_capacity(max(rows, 1), slots, C), slots * -(-max(rows, 1) // C)) * heads + 1
    recorded = record_tasks(cu, offsets, schedule, rows, C, heads, room, max(rows, 1))
    for seq_start, seq_len, chunk, head in recorded:
        assert 0 <= seq_start <= seq_start + seq_len <= rows, (values, rows, seq_start, seq_len)
        assert 0 <= chunk and chunk * C < seq_len, (values, rows, chunk, seq_len)
        assert 0 <= head < heads
    if schedule != "rect":  # the flat list: exactly the capped chunk count, per head
        assert len(recorded) == expected_offsets[-1] * heads


def test_schedules_compute_bitwise_identical_results():
    # A schedule decides which program computes a chunk, never how: the arithmetic is the same. Run
    # twice, the dynamic schedule shows that every launch restarts its task counters from 0.
    q, k, v, do, cu = make_inputs([30, 0, 1, 17, 9], 7, seed=5)
    results = [attention_and_grads(
        lambda q, k, v: varlen_attention_triton(q, k, v, cu, causal=True, schedule=schedule,
                                                max_seqlen=30 if schedule == "rect" else None), q, k, v, do)
        for schedule in ("rect", "flat", "persistent", "dynamic", "dynamic")]
    for schedule, result in zip(("flat", "persistent", "dynamic", "dynamic again"), results[1:]):
        for mine, rect in zip(result, results[0]):
            assert torch.equal(mine[:57], rect[:57]), schedule  # rows past L are unspecified by default


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
    assert torch.equal(launch_chunk_offsets(cu, C), offsets)  # allocated when no buffer is given
    # Independent reference: a Python loop over the sequences, ceil per sequence.
    expected = [0]
    for s in lengths + [0] * spare_slots:
        expected.append(expected[-1] + -(-s // C))
    assert offsets.cpu().tolist() == expected
    assert offsets.cpu().tolist() == chunk_offsets(cu, C).cpu().tolist()
    assert counter.cpu().tolist() == ([0] * counters if counters else [99])


def test_a_rect_bound_past_T_is_clamped_to_T():
    # No sequence is longer than T: a bound of 2**40 must not size a grid of 2**36 CTAs per sequence.
    q, k, v, do, cu = make_inputs([40, 8, 0], 3, rows=48)
    out = varlen_attention_triton(q, k, v, cu, schedule="rect", max_seqlen=2**40)
    assert_attention_close([out], reference_and_grads(q, k, v, do, cu), 48, RTOL)
