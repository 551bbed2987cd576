"""Chapter 6's picture of the shared pool draws what its inputs say: a row per bucket, largest first
(GraphBuckets' capture order), every buffer view and intermediate as wide as its capacity times its
bytes per token, the views from each buffer's row 0, the pool as wide as the measured pool."""

import matplotlib
import pytest
from matplotlib.patches import Rectangle

from attn_gym_lite.book.figures.ch06_buckets import plot_shared_pool

matplotlib.use("Agg")
MiB = 2**20


def boxes(ax, gid):
    """The left edges, then the widths, of the rectangles tagged ``gid``, top row first."""
    found = sorted((p.get_y(), p.get_x(), p.get_width()) for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == gid)
    return [x for _, x, _ in found] + [w for _, _, w in found]


def test_rows_largest_first_and_boxes_capacity_times_bytes_per_token():
    x_row, hidden_row, out_row, pool = 3072, 6144, 3072, 64 * MiB
    fig = plot_shared_pool([1024, 2048, 512, 2048], buffers={"x": x_row, "out": out_row},
                           intermediates={"hidden": hidden_row, "result": out_row}, pool_bytes=pool)
    left, right = fig.axes[:2]
    order = [2048, 1024, 512]
    assert [t.get_text() for t in left.get_yticklabels()] == [f"{i}. T = {c:,}" for i, c in enumerate(order, 1)]
    assert left.get_ylim()[0] > left.get_ylim()[1]  # the first capture on top
    assert boxes(left, "x") == pytest.approx([0] * 3 + [c * x_row / MiB for c in order])
    assert boxes(left, "out") == pytest.approx([2048 * x_row / MiB] * 3 + [c * out_row / MiB for c in order])
    assert boxes(right, "hidden") == pytest.approx([0] * 3 + [c * hidden_row / MiB for c in order])
    assert boxes(right, "result") == pytest.approx([c * hidden_row / MiB for c in order] + [c * out_row / MiB for c in order])
    assert boxes(right, "pool")[3:] == pytest.approx([pool / MiB] * 3)
    assert [line.get_xdata()[0] for line in right.lines] == pytest.approx([pool / MiB])

