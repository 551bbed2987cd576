"""Tests for attn_gym_lite.data.study and .recommend, their figures, and the packing-study suite.

Statistics are checked against hand-computed examples and plain loops; the study and the
recommendation against the policies run directly.
"""

from __future__ import annotations

import json
import math
import random

import matplotlib
import pytest
from helpers import ByteTokenizer

from attn_gym_lite.bench import packing as packing_bench
from attn_gym_lite.bench.packing import packer_throughput
from attn_gym_lite.bench.suites import SUITES
from attn_gym_lite.book.figures.ch07_packing import plot_length_distribution, plot_packing_run, plot_packing_study, plot_policy_batches
from attn_gym_lite.book.results import step_token_rate, study_markdown
from attn_gym_lite.data import BestFit, FirstFit, InOrder, segment_lengths
from attn_gym_lite.data.recommend import recommend
from attn_gym_lite.data.study import (
    PackingStats,
    document_lengths,
    length_summary,
    nearest_rank,
    pack_lengths,
    packing_stats,
    packing_study,
    piece_stream,
    study_policies,
)

matplotlib.use("Agg")


def test_packing_stats_hand_computed():
    batches = [[4, 4], [10], [3, 3, 3], [1]]
    # The last batch is left out: counted L = 8, 10, 9 of T = 10; M = 2, 1, 3.
    assert packing_stats(batches, 10) == PackingStats(
        token_capacity=10, batches=3, mean_fill=0.9, mean_padding=1.0, median_M=2, p99_M=3, max_M=3
    )
    # All four: L = 8, 10, 9, 1 -> fill 28/40, padding (2 + 0 + 1 + 9) / 4; sorted M = 1, 1, 2, 3.
    assert packing_stats(batches, 10, drop_last=False) == PackingStats(
        token_capacity=10, batches=4, mean_fill=0.7, mean_padding=3.0, median_M=1, p99_M=3, max_M=3
    )
    # A single batch is always counted.
    assert packing_stats([[6]], 8).mean_padding == 2.0


def test_nearest_rank_and_length_summary():
    values = list(range(1, 101))
    random.Random(0).shuffle(values)
    assert [nearest_rank(values, q) for q in (0.01, 0.5, 0.99, 1.0)] == [1, 50, 99, 100]
    assert nearest_rank([7, 3], 0.5) == 3
    assert length_summary([5, 0, 10, 5]) == {
        "documents": 4, "tokens": 20, "mean": 5.0, "p10": 0, "p50": 5, "p90": 10, "p99": 10, "max": 10
    }


def test_document_lengths_counts_tokens_per_document():
    corpus = ["abc", "", "é" * 5, "x" * 200]
    assert document_lengths(iter(corpus), ByteTokenizer(), progress=True) == [3, 0, 10, 200]


def test_piece_stream_shuffles_each_pass_and_cuts_documents():
    lengths = [0, 1, 5, 20, 7]
    stream = piece_stream(lengths, max_piece_tokens=8, passes=3, seed=4)
    # Every pass holds the documents of >= 2 tokens, cut at 8: 5 | 8 8 4 | 7.
    assert sorted(stream) == sorted([5, 8, 8, 4, 7] * 3)
    rng = random.Random(4)
    kept, expected = [5, 20, 7], []
    for _ in range(3):
        rng.shuffle(kept)
        expected += [n for length in kept for n in segment_lengths(length, 8)]
    assert stream == expected


def corpus_lengths(seed=0, count=300):
    rng = random.Random(seed)
    # Heavy-tailed, like real documents: many short, a few much longer than T.
    return [int(rng.paretovariate(0.9) * 40) for _ in range(count)]


def test_packing_study_rows_match_direct_runs():
    lengths = corpus_lengths()
    policies = [InOrder(), FirstFit(4), BestFit(4)]
    rows = packing_study(lengths, token_capacities=(512, 1024), policies=policies,
                         max_piece_tokens=768, passes=2, seed=3, progress=True)
    assert [(r["T"], r["policy"], r["B"], r["N_bound"]) for r in rows] == [
        (512, "in-order", None, 512), (512, "first-fit", 4, 4), (512, "best-fit", 4, 4),
        (1024, "in-order", None, 1024), (1024, "first-fit", 4, 4), (1024, "best-fit", 4, 4),
    ]
    for row, (T, policy) in zip(rows, [(t, p) for t in (512, 1024) for p in policies]):
        pieces = piece_stream(lengths, max_piece_tokens=min(768, T), passes=2, seed=3)
        batches = list(policy.batches(pieces, T))[:-1]  # the last batch is not counted
        active = [sum(pieces[p] for p in batch) for batch in batches]
        sizes = sorted(len(batch) for batch in batches)
        assert row["batches"] == len(batches)
        assert row["mean_fill"] == pytest.approx(sum(active) / (T * len(active)))
        assert row["mean_padding"] == pytest.approx(T - sum(active) / len(active))
        assert row["median_M"] == sizes[math.ceil(0.5 * len(sizes)) - 1]
        assert row["p99_M"] == sizes[math.ceil(0.99 * len(sizes)) - 1]
        assert row["max_M"] == sizes[-1] <= row["N_bound"]
    table = study_markdown(rows)
    assert table.count("\n") == 1 + len(rows) and "| 512 | in-order | – |" in table
    json.dumps(rows)  # recordable as is


