"""Tests for attn_gym_lite.ragged: packed tensors and cu_seqlens metadata.

Each result is checked against an independent reference: a hand-computed example
(lengths [65, 63] -> cu_seqlens [0, 65, 128]) or a naive Python loop over sequences.
"""

import math
import re

import numpy as np
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
    unpack_sequences,
    validate_cu_seqlens,
    zipf_lengths,
)

FAST = settings(max_examples=40, deadline=None)


def cu(values):
    return torch.tensor(values, dtype=torch.int32)


def naive_prefix_sum(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def make_sequences(lengths, trailing, dtype=torch.float32):
    """Sequences whose every element is distinct, so misplaced rows are caught."""
    sequences, start = [], 0
    for n in lengths:
        numel = n * (torch.Size(trailing).numel())
        sequences.append(torch.arange(start, start + numel, dtype=dtype).reshape(n, *trailing))
        start += numel
    return sequences


lengths_lists = st.lists(st.integers(0, 6), min_size=1, max_size=6)
trailing_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


# --- cu_seqlens metadata ------------------------------------------------------


def test_cu_seqlens_from_lengths_hand_example():
    for lengths in ([65, 63], torch.tensor([65, 63]), torch.tensor([65, 63], dtype=torch.int16)):
        result = cu_seqlens_from_lengths(lengths)
        assert result.dtype == torch.int32
        assert result.tolist() == [0, 65, 128]
    assert cu_seqlens_from_lengths([0, 3, 0]).tolist() == [0, 0, 3, 3]


@FAST
@given(lengths=lengths_lists)
def test_cu_seqlens_and_lengths_round_trip(lengths):
    cu_seqlens = cu_seqlens_from_lengths(lengths)
    assert cu_seqlens.tolist() == naive_prefix_sum(lengths)
    round_trip = lengths_from_cu_seqlens(cu_seqlens)
    assert round_trip.dtype == torch.int32
    assert round_trip.tolist() == lengths


@pytest.mark.parametrize(
    ("lengths", "error", "match"),
    [
        ([5, -3], ValueError, "lengths must be >= 0, got lengths[1] = -3"),
        (torch.tensor([2, 0, -1]), ValueError, "lengths must be >= 0, got lengths[2] = -1"),
        ([], ValueError, "lengths must hold at least one sequence length"),
        (torch.tensor([1.0, 2.0]), TypeError, "lengths must have an integer dtype, got torch.float32"),
        (torch.ones(2, 2, dtype=torch.int64), ValueError, "got shape (2, 2)"),
        ([1, 2.5], TypeError, "lengths[1] must be an int, got 2.5"),
        ([True], TypeError, "lengths[0] must be an int, got True"),
        ("12", TypeError, "lengths must be a 1-D integer tensor or a sequence of ints, got str"),
        ([2**31, 0], ValueError, "lengths[0] must be an int in [0, 2147483647] (cu_seqlens is int32), got 2147483648"),
        ([2**30, 2**30], ValueError, "sum of lengths must fit in int32 (<= 2147483647), the cu_seqlens dtype, got 2147483648"),
        # Reliability tail. Before: the int64 running sum wrapped and passed the total's check:
        # [2**62, 2**62] gave cu_seqlens [0, 0, 0], [2**63 - 1, 1] gave [0, -1, 0].
        ([2**62, 2**62], ValueError, "lengths[0] must be an int in [0, 2147483647] (cu_seqlens is int32), got 4611686018427387904"),
        ([5, 2**63 - 1, 1], ValueError, "lengths[1] must be an int in [0, 2147483647] (cu_seqlens is int32)"),
        (torch.tensor([2**62] * 4), ValueError, "lengths[0] must be an int in [0, 2147483647] (cu_seqlens is int32)"),
    ],
)
def test_cu_seqlens_from_lengths_errors(lengths, error, match):
    with pytest.raises(error, match=re.escape(match)):
        cu_seqlens_from_lengths(lengths)


def test_cu_seqlens_from_lengths_names_a_bad_device():
    # The device reached Tensor.to: torch's RuntimeError ("Expected one of cpu, cuda, ...") for
    # "foo", "Torch not compiled with CUDA enabled" for "cuda" without a GPU, TypeError "to()
    # received an invalid combination of arguments" for a bool.
    for lengths in ([1, 2], torch.tensor([1, 2])):
        with pytest.raises(ValueError, match=r"device must be a torch.device, a device string .*, got 'foo'"):
            cu_seqlens_from_lengths(lengths, device="foo")
        with pytest.raises(TypeError, match=r"device must be a torch.device, a device string .*, got bool True"):
            cu_seqlens_from_lengths(lengths, device=True)
        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match=r"device must be an available device; CUDA is not available here"):
                cu_seqlens_from_lengths(lengths, device="cuda")
        assert cu_seqlens_from_lengths(lengths, device=torch.device("meta")).is_meta  # documented: shape only
    assert cu_seqlens_from_lengths([1, 2], device="cpu").tolist() == [0, 1, 3]


