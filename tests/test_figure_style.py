"""One figure style across the book: every public plot function, called on the recorded results
where it draws one (on the suite's own row builders where no recording ships), opens a figure of
the book's width in the book's fonts, names what every value axis measures, and leaves the reader's
matplotlib settings as it found them (importing the figures sets nothing: ``styled`` is an
``rc_context``)."""

import functools
import importlib
import inspect
import itertools
import pkgutil
import random

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from attn_gym_lite.bench.linear_attention import amdahl_point, amdahl_summary, overcapture_point
from attn_gym_lite.bench.masking import ablation_verdicts
from attn_gym_lite.bench.scale_out import scaling, throughput
from attn_gym_lite.book import figures
from attn_gym_lite.book.figures.ch04_schedulers import cta_maps
from attn_gym_lite.book.figures.style import FULL_WIDTH, STYLE
from attn_gym_lite.book.results import RESULTS_ROOT, load_result
from attn_gym_lite.data import BestFit, FirstFit, InOrder
from attn_gym_lite.data.capacity import plan_buckets
from attn_gym_lite.data.study import pack_lengths
from attn_gym_lite.profiling import GraphAnnotations
from attn_gym_lite.profiling.trace import load_trace
from attn_gym_lite.schedule import grid_sizes

matplotlib.use("Agg")
CHAPTERS = [importlib.import_module(f"{figures.__name__}.{m.name}") for m in pkgutil.iter_modules(figures.__path__)
            if m.name.startswith("ch")]
F = {name: f for module in CHAPTERS for name, f in inspect.getmembers(module, inspect.isfunction)
     if name.startswith("plot_") and f.__module__ == module.__name__}


def scale_out_record() -> dict:
    """A ``scale-out`` result built by the suite's own row builders (made-up step times): two
    workloads, W = 1 and 2, both modes, 6 timed steps each."""
    rng = random.Random(0)
    record = {"runs": [], "traces": {}, "errors": {}, "tokens": {}}
    for size, workload, mode in itertools.product((1, 2), ("pretraining", "sft"), ("eager", "graph")):
        tokens = record["tokens"].setdefault((size, workload), [rng.randint(3000, 4096) * size for _ in range(6)])
        step_ms = [(9.0 if mode == "eager" else 4.0) * (1 + 0.2 * rng.random()) for _ in tokens]
        record["runs"].append({"workload": workload, "world_size": size, "mode": mode, **throughput(tokens, step_ms)})
    record["scaling"] = scaling(record["runs"])
    return record


def kda_record(scale: float = 1.0) -> dict:
    """A ``linear-attention`` result built by the suite's own row builders (made-up times)."""
    series = {
        "ours": [overcapture_point(L, 32, scale * (100 + L / 10), scale * (95 + L / 10)) for L in (512, 2048, 8192)],
        "fla_graph": [overcapture_point(L, 32, scale * (300 + L / 3), scale * (100 + L / 3)) for L in (512, 2048, 8192)],
    }
    points = [amdahl_point(4096, 32, 1230.0, 3430.0), amdahl_point(2048, 32, 770.0, 2910.0), amdahl_point(1024, 32, 500.0, 2600.0)]
    return {"overcapture": {"config": {"T": 8192, "N": 128, "M": 32, "H": 16, "K": 128, "V": 128}, "series": series, "errors": {}},
            "amdahl": {"config": {"hidden_size": 2048, "num_heads": 16, "head_dim": 128}, "points": points,
                       "summary": amdahl_summary(points), "errors": {}}}


@functools.cache
def _recordings() -> dict:
    suites = ("hello-world", "buckets", "profiling", "schedulers", "packing-study", "masking", "end-to-end", "training-loop")
    return {suite: load_result(suite) for suite in suites}