def test_default_study_grid():
    rows = packing_study(corpus_lengths(count=60), passes=1)
    assert {r["T"] for r in rows} == {8192, 16384, 32768}
    assert len(rows) == 3 * (1 + 2 * 5)
    assert {r["B"] for r in rows} == {None, 1, 8, 32, 64, 128}


def test_recommend_picks_the_smallest_buffer_that_meets_the_budget():
    lengths = corpus_lengths(1, count=400)
    T, budget, sizes = 1024, 0.02, (1, 2, 4, 8, 16, 32)
    advice = recommend(lengths, T, budget, buffer_sizes=sizes, max_piece_tokens=1024, passes=2)
    pieces = piece_stream(lengths, max_piece_tokens=1024, passes=2)
    padding = {b: packing_stats(pack_lengths(pieces, BestFit(b), T), T).mean_padding for b in sizes}
    meeting = [b for b in sizes if padding[b] <= budget * T]
    assert meeting, padding  # the example is built so that some buffer meets the budget
    assert advice.buffer_size == meeting[0] and advice.sequence_capacity == meeting[0]
    assert advice.one_graph and advice.bucket_plan is None and not advice.buckets_meet_budget
    assert advice.mean_padding == pytest.approx(padding[meeting[0]])
    assert advice.policy == f"best-fit B={meeting[0]}"
    assert "one graph suffices" in advice.summary()
    batches = pack_lengths(pieces, BestFit(meeting[0]), T)
    assert advice.active_tokens == [sum(batch) for batch in batches]
    first_fit = recommend(lengths, T, budget, rule=FirstFit, buffer_sizes=sizes, max_piece_tokens=1024, passes=2)
    assert first_fit.policy.startswith("first-fit")


def test_recommend_falls_back_to_graph_buckets():
    # Documents of 1000 tokens, one per batch (B = 1): one 4096 graph pads 3096 rows per batch;
    # a 1024-token bucket pads 24 (0.6% of T), within a 1% budget.
    advice = recommend([1000] * 50, 4096, 0.01, buffer_sizes=(1,), passes=1)
    assert not advice.one_graph and advice.mean_padding == 3096
    assert advice.buckets_meet_budget and advice.bucket_plan.capacities == (1024,)
    assert advice.bucket_plan.expected_padded_rows == 24
    assert "graph buckets (1024,) meet it" in advice.summary()
    # No bucket plan can meet a zero budget with L = 1000 and 128-aligned capacities.
    strict = recommend([1000] * 50, 4096, 0.0, buffer_sizes=(1,), passes=1, max_buckets=3)
    assert not strict.one_graph and not strict.buckets_meet_budget
    assert "neither packing nor" in strict.summary()


def test_recommend_never_plans_a_bucket_above_T():
    # Capacities are multiples of bucket_align capped at T: with the default align 128 > T = 16,
    # every L rounds to T.
    lengths = [3, 5, 7, 9, 11, 4, 6] * 10
    small = recommend(lengths, 16, 0.0, buffer_sizes=[64])
    assert not small.one_graph
    # bucket_align >= T: every L rounds to T, so the plan is the one graph of capacity T.
    assert small.bucket_plan.capacities == (16,)
    assert small.bucket_plan.expected_padded_rows == pytest.approx(
        sum(16 - L for L in small.active_tokens) / len(small.active_tokens))
    assert "neither packing nor 1 buckets meet the budget" in small.summary()
    assert recommend(lengths, 128, 0.0, buffer_sizes=[64]).bucket_plan.capacities == (128,)
    # T not a multiple of bucket_align: the top capacity is T, not 256.
    assert recommend(lengths, 200, 0.0, buffer_sizes=[64]).bucket_plan.capacities == (128, 200)
    # A smaller alignment gives the buckets room.
    aligned = recommend(lengths, 128, 0.0, buffer_sizes=[64], bucket_align=8)
    assert len(aligned.bucket_plan.capacities) >= 2 and aligned.bucket_plan.capacities[-1] <= 128


def test_step_token_rate_from_a_record():
    record = {"config": {"T": 4096}, "graph": {"step_us": 2048.0}, "eager": {"step_us": 4096.0}}
    assert step_token_rate(record) == {"T": 4096, "step_us": 2048.0, "batches_per_s": 1e6 / 2048,
                                       "tokens_per_s": 2e6}
    assert step_token_rate(record, "eager")["tokens_per_s"] == 1e6