def test_lengths_from_cu_seqlens_tail_slots_are_empty():
    assert lengths_from_cu_seqlens(cu([0, 65, 128, 128, 128])).tolist() == [65, 63, 0, 0]


def test_pad_cu_seqlens_repeats_active_tokens():
    cu_seqlens = cu([0, 65, 128])
    padded = pad_cu_seqlens(cu_seqlens, 5)
    assert padded.dtype == torch.int32
    assert padded.tolist() == [0, 65, 128, 128, 128, 128]
    assert cu_seqlens.tolist() == [0, 65, 128]  # input untouched
    same = pad_cu_seqlens(cu_seqlens, 2)
    assert same.tolist() == [0, 65, 128]
    assert same.data_ptr() != cu_seqlens.data_ptr()  # a new tensor, never an alias


def test_pad_cu_seqlens_errors():
    with pytest.raises(ValueError, match=re.escape("at most sequence_capacity + 1 = 2 entries, got 3")):
        pad_cu_seqlens(cu([0, 65, 128]), 1)
    with pytest.raises(ValueError, match=re.escape("sequence_capacity must be an int >= 1, got 0")):
        pad_cu_seqlens(cu([0, 4]), 0)
    with pytest.raises(TypeError, match=re.escape("sequence_capacity must be an int >= 1, got 3.0")):
        pad_cu_seqlens(cu([0, 4]), 3.0)
    with pytest.raises(TypeError, match="cu_seqlens must have dtype torch.int32"):
        pad_cu_seqlens(torch.tensor([0, 4]), 3)


def test_every_host_reader_refuses_a_meta_tensor_by_name():
    # One kind: functions that read a tensor's values on the host. A meta tensor has none, and
    # torch's own NotImplementedError would name neither the argument nor the cause.
    from attn_gym_lite.checks import check_int_sequence
    from attn_gym_lite.schedule import G_active, decode_chunk

    meta = torch.tensor([0, 5, 9], dtype=torch.int32, device="meta")
    calls = {
        "cu_seqlens": lambda: max_seqlen(meta),
        "capacities": lambda: check_int_sequence("capacities", meta),
        "lengths": lambda: G_active(meta, 4),
        "chunk_offsets": lambda: decode_chunk(meta, cu([0, 5, 9]), 0, 4),
    }
    for argument, call in calls.items():
        with pytest.raises(ValueError, match=re.escape(f"{argument} must hold values")):
            call()


def test_max_seqlen():
    assert max_seqlen(cu([0, 65, 128])) == 65
    assert max_seqlen(cu([0, 3, 10, 10, 10])) == 7
    assert max_seqlen(cu([0, 0, 0])) == 0


# --- validate_cu_seqlens ------------------------------------------------------


def test_validate_accepts_well_formed_metadata():
    assert validate_cu_seqlens(cu([0, 65, 128])) is None
    validate_cu_seqlens(cu([0, 65, 128, 128]), 128, max_seqlen=65, device="cpu")
    validate_cu_seqlens(cu([0, 0]), 0, max_seqlen=0)