def _cases() -> dict:
    """One call per public plot function, on the recordings where the function draws one."""
    r = _recordings()
    hello, buckets, study = r["hello-world"], r["buckets"], r["packing-study"]
    samples = buckets["training"]["active_tokens"]
    trace = load_trace(RESULTS_ROOT / "h200" / r["profiling"]["trace_files"]["graph_labelled"])
    pieces = [min(length, 1024) for length in study["document_lengths"][:60]]
    return {
        "plot_packed_batch": lambda: F["plot_packed_batch"](torch.tensor([0, 300, 1000, 1800, 1800], dtype=torch.int32), 2048),
        "plot_hello_world": lambda: F["plot_hello_world"](hello, hello),
        "plot_training_loop": lambda: F["plot_training_loop"](r["training-loop"]),
        "plot_bucket_compute": lambda: F["plot_bucket_compute"](buckets, buckets["compute"]),
        "plot_padding_versus_buckets": lambda: F["plot_padding_versus_buckets"](
            [plan_buckets(samples, k, align=256) for k in range(1, 5)], sum(samples) / len(samples)),
        "plot_timeline": lambda: F["plot_timeline"](trace, title="graph replay, labelled"),
        "plot_capture_order": lambda: F["plot_capture_order"](GraphAnnotations.from_dict(r["profiling"]["annotations"]), trace),
        "plot_timelines": lambda: F["plot_timelines"]([trace, trace], ["stock", "labelled"], start_us=0, end_us=2000),
        "plot_series": lambda: F["plot_series"]({"pretraining": [0.9, 1.0, 0.95], "sft": [0.3, 0.6, 0.2]},
                                                ylabel="L / T (fraction of capacity)", title="fill", ylim=(0, 1.05), markers=True),
        "plot_compact_timeline": lambda: F["plot_compact_timeline"](r["profiling"]["host_phases"]["timeline"], title="one step"),
        "plot_hello_world_timelines": lambda: F["plot_hello_world_timelines"](hello),
        "plot_step_dataflow": lambda: F["plot_step_dataflow"](),
        "plot_host_phases": lambda: F["plot_host_phases"](r["profiling"]["host_phases"]),
        "plot_boundary_memory": lambda: F["plot_boundary_memory"](buckets),
        "plot_shared_pool": lambda: F["plot_shared_pool"](
            next(p["capacities"] for p in buckets["memory"] if p["config"] == "shared buckets"),
            {"x": 8192, "out": 8192}, {"h": 8192, "y": 8192}),
        "plot_masking": lambda: F["plot_masking"](ablation_verdicts(r["masking"]["block_ablation"]), r["masking"]["mask_cost"]["points"]),
        "plot_grid_sizes": lambda: F["plot_grid_sizes"](grid_sizes(16384, 256, [700, 200, 124], 128, 16, 132)),
        "plot_cta_maps": lambda: F["plot_cta_maps"](cta_maps([7, 2, 0, 5], 16, 5, 4, 3)),
        "plot_sweeps": lambda: F["plot_sweeps"](r["schedulers"], r["schedulers"]),
        "plot_throughput": lambda: F["plot_throughput"](r["schedulers"]),
        "plot_length_distribution": lambda: F["plot_length_distribution"](study["document_lengths"], title="stdlib"),
        "plot_policy_batches": lambda: F["plot_policy_batches"](pieces[:20], [InOrder(), FirstFit(4), BestFit(8)], 2048),
        "plot_packing_study": lambda: F["plot_packing_study"](study["table"]),
        "plot_packing_run": lambda: F["plot_packing_run"](pack_lengths(pieces, BestFit(8), 2048), 2048, 8),
        "plot_end_to_end_losses": lambda: F["plot_end_to_end_losses"](r["end-to-end"]),
        "plot_end_to_end_throughput": lambda: F["plot_end_to_end_throughput"](r["end-to-end"], r["end-to-end"]),
        "plot_kda_overcapture": lambda: F["plot_kda_overcapture"](kda_record(), kda_record(0.9)),
        "plot_kda_amdahl": lambda: F["plot_kda_amdahl"](kda_record(), kda_record()),
        "plot_kda_chunks": lambda: F["plot_kda_chunks"](torch.tensor([0, 9, 12, 12, 18], dtype=torch.int32), 4, 24),
        "plot_scale_out": lambda: F["plot_scale_out"](scale_out_record()),
    }


def _value_axes(ax):
    """Each axis of ``ax`` whose tick labels are numbers (a value axis needs a label with its unit);
    streams, stacks, layouts name themselves."""
    ax.figure.canvas.draw()
    for axis in (ax.xaxis, ax.yaxis):
        texts = [t.get_text().replace("\\mathdefault", "") for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
        if texts and all(any(c.isdigit() for c in t) and not any(c.isalpha() for c in t) for t in texts):
            yield axis


def test_every_public_plot_function_has_a_case():
    assert len(CHAPTERS) == 10 and sorted(_cases()) == sorted(F)


@pytest.mark.parametrize("name", sorted(F))
def test_each_figure_has_the_book_width_fonts_and_labelled_value_axes(name):
    before = dict(matplotlib.rcParams)
    drawn = _cases()[name]()
    assert dict(matplotlib.rcParams) == before, "drawing changed the reader's rcParams"
    fig = drawn if isinstance(drawn, matplotlib.figure.Figure) else drawn.figure
    try:
        assert fig.get_figwidth() == FULL_WIDTH
        assert fig.get_layout_engine() is not None  # constrained: titles and legends get their room
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            if ax.get_title():
                assert ax.title.get_fontsize() == STYLE["axes.titlesize"], ax.get_title()
            for axis in (ax.xaxis, ax.yaxis):
                assert {t.get_fontsize() for t in axis.get_ticklabels() if t.get_text()} <= {STYLE["xtick.labelsize"]}, name
                assert axis.label.get_fontsize() == STYLE["axes.labelsize"], axis.label.get_text()
            for axis in _value_axes(ax):
                assert axis.label.get_text().strip(), f"{name}: a value axis without a label (ticks {axis.get_ticklabels()[:3]})"
    finally:
        plt.close(fig)


def test_spread_is_drawn_where_the_record_holds_one():
    def whiskers(ax):
        return sorted((s[0][1], s[1][1]) for c in ax.collections for s in c.get_segments())

    # training-loop: each mode ran twice; the whisker spans the two step times (ms).
    training = load_result("training-loop")
    fig = F["plot_training_loop"](training)
    expected = [sorted((training[m]["step_us"] / 1e3, training[f"{m}_repeat"]["step_us"] / 1e3)) for m in ("eager", "graph")]
    assert whiskers(fig.axes[1]) == [pytest.approx(tuple(span)) for span in sorted(expected)]
    # scale-out: p10 to p90 of the per-step rates, rebuilt independently (numpy's linear p10, p90 of 6 values).
    record = scale_out_record()
    fig = F["plot_scale_out"](record)
    rates = [sorted(t / (ms / 1e3) / 1e6 for t, ms in zip(record["tokens"][r["world_size"], r["workload"]], r["step_ms"]))
             for r in record["runs"]]
    expected = sorted(((r[0] + r[1]) / 2, (r[4] + r[5]) / 2) for r in rates)
    assert whiskers(fig.axes[0]) == [pytest.approx(span) for span in expected]
    # packing study: the band runs from the median to the max M of each policy.
    study = load_result("packing-study")
    fig = F["plot_packing_study"](study["table"])
    bands = [c for ax in fig.axes for c in ax.collections if "median to max" in c.get_label()]
    assert len(bands) == 2 * len({row["T"] for row in study["table"]})
    plt.close("all")
