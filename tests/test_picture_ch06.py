"""Chapter 6's picture of the shared pool draws what its inputs say: a row per bucket, largest first
(GraphBuckets' capture order), every buffer view and intermediate as wide as its capacity times its
bytes per token, the views from each buffer's row 0, the pool as wide as the largest capture's
intermediates or the measured pool. The expected boxes are rebuilt here from the bytes of a real
module's tensors (on the meta device), not from the figure's arithmetic."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import Rectangle

from attn_gym_lite.book.figures.ch06_buckets import plot_shared_pool
from attn_gym_lite.data.capacity import plan_buckets

matplotlib.use("Agg")
MiB = 1024 * 1024


def _core_rows(dim=1536):
    """Bytes of one token's row of the input, the hidden activation and the output of two bf16
    projections, read off the tensors themselves."""
    core = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim, bias=False), torch.nn.Linear(2 * dim, dim, bias=False))
    x = torch.empty(1, dim, device="meta", dtype=torch.bfloat16)
    hidden = core.to("meta", torch.bfloat16)[0](x)
    out = core[1](hidden)
    return x.nbytes, hidden.nbytes, out.nbytes


def _boxes(ax, gid):
    """``[(top y, left, width)]`` of the rectangles tagged ``gid``, top row first."""
    found = [(p.get_y(), p.get_x(), p.get_width()) for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == gid]
    return sorted(found)


def _lefts_widths(ax, gid):
    """The left edges of the rows' boxes tagged ``gid``, top row first, then their widths."""
    boxes = _boxes(ax, gid)
    return [x for _, x, _ in boxes] + [w for _, _, w in boxes]


@pytest.fixture
def drawn():
    samples = [300, 700, 900, 1500, 1600, 2000, 2048, 450, 1100, 1900]
    capacities = list(plan_buckets(samples, 3, align=256).capacities)
    x_row, hidden_row, out_row = _core_rows()
    pool = 2 * 2048 * (hidden_row + out_row)  # a "measurement" twice the largest capture's intermediates
    fig = plot_shared_pool(capacities[::-1] + capacities[:1], buffers={"x": x_row, "out": out_row},
                           intermediates={"hidden": hidden_row, "result": out_row}, pool_bytes=pool)
    yield capacities, (x_row, hidden_row, out_row), pool, fig
    plt.close(fig)


def test_rows_are_the_buckets_largest_first(drawn):
    capacities, _, _, fig = drawn
    left, right = fig.axes[:2]
    expected = sorted(set(capacities), reverse=True)
    assert len(expected) == 3 and expected[0] == 2048
    bottom, top = left.get_ylim()
    assert bottom > top  # row 0 at the top: the first capture reads first
    labels = [t.get_text() for t in left.get_yticklabels()]
    assert labels == [f"{i}. T = {c:,}" for i, c in enumerate(expected, 1)]
    assert [y for y, _, _ in _boxes(right, "hidden")] == sorted(y for y, _, _ in _boxes(right, "hidden"))


def test_views_and_intermediates_are_capacity_times_bytes_per_token(drawn):
    capacities, (x_row, hidden_row, out_row), pool, fig = drawn
    left, right = fig.axes[:2]
    expected = sorted(set(capacities), reverse=True)
    largest = expected[0]
    # Buffers: every bucket's view starts at its buffer's row 0; "out" is a buffer of its own after "x".
    assert _lefts_widths(left, "x") == pytest.approx([0] * 3 + [c * x_row / MiB for c in expected])
    assert _lefts_widths(left, "out") == pytest.approx([largest * x_row / MiB] * 3 + [c * out_row / MiB for c in expected])
    assert [w for _, _, w in _boxes(left, "unused rows")] == pytest.approx([largest * r / MiB for _ in expected for r in (x_row, out_row)])
    # Pool: each capture's intermediates, as large as its capacity, inside the one pool drawn per row.
    assert _lefts_widths(right, "hidden") == pytest.approx([0] * 3 + [c * hidden_row / MiB for c in expected])
    assert _lefts_widths(right, "result") == pytest.approx([c * hidden_row / MiB for c in expected] + [c * out_row / MiB for c in expected])
    assert [w for _, _, w in _boxes(right, "pool")] == pytest.approx([pool / MiB] * len(expected))
    assert [line.get_xdata()[0] for line in right.lines] == pytest.approx([pool / MiB])


def test_without_a_measurement_the_pool_is_the_largest_capture():
    fig = plot_shared_pool([4096, 1024], buffers={"x": 8192}, intermediates={"a": 8192, "b": 16384})
    right = fig.axes[1]
    assert [w for _, _, w in _boxes(right, "pool")] == pytest.approx([4096 * (8192 + 16384) / MiB] * 2)
    assert not right.lines
    plt.close(fig)
