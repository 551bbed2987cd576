"""The linear-attention chapter's figures, drawn from synthetic records assembled by the suite's own
row builders (no GPU: the values are made up, the structure is the suite's)."""

import matplotlib
import pytest

from attn_gym_lite.bench.linear_attention import amdahl_point, amdahl_summary, overcapture_point
from attn_gym_lite.book.plots import plot_kda_amdahl, plot_kda_overcapture

matplotlib.use("Agg")


def _overcapture_record(scale: float = 1.0) -> dict:
    series = {
        "ours": [overcapture_point(L, 32, scale * (100 + L / 10), scale * (95 + L / 10)) for L in (512, 2048, 8192)],
        "fla_graph": [overcapture_point(L, 32, scale * (300 + L / 3), scale * (100 + L / 3)) for L in (512, 2048, 8192)],
    }
    return {"overcapture": {"config": {"T": 8192, "N": 128, "M": 32, "H": 16, "K": 128, "V": 128},
                            "series": series, "errors": {}}}


def test_overcapture_figure_draws_both_series_and_their_ratios():
    record = _overcapture_record()
    fig = plot_kda_overcapture(record, live=_overcapture_record(0.9))
    times, ratios = fig.axes
    # recorded: captured + exact per series; live: the same again
    assert len(times.lines) == 8
    captured = times.lines[0]
    assert list(captured.get_xdata()) == [512, 2048, 8192]
    assert list(captured.get_ydata()) == [row["captured_us"] for row in record["overcapture"]["series"]["ours"]]
    fla_ratio = ratios.lines[1]
    assert list(fla_ratio.get_ydata()) == pytest.approx(
        [row["captured_us"] / row["exact_us"] for row in record["overcapture"]["series"]["fla_graph"]])
    assert any(line.get_ydata()[0] == 1.05 for line in ratios.lines)  # the goal line


def test_overcapture_figure_names_a_failed_series():
    record = _overcapture_record()["overcapture"]
    del record["series"]["fla_graph"]
    record["errors"] = {"fla_graph": "ModuleNotFoundError: No module named 'fla'"}
    fig = plot_kda_overcapture(record, goal=None)
    assert "failed: fla_graph" in fig.axes[0].get_title()
    assert len(fig.axes[1].lines) == 2  # ours + the 1.0 line


def test_amdahl_figure_stacks_core_and_rest_and_scales_to_the_largest_T():
    points = [amdahl_point(4096, 32, 1230.0, 3430.0), amdahl_point(2048, 32, 770.0, 2910.0),
              amdahl_point(1024, 32, 500.0, 2600.0)]
    record = {"amdahl": {"config": {"hidden_size": 2048, "num_heads": 16, "head_dim": 128}, "points": points,
                         "summary": amdahl_summary(points), "errors": {}}}
    fig = plot_kda_amdahl(record)
    bars, scaling = fig.axes
    heights = [patch.get_height() for patch in bars.patches]
    assert heights[:3] == pytest.approx([0.5, 0.77, 1.23])  # core, ms, sorted by T
    assert heights[3:] == pytest.approx([2.1, 2.14, 2.2])  # the rest of the layer, stacked on top
    module, core, proportional = scaling.lines
    assert list(module.get_ydata()) == pytest.approx([2600 / 3430, 2910 / 3430, 1.0])
    assert list(core.get_ydata()) == pytest.approx([500 / 1230, 770 / 1230, 1.0])
    assert list(proportional.get_ydata()) == pytest.approx([0.25, 0.5, 1.0])
    assert [t.get_text() for t in bars.texts] == ["core 19%", "core 26%", "core 36%"]


def test_amdahl_figure_refuses_an_empty_record():
    with pytest.raises(ValueError, match="no points"):
        plot_kda_amdahl({"config": {}, "points": [], "errors": {"T=4096": "boom"}})
