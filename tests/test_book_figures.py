"""The book's figures and printed text as a reader sees them: values drawn where they belong, labels
that do not overlap, banners that fit a cell's width, Markdown without reStructuredText markup."""

import itertools
import random

import matplotlib
import pytest
import torch

from attn_gym_lite.book.plots import plot_padding_versus_buckets
from attn_gym_lite.book.results import BANNER_WIDTH, banner, load_result, pitfall_markdown, provenance_line
from attn_gym_lite.data.capacity import plan_buckets

matplotlib.use("Agg")


def _text_boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [(text.get_text(), text.get_window_extent(renderer)) for ax in fig.axes
            for text in [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label] if text.get_text()]


def test_plan_buckets_figure_shows_each_plan_and_no_label_overlaps():
    rng = random.Random(0)
    samples = [rng.randint(300, 4096) for _ in range(400)]
    plans = [plan_buckets(samples, k, align=256) for k in range(1, 7)]
    fig = plot_padding_versus_buckets(plans, sum(samples) / len(samples))
    padding_ax, ladder_ax = fig.axes
    # the padding curve and its labels: 1 - expected_fill per k, independently recomputed from the samples
    for plan in plans:
        bucket = [min(c for c in plan.capacities if c >= s) for s in samples]
        assert 1 - plan.expected_fill == pytest.approx(1 - sum(samples) / sum(bucket))
    assert list(padding_ax.lines[0].get_ydata()) == pytest.approx([1 - p.expected_fill for p in plans])
    assert [t.get_text() for t in padding_ax.texts] == [f"{1 - p.expected_fill:.1%}" for p in plans]
    # the ladder: every capacity of plan k at x = k
    drawn = sorted((x, y) for c in ladder_ax.collections for x, y in c.get_offsets().tolist())
    assert drawn == sorted((k, c) for k, p in enumerate(plans, 1) for c in p.capacities)
    # no two texts overlap, and every text lies inside the figure
    boxes = _text_boxes(fig)
    figure_box = fig.bbox
    for (name_a, a), (name_b, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"{name_a!r} overlaps {name_b!r}"
    for name, box in boxes:
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1, name


@pytest.mark.parametrize("suite", ["pitfalls", "packing-study", "end-to-end"])
def test_banner_lines_fit_the_cell_and_keep_every_word(suite):
    record = load_result(suite)
    not_run = "the GPU host's own run of this study (on its Python and its tokenizer, whose lengths differ)"
    text = banner(record, not_run)
    assert all(len(line) <= BANNER_WIDTH for line in text.splitlines()), text
    assert len(text.splitlines()) >= 3  # the provenance line alone is longer than one line
    # wrapping only moved words between lines: the same words, in the same order
    if not torch.cuda.is_available():
        expected = f"CPU mode: no CUDA device here, so {not_run} did not run. Showing the recording from: {provenance_line(record)}"
        if record.get("declared_stale"):  # results/stale.json's reason closes the banner
            expected += f" Older than this package: {record['declared_stale']}"
        assert text.split() == expected.split()
    assert "`" not in text and record["provenance"]["command"] in " ".join(text.split())


def test_pitfall_markdown_turns_docstring_literals_into_code_spans():
    report = {"name": "x", "what": "``.item()`` inside ``capture_graph``: a host sync.", "outcome": "error",
              "error_type": "RuntimeError", "message": "bad `thing` happened"}
    assert pitfall_markdown(report, "recorded").splitlines() == [
        "**[recorded]** `.item()` inside `capture_graph`: a host sync.",
        "",
        "- outcome: **error**",
        "- error_type: `RuntimeError`",
        "- message: `bad 'thing' happened`",
    ]
    for recorded in load_result("pitfalls")["pitfalls"]:
        assert "``" not in pitfall_markdown(recorded, "recorded")
    with pytest.raises(ValueError, match="report must hold 'what' and 'outcome'.*missing \\['outcome'\\]"):
        pitfall_markdown({"what": "x"}, "live")


def test_masking_figure_colours_each_verdict_and_plots_the_cost():
    from attn_gym_lite.book.plots import plot_masking

    verdicts = {"all": {"input": "ok", "w": "ok"}, "none": {"input": "12 non-finite", "w": "WRONG"}}
    points = [{"L": 8192, "masked_us": 2000.0, "unmasked_us": 1900.0}, {"L": 1024, "masked_us": 1500.0, "unmasked_us": 1400.0}]
    fig = plot_masking(verdicts, points)
    table, cost = fig.axes[:2]
    # rows = variants, columns = gradients; ok -> 0, WRONG -> 1, non-finite -> 2
    assert table.images[0].get_array().tolist() == [[0, 0], [2, 1]]
    assert [t.get_text() for t in table.get_yticklabels()] == ["all", "none"]
    masked, unmasked = cost.lines[:2]
    assert list(masked.get_xdata()) == [8192, 1024] and list(masked.get_ydata()) == [2.0, 1.5]
    assert list(unmasked.get_ydata()) == [1.9, 1.4]


def test_plot_series_draws_each_series_as_given():
    from attn_gym_lite.book.plots import plot_series

    fig = plot_series({"a": [0.5, 0.25, 1.0], "b": [2.0, 3.0]}, ylabel="loss (nats/token)", title="t")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["a", "b"]
    assert [list(line.get_ydata()) for line in lines] == [[0.5, 0.25, 1.0], [2.0, 3.0]]
    assert [list(line.get_xdata()) for line in lines] == [[0, 1, 2], [0, 1]]


@pytest.mark.parametrize(("series", "options", "error", "match"), [
    ({}, {}, ValueError, "series must hold at least one named series, got an empty dict"),
    ([1.0, 2.0], {}, TypeError, "series must be a dict of name -> values, got list"),
    ({"a": "abc"}, {}, TypeError, r"series\['a'\] must be a sequence of real numbers, got the string 'abc'"),
    ({"a": []}, {}, ValueError, r"series\['a'\] must be a non-empty 1-D sequence of numbers, got shape \(0,\)"),
    ({"a": [[1.0, 2.0], [3.0, 4.0]]}, {}, ValueError, r"series\['a'\] must be a non-empty 1-D .* got shape \(2, 2\)"),
    ({"a": [1.0, "x"]}, {}, TypeError, r"series\['a'\] must be a sequence of real numbers"),
    ({1: [1.0]}, {}, TypeError, "series names must be str, got int 1"),
    ({"a": [1.0]}, {"ylim": (1.0,)}, TypeError, r"ylim must be a \(low, high\) pair of real numbers or None, got \(1.0,\)"),
    ({"a": [1.0]}, {"ylim": (2.0, 1.0)}, ValueError, r"ylim must have low < high, got \(2.0, 1.0\)"),
    ({"a": [1.0]}, {"markers": 1}, TypeError, "markers must be a bool, got 1"),
    ({"a": [1.0]}, {"ylabel": None}, TypeError, "ylabel must be a str, got NoneType"),
])
def test_plot_series_refuses_what_it_would_draw_wrongly(series, options, error, match):
    """Before: an empty dict drew an empty axes, a string drew its characters as categories, a 2-D
    array drew several lines under one name, a one-element ylim set only the bottom."""
    from attn_gym_lite.book.plots import plot_series

    with pytest.raises(error, match=match):
        plot_series(series, **{"ylabel": "loss (nats/token)", "title": "t", **options})


def test_plot_series_reads_arrays_tensors_and_iterators_as_values():
    import numpy as np
    import torch

    from attn_gym_lite.book.plots import plot_series

    fig = plot_series({"array": np.array([1.0, 2.0]), "tensor": torch.tensor([3.0, 4.0], requires_grad=True),
                       "iterator": iter([5.0, 6.0])}, ylabel="x (1)", title="t")
    assert [list(line.get_ydata()) for line in fig.axes[0].get_lines()] == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]