@pytest.mark.parametrize(
    ("cu_seqlens", "kwargs", "error", "match"),
    [
        ([0, 65, 128], {}, TypeError, "cu_seqlens must be a torch.Tensor of int32 prefix sums, got list"),
        (
            torch.tensor([0, 65, 128]),
            {},
            TypeError,
            "cu_seqlens must have dtype torch.int32 (FlashAttention varlen convention), got torch.int64",
        ),
        # A meta cu_seqlens has no values to validate: the device argument itself is refused.
        (cu([0, 65, 128]), {"device": "meta"}, ValueError, "device must be a device that holds values (not 'meta'), got meta"),
        (cu([0, 65, 128]), {"device": "foo"}, ValueError, "device must be a torch.device, a device string"),
        (cu([0, 65, 128]), {"device": 1.5}, TypeError, "device must be a torch.device, a device string"),
        (cu([[0, 1], [1, 2]]), {}, ValueError, "cu_seqlens must be 1-D with shape [N + 1], got shape (2, 2)"),
        (cu([0]), {}, ValueError, "cu_seqlens must have at least 2 entries (shape [N + 1] with N >= 1), got shape (1,)"),
        (cu([3, 65, 128]), {}, ValueError, "cu_seqlens[0] must be 0, got 3"),
        (
            cu([0, 65, 128, 100, 128]),
            {},
            ValueError,
            "cu_seqlens must be non-decreasing, but cu_seqlens[3] = 100 < cu_seqlens[2] = 128",
        ),
        (
            cu([0, 65, 128]),
            {"token_capacity": 100},
            ValueError,
            "cu_seqlens[-1] (active tokens L) must be <= token_capacity T = 100, got L = 128",
        ),
        (
            cu([0, 10, 75, 128]),
            {"max_seqlen": 64},
            ValueError,
            "max_seqlen must be >= the longest sequence, got max_seqlen = 64 but sequence 1 has length 65",
        ),
        (cu([0, 1]), {"token_capacity": -1}, ValueError, "token_capacity must be an int >= 0, got -1"),
        (cu([0, 1]), {"max_seqlen": 1.5}, TypeError, "max_seqlen must be an int >= 0, got 1.5"),
        (
            torch.tensor([0, 5, 9], dtype=torch.int32, device="meta"),
            {},
            ValueError,
            "cu_seqlens must hold values (its entries are read on the host), got a meta tensor of shape (3,)",
        ),
    ],
)
def test_validate_rejects(cu_seqlens, kwargs, error, match):
    with pytest.raises(error, match=re.escape(match)):
        validate_cu_seqlens(cu_seqlens, **kwargs)


# --- zipf_lengths -------------------------------------------------------------


@FAST
@given(
    num_sequences=st.integers(1, 64),
    spare=st.integers(0, 5000),
    exponent=st.floats(0.0, 3.0),
    seed=st.integers(0, 2**16),
)
def test_zipf_lengths_properties(num_sequences, spare, exponent, seed):
    total = num_sequences + spare
    generator = torch.Generator().manual_seed(seed)
    lengths = zipf_lengths(total, num_sequences, exponent=exponent, generator=generator)
    assert lengths.dtype == torch.int32
    assert lengths.device.type == "cpu"
    assert lengths.shape == (num_sequences,)
    assert int(lengths.sum()) == total
    assert int(lengths.min()) >= 1


def test_zipf_lengths_is_deterministic_with_a_generator():
    first = zipf_lengths(4096, 32, generator=torch.Generator().manual_seed(7))
    again = zipf_lengths(4096, 32, generator=torch.Generator().manual_seed(7))
    other = zipf_lengths(4096, 32, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)  # a different ranking of the same lengths
    assert sorted(first.tolist()) == sorted(other.tolist())


def test_zipf_lengths_follow_the_rank_shares():
    total, n, exponent = 4096, 32, 1.2
    lengths = zipf_lengths(total, n, exponent=exponent, generator=torch.Generator().manual_seed(0))
    # Replay the same ranking and predict every length in plain Python floats.
    ranks = (torch.randperm(n, generator=torch.Generator().manual_seed(0)) + 1).tolist()
    harmonic = sum(r**-exponent for r in range(1, n + 1))
    for length, rank in zip(lengths.tolist(), ranks):
        predicted = 1 + (total - n) * rank**-exponent / harmonic
        assert abs(length - predicted) < 1, (rank, length, predicted)
    # The rank-1 sequence is the longest: 1 + 4064 / sum(r^-1.2 for r <= 32)
    # = 1 + 4064 / 3.0993 = 1312.24 tokens, about a third of the batch.
    assert ranks[int(lengths.argmax())] == 1
    assert int(lengths.max()) == 1312