def test_packer_throughput_reports_consistent_rates():
    documents = ["x" * n for n in (100, 700, 1500, 40, 3000)] * 4
    result = packer_throughput(documents, ByteTokenizer(), token_capacity=2048, max_piece_tokens=1024,
                               policy=FirstFit(8), min_seconds=0.01)
    assert (result["documents"], result["tokens"]) == (20, sum(map(len, documents)))
    assert result["pieces"] == 4 * (1 + 1 + 2 + 1 + 3)
    assert result["policy"] == "first-fit B=8" and result["batches"] >= 1
    for stage in ("tokenize", "pack", "assemble", "pack_and_assemble"):
        rates = result[stage]
        assert rates["tokens_per_s"] > 0
        assert rates["tokens_per_s"] / rates["documents_per_s"] == pytest.approx(result["tokens"] / 20)
    combined = result["pack_and_assemble"]["tokens_per_s"]
    assert combined < min(result["pack"]["tokens_per_s"], result["assemble"]["tokens_per_s"])


def test_the_study_figure_draws_published_points_only_at_their_T():
    # Hand-made "published" figures: two at T = 1024 (one with a p99 M) and one at a T the study
    # did not run, which must not be drawn.
    published = {"corpora": {
        "Dolma 3": {"rows": [{"T": 1024, "B": 8, "mean_fill": 0.75, "p99_M": 5},
                             {"T": 2048, "B": 8, "mean_fill": 0.5, "p99_M": 7}]},
        "FineWeb sample-10BT": {"rows": [{"T": 1024, "B": 2, "mean_fill": 0.9}]},
    }}
    rows = packing_study(corpus_lengths(count=80), token_capacities=(1024,),
                         policies=[InOrder(), BestFit(2), BestFit(8)], passes=1)
    top, bottom = plot_packing_study(rows, seed_published=published).axes

    def points(ax):
        return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                for line in ax.lines if line.get_label().startswith("seed")}

    assert points(top) == {"seed: Dolma 3": ([8], [pytest.approx(25.0)]),
                           "seed: FineWeb sample-10BT": ([2], [pytest.approx(10.0)])}
    assert points(bottom) == {"seed: Dolma 3 p99 M": ([8], [5])}


def test_figures_draw_the_data():
    ax = plot_length_distribution([0, 3, 50, 50, 900], title="t")
    assert sum(p.get_height() for p in ax.patches) == 4  # the empty document is not drawn
    fig = plot_policy_batches([6, 6, 2, 2], [InOrder(), FirstFit(4)], 8)
    widths = [[p.get_width() for p in ax.patches] for ax in fig.axes]
    # In order: [6 | 2 pad], [6, 2 | 0 pad], [2 | 6 pad]; first-fit: [6, 2 | 0], [6, 2 | 0].
    assert widths == [[6, 2, 6, 2, 0, 2, 6], [6, 2, 0, 6, 2, 0]]
    rows = packing_study(corpus_lengths(count=80), token_capacities=(1024,),
                         policies=[InOrder(), BestFit(2), BestFit(8)], passes=1)
    fig = plot_packing_study(rows)
    top = fig.axes[0]
    best = next(line for line in top.lines if line.get_label() == "best-fit")
    assert list(best.get_xdata()) == [2, 8]
    assert list(best.get_ydata()) == pytest.approx([100 * (1 - r["mean_fill"]) for r in rows[1:]])
    fig = plot_packing_run([[3, 4], [8], [1, 1, 1]], 8, 4)
    assert list(fig.axes[0].lines[0].get_ydata()) == pytest.approx([87.5, 100, 37.5])


def test_packing_study_suite_is_registered_and_recordable(monkeypatch):
    assert SUITES["packing-study"].load() is packing_bench.packing_study_suite
    tokenizer = ByteTokenizer()
    monkeypatch.setattr(packing_bench, "load_tokenizer", lambda: tokenizer)
    corpus = ["a" * n for n in (10, 5000, 300, 9000, 40, 700)] * 3
    monkeypatch.setattr(packing_bench, "python_stdlib_corpus", lambda limit=None: iter(corpus[:limit]))
    record = packing_bench.packing_study_suite(passes=1, throughput_documents=6)
    json.dumps(record)
    assert record["document_lengths"] == [len(text) for text in corpus]
    assert record["corpus"]["tokenizer"] == "bytes" and record["corpus"]["documents"] == 18
    assert len(record["table"]) == 33 and record["throughput"]["documents"] == 6
    assert record["cpu"]["cores"] >= 1 and record["cpu"]["model"]


def test_study_policies_are_in_order_then_each_rule_per_buffer_size():
    policies = study_policies([1, 8])
    assert [(type(p), getattr(p, "buffer_size", None)) for p in policies] == [
        (InOrder, None), (FirstFit, 1), (BestFit, 1), (FirstFit, 8), (BestFit, 8)]
