"""Tests for attn_gym_lite.data.segment and attn_gym_lite.data.packing.

Each policy is checked against an independent reference written the slow, obvious way (in order:
a running sum; first-fit: "repeatedly take the oldest candidate that fits"; best-fit: "repeatedly
take the largest candidate that fits"), on random length streams (hypothesis) and adversarial
ones, and against the properties the module promises: every piece in exactly one batch,
``L <= T``, ``1 <= M <= bound``, candidates only from the ``B`` oldest unpacked pieces, no
candidate left that would still fit, first-fit's bounded wait, and exact resumption from the
unpacked pieces.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.data import BestFit, FirstFit, InOrder, segment, segment_lengths

# ---------------------------------------------------------------------------------------------
# Segmentation
# ---------------------------------------------------------------------------------------------


def test_segment_boundary_rule_by_hand():
    assert segment(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert segment(list(range(8)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert segment([7], 4) == [[7]]
    assert segment([], 4) == []
    assert segment((1, 2, 3), 1) == [(1,), (2,), (3,)]  # keeps the sequence type
    assert [p.tolist() for p in segment(torch.arange(5), 2)] == [[0, 1], [2, 3], [4]]
    assert segment_lengths(10, 4) == [4, 4, 2]
    assert segment_lengths(8, 4) == [4, 4]
    assert segment_lengths(0, 4) == []


@given(st.lists(st.integers(0, 50_000), max_size=60), st.integers(1, 70))
def test_segment_loses_and_duplicates_nothing(ids, size):
    pieces = segment(ids, size)
    assert list(itertools.chain.from_iterable(pieces)) == ids
    assert all(1 <= len(piece) <= size for piece in pieces)
    assert all(len(piece) == size for piece in pieces[:-1])
    assert [len(piece) for piece in pieces] == segment_lengths(len(ids), size)
    assert len(pieces) == -(-len(ids) // size)


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------


def reference_in_order(lengths, T, N):
    batches, batch, used = [], [], 0
    for position, length in enumerate(lengths):
        if batch and (used + length > T or len(batch) == N):
            batches.append(batch)
            batch, used = [], 0
        batch.append(position)
        used += length
    return batches + ([batch] if batch else [])


def reference_look_ahead(lengths, T, B, N, rule):
    """Fill a buffer of B, then repeatedly pick one candidate until none fits."""
    unpacked = list(range(len(lengths)))
    batches = []
    while unpacked:
        buffer = unpacked[:B]
        batch, room = [], T
        while len(batch) < N:
            fitting = [p for p in buffer if p not in batch and lengths[p] <= room]
            if not fitting:
                break
            # first-fit: the oldest; best-fit: the largest, oldest among equals.
            pick = fitting[0] if rule == "first-fit" else max(fitting, key=lambda p: (lengths[p], -p))
            batch.append(pick)
            room -= lengths[pick]
        batches.append(sorted(batch))
        unpacked = [p for p in unpacked if p not in batch]
    return batches


def reference(policy, lengths, T, N=None):
    bound = policy.sequence_bound(T, N)
    if isinstance(policy, InOrder):
        return reference_in_order(lengths, T, bound)
    return reference_look_ahead(lengths, T, policy.buffer_size, bound, policy.name)


POLICIES = [InOrder(), FirstFit(1), FirstFit(3), FirstFit(8), BestFit(1), BestFit(3), BestFit(8)]


def check_properties(policy, lengths, T, N, batches):
    """Everything the packing module promises about one run."""
    bound = policy.sequence_bound(T, N)
    assert bound == min(T, N or T, getattr(policy, "buffer_size", T))
    # Every piece in exactly one batch: no token lost or duplicated.
    assert sorted(itertools.chain.from_iterable(batches)) == list(range(len(lengths)))
    packed = set()
    for index, batch in enumerate(batches):
        assert batch == sorted(batch)
        assert 1 <= len(batch) <= bound
        used = sum(lengths[p] for p in batch)
        assert used <= T
        unpacked = [p for p in range(len(lengths)) if p not in packed]
        if isinstance(policy, InOrder):
            # Consecutive runs of the stream, closed only when the next piece does not fit.
            assert batch == unpacked[: len(batch)]
            if index + 1 < len(batches):
                following = lengths[batches[index + 1][0]]
                assert used + following > T or len(batch) == bound
        else:
            window = unpacked[: policy.buffer_size]
            assert set(batch) <= set(window)  # chosen among the B oldest unpacked pieces
            if len(batch) < bound:  # greedy: nothing left in the buffer would still fit
                assert all(lengths[p] > T - used for p in window if p not in batch)
        packed |= set(batch)


LENGTH_STREAMS = st.integers(1, 40).flatmap(
    lambda T: st.tuples(
        st.just(T),
        st.lists(st.integers(1, T), max_size=60),
        st.one_of(st.none(), st.integers(1, T)),
    )
)


@settings(max_examples=300, deadline=None)
@given(LENGTH_STREAMS, st.sampled_from(POLICIES))
def test_policies_match_references_on_random_streams(case, policy):
    T, lengths, N = case
    batches = list(policy.batches(lengths, T, N))
    assert batches == reference(policy, lengths, T, N)
    check_properties(policy, lengths, T, N, batches)
    # Deterministic, and lazy input (a generator) gives the same batches as a list.
    assert list(policy.batches(iter(lengths), T, N)) == batches


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label)
@pytest.mark.parametrize(
    ("name", "lengths", "T"),
    [
        ("all length 1", [1] * 50, 16),
        ("all exactly T", [16] * 9, 16),
        ("T = 1", [1] * 7, 1),
        ("alternating T and 1", [16, 1] * 10, 16),
        ("one piece", [5], 16),
        ("empty stream", [], 16),
        ("descending", list(range(16, 0, -1)) * 3, 16),
    ],
)
def test_policies_on_adversarial_streams(policy, name, lengths, T):
    for N in (None, 3):
        batches = list(policy.batches(lengths, T, N))
        assert batches == reference(policy, lengths, T, N), name
        check_properties(policy, lengths, T, N, batches)


def test_adversarial_values_by_hand():
    # All length 1: in order packs T of them (M = T, the bound); a buffer caps M at B.
    assert [len(b) for b in InOrder().batches([1] * 20, 8)] == [8, 8, 4]
    assert [len(b) for b in FirstFit(3).batches([1] * 8, 8)] == [3, 3, 2]
    assert [len(b) for b in BestFit(3).batches([1] * 8, 8, 2)] == [2, 2, 2, 2]
    # Exactly T: one piece per batch for every policy.
    for policy in POLICIES:
        assert list(policy.batches([8, 8, 8], 8)) == [[0], [1], [2]]
    # The classic case look-ahead exists for: 6, 6, 2, 2 into T = 8.
    assert list(InOrder().batches([6, 6, 2, 2], 8)) == [[0], [1, 2], [3]]
    assert list(FirstFit(4).batches([6, 6, 2, 2], 8)) == [[0, 2], [1, 3]]
    # Best-fit takes the largest that fits: 5 then 3 (not 2 + 2 + 3 after the 5).
    assert list(BestFit(4).batches([2, 5, 2, 3], 8)) == [[1, 3], [0, 2]]
    assert list(FirstFit(4).batches([2, 5, 2, 3], 8)) == [[0, 1], [2, 3]]


def test_a_piece_longer_than_T_or_empty_is_refused():
    # Documents longer than T must be cut first (segment); an empty piece would take a slot.
    for policy in POLICIES:
        for lengths in ([3, 9], [0, 3]):
            with pytest.raises(ValueError, match="lengths"):
                list(policy.batches(lengths, 8))
        pieces = [n for document in (0, 20, 3, 0, 17) for n in segment_lengths(document, 8)]
        assert sum(pieces[p] for batch in policy.batches(pieces, 8) for p in batch) == 40
        assert sorted(p for b in policy.batches(np.array([3, 5]), 8) for p in b) == [0, 1]  # numpy ints


def test_sequence_bounds():
    assert InOrder().sequence_bound(4096) == 4096
    assert InOrder().sequence_bound(4096, 32) == 32
    assert BestFit(32).sequence_bound(4096) == 32
    assert BestFit(32).sequence_bound(16) == 16
    assert FirstFit(64).sequence_bound(4096, 48) == 48
    assert [p.label for p in (InOrder(), FirstFit(8), BestFit(32))] == [
        "in-order",
        "first-fit B=8",
        "best-fit B=32",
    ]


@settings(max_examples=200, deadline=None)
@given(LENGTH_STREAMS, st.integers(1, 10))
def test_first_fit_waits_at_most_B_minus_1_batches(case, B):
    T, lengths, N = case
    batches = list(FirstFit(B).batches(lengths, T, N))
    packed_before = list(itertools.accumulate([len(b) for b in batches], initial=0))
    batch_of = {p: index for index, batch in enumerate(batches) for p in batch}
    for position, index in batch_of.items():
        # The piece entered the buffer at the first batch whose window reached it.
        entered = next(b for b in range(len(batches)) if position < packed_before[b] + B)
        assert index - entered <= B - 1


def test_best_fit_can_make_a_short_piece_wait_indefinitely():
    # Pieces of T keep arriving; the 1-token piece is never the largest that fits an empty batch.
    lengths = [1] + [8] * 30
    batches = list(BestFit(4).batches(lengths, 8))
    assert batches[-1] == [0] and len(batches) == 31


@settings(max_examples=200, deadline=None)
@given(LENGTH_STREAMS, st.sampled_from(POLICIES), st.data())
def test_resuming_from_the_unpacked_pieces_reproduces_the_rest(case, policy, data):
    """The property PackedLoader's state relies on."""
    T, lengths, N = case
    batches = list(policy.batches(lengths, T, N))
    cut = data.draw(st.integers(0, len(batches)))
    done = set(itertools.chain.from_iterable(batches[:cut]))
    remaining = [p for p in range(len(lengths)) if p not in done]  # stream order
    resumed = policy.batches([lengths[p] for p in remaining], T, N)
    assert [[remaining[i] for i in batch] for batch in resumed] == batches[cut:]