def test_zipf_lengths_exponent_zero_is_near_uniform():
    lengths = zipf_lengths(100, 7, exponent=0.0)
    assert int(lengths.max()) - int(lengths.min()) <= 1
    assert int(lengths.sum()) == 100


def test_zipf_lengths_one_token_each():
    assert zipf_lengths(5, 5).tolist() == [1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((3, 4), {}, ValueError,
         "total_tokens must be >= num_sequences (each sequence gets at least 1 token), got total_tokens = 3 < num_sequences = 4"),
        ((10, 0), {}, ValueError, "num_sequences must be an int >= 1, got 0"),
        ((10.0, 2), {}, TypeError, "total_tokens must be an int >= 0, got 10.0"),
        ((2**31, 2), {}, ValueError, "total_tokens must be <= 2147483647"),
        ((10, 2), {"exponent": -1.0}, ValueError, "exponent must be a finite real number >= 0, got -1.0"),
        ((10, 2), {"exponent": float("nan")}, ValueError, "exponent must be a finite real number >= 0, got nan"),
        ((10, 2), {"exponent": "1.2"}, TypeError, "exponent must be a finite real number >= 0, got '1.2'"),
        ((10, 2), {"generator": 0}, TypeError, "generator must be a torch.Generator or None, got int"),
    ],
)
def test_zipf_lengths_errors(args, kwargs, error, match):
    with pytest.raises(error, match=re.escape(match)):
        zipf_lengths(*args, **kwargs)


# --- pack / unpack ------------------------------------------------------------


def test_pack_sequences_hand_example():
    a, b = torch.ones(65, 4), torch.zeros(63, 4)
    packed, cu_seqlens = pack_sequences([a, b])
    assert packed.shape == (128, 4)
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 65, 128]
    assert packed[:65].eq(1).all() and packed[65:].eq(0).all()


@FAST
@given(lengths=lengths_lists, trailing=trailing_shapes)
def test_pack_unpack_round_trip(lengths, trailing):
    sequences = make_sequences(lengths, trailing)
    packed, cu_seqlens = pack_sequences(sequences)

    # Reference: append rows one at a time.
    rows = [row for seq in sequences for row in seq]
    assert packed.shape == (sum(lengths), *trailing)
    for got, want in zip(packed, rows):
        assert torch.equal(got, want)
    assert cu_seqlens.tolist() == naive_prefix_sum(lengths)

    unpacked = unpack_sequences(packed, cu_seqlens)
    assert len(unpacked) == len(sequences)
    for got, want in zip(unpacked, sequences):
        assert torch.equal(got, want)


def test_unpack_ignores_capacity_rows_and_gives_empty_tail_slots():
    packed = torch.arange(10.0)  # T = 10, L = 5
    pieces = unpack_sequences(packed, cu([0, 2, 5, 5, 5]))
    assert [p.tolist() for p in pieces] == [[0.0, 1.0], [2.0, 3.0, 4.0], [], []]
    pieces[1][0] = -1.0  # views: writes land in packed
    assert packed[2] == -1.0


def test_unpack_errors():
    with pytest.raises(ValueError, match=re.escape("token_capacity T = 4, got L = 5")):
        unpack_sequences(torch.zeros(4), cu([0, 5]))
    with pytest.raises(ValueError, match=re.escape("packed must have a token dimension")):
        unpack_sequences(torch.tensor(1.0), cu([0, 1]))
    with pytest.raises(ValueError, match=re.escape("cu_seqlens must be on device meta, got cpu")):
        unpack_sequences(torch.zeros(4, device="meta"), cu([0, 1]))


@pytest.mark.parametrize(
    ("sequences", "error", "match"),
    [
        ([], ValueError, "sequences must hold at least one tensor, got an empty list"),
        (torch.zeros(3, 2), TypeError, "sequences must be a list or tuple of tensors, got Tensor"),
        ([torch.zeros(2), [1.0]], TypeError, "sequences[1] must be a torch.Tensor of shape [T, ...], got list"),
        ([torch.zeros(2), torch.tensor(1.0)], ValueError, "sequences[1] must have a token dimension"),
        (
            [torch.zeros(2, 3), torch.zeros(1, 4)],
            ValueError,
            "sequences[1] must have trailing shape (3,) like sequences[0], got shape (1, 4)",
        ),
        (
            [torch.zeros(2), torch.zeros(2, dtype=torch.float64)],
            TypeError,
            "sequences[1] must have dtype torch.float32 like sequences[0], got torch.float64",
        ),
        (
            [torch.zeros(2), torch.zeros(2, device="meta")],
            ValueError,
            "sequences[1] must be on device cpu like sequences[0], got meta",
        ),
    ],
)
def test_pack_sequences_errors(sequences, error, match):
    with pytest.raises(error, match=re.escape(match)):
        pack_sequences(sequences)