def test_plot_timelines_refuses_a_lone_trace_and_string_titles():
    """Before: titles="ab" for two traces titled them 'a' and 'b'; one trace dict passed as
    traces was iterated by key and reported as a trace of type str."""
    from attn_gym_lite.book.plots import plot_timelines

    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10.0, "dur": 5.0, "pid": 0, "tid": 7}]}
    with pytest.raises(TypeError, match=r"titles must be a sequence of strings, one per trace, got str 'ab'"):
        plot_timelines([trace, trace], "ab")
    with pytest.raises(TypeError, match=r"traces must be a sequence of Chrome trace dicts, got dict \(one trace\? pass \[trace\]\)"):
        plot_timelines(trace, ["a"])
    with pytest.raises(TypeError, match=r"titles\[1\] must be a str, got int"):
        plot_timelines([trace, trace], ["a", 2])
    fig = plot_timelines(iter([trace]), ("only",))
    assert [ax.get_title() for ax in fig.axes] == ["only"]


def test_plot_timelines_stacks_one_axes_per_trace_and_refuses_missing_titles():
    from attn_gym_lite.book.plots import plot_timelines

    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10.0, "dur": 5.0, "pid": 0, "tid": 7},
                             {"ph": "X", "cat": "kernel", "name": "k", "ts": 20.0, "dur": 5.0, "pid": 0, "tid": 7}]}
    fig = plot_timelines([trace, trace], ["first", "second"])
    assert [ax.get_title() for ax in fig.axes] == ["first", "second"]
    with pytest.raises(ValueError, match="titles must name each of the 2 traces"):
        plot_timelines([trace, trace], ["only one"])
