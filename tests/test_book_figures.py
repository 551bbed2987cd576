"""The book's figures and printed text as a reader sees them: values drawn where they belong, labels
that do not overlap, banners that fit a cell's width, Markdown without reStructuredText markup."""

import itertools
import random

import matplotlib
import pytest
import torch

from attn_gym_lite.book.figures.ch03_profiling import plot_timelines
from attn_gym_lite.book.figures.ch05_masking import plot_masking
from attn_gym_lite.book.figures.ch06_buckets import plot_padding_versus_buckets
from attn_gym_lite.book.results import BANNER_WIDTH, banner, load_result, pitfall_markdown, provenance_line
from attn_gym_lite.data.capacity import plan_buckets

matplotlib.use("Agg")


def test_plan_buckets_figure_shows_each_plan_and_no_label_overlaps():
    rng = random.Random(0)
    samples = [rng.randint(300, 4096) for _ in range(400)]
    plans = [plan_buckets(samples, k, align=256) for k in range(1, 7)]
    fig = plot_padding_versus_buckets(plans, sum(samples) / len(samples))
    padding_ax, ladder_ax = fig.axes
    # the padding curve and its labels: 1 - expected_fill per k, independently recomputed from the samples
    padding = [1 - sum(samples) / sum(min(c for c in p.capacities if c >= s) for s in samples) for p in plans]
    assert list(padding_ax.lines[0].get_ydata()) == pytest.approx(padding)
    assert [t.get_text() for t in padding_ax.texts] == [f"{1 - p.expected_fill:.1%}" for p in plans]
    drawn = sorted((x, y) for c in ladder_ax.collections for x, y in c.get_offsets().tolist())
    assert drawn == sorted((k, c) for k, p in enumerate(plans, 1) for c in p.capacities)  # capacities of plan k at x = k
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.axes
             for t in [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label] if t.get_text()]
    for (name_a, a), (name_b, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"{name_a!r} overlaps {name_b!r}"
    for name, box in boxes:
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, name


@pytest.mark.parametrize("suite", ["pitfalls", "packing-study", "end-to-end"])
def test_banner_lines_fit_the_cell_and_keep_every_word(suite):
    record = load_result(suite)
    not_run = "the GPU host's own run of this study (on its Python and its tokenizer, whose lengths differ)"
    text = banner(record, not_run)
    assert all(len(line) <= BANNER_WIDTH for line in text.splitlines()), text
    assert len(text.splitlines()) >= 3  # the provenance line alone is longer than one line
    if not torch.cuda.is_available():  # wrapping only moved words between lines
        expected = f"CPU mode: no CUDA device here, so {not_run} did not run. Showing the recording from: {provenance_line(record)}"
        if record.get("declared_stale"):
            expected += f" Older than this package: {record['declared_stale']}"
        assert text.split() == expected.split()
    assert "`" not in text and record["provenance"]["command"] in " ".join(text.split())


def test_pitfall_markdown_turns_docstring_literals_into_code_spans():
    report = {"name": "x", "what": "``.item()`` inside ``capture_graph``: a host sync.", "outcome": "error",
              "error_type": "RuntimeError", "message": "bad `thing` happened"}
    assert pitfall_markdown(report, "recorded").splitlines() == [
        "**[recorded]** `.item()` inside `capture_graph`: a host sync.", "", "- outcome: **error**",
        "- error_type: `RuntimeError`", "- message: `bad 'thing' happened`"]
    for recorded in load_result("pitfalls")["pitfalls"]:
        assert "``" not in pitfall_markdown(recorded, "recorded")


def test_masking_figure_colours_each_verdict_and_plots_the_cost():
    verdicts = {"all": {"input": "ok", "w": "ok"}, "none": {"input": "12 non-finite", "w": "WRONG"}}
    points = [{"L": 8192, "masked_us": 2000.0, "unmasked_us": 1900.0}, {"L": 1024, "masked_us": 1500.0, "unmasked_us": 1400.0}]
    table, cost = plot_masking(verdicts, points).axes[:2]
    assert table.images[0].get_array().tolist() == [[0, 0], [2, 1]]  # ok -> 0, WRONG -> 1, non-finite -> 2
    assert [t.get_text() for t in table.get_yticklabels()] == ["all", "none"]
    masked, unmasked = cost.lines[:2]
    assert list(masked.get_xdata()) == [8192, 1024] and list(masked.get_ydata()) == [2.0, 1.5]
    assert list(unmasked.get_ydata()) == [1.9, 1.4]


def test_plot_timelines_stacks_one_axes_per_trace_on_one_window():
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": 5.0, "pid": 0, "tid": 7} for ts in (10.0, 20.0)]}
    fig = plot_timelines([trace, trace], ["first", "second"], start_us=5)
    assert [(ax.get_title(), ax.get_xlim()[0]) for ax in fig.axes] == [("first", 5), ("second", 5)]