# --- padded <-> packed --------------------------------------------------------


def naive_packed_to_padded(packed, lengths, width, padding_value):
    out = torch.full((len(lengths), width, *packed.shape[1:]), padding_value, dtype=packed.dtype)
    start = 0
    for b, n in enumerate(lengths):
        for s in range(n):
            out[b, s] = packed[start + s]
        start += n
    return out


@FAST
@given(
    lengths=lengths_lists,
    trailing=trailing_shapes,
    empty_slots=st.integers(0, 3),
    spare_rows=st.integers(0, 4),
    extra_width=st.integers(0, 2),
)
def test_packed_padded_round_trip(lengths, trailing, empty_slots, spare_rows, extra_width):
    sequences = make_sequences(lengths, trailing)
    packed, cu_seqlens = pack_sequences(sequences)
    # A static-capacity batch: T > L capacity rows holding garbage, N > M empty slots.
    capacity_rows = torch.full((spare_rows, *trailing), 999.0)
    static_packed = torch.cat((packed, capacity_rows))
    static_cu = pad_cu_seqlens(cu_seqlens, len(lengths) + empty_slots)
    all_lengths = lengths + [0] * empty_slots
    width = max(lengths) + extra_width

    padded = packed_to_padded(static_packed, static_cu, max_seqlen=width, padding_value=-1.0)
    assert torch.equal(padded, naive_packed_to_padded(packed, all_lengths, width, -1.0))
    if extra_width == 0:
        default = packed_to_padded(static_packed, static_cu, padding_value=-1.0)
        assert torch.equal(default, padded)

    repacked, repacked_cu = padded_to_packed(padded, all_lengths)
    assert torch.equal(repacked, packed)
    assert torch.equal(repacked_cu, static_cu)
    repacked_from_tensor, _ = padded_to_packed(padded, torch.tensor(all_lengths))
    assert torch.equal(repacked_from_tensor, packed)


def test_padded_to_packed_hand_example():
    padded = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    packed, cu_seqlens = padded_to_packed(padded, [3, 1, 2])
    assert packed.tolist() == [1, 2, 3, 4, 5, 6]
    assert cu_seqlens.tolist() == [0, 3, 4, 6]


def test_packed_to_padded_integer_dtype_and_gradient():
    ints = packed_to_padded(torch.tensor([1, 2, 3]), cu([0, 1, 3]))
    assert ints.dtype == torch.int64
    assert ints.tolist() == [[1, 0], [2, 3]]

    packed = torch.randn(6, 2, requires_grad=True)  # T = 6, L = 4
    packed_to_padded(packed, cu([0, 3, 4])).sum().backward()
    assert packed.grad[:4].eq(1).all()
    assert packed.grad[4:].eq(0).all()  # capacity rows get no gradient


def test_packed_padded_errors():
    with pytest.raises(ValueError, match=re.escape("got max_seqlen = 2 but sequence 0 has length 3")):
        packed_to_padded(torch.zeros(4), cu([0, 3, 4]), max_seqlen=2)
    with pytest.raises(TypeError, match=re.escape("padding_value must be a number (a fill for torch.float32), got str 'x'")):
        packed_to_padded(torch.zeros(4), cu([0, 3, 4]), padding_value="x")


