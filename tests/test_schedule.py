"""Grid arithmetic and chunk decoding (attn_gym_lite.schedule): the seed's worked example, the
capacity bound for every layout, the oracle decoding every chunk exactly once, and the figures and
records built from them."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.schedule import (
    G_active,
    G_rect,
    choose_schedule,
    chunk_capacity,
    chunk_offsets,
    decode_chunk,
    launch_grid,
    num_sms,
    persistent_workers,
)


def test_seed_worked_example_and_grid_sizes_by_hand():
    cu = torch.tensor([0, 65, 128], dtype=torch.int32)
    assert chunk_offsets(cu, 64).tolist() == [0, 2, 3]
    # The tempting shortcut ceil(cu_seqlens / C) loses the boundary: sequence 1 gets no chunk.
    assert (-(-cu // 64)).tolist() == [0, 2, 2]
    assert [decode_chunk([0, 2, 3], cu, f, 64) for f in range(3)] == [(0, 0, 0), (0, 1, 64), (1, 0, 65)]
    assert G_active([65, 63], 64) == 3 and G_rect(2, 65, 64) == 4
    # T=16384, N=256, C=128: M_max = 256, capacity 256 + 16128 // 128 = 382 chunks per head.
    assert chunk_capacity(16384, 256, 128) == 382
    assert G_rect(256, 16384, 128) == 256 * 128
    # Fewer tokens than slots: at most T sequences can be non-empty.
    assert chunk_capacity(5, 8, 4) == 5 and chunk_capacity(0, 3, 4) == 0
    assert [persistent_workers(*args) for args in ((382 * 16, 132, 1), (10, 132, 2), (0, 132, 1))] == [132, 10, 1]


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40), spare_slots=st.integers(0, 5),
       spare_tokens=st.integers(0, 300), C=st.integers(1, 130))
def test_active_chunks_never_exceed_capacity(lengths, spare_slots, spare_tokens, C):
    T = sum(lengths) + spare_tokens
    N = len(lengths) + spare_slots
    assert G_active(lengths, C) <= chunk_capacity(T, N, C)
    assert G_active(lengths, C) <= G_rect(N, max(lengths), C)


@settings(max_examples=200, deadline=None)
@given(T=st.integers(0, 2000), N=st.integers(1, 64), C=st.integers(1, 130))
def test_capacity_is_attained(T, N, C):
    # M_max - 1 sequences of one token and one long sequence reach the bound exactly.
    m_max = min(T, N)
    if m_max == 0:
        assert chunk_capacity(T, N, C) == 0
        return
    lengths = [1] * (m_max - 1) + [T - (m_max - 1)]
    assert G_active(lengths, C) == chunk_capacity(T, N, C)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 90), min_size=1, max_size=24), spare_slots=st.integers(0, 4),
       C=st.integers(1, 40))
def test_oracle_decodes_every_chunk_exactly_once(lengths, spare_slots, C):
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), len(lengths) + spare_slots)
    offsets = chunk_offsets(cu, C)
    expected_offsets = [0]
    for s in lengths + [0] * spare_slots:
        expected_offsets.append(expected_offsets[-1] + math.ceil(s / C))
    assert offsets.tolist() == expected_offsets
    assert offsets.dtype == torch.int32 and offsets[-1] == G_active(lengths, C)

    decoded = [decode_chunk(offsets, cu, f, C) for f in range(int(offsets[-1]))]
    expected = [(i, j) for i, s in enumerate(lengths) for j in range(math.ceil(s / C))]
    assert sorted((seq, local) for seq, local, _ in decoded) == expected  # each chunk once
    bounds = cu.tolist()
    for seq, local, start in decoded:
        assert start == bounds[seq] + local * C and bounds[seq] <= start < bounds[seq + 1]


def test_choose_schedule_and_launch_grids():
    # flat up to 64 waves of resident CTAs (G_cap = 382 chunks x 16 heads = 6,112 <= 64 * 132), then dynamic.
    assert choose_schedule(16384, 256, 128, 16, 132, 1) == "flat"
    assert choose_schedule(131072, 256, 128, 16, 132, 1) == "dynamic"
    sizes = dict(T=1000, N=10, C=64, heads=4, num_sms=8, ctas_per_sm=2)
    assert launch_grid("rect", max_seqlen=300, **sizes) == (5, 10, 4)
    assert launch_grid("flat", **sizes) == (chunk_capacity(1000, 10, 64), 4)
    assert launch_grid("persistent", **sizes) == launch_grid("dynamic", max_seqlen=300, **sizes) == (16,)
    assert launch_grid("rect", **{**sizes, "T": 0}, max_seqlen=1) == (1, 10, 4)  # an empty batch's grid
    assert num_sms("cpu") == num_sms(torch.device("cpu")) == 4
    with pytest.raises(ValueError, match="schedule"):  # "auto" is resolved first, by choose_schedule
        launch_grid("auto", **sizes)


def test_chunk_offsets_of_a_huge_chunk_do_not_wrap():
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    for C in (2**31 - 1, 2**31, 2**40):  # int32 arithmetic gave [-1, -1] at C = 2**31
        assert chunk_offsets(cu, C).tolist() == [0, 1, 1, 2]


def test_lengths_count_from_any_container():
    assert G_active([4, 4], 2) == G_active((s for s in [4, 4]), 2) == G_active(np.array([4, 4]), 2) == 4
    assert G_active(torch.tensor([4, 4]), 2) == 4 and type(G_active(np.array([3, 4]), 2)) is int
    assert G_active([], 4) == G_active(torch.zeros(0, dtype=torch.int64), 4) == 0
    # An empty slot between two sequences decodes past it, as the kernels do.
    assert decode_chunk([0, 2, 2, 3], [0, 65, 65, 128], 2, 64) == (2, 0, 65)


def test_grid_sizes_and_their_figure():
    import matplotlib

    from attn_gym_lite.book.figures.ch04_schedulers import plot_grid_sizes
    from attn_gym_lite.schedule import grid_sizes

    matplotlib.use("Agg")
    sizes = grid_sizes(16384, 256, [700, 200, 124], 128, 16, 132)
    assert sizes == {"active": (6 + 2 + 1) * 16, "rect": 256 * 128 * 16, "flat": 382 * 16, "persistent": 132}
    ax = plot_grid_sizes(sizes)
    widths = [p.get_width() for p in ax.patches]
    # Working part then idle part, for rect, flat, persistent (persistent has no idle part here).
    assert widths == [144, 144, 132, 524288 - 144, 6112 - 144, 0]


def test_dense_gap_and_eager_overhead_read_a_record():
    from attn_gym_lite.bench.schedulers import dense_gap, eager_overhead

    row = lambda f, b: {"fwd_tflops": f, "fwd_bwd_tflops": b}
    record = {
        "throughput": {
            "uniform_16x1024_full": {"sdpa_flash": row(500, 400), "sdpa_cudnn": row(520, 380), "varlen_attn": row(300, 250),
                                     "flat": row(390, 310), "dynamic": row(400, 300), "persistent+zero": row(999, 999)},
            "zipf_16384x64_full": {"varlen_attn": row(1, 1), "flat": row(2, 2)},  # no dense row: skipped
        },
        "eager": {"rows": {"varlen_attn": {"fwd_host_us": 50.0, "fwd_bwd_host_us": 200.0},
                           "default": {"fwd_host_us": 75.0, "fwd_bwd_host_us": 260.0}}},
    }
    fwd, fwd_bwd = dense_gap(record)
    assert (fwd["dense_backend"], fwd["dense"], fwd["ours_schedule"], fwd["ours"]) == ("cudnn", 520, "dynamic", 400)
    assert fwd["ours_vs_dense"] == 400 / 520 and fwd["ours_vs_varlen_attn"] == 400 / 300
    assert (fwd_bwd["dense_backend"], fwd_bwd["ours_schedule"], fwd_bwd["ours_vs_dense"]) == ("flash", "flat", 310 / 400)
    rows = {r["implementation"]: r for r in eager_overhead(record)}
    assert rows["default"]["fwd_vs_varlen_attn"] == 1.5 and rows["default"]["fwd_bwd_vs_varlen_attn"] == 1.3


def test_cta_maps_and_their_picture():
    import matplotlib

    from attn_gym_lite.book.figures.ch04_schedulers import cta_maps, plot_cta_maps

    matplotlib.use("Agg")
    lengths, T, N, C, sms = [7, 2, 0, 5], 16, 5, 4, 3
    # Independently: the real chunks sequence by sequence, and each grid's size by hand.
    chunks = [(s, c) for s, n in enumerate(lengths) for c in range(math.ceil(n / C))]
    maps = cta_maps(lengths, T, N, C, sms)
    assert len(maps["rect"]) == N * math.ceil(T / C) and len(maps["flat"]) == N + (T - N) // C
    assert [t for runs in maps["rect"] for t in runs] == chunks
    assert [t for runs in maps["flat"] for t in runs] == chunks and all(maps["flat"][:len(chunks)])
    assert maps["persistent"] == [chunks[0::3], chunks[1::3], chunks[2::3]]
    fig = plot_cta_maps(maps)
    labels = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert labels[2] == ["\n".join(f"s{s} c{c}" for s, c in runs) for runs in maps["persistent"]]
    assert [len(ax.patches) for ax in fig.axes] == [20, 7, 3]
