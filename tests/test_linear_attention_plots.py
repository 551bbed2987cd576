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