@pytest.mark.parametrize(("dtype", "value", "error", "match"), [
    # Before: torch's "value cannot be converted to type uint8_t without overflow" (RuntimeError) ...
    (torch.uint8, 300, ValueError, "padding_value must be an integral value in [0, 255] (a fill for torch.uint8), got 300"),
    (torch.float32, 1 + 2j, TypeError, "padding_value must be a real number (a fill for torch.float32), got (1+2j)"),
    (torch.float16, 70000.0, ValueError, "padding_value must be within torch.float16's range (magnitude <= 65504), got 70000.0"),
    (torch.int64, 2**63, ValueError, "padding_value must be an integral value in [-9223372036854775808"),
    (torch.int32, math.nan, ValueError, "padding_value must be an integral value in [-2147483648, 2147483647]"),
    # ... or a silently different fill: -1 stored as 255, 0.5 truncated to 0, 2 stored as True.
    (torch.uint8, -1, ValueError, "padding_value must be an integral value in [0, 255] (a fill for torch.uint8), got -1"),
    (torch.int32, 0.5, ValueError, "(a fill for torch.int32), got 0.5"),
    (torch.bool, 2, ValueError, "padding_value must be an integral value in [0, 1] (a fill for torch.bool), got 2"),
])
def test_packed_to_padded_refuses_a_fill_its_dtype_cannot_hold(dtype, value, error, match):
    with pytest.raises(error, match=re.escape(match)):
        packed_to_padded(torch.ones(4, dtype=dtype), cu([0, 3, 4]), padding_value=value)


def test_packed_to_padded_keeps_every_fill_its_dtype_holds():
    for dtype, value in ((torch.uint8, 255), (torch.int32, -7.0), (torch.bool, False), (torch.float32, -math.inf),
                         (torch.float16, math.nan), (torch.complex64, 1 + 2j), (torch.int64, np.int64(-100))):
        padded = packed_to_padded(torch.ones(4, dtype=dtype), cu([0, 3, 4]), padding_value=value)
        expected = torch.full((2, 3), value, dtype=dtype)  # row 0 is sequence 0, row 1 one token then fill
        expected[0], expected[1, 0] = 1, 1
        torch.testing.assert_close(padded, expected, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=re.escape("padded must have shape [B, S, ...], got shape (3,)")):
        padded_to_packed(torch.zeros(3), [1, 1, 1])
    with pytest.raises(TypeError, match=re.escape("padded must be a torch.Tensor of shape [B, S, ...], got list")):
        padded_to_packed([[1]], [1])
    with pytest.raises(ValueError, match=re.escape("one entry per row of padded (B = 2), got 3")):
        padded_to_packed(torch.zeros(2, 4), [1, 1, 1])
    with pytest.raises(ValueError, match=re.escape("lengths must be <= padded.shape[1] = 4, got lengths[1] = 5")):
        padded_to_packed(torch.zeros(2, 4), [1, 5])
    with pytest.raises(ValueError, match=re.escape("lengths must be >= 0, got lengths[0] = -1")):
        padded_to_packed(torch.zeros(2, 4), [-1, 1])


# --- active_token_mask --------------------------------------------------------


@FAST
@given(lengths=lengths_lists, spare_rows=st.integers(0, 5), dim=st.integers(1, 3))
def test_active_token_mask_matches_naive_loop(lengths, spare_rows, dim):
    cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + 2)
    active_tokens = sum(lengths)
    token_capacity = active_tokens + spare_rows
    expected = [t < active_tokens for t in range(token_capacity)]

    from_int = active_token_mask(token_capacity, cu_seqlens)
    from_tensor = active_token_mask(torch.empty(token_capacity, dim), cu_seqlens)
    for mask in (from_int, from_tensor):
        assert mask.dtype == torch.bool
        assert mask.shape == (token_capacity,)
        assert mask.tolist() == expected


def test_active_token_mask_hand_example():
    assert active_token_mask(6, cu([0, 2, 4, 4])).tolist() == [True] * 4 + [False] * 2
    assert active_token_mask(0, cu([0, 0])).tolist() == []


@pytest.mark.parametrize(
    ("x", "cu_seqlens", "error", "match"),
    [
        (torch.tensor(3.0), cu([0, 1]), ValueError, "x_or_token_capacity must have a token dimension"),
        ("8", cu([0, 1]), TypeError, "x_or_token_capacity must be a tensor of shape [T, ...] or an int T >= 0, got '8'"),
        (-1, cu([0, 1]), ValueError, "x_or_token_capacity must be an int in [0, 2147483647], got -1"),
        (torch.empty(4, device="meta"), cu([0, 1]), ValueError, "cu_seqlens must be on device meta, got cpu"),
        (4, torch.tensor([0, 1]), TypeError, "cu_seqlens must have dtype torch.int32"),
        (4, cu([1]), ValueError, "cu_seqlens must have at least 2 entries"),
    ],
)
def test_active_token_mask_errors(x, cu_seqlens, error, match):
    with pytest.raises(error, match=re.escape(match)):
        active_token_mask(x, cu_seqlens)


