"""One figure style across the book: every public plot function, called on the recorded results
where it draws one (on the suite's own row builders where no recording ships), opens a figure of
the book's width in the book's fonts, names what every value axis measures, and leaves the reader's
matplotlib settings as it found them."""

import functools
import importlib
import inspect
import json
import os
import pkgutil
import random
import subprocess
import sys

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from attn_gym_lite.bench.linear_attention import amdahl_point, amdahl_summary, overcapture_point
from attn_gym_lite.bench.masking import ablation_verdicts
from attn_gym_lite.bench.scale_out import scaling, throughput
from attn_gym_lite.book import figures
from attn_gym_lite.book.figures.style import FULL_WIDTH, STYLE
from attn_gym_lite.book.results import RESULTS_ROOT, load_result
from attn_gym_lite.data import BestFit, FirstFit, InOrder
from attn_gym_lite.data.capacity import plan_buckets
from attn_gym_lite.data.study import pack_lengths
from attn_gym_lite.profiling.trace import load_trace
from attn_gym_lite.schedule import grid_sizes

matplotlib.use("Agg")
CHAPTERS = [importlib.import_module(f"{figures.__name__}.{m.name}") for m in pkgutil.iter_modules(figures.__path__)
            if m.name.startswith("ch")]
F = {name: f for module in CHAPTERS for name, f in inspect.getmembers(module, inspect.isfunction)
     if name.startswith("plot_") and f.__module__ == module.__name__}


def scale_out_record() -> dict:
    """A ``scale-out`` result built by the suite's own row builders (made-up step times): two
    workloads, W = 1 and 2, both modes."""
    rng = random.Random(0)
    warm, steps = 2, 8
    record = {"config": {"timed_warmup": warm, "steps": steps}, "workloads": {}, "runs": [], "traces": {}, "errors": {}}
    for size in (1, 2):
        record["workloads"][f"W={size}"] = {w: {"global_active_tokens": [rng.randint(3000, 4096) * size for _ in range(steps)]}
                                           for w in ("pretraining", "sft")}
        for workload in ("pretraining", "sft"):
            for mode, base in (("eager", 9.0), ("graph", 4.0)):
                step_ms = [base * (1 + 0.2 * rng.random()) for _ in range(steps - warm)]
                tokens = record["workloads"][f"W={size}"][workload]["global_active_tokens"][warm:]
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
    hello, buckets, profiling, study = r["hello-world"], r["buckets"], r["profiling"], r["packing-study"]
    samples = buckets["training"]["active_tokens"]
    trace = load_trace(RESULTS_ROOT / "h200" / profiling["trace_files"]["graph_labelled"])
    pieces = [min(length, 1024) for length in study["document_lengths"][:60]]
    return {
        "plot_packed_batch": lambda: F["plot_packed_batch"](torch.tensor([0, 300, 1000, 1800, 1800], dtype=torch.int32), 2048),
        "plot_hello_world": lambda: F["plot_hello_world"](hello, hello),
        "plot_training_loop": lambda: F["plot_training_loop"](r["training-loop"]),
        "plot_bucket_compute": lambda: F["plot_bucket_compute"](buckets, buckets["compute"]),
        "plot_padding_versus_buckets": lambda: F["plot_padding_versus_buckets"](
            [plan_buckets(samples, k, align=256) for k in range(1, 5)], sum(samples) / len(samples)),
        "plot_timeline": lambda: F["plot_timeline"](trace, title="graph replay, labelled"),
        "plot_timelines": lambda: F["plot_timelines"]([trace, trace], ["stock", "labelled"], start_us=0, end_us=2000),
        "plot_series": lambda: F["plot_series"]({"pretraining": [0.9, 1.0, 0.95], "sft": [0.3, 0.6, 0.2]},
                                                ylabel="L / T (fraction of capacity)", title="fill", ylim=(0, 1.05), markers=True),
        "plot_compact_timeline": lambda: F["plot_compact_timeline"](hello["timelines"]["eager"], title="eager"),
        "plot_hello_world_timelines": lambda: F["plot_hello_world_timelines"](hello),
        "plot_host_phases": lambda: F["plot_host_phases"](profiling["host_phases"]),
        "plot_boundary_memory": lambda: F["plot_boundary_memory"](buckets),
        "plot_masking": lambda: F["plot_masking"](ablation_verdicts(r["masking"]["block_ablation"]), r["masking"]["mask_cost"]["points"]),
        "plot_grid_sizes": lambda: F["plot_grid_sizes"](grid_sizes(16384, 256, [700, 200, 124], 128, 16, 132)),
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
        "plot_scale_out": lambda: F["plot_scale_out"](scale_out_record()),
    }


