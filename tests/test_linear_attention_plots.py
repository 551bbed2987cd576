"""The linear-attention chapter's figures, from records built by the suite's own row builders."""

import matplotlib
import pytest
from test_figure_style import kda_record

from attn_gym_lite.book.figures.ch09_linear_attention import GOAL, plot_kda_amdahl, plot_kda_overcapture

matplotlib.use("Agg")


def test_overcapture_figure_draws_both_series_their_ratios_and_names_a_failed_one():
    record = kda_record()["overcapture"]
    times, ratios = plot_kda_overcapture(record, live=kda_record(0.9)).axes
    assert len(times.lines) == 8  # captured + exact per series, recorded and live
    assert list(times.lines[0].get_xdata()) == [512, 2048, 8192]
    assert list(times.lines[0].get_ydata()) == [row["captured_us"] for row in record["series"]["ours"]]
    assert list(ratios.lines[1].get_ydata()) == pytest.approx([r["captured_us"] / r["exact_us"] for r in record["series"]["fla_graph"]])
    assert [line.get_ydata()[0] for line in ratios.lines[-2:]] == [1.0, GOAL]
    del record["series"]["fla_graph"]
    record["errors"] = {"fla_graph": "ModuleNotFoundError: No module named 'fla'"}
    times, ratios = plot_kda_overcapture(record).axes
    assert "failed: fla_graph" in times.get_title() and len(ratios.lines) == 3  # ours, 1.0 and the goal


def test_amdahl_figure_stacks_core_and_rest_and_scales_to_the_largest_T():
    bars, scaling = plot_kda_amdahl(kda_record()).axes
    heights = [patch.get_height() for patch in bars.patches]
    assert heights[:3] == pytest.approx([0.5, 0.77, 1.23])  # core, ms, sorted by T
    assert heights[3:] == pytest.approx([2.1, 2.14, 2.2])  # the rest of the layer, stacked on top
    module, core, proportional = scaling.lines
    assert list(module.get_ydata()) == pytest.approx([2600 / 3430, 2910 / 3430, 1.0])
    assert list(core.get_ydata()) == pytest.approx([500 / 1230, 770 / 1230, 1.0])
    assert list(proportional.get_ydata()) == pytest.approx([0.25, 0.5, 1.0])
    assert [t.get_text() for t in bars.texts] == ["core 19%", "core 26%", "core 36%"]


def test_chunk_picture_draws_each_sequences_chunks_and_hands_state_only_within_one():
    from attn_gym_lite.book.figures.ch09_linear_attention import plot_kda_chunks
    from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

    lengths, C = [9, 3, 0, 6, 1], 4
    ax = plot_kda_chunks(pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 7), C, 30).axes[0]
    chunks = [(s, start) for s, n in enumerate(lengths) for start in range(0, n, C)]  # by hand
    boxes = sorted((p.get_x(), p.get_width()) for p in ax.patches if p.get_gid() == "chunk")
    offsets = [sum(lengths[:s]) for s in range(len(lengths))]
    assert boxes == [(offsets[s] + start, min(C, lengths[s] - start)) for s, start in chunks]
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("S = 0") == sum(n > 0 for n in lengths)  # a reset at every non-empty sequence
    assert labels.count("") == sum(max(-(-n // C) - 1, 0) for n in lengths)  # hand-offs within sequences
