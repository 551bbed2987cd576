"""attn_gym_lite.ragged against hand-computed examples and naive Python loops over sequences."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ragged import (
    active_token_mask,
    cu_seqlens_from_lengths,
    lengths_from_cu_seqlens,
    max_seqlen,
    pack_sequences,
    packed_to_padded,
    pad_cu_seqlens,
    padded_to_packed,
    positions_in_sequence,
    unpack_sequences,
    validate_cu_seqlens,
    zipf_lengths,
)

FAST = settings(max_examples=40, deadline=None)
lengths_lists = st.lists(st.integers(0, 6), min_size=1, max_size=6)
trailing_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def cu(values):
    return torch.tensor(values, dtype=torch.int32)


def naive_prefix_sum(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def make_sequences(lengths, trailing):
    """Sequences whose every element is distinct, so misplaced rows are caught."""
    sequences, start = [], 0
    for n in lengths:
        numel = n * torch.Size(trailing).numel()
        sequences.append(torch.arange(start, start + numel, dtype=torch.float32).reshape(n, *trailing))
        start += numel
    return sequences


def test_hand_examples():
    for lengths in ([65, 63], torch.tensor([65, 63]), torch.tensor([65, 63], dtype=torch.int16)):
        assert cu_seqlens_from_lengths(lengths).dtype == torch.int32
        assert cu_seqlens_from_lengths(lengths).tolist() == [0, 65, 128]
    assert cu_seqlens_from_lengths([1, 2], device="meta").is_meta
    assert lengths_from_cu_seqlens(cu([0, 65, 128, 128, 128])).tolist() == [65, 63, 0, 0]
    assert (max_seqlen(cu([0, 65, 128])), max_seqlen(cu([0, 3, 10, 10])), max_seqlen(cu([0, 0, 0]))) == (65, 7, 0)
    padded = pad_cu_seqlens(cu([0, 65, 128]), 5)
    assert padded.tolist() == [0, 65, 128, 128, 128, 128] and padded.dtype == torch.int32
    same = cu([0, 65, 128])
    assert pad_cu_seqlens(same, 2).tolist() == [0, 65, 128] and pad_cu_seqlens(same, 2).data_ptr() != same.data_ptr()
    assert active_token_mask(6, cu([0, 2, 4, 4])).tolist() == [True] * 4 + [False] * 2
    assert active_token_mask(0, cu([0, 0])).tolist() == []
    # Positions restart at every boundary, skip empty sequences, and count on from L past it.
    assert positions_in_sequence(cu([0, 2, 2, 5]), 7).tolist() == [0, 1, 0, 1, 2, 0, 1]
    validate_cu_seqlens(cu([0, 65, 128, 128]), 128, max_seqlen=65)
    validate_cu_seqlens(cu([0, 0]), 0, max_seqlen=0)
    packed = torch.arange(10.0)  # T = 10, L = 5: capacity rows are not returned, tail slots are empty
    pieces = unpack_sequences(packed, cu([0, 2, 5, 5, 5]))
    assert [p.tolist() for p in pieces] == [[0.0, 1.0], [2.0, 3.0, 4.0], [], []]
    pieces[1][0] = -1.0  # views
    assert packed[2] == -1.0


@FAST
@given(lengths=lengths_lists)
def test_cu_seqlens_and_lengths_round_trip(lengths):
    cu_seqlens = cu_seqlens_from_lengths(lengths)
    assert cu_seqlens.tolist() == naive_prefix_sum(lengths)
    assert lengths_from_cu_seqlens(cu_seqlens).tolist() == lengths


@pytest.mark.parametrize("call", [
    lambda: cu_seqlens_from_lengths([5, -3]),
    lambda: cu_seqlens_from_lengths([2**30, 2**30]),
    lambda: cu_seqlens_from_lengths([2**62, 2**62]),  # wraps an int64 running sum to [0, 0, 0]
    lambda: cu_seqlens_from_lengths(torch.tensor([2**62] * 4)),
    lambda: padded_to_packed(torch.zeros(2, 4), [1, 5]),  # longer than the padded row
    lambda: validate_cu_seqlens(torch.tensor([0, 65, 128])),  # int64
    lambda: validate_cu_seqlens(cu([[0, 1], [1, 2]])),
    lambda: validate_cu_seqlens(cu([0])),
    lambda: validate_cu_seqlens(cu([[0, 9], [3, 9], [5, 9]])[:, 0]),  # strided
    lambda: validate_cu_seqlens(cu([3, 65, 128])),
    lambda: validate_cu_seqlens(cu([0, 65, 128, 100, 128])),
    lambda: validate_cu_seqlens(cu([0, 65, 128]), token_capacity=100),
    lambda: validate_cu_seqlens(cu([0, 10, 75, 128]), max_seqlen=64),
])
def test_each_rule_is_refused_naming_its_argument(call):
    with pytest.raises((TypeError, ValueError), match="lengths|cu_seqlens|max_seqlen"):
        call()


@FAST
@given(num_sequences=st.integers(1, 64), spare=st.integers(0, 5000), exponent=st.floats(0.0, 3.0),
       seed=st.integers(0, 2**16))
def test_zipf_lengths_properties(num_sequences, spare, exponent, seed):
    total = num_sequences + spare
    lengths = zipf_lengths(total, num_sequences, exponent=exponent, generator=torch.Generator().manual_seed(seed))
    assert lengths.dtype == torch.int32 and lengths.shape == (num_sequences,)
    assert int(lengths.sum()) == total and int(lengths.min()) >= 1


def test_zipf_lengths_follow_the_rank_shares():
    total, n, exponent = 4096, 32, 1.2
    lengths = zipf_lengths(total, n, exponent=exponent, generator=torch.Generator().manual_seed(0))
    assert torch.equal(lengths, zipf_lengths(total, n, exponent=exponent, generator=torch.Generator().manual_seed(0)))
    # Replay the same ranking and predict every length in plain Python floats.
    ranks = (torch.randperm(n, generator=torch.Generator().manual_seed(0)) + 1).tolist()
    harmonic = sum(r**-exponent for r in range(1, n + 1))
    for length, rank in zip(lengths.tolist(), ranks):
        assert abs(length - (1 + (total - n) * rank**-exponent / harmonic)) < 1, (rank, length)
    # The rank-1 sequence: 1 + 4064 / sum(r^-1.2 for r <= 32) = 1 + 4064 / 3.0993 = 1312.24 tokens.
    assert ranks[int(lengths.argmax())] == 1 and int(lengths.max()) == 1312
    near_uniform = zipf_lengths(100, 7, exponent=0.0)
    assert int(near_uniform.max()) - int(near_uniform.min()) <= 1 and int(near_uniform.sum()) == 100
    assert zipf_lengths(5, 5).tolist() == [1] * 5


@FAST
@given(lengths=lengths_lists, trailing=trailing_shapes)
def test_pack_unpack_round_trip(lengths, trailing):
    sequences = make_sequences(lengths, trailing)
    packed, cu_seqlens = pack_sequences(sequences)
    rows = [row for seq in sequences for row in seq]  # reference: append rows one at a time
    assert packed.shape == (sum(lengths), *trailing)
    assert all(torch.equal(got, want) for got, want in zip(packed, rows))
    assert cu_seqlens.tolist() == naive_prefix_sum(lengths)
    unpacked = unpack_sequences(packed, cu_seqlens)
    assert len(unpacked) == len(sequences)
    assert all(torch.equal(got, want) for got, want in zip(unpacked, sequences))


def naive_packed_to_padded(packed, lengths, width, padding_value):
    out = torch.full((len(lengths), width, *packed.shape[1:]), padding_value, dtype=packed.dtype)
    start = 0
    for b, n in enumerate(lengths):
        for s in range(n):
            out[b, s] = packed[start + s]
        start += n
    return out


@FAST
@given(lengths=lengths_lists, trailing=trailing_shapes, empty_slots=st.integers(0, 3), spare_rows=st.integers(0, 4),
       extra_width=st.integers(0, 2))
def test_packed_padded_round_trip(lengths, trailing, empty_slots, spare_rows, extra_width):
    sequences = make_sequences(lengths, trailing)
    packed, cu_seqlens = pack_sequences(sequences)
    # A static-capacity batch: T > L capacity rows holding garbage, N > M empty slots.
    static_packed = torch.cat((packed, torch.full((spare_rows, *trailing), 999.0)))
    static_cu = pad_cu_seqlens(cu_seqlens, len(lengths) + empty_slots)
    all_lengths = lengths + [0] * empty_slots
    width = max(lengths) + extra_width

    padded = packed_to_padded(static_packed, static_cu, max_seqlen=width, padding_value=-1.0)
    assert torch.equal(padded, naive_packed_to_padded(packed, all_lengths, width, -1.0))
    if extra_width == 0:
        assert torch.equal(packed_to_padded(static_packed, static_cu, padding_value=-1.0), padded)
    for given_lengths in (all_lengths, torch.tensor(all_lengths)):
        repacked, repacked_cu = padded_to_packed(padded, given_lengths)
        assert torch.equal(repacked, packed) and torch.equal(repacked_cu, static_cu)


def test_packed_to_padded_integer_dtype_and_gradient():
    assert packed_to_padded(torch.tensor([1, 2, 3]), cu([0, 1, 3])).tolist() == [[1, 0], [2, 3]]
    packed = torch.randn(6, 2, requires_grad=True)  # T = 6, L = 4
    packed_to_padded(packed, cu([0, 3, 4])).sum().backward()
    assert packed.grad[:4].eq(1).all() and packed.grad[4:].eq(0).all()  # capacity rows get no gradient


@FAST
@given(lengths=lengths_lists, spare_rows=st.integers(0, 5), dim=st.integers(1, 3))
def test_mask_and_positions_match_naive_loops(lengths, spare_rows, dim):
    cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + 2)
    active_tokens, token_capacity = sum(lengths), sum(lengths) + spare_rows
    expected = [t < active_tokens for t in range(token_capacity)]
    assert active_token_mask(token_capacity, cu_seqlens).tolist() == expected
    assert active_token_mask(torch.empty(token_capacity, dim), cu_seqlens).tolist() == expected
    positions = [t - start for start, n in zip(naive_prefix_sum(lengths), lengths) for t in range(start, start + n)]
    positions += list(range(spare_rows))
    assert positions_in_sequence(cu_seqlens, token_capacity).tolist() == positions


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_active_token_mask_is_rebuilt_on_every_graph_replay():
    static_cu = cu([0, 3, 5, 5]).cuda()
    hidden = torch.ones(8, 2, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside capture
        active_token_mask(hidden, static_cu)
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask = active_token_mask(hidden, static_cu)
        with pytest.raises(RuntimeError, match="cannot happen during CUDA graph capture"):
            validate_cu_seqlens(static_cu)

    for new_cu, active_tokens in (([0, 1, 2, 2], 2), ([0, 4, 6, 8], 8), ([0, 0, 0, 0], 0)):
        static_cu.copy_(cu(new_cu))
        graph.replay()
        torch.cuda.synchronize()
        assert mask.cpu().tolist() == [t < active_tokens for t in range(8)]