def _value_axes(ax):
    """The axes' x and y axis, and whether it carries numbers (a value axis needs a label with its
    unit; a categorical axis, or one without tick labels, names itself)."""
    ax.figure.canvas.draw()
    for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
        texts = [t.get_text().replace("\N{MINUS SIGN}", "-").replace(",", "").replace("%", "")
                 for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
        yield axis, label, bool(texts) and all(_is_number(t) for t in texts)


def _is_number(text: str) -> bool:
    text = text.strip("$").replace("\\mathdefault{", "").replace("}", "").replace("^{", "e").replace("{", "")
    try:
        float(text.replace("10e", "1e"))
    except ValueError:
        return False
    return True


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
            for axis, label, numeric in _value_axes(ax):
                assert {t.get_fontsize() for t in axis.get_ticklabels() if t.get_text()} <= {STYLE["xtick.labelsize"]}, name
                if label:
                    assert axis.label.get_fontsize() == STYLE["axes.labelsize"], label
                if numeric:
                    assert label.strip(), f"{name}: a value axis without a label (ticks {axis.get_ticklabels()[:3]})"
    finally:
        plt.close(fig)


def test_spread_is_drawn_where_the_record_holds_one():
    # training-loop: each mode ran twice; the whisker spans the two step times (ms).
    training = load_result("training-loop")
    fig = F["plot_training_loop"](training)
    (whiskers,) = [c for c in fig.axes[1].collections if c.get_segments()]
    assert all(segment[0][0] == segment[1][0] for segment in whiskers.get_segments())  # vertical
    spans = sorted((s[0][1], s[1][1]) for s in whiskers.get_segments())
    expected = sorted(tuple(sorted((training[m]["step_us"] / 1e3, training[f"{m}_repeat"]["step_us"] / 1e3))) for m in ("eager", "graph"))
    assert spans == [pytest.approx(span) for span in expected]
    plt.close(fig)
    # scale-out: p10 to p90 of the per-step rates, rebuilt independently from the record.
    record = scale_out_record()
    fig = F["plot_scale_out"](record)
    expected = []
    for run in record["runs"]:
        tokens = record["workloads"][f"W={run['world_size']}"][run["workload"]]["global_active_tokens"][2:]
        rates = sorted(t / (ms / 1e3) / 1e6 for t, ms in zip(tokens, run["step_ms"]))
        expected.append(((rates[0] + rates[1]) / 2, (rates[4] + rates[5]) / 2))  # numpy's linear p10, p90 of 6 values
    drawn = sorted((s[0][1], s[1][1]) for c in fig.axes[0].collections for s in c.get_segments())
    assert drawn == [pytest.approx(span) for span in sorted(expected)]
    plt.close(fig)
    # packing study: the band runs from the median to the max M of each policy.
    study = load_result("packing-study")
    fig = F["plot_packing_study"](study["table"])
    bands = [c for ax in fig.axes for c in ax.collections if "median to max" in c.get_label()]
    assert len(bands) == 2 * len({row["T"] for row in study["table"]})
    plt.close(fig)


def test_importing_the_figures_leaves_the_rcparams_alone():
    code = ("import json, matplotlib, matplotlib.pyplot\n"
            "before = {k: repr(v) for k, v in matplotlib.rcParams.items()}\n"
            + "".join(f"import {module.__name__}\n" for module in CHAPTERS) +
            "print(json.dumps(sorted(k for k, v in matplotlib.rcParams.items() if before[k] != repr(v))))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