# --- CUDA graph capture (GPU only) -------------------------------------------


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
        with pytest.raises(RuntimeError, match="values are read on the host, which cannot happen during CUDA graph capture"):
            validate_cu_seqlens(static_cu)

    for new_cu, active_tokens in (([0, 1, 2, 2], 2), ([0, 4, 6, 8], 8), ([0, 0, 0, 0], 0)):
        static_cu.copy_(cu(new_cu))
        graph.replay()
        torch.cuda.synchronize()
        assert mask.cpu().tolist() == [t < active_tokens for t in range(8)]


def test_lengths_are_read_on_the_host_whatever_their_device():
    # A meta tensor failed inside torch.nonzero (NotImplementedError); so did packing meta
    # sequences, whose lengths are ints but whose cu_seqlens was built on the meta device.
    with pytest.raises(ValueError, match=r"lengths must hold values .* got a meta tensor of shape \(2,\)"):
        cu_seqlens_from_lengths(torch.tensor([1, 2], device="meta"))
    meta = cu_seqlens_from_lengths([1, 2], device="meta")
    assert meta.is_meta and meta.shape == (3,) and meta.dtype == torch.int32
    packed, cu = pack_sequences([torch.ones(2, 4, device="meta"), torch.ones(3, 4, device="meta")])
    assert packed.shape == (5, 4) and cu.is_meta and cu.shape == (3,)
    # An entry past int64 raised torch's unnamed 'Overflow when unpacking long long'.
    with pytest.raises(ValueError, match=rf"lengths\[1\] must be an int in \[0, {2**31 - 1}\], got {2**70}"):
        cu_seqlens_from_lengths([1, 2**70])
    # Values and devices as before: the prefix sums of the lengths, on the lengths' device.
    lengths = torch.tensor([3, 0, 5], dtype=torch.int16)
    assert cu_seqlens_from_lengths(lengths).tolist() == [0, 3, 3, 8]
    assert cu_seqlens_from_lengths(lengths).dtype == torch.int32


def test_int32_bounds_and_host_value_rules_where_they_were_missing():
    """Reliability tail, round 2. Before: pad_cu_seqlens padded a CPU [3, 1] to [3, 1, 1, 1];
    packed_to_padded(max_seqlen=2**62) failed with "Storage size calculation overflowed";
    active_token_mask(2**40, cu) and positions_in_sequence(cu, 2**40) tried to allocate (a bare
    allocator error), and past 2**31 their int32 rows would wrap negative."""
    from attn_gym_lite.ragged import positions_in_sequence

    with pytest.raises(ValueError, match=r"^cu_seqlens\[0\] must be 0, got 3"):
        pad_cu_seqlens(cu([3, 1]), 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens must be non-decreasing, but cu_seqlens\[2\] = 1 < cu_seqlens\[1\] = 3"):
        pad_cu_seqlens(cu([0, 3, 1]), 3)
    assert pad_cu_seqlens(cu([0, 2, 4]), 4).tolist() == [0, 2, 4, 4, 4]
    with pytest.raises(ValueError, match=r"^max_seqlen must be an int in \[0, 2147483647\], got 4611686018427387904$"):
        packed_to_padded(torch.arange(5.0), cu([0, 2, 4]), max_seqlen=2**62)
    assert packed_to_padded(torch.arange(5.0), cu([0, 2, 4]), max_seqlen=3).tolist() == [[0.0, 1.0, 0.0], [2.0, 3.0, 0.0]]
    with pytest.raises(ValueError, match=r"^x_or_token_capacity must be an int in \[0, 2147483647\], got 1099511627776$"):
        active_token_mask(2**40, cu([0, 2]))
    with pytest.raises(ValueError, match=r"^token_capacity must be an int in \[0, 2147483647\], got 2147483648$"):
        positions_in_sequence(cu([0, 2]), 2**31)
