"""Every figure of the book, in one place and one style.

Each function draws from a recorded result (``results/<gpu>/<suite>.json``) and, on a GPU, the
reader's live run beside it, or from values the chapter computed on the CPU. Sections follow the
chapters: ragged tensors and graph capture, profiling (timelines), schedulers, graph buckets, data
packing, the end-to-end comparison, linear attention, scaling out.

The style lives in one place at the top (:data:`STYLE`, :data:`SERIES_COLOURS`,
:data:`FULL_WIDTH`): every public function draws inside it, at the same width, in the same fonts,
with a unit on every value axis and, where a recording holds a spread (repeats, per-step samples,
percentiles), whiskers or a band beside the median. It is applied per call (``rc_context``), never
globally: importing this module leaves the reader's matplotlib settings alone.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator, PercentFormatter

from ..checks import check_bool, check_real
from ..data.packing import PackingPolicy
from ..data.study import nearest_rank
from ..profiling.annotate import REGION_CATEGORY, REGION_TRACK_OFFSET
from ..profiling.summary import _NO_GPU_HINT, device_events
from ..profiling.trace import LANE_TID_BASE, Trace, check_trace
from .seed import SEED_PUBLISHED

# ---------------------------------------------------------------------------------------------
# The one style: every public function below draws inside it (``@_styled``), so all figures of
# the book share a width, fonts, grid and colours. Nothing here touches the global rcParams: a
# reader who imports the package keeps their own matplotlib look for their own plots.
# ---------------------------------------------------------------------------------------------

#: Width of every figure the book draws, in inches: a Jupyter Book page column scales it to the
#: same on-screen width, so the same font size reads the same in every chapter.
FULL_WIDTH = 10.0
#: Height of a one-row figure with nothing special to fit (a row of timelines sets its own).
ROW_HEIGHT = 3.6

#: The rcParams active while a plot function draws (:func:`style`).
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "legend.frameon": False,
    "figure.titlesize": 11,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    "axes.linewidth": 0.8,
    "axes.grid": True,
    "axes.axisbelow": True,  # grid lines behind bars and bands
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "errorbar.capsize": 2.5,
    "figure.dpi": 100,
    "figure.figsize": (FULL_WIDTH, ROW_HEIGHT),
    # Constrained layout makes room for titles, outside legends and bar labels at draw time.
    "figure.constrained_layout.use": True,
}

#: One colour per series that recurs across chapters: the eager step is red and a graph replay
#: blue wherever they appear; ours (the package's Triton kernels, the book's path) shares the
#: graph replay's blue; torch's ``varlen_attn`` is orange, ``torch.compile`` purple, fla olive,
#: graph buckets green, a neutral reference (unmasked, proportional, padding) grey.
SERIES_COLOURS: dict[str, str] = {
    "eager": "tab:red",
    "graph replay": "tab:blue",
    "ours": "tab:blue",
    "varlen_attn": "tab:orange",
    "torch.compile": "tab:purple",
    "fla": "tab:olive",
    "buckets": "tab:green",
    "reference": "0.5",
    "padding": "0.88",
}

#: How a recorded series and the reader's live run of it differ: the same colour, the live one
#: dotted and lighter (lines), or hatched (bars).
RECORDED_STYLE: dict[str, Any] = {"linestyle": "-", "alpha": 1.0}
LIVE_STYLE: dict[str, Any] = {"linestyle": ":", "alpha": 0.6}
LIVE_HATCH = "//"

_F = TypeVar("_F", bound=Callable[..., Any])


@contextlib.contextmanager
def style() -> Iterator[None]:
    """The book's figure style (:data:`STYLE`) for the duration of a ``with`` block, restored after.

    Use it around your own plots to match the book's; the package never sets it globally.
    """
    with mpl.rc_context(STYLE):
        yield


def _styled(function: _F) -> _F:
    """Run a plot function inside :func:`style`: fonts, grid and layout apply while it creates
    and draws its figure (text sizes are fixed when a text is made, so creation is what counts)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with style():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _figure(nrows: int = 1, ncols: int = 1, height: float = ROW_HEIGHT, **kw):
    """``plt.subplots`` at the book's width (:data:`FULL_WIDTH`) and ``height`` inches, in the
    book's style with constrained layout; ``kw`` goes to ``plt.subplots`` (``sharex``,
    ``gridspec_kw``, ``squeeze``, ...). Returns ``(figure, axes)`` as ``plt.subplots`` does."""
    with style():
        return plt.subplots(nrows, ncols, figsize=(FULL_WIDTH, height), layout="constrained", **kw)


def _log_ticks(ax, which: str = "xy") -> None:
    """Plain numbers at 1, 2 and 5 times each power of ten on the log axes named in ``which``
    (``"x"``, ``"y"``, ``"xy"``): ``2,000`` reads faster than ``2×10³``, and the minor labels that
    matplotlib writes on short log ranges no longer run into each other."""
    def plain(value: float, _position=None) -> str:
        return f"{value:,.0f}" if value >= 1 else f"{value:g}"

    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(plain))
        axis.set_minor_locator(NullLocator())


def _spread_bars(ax, x, low, high, colour="black", horizontal: bool = False) -> None:
    """Error bars from ``low`` to ``high`` around bars or points at ``x`` (``horizontal``: the
    spread runs along x, for ``barh``); drawn without markers so the bar or point stays the median."""
    centre = (np.asarray(low, dtype=float) + np.asarray(high, dtype=float)) / 2
    half = (np.asarray(high, dtype=float) - np.asarray(low, dtype=float)) / 2
    if horizontal:
        ax.errorbar(centre, x, xerr=half, fmt="none", ecolor=colour, elinewidth=1.0)
    else:
        ax.errorbar(x, centre, yerr=half, fmt="none", ecolor=colour, elinewidth=1.0)

# ---------------------------------------------------------------------------------------------
# Ragged tensors, graph capture, buckets
# ---------------------------------------------------------------------------------------------


@_styled
def plot_packed_batch(cu_seqlens: torch.Tensor, token_capacity: int, ax=None):
    """Draw one packed batch as a strip of ``T`` rows: one colour per sequence, grey padding.

    Args:
        cu_seqlens: int32 ``[N + 1]`` (tail repeating ``L``), any device.
        token_capacity: ``T``, the strip's length in tokens.
    Returns: the matplotlib ``Axes``.
    """
    bounds = cu_seqlens.cpu().tolist()
    ax = ax or _figure(height=1.5)[1]
    ax.grid(False)  # a strip of rows: the sequence boundaries are the lines to see
    colours = plt.get_cmap("tab20").colors
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            ax.barh(0, end - start, left=start, color=colours[i % len(colours)], edgecolor="white", linewidth=0.5)
    active = bounds[-1]
    ax.barh(0, token_capacity - active, left=active, color=SERIES_COLOURS["padding"], hatch="//", edgecolor="0.6")
    m = sum(e > s for s, e in zip(bounds[:-1], bounds[1:]))
    ax.set(xlim=(0, token_capacity), yticks=[], xlabel="buffer row (tokens)")
    ax.set_title(f"T={token_capacity}, L={active}, N={len(bounds) - 1}, M={m}, padding={token_capacity - active}")
    return ax


@_styled
def plot_hello_world(recorded: dict, live: dict | None = None):
    """Bars of µs per forward+backward, eager versus graph replay, per model size.

    Args:
        recorded: the ``hello_world`` result from ``results/``.
        live: the same suite run on this machine's GPU, drawn beside it when given.
    Returns: the matplotlib ``Figure``.
    """
    sources = [("recorded", recorded)] + ([("live", live)] if live else [])
    runs = recorded["runs"]
    fig, axes = _figure(1, len(runs), squeeze=False)
    for ax, index in zip(axes[0], range(len(runs))):
        config = runs[index]["config"]
        labels, values, hatches = [], [], []
        for name, record in sources:
            run = record["runs"][index]
            labels += [f"eager\n{name}", f"replay\n{name}"]
            values += [run["eager_wall_us"], run["replay_wall_us"]]
            hatches += [LIVE_HATCH if name == "live" else ""] * 2
        bars = ax.bar(labels, values, color=[SERIES_COLOURS["eager"], SERIES_COLOURS["graph replay"]] * len(sources),
                      hatch=hatches, edgecolor="white")
        ax.bar_label(bars, fmt="%.0f")
        ax.margins(y=0.12)  # room for the bar labels
        ax.grid(False, axis="x")
        ax.set(title=f"dim {config['dim']}, {config['num_heads']} heads, T={config['T']}, N={config['N']}",
               ylabel="fwd+bwd, wall clock (µs)")
    return fig


@_styled
def plot_training_loop(recorded: dict, live: dict | None = None):
    """Loss per step (eager and graph, same batches; faint: per step, bold: running mean) and
    step time, recorded and live.

    Returns: the matplotlib ``Figure``.
    """
    fig, (loss_ax, time_ax) = _figure(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    labels, values, ranges = [], [], []
    for name, record, style in [("recorded", recorded, "-")] + ([("live", live, ":")] if live else []):
        for mode, colour in (("eager", SERIES_COLOURS["eager"]), ("graph", SERIES_COLOURS["graph replay"])):
            if mode in record:
                losses = np.asarray(record[mode]["losses"])
                loss_ax.plot(losses, style, color=colour, alpha=0.25, linewidth=0.8)
                # Batches differ (a test file, a parser): a running mean shows the trend.
                window = max(1, min(20, len(losses) // 5))
                trend = running_mean(losses, window)
                loss_ax.plot(np.arange(window - 1, len(losses)), trend, style, color=colour,
                             label=f"{mode} ({name}), {window}-step mean")
                if record[mode]["step_us"] is not None:
                    labels.append(f"{mode}\n{name}")
                    values.append(record[mode]["step_us"] / 1e3)
                    # The suite runs each mode twice (``<mode>_repeat``): the range of the runs.
                    runs = [record[key]["step_us"] / 1e3 for key in (mode, f"{mode}_repeat")
                            if record.get(key, {}).get("step_us") is not None]
                    ranges.append((min(runs), max(runs), len(runs)))
    loss_ax.set(xlabel="training step", ylabel="loss (nats/token)", title="same batches, same initial weights")
    loss_ax.legend()
    bars = time_ax.bar(labels, values, color=[SERIES_COLOURS["eager" if "eager" in label else "graph replay"]
                                              for label in labels],
                       hatch=[LIVE_HATCH if "live" in label else "" for label in labels], edgecolor="white")
    repeated = [i for i, (_, _, count) in enumerate(ranges) if count > 1]
    if repeated:
        _spread_bars(time_ax, repeated, [ranges[i][0] for i in repeated], [ranges[i][1] for i in repeated])
    time_ax.bar_label(bars, fmt="%.2f", padding=4)
    time_ax.margins(y=0.15)
    time_ax.grid(False, axis="x")
    time_ax.set(ylabel="training step, wall clock (ms)",
                title="step time" + (" (bar: first run,\nwhisker: range of its repeats)" if repeated else ""))
    return fig


@_styled
def plot_bucket_compute(recorded: dict, live: list[dict] | None = None):
    """Forward + backward replay time versus active tokens ``L``: one graph at ``T`` (flat) versus
    the bucket that fits ``L``. ``recorded`` is the ``buckets`` result; ``live`` a ``compute()``
    list from this machine.

    Returns: the matplotlib ``Figure``.
    """
    fig, ax = _figure()
    sources = [("recorded", recorded["compute"], RECORDED_STYLE)] + ([("live", live, LIVE_STYLE)] if live else [])
    for name, points, line_style in sources:
        ls = [p["L"] for p in points]
        ax.plot(ls, [p["one_graph_us"] / 1e3 for p in points], marker="o", color=SERIES_COLOURS["graph replay"],
                label=f"one graph at T ({name})", **line_style)
        ax.plot(ls, [p["bucket_us"] / 1e3 for p in points], marker="o", color=SERIES_COLOURS["buckets"],
                label=f"smallest bucket >= L ({name})", **line_style)
    ax.set(xscale="log", yscale="log", xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (ms)",
           title="the projection tax, and what buckets take back")
    _log_ticks(ax)
    ax.legend()
    return fig


@_styled
def plot_padding_versus_buckets(plans: list, samples_mean: float):
    """Expected padded rows (as a fraction of all replayed rows) versus the number of buckets,
    for a list of :class:`attn_gym_lite.data.capacity.BucketPlan` with k = 1, 2, ...

    Left: the padding fraction per k, each point labelled with its percentage. Right: the
    capacities each plan chose (tokens), one column of marks per k, so long capacity lists never
    overlap as text labels would.

    Returns: the matplotlib ``Figure`` (two axes).
    """
    fig, (ax, ladder) = _figure(1, 2, height=3.4, gridspec_kw={"width_ratios": [3, 2]})
    ks = list(range(1, len(plans) + 1))
    padding = [1 - p.expected_fill for p in plans]
    ax.plot(ks, padding, "o-", color=SERIES_COLOURS["buckets"])
    for k, value in zip(ks, padding):
        ax.annotate(f"{value:.1%}", (k, value), textcoords="offset points", xytext=(0, 7), ha="center")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set(xlabel="buckets k", ylabel="padded rows (% of replayed rows)", xticks=ks, xlim=(0.5, len(ks) + 0.5),
           ylim=(0, max(padding) * 1.25 or 1),
           title=f"plan_buckets on the loader's L\n(mean {samples_mean:.0f} tokens)")
    for k, plan in zip(ks, plans):
        ladder.scatter([k] * len(plan.capacities), plan.capacities, marker="_", s=300, color=SERIES_COLOURS["buckets"])
    ladder.set(xlabel="buckets k", ylabel="capacity T (tokens)", xticks=ks, xlim=(0.5, len(ks) + 0.5),
               title="the capacities chosen")
    return fig


# ---------------------------------------------------------------------------------------------
# Profiling: a trace's GPU side as a timeline
# ---------------------------------------------------------------------------------------------


@_styled
def plot_timeline(
    trace: Trace,
    ax=None,
    *,
    title: str | None = None,
    start_us: float | None = None,
    end_us: float | None = None,
    show_region_boxes: bool = True,
):
    """Draw a trace's GPU side: one row per stream (and per region track), boxes per event.

    Kernels are coloured by ``args["region"]`` (grey when unlabelled); region boxes from
    :func:`annotate_trace` get their own row above their stream, with their names written in.
    Time is shown in µs from the first device event (kernel, memcpy or memset).

    Args:
        trace: Chrome trace dict.
        ax: a matplotlib ``Axes`` to draw on; default a new figure.
        title: axes title.
        start_us, end_us: window to show, in µs from the first device event (default all).
        show_region_boxes: draw the region rows if present.

    Returns:
        The matplotlib ``Axes``.

    Raises:
        TypeError / ValueError: ``trace`` is not a trace dict, by the rules of
            :func:`~attn_gym_lite.profiling.trace.check_trace` (a dict without ``traceEvents`` is
            a ValueError).
        ValueError: the trace has no device events, or ``start_us >= end_us``.
    """
    check_trace(trace, "plot_timeline")
    if start_us is not None and end_us is not None and not start_us < end_us:
        raise ValueError(f"plot_timeline: start_us must be < end_us, got start_us={start_us}, end_us={end_us}")
    events = device_events(trace)
    if not events:
        raise ValueError(f"plot_timeline: the trace has no kernel, memcpy or memset events{_NO_GPU_HINT}")
    origin = events[0]["ts"]
    boxes = [e for e in trace.get("traceEvents", []) if e.get("cat") == REGION_CATEGORY and e.get("ph") == "X"]
    rows: dict[Any, int] = {}
    names = {
        e.get("tid"): str(e.get("args", {}).get("name"))
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    shown = events + (boxes if show_region_boxes else [])
    for tid in sorted({e.get("tid") for e in shown}, key=_row_order, reverse=True):
        rows[tid] = len(rows)  # row 0 is at the bottom: the first stream ends up on top
    regions = sorted({str(e.get("args", {}).get("region")) for e in shown if e.get("args", {}).get("region")})
    # tab20 comes in dark/light pairs: a region is dark, its backward the light shade of it.
    palette = plt.get_cmap("tab20")
    bases = sorted({r.removesuffix(" backward") or r for r in regions})
    colours = {r: palette((2 * bases.index(r.removesuffix(" backward") or r) + r.endswith(" backward")) % 20)
               for r in regions}
    # The region legend sits right of the rows: two columns once it is long, and a figure tall
    # enough for it (about 0.2 inch an entry at the book's legend size).
    entries = len(regions) + 1 if regions else 0
    legend_columns = 1 if entries <= 6 else 2
    if ax is None:
        _, ax = _figure(height=max(1.0 + 0.5 * len(rows), 0.8 + 0.2 * -(-entries // legend_columns)))
    ax.grid(False, axis="y")  # rows are streams, not values
    box_ids = {id(b) for b in boxes}
    for event in shown:
        region = event.get("args", {}).get("region")
        colour = colours.get(str(region), (0.6, 0.6, 0.6, 1.0)) if region else (0.6, 0.6, 0.6, 1.0)
        left = event["ts"] - origin
        ax.broken_barh([(left, max(event["dur"], 1e-3))], (rows[event.get("tid")] - 0.4, 0.8),
                       facecolors=colour, edgecolors="white" if id(event) in box_ids else "none", linewidth=0.3)
    ax.set_yticks(list(rows.values()))
    ax.set_yticklabels([names.get(tid, f"stream {tid}") for tid in rows])
    ax.set_xlabel("time from the first GPU event (µs)")
    if start_us is not None or end_us is not None:
        low, high = ax.get_xlim()
        ax.set_xlim(low if start_us is None else start_us, high if end_us is None else end_us)
    if title:
        ax.set_title(title)
    if regions:
        ax.legend(handles=[Patch(color=colours[r], label=r) for r in regions] + [Patch(color=(0.6, 0.6, 0.6), label="(unlabelled)")],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), ncols=legend_columns)
    return ax


@_styled
def plot_timelines(traces: Sequence[Trace], titles: Sequence[str], *, start_us: float | None = None,
                   end_us: float | None = None):
    """Several traces' GPU sides (:func:`plot_timeline`), one above the other on a shared time axis
    (each from its own first device event), e.g. an eager step over its replay (chapter 3).

    Args:
        traces: Chrome trace dicts, drawn top to bottom.
        titles: one title per trace.
        start_us, end_us: the window shown, in µs from each trace's first device event.

    Returns: the matplotlib ``Figure``.

    Raises:
        TypeError: ``traces`` is one trace dict or a string rather than a sequence of them;
            ``titles`` is a string or holds a non-string; or as :func:`plot_timeline`.
        ValueError: ``titles`` does not have one entry per trace; or as :func:`plot_timeline`.
    """
    if isinstance(traces, (dict, str, bytes)) or not isinstance(traces, Iterable):
        hint = " (one trace? pass [trace])" if isinstance(traces, dict) else ""
        raise TypeError(f"traces must be a sequence of Chrome trace dicts, got {type(traces).__name__}{hint}")
    if isinstance(titles, (str, bytes)) or not isinstance(titles, Iterable):
        raise TypeError(f"titles must be a sequence of strings, one per trace, got {type(titles).__name__} {titles!r:.60}")
    traces, titles = list(traces), list(titles)
    for index, title in enumerate(titles):
        if not isinstance(title, str):
            raise TypeError(f"titles[{index}] must be a str, got {type(title).__name__}")
    if len(titles) != len(traces) or not traces:
        raise ValueError(f"titles must name each of the {len(traces)} traces (at least one), got {len(titles)} titles")
    fig, axes = _figure(len(traces), 1, height=2.3 * len(traces), sharex=True, squeeze=False)
    for ax, trace, title in zip(axes[:, 0], traces, titles):
        plot_timeline(trace, ax=ax, title=title, start_us=start_us, end_us=end_us)
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


@_styled
def plot_series(series: dict[str, Sequence[float]], *, ylabel: str, title: str, xlabel: str = "step",
                ylim: tuple[float, float] | None = None, markers: bool = False):
    """One line per named series against its index (a chapter's own small runs: how full each
    batch is, the losses of a model trained in the notebook).

    Args:
        series: name (str) -> values, in order: at least one series, each a non-empty 1-D
            sequence of real numbers (list, tuple, NumPy array, CPU tensor, iterator); NaN (or
            ``None``) is drawn as a gap.
        ylabel: the value axis label, with its unit.
        title, xlabel: the axes title and the index axis label.
        ylim: ``(low, high)``, finite and ``low < high``: the value axis range (default:
            matplotlib's).
        markers: draw a marker at each value.

    Returns: the matplotlib ``Figure``.

    Raises:
        TypeError: ``series`` is not a dict, a name is not a str, a series is a string or not
            numbers, a label is not a str, ``markers`` not a bool, ``ylim`` not a pair of reals.
        ValueError: ``series`` is empty, a series is empty or not 1-D, ``ylim`` is not finite
            and increasing.
    """
    lines = _check_series(series)
    for name, value in (("ylabel", ylabel), ("title", title), ("xlabel", xlabel)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    check_bool("markers", markers)
    if ylim is not None:
        if isinstance(ylim, (str, bytes)) or not isinstance(ylim, Sequence) or len(ylim) != 2:
            raise TypeError(f"ylim must be a (low, high) pair of real numbers or None, got {ylim!r}")
        low, high = check_real("ylim[0]", ylim[0]), check_real("ylim[1]", ylim[1])
        if not low < high:
            raise ValueError(f"ylim must have low < high, got {ylim!r}")
    fig, ax = _figure(height=3.0)
    for name, values in lines.items():
        ax.plot(values, "o-" if markers else "-", markersize=3, label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if ylim is not None:
        ax.set_ylim(low, high)
    ax.legend()
    return fig


def _check_series(series: object) -> dict[str, np.ndarray]:
    """``series`` as name -> 1-D float array, refusing what would draw something else silently
    (a string drawn as categories, a 2-D array drawn as several unlabelled lines, no line)."""
    if not isinstance(series, dict):
        raise TypeError(f"series must be a dict of name -> values, got {type(series).__name__}")
    if not series:
        raise ValueError("series must hold at least one named series, got an empty dict")
    lines = {}
    for name, values in series.items():
        if not isinstance(name, str):
            raise TypeError(f"series names must be str, got {type(name).__name__} {name!r}")
        if isinstance(values, (str, bytes)):
            raise TypeError(f"series[{name!r}] must be a sequence of real numbers, got the string {values!r:.60}")
        if isinstance(values, torch.Tensor):
            values = values.detach().cpu()
        elif isinstance(values, Iterable) and not isinstance(values, (np.ndarray, Sequence)):
            values = list(values)  # an iterator or generator, read once
        try:
            array = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            raise TypeError(f"series[{name!r}] must be a sequence of real numbers, got {type(values).__name__} "
                            f"{values!r:.60}") from None
        if array.ndim != 1 or array.size == 0:
            raise ValueError(f"series[{name!r}] must be a non-empty 1-D sequence of numbers, got shape {array.shape}")
        lines[name] = array
    return lines


def _row_order(tid: Any) -> tuple:
    """Streams in id order, each with its region track first and its extra lanes after."""
    if not isinstance(tid, int):
        return (float("inf"), 0, 0)
    lane, base = divmod(tid, LANE_TID_BASE)
    is_regions = base >= REGION_TRACK_OFFSET
    return (base - REGION_TRACK_OFFSET if is_regions else base, 0 if is_regions else 1, lane)


# One colour per kind of row in the compact timelines, the same in every figure.
_TIMELINE_COLOURS = {"host": "tab:blue", "launch": "tab:orange", "runtime": "0.6", "device": "tab:green"}
MIB = 2**20


def _timeline_colour(track: str, name: str) -> str:
    if track.startswith("GPU"):
        return _TIMELINE_COLOURS["device"]
    if track.startswith("CUDA"):
        return _TIMELINE_COLOURS["launch"] if "Launch" in name else _TIMELINE_COLOURS["runtime"]
    return _TIMELINE_COLOURS["host"]


@_styled
def plot_compact_timeline(timeline: dict, ax=None, *, title: str | None = None, max_depth: int | None = None):
    """Draw a :func:`~attn_gym_lite.profiling.compact.compact_timeline`: one row per track (host
    threads on top, then runtime calls, then GPU streams), nested host slices as thinner bars
    inside their row; host ops blue, launches orange, other runtime calls grey, device events green.

    Args:
        timeline: the compact timeline dict (``tracks``, ``events``).
        ax: a matplotlib ``Axes``; default a new figure.
        title: axes title.
        max_depth: draw host slices at most this deep (default: all that were kept).

    Returns: the matplotlib ``Axes``.

    Raises:
        ValueError: a timeline without events.
    """
    tracks, events = timeline["tracks"], timeline["events"]
    if not events:
        raise ValueError("plot_compact_timeline: the timeline has no events")
    deepest = 1 + max(e[2] for e in events)
    if ax is None:
        _, ax = _figure(height=1.0 + 0.5 * len(tracks))
    ax.grid(False, axis="y")  # rows are tracks, not values
    for name, track, depth, start, duration in events:
        if max_depth is not None and depth > max_depth:
            continue
        row = len(tracks) - 1 - track  # the first track on top
        height = 0.8 * (1 - depth / (deepest + 1))
        ax.broken_barh([(start, max(duration, 1e-3))], (row - height / 2, height),
                       facecolors=_timeline_colour(tracks[track], name), edgecolors="white", linewidth=0.2)
    ax.set_yticks(range(len(tracks)), tracks[::-1])
    ax.set_xlabel("time from the first event (µs)")
    if title:
        ax.set_title(title)
    return ax


@_styled
def plot_hello_world_timelines(recorded: dict):
    """The seed's first two pictures: one eager forward + backward above, one graph replay of the
    same step below, on one time axis (``recorded["timelines"]`` of the ``hello-world`` suite).
    Each title gives the launches, device events and how busy the GPU was over the step.

    Returns: the matplotlib ``Figure``.

    Raises:
        KeyError: the record has no ``"timelines"`` (the suite recorded ``"timelines_error"``).
    """
    timelines = recorded["timelines"]
    modes = [m for m in ("eager", "replay") if m in timelines]
    heights = [len(timelines[m]["tracks"]) + 1 for m in modes]
    fig, axes = _figure(len(modes), 1, height=0.5 * sum(heights) + 1.4, sharex=True,
                        gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        timeline = timelines[mode]
        counts = timeline["counts"]
        busy = counts["device_busy_us"] / timeline["span_us"] if timeline["span_us"] else 0.0
        plot_compact_timeline(timeline, ax, title=(
            f"{mode}: {counts['launches']} launches, {counts['device_events']} GPU events, "
            f"GPU busy {busy:.0%} of {timeline['span_us']:.0f} µs"))
    axes[0, 0].legend(handles=[Patch(color=c, label=k) for k, c in _TIMELINE_COLOURS.items()],
                      loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


@_styled
def plot_host_phases(phases: dict):
    """One training step phase by phase (:func:`~attn_gym_lite.profiling.compact.host_phases`).

    Top: each phase's host span (solid) and the GPU span of the work it launched (hatched, on the
    same row). Bottom: a flame chart of the longest phase, Python frames and ops by depth, named
    where the box is wide enough.

    Returns: the matplotlib ``Figure``.
    """
    order = phases["order"]
    fig, (phase_ax, flame_ax) = _figure(2, 1, height=2 + 0.4 * len(order) + 3,
                                        gridspec_kw={"height_ratios": [len(order) + 1, 6]})
    phase_ax.grid(False, axis="y")
    flame_ax.grid(False, axis="y")
    colours = plt.get_cmap("tab10")
    for row, name in enumerate(order):
        span = phases["phases"][name]
        y = len(order) - 1 - row
        phase_ax.broken_barh([(span["start_us"], max(span["dur_us"], 1e-3))], (y - 0.35, 0.35),
                             facecolors=colours(row), label="host" if row == 0 else None)
        if span["gpu_start_us"] is not None:
            phase_ax.broken_barh([(span["gpu_start_us"], max(span["gpu_end_us"] - span["gpu_start_us"], 1e-3))],
                                 (y, 0.35), facecolors="none", edgecolors=colours(row), hatch="///",
                                 label="GPU" if row == 0 else None)
    phase_ax.set_yticks(range(len(order)), order[::-1])
    phase_ax.set(xlabel="time from the step's start (µs)", title="host span (solid) and GPU span (hatched) per phase")
    longest = phases["longest"]
    flame = phases["flame"]
    duration = phases["phases"][longest]["dur_us"]
    for name, depth, start, length in flame:
        flame_ax.broken_barh([(start, length)], (-depth - 0.9, 0.9), facecolors=colours(order.index(longest)),
                             edgecolors="white", linewidth=0.3, alpha=0.55)
        if length > 0.12 * duration:  # only where the name has room
            flame_ax.text(start + length / 2, -depth - 0.45, name.rsplit("/", 1)[-1][:40], ha="center",
                          va="center", fontsize=6, clip_on=True)
    flame_ax.set_xlim(0, duration)
    flame_ax.set_ylim(-(1 + max((f[1] for f in flame), default=0)) - 0.2, 0.2)
    flame_ax.set_yticks([])
    stacks = "Python frames and ops" if phases["stacks"] else "ops (no Python stacks recorded)"
    flame_ax.set(xlabel=f"time from the start of {longest!r} (µs)", title=f"longest phase, {longest!r}: {stacks}")
    return fig


# Bands of the optimizer-boundary memory figure, bottom to top.
_MEMORY_BANDS = {"parameters": "tab:blue", "Adam state": "tab:purple",
                 "captured gradient buffers": "tab:orange", "fresh gradients": "tab:red",
                 "activations and other": "0.75"}


def boundary_memory_bands(mode_record: dict) -> dict[str, np.ndarray]:
    """The bands of :func:`plot_boundary_memory` for one mode, in bytes per timeline point:
    what was allocated before the step (parameters, Adam state, the captured optimizer's gradient
    buffers) stays flat; the fresh gradients are the tagged allocations; everything else allocated
    (before the step or during it: activations, workspaces, the inputs) is the rest of the total."""
    before, timeline = mode_record["before"], mode_record["timeline"]
    total = before["allocated_bytes"] + np.asarray(timeline["allocated_bytes"], dtype=np.float64)
    flat = {"parameters": before["parameter_bytes"], "Adam state": before["optimizer_state_bytes"],
            "captured gradient buffers": before["captured_gradient_bytes"]}
    bands = {name: np.full_like(total, value) for name, value in flat.items()}
    bands["fresh gradients"] = np.asarray(timeline["tags"]["fresh gradients"], dtype=np.float64)
    bands["activations and other"] = np.clip(total - sum(bands.values()), 0, None)
    return bands


@_styled
def plot_boundary_memory(recorded: dict):
    """Allocated memory over one training step at the optimizer boundary, one panel per mode
    (``recorded["optimizer_boundary_memory"]`` of the ``buckets`` suite, or that dict itself):
    stacked bands (:func:`boundary_memory_bands`) in MiB against the allocator's events, a line
    where every fresh gradient is complete. Where gradients are copied into a captured optimizer's
    buffers, the red and orange bands stand together: the gradients exist twice.

    Returns: the matplotlib ``Figure``.
    """
    record = recorded.get("optimizer_boundary_memory", recorded)
    modes = [m for m in record if isinstance(record[m], dict) and "timeline" in record[m]]
    fig, axes = _figure(1, len(modes), height=3.8, sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        mode_record = record[mode]
        bands = boundary_memory_bands(mode_record)
        x = np.asarray(mode_record["timeline"]["entry"])
        ax.stackplot(x, *[bands[name] / MIB for name in _MEMORY_BANDS], labels=list(_MEMORY_BANDS),
                     colors=list(_MEMORY_BANDS.values()), step="post")
        ax.axvline(mode_record["marked_entry"], color="black", linestyle=":", linewidth=1)
        ax.set(xlabel="allocator event (index in the step)",
               title=f"{mode}\npeak {mode_record['peak_allocated_bytes'] / MIB:,.0f} MiB")
    axes[0, 0].set_ylabel("allocated (MiB)")
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


# ---------------------------------------------------------------------------------------------
# Schedulers
# ---------------------------------------------------------------------------------------------

# One colour per implementation, the same in every figure.
# torch's varlen_attn keeps its colour of every chapter; ours are the blues (persistent, the
# book's default path, in SERIES_COLOURS["ours"]) and their neighbours; dense kernels are greys.
COLOURS = {"varlen_attn": SERIES_COLOURS["varlen_attn"], "rect": "tab:brown", "flat": "tab:green",
           "persistent": SERIES_COLOURS["ours"], "dynamic": "tab:cyan", "default": "black",
           "persistent+zero": "navy", "sdpa_flash": "0.35", "sdpa_cudnn": "0.55", "sdpa_efficient": "0.75"}

# The three sweeps: what the x axis is, and how to read it from a row.
SWEEPS = {
    "fragmentation": ("active sequences M (sequences; L fixed)", lambda row: row["M"]),
    "overcapture": ("active tokens L (tokens; M fixed)", lambda row: row["L"]),
    "constant": ("active fraction M/N = L/T (128 tokens each)", None),
}


# ---------------------------------------------------------------------------------------------
# Masking
# ---------------------------------------------------------------------------------------------

_VERDICT_COLOURS = {"ok": "tab:green", "WRONG": "tab:orange", "non-finite": "tab:red"}


@_styled
def plot_masking(verdicts: dict[str, dict[str, str]], cost_points: Sequence[dict]):
    """The masking chapter's two results in one figure.

    Left: the block ablation, one row per set of masks, one column per gradient, each cell green
    (matches the exact gradient), orange (finite but wrong) or red (non-finite); ``verdicts`` as
    :func:`attn_gym_lite.bench.masking.ablation_verdicts` returns them. Right: what the masks cost,
    masked and unmasked replay time (µs) against the active tokens ``L``, from the ``mask_cost``
    points (``L``, ``masked_us``, ``unmasked_us``).

    Returns: the matplotlib ``Figure``.
    """
    variants = list(verdicts)
    names = list(next(iter(verdicts.values())))
    kinds = list(_VERDICT_COLOURS)
    grid = np.array([[kinds.index("non-finite" if v.endswith("non-finite") else v) for v in verdicts[r].values()]
                     for r in variants])
    fig, (table_ax, cost_ax) = _figure(1, 2, height=3.8, gridspec_kw={"width_ratios": [3, 2]})
    table_ax.grid(False)
    table_ax.imshow(grid, cmap=ListedColormap([_VERDICT_COLOURS[k] for k in kinds]), vmin=-0.5,
                    vmax=len(kinds) - 0.5, aspect="auto")
    table_ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
    table_ax.set_yticks(range(len(variants)), variants)
    table_ax.set(title="gradients at capacity vs the exact ones", xlabel="gradient", ylabel="masks applied")
    table_ax.legend(handles=[Patch(color=_VERDICT_COLOURS[k], label=k) for k in kinds],
                    loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ls = [p["L"] for p in cost_points]
    cost_ax.plot(ls, [p["masked_us"] / 1e3 for p in cost_points], "o-", color=SERIES_COLOURS["graph replay"],
                 label="masked")
    cost_ax.plot(ls, [p["unmasked_us"] / 1e3 for p in cost_points], "o--", color=SERIES_COLOURS["reference"],
                 label="unmasked")
    cost_ax.set(xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (ms)", title="what the masks cost",
                ylim=(0, None))
    cost_ax.legend()
    return fig


@_styled
def plot_grid_sizes(sizes: dict, ax=None):
    """Bars of launched CTAs per schedule (log scale), split into CTAs with work and CTAs that exit
    at once. A persistent worker runs several tasks, so it has no idle part while tasks remain.

    Returns: the matplotlib ``Axes``.
    """
    ax = ax or _figure(height=3.0)[1]
    ax.grid(False, axis="y")
    names = ["rect", "flat", "persistent"]
    launched = np.array([sizes[n] for n in names], dtype=float)
    working = np.minimum(launched, sizes["active"])
    ax.barh(names, working, color=[COLOURS[n] for n in names], label="CTAs with work")
    ax.barh(names, launched - working, left=working, color=SERIES_COLOURS["padding"], hatch="//", edgecolor="0.6",
            label="CTAs that exit at once")
    for y, (total, busy) in enumerate(zip(launched, working)):
        ax.text(total, y, f" {int(total):,} launched, {int(total - busy):,} wasted", va="center")
    ax.set_xscale("log")
    ax.set_xlim(1, launched.max() * 30)
    ax.set_xlabel(f"thread blocks launched (CTAs; active tasks: {sizes['active']:,})")
    ax.legend(loc="upper right")
    return ax


def _x(sweep: str, record: dict, row: dict) -> float:
    if sweep == "constant":
        return row["M"] / record[sweep]["N"]
    return SWEEPS[sweep][1](row)


@_styled
def plot_sweeps(recorded: dict, live: dict | None = None, implementations=None):
    """The three overcapture sweeps: replay µs of the captured graph (solid) and of the exact-shape
    graph (dashed) per implementation; a live run, if given, dotted beside them.

    Args:
        recorded: the ``schedulers`` result from ``results/`` (or any dict holding some of the
            sweeps in its format); one panel per sweep it holds.
        live: the same suite (or part of it) run on this machine.
        implementations: which series to draw; all recorded ones by default.
    Returns: the matplotlib ``Figure``.
    """
    sweeps = [sweep for sweep in SWEEPS if sweep in recorded]
    fig, axes = _figure(1, len(sweeps), height=4.2, squeeze=False)
    axes = axes[0]
    for ax, sweep in zip(axes, sweeps):
        sources = [("recorded", recorded, RECORDED_STYLE["alpha"])] + (
            [("live", live, LIVE_STYLE["alpha"])] if live and sweep in live else [])
        for source, record, alpha in sources:
            for name, rows in record[sweep]["series"].items():
                if implementations and name not in implementations:
                    continue
                x = [_x(sweep, record, row) for row in rows]
                label = name if source == "recorded" else f"{name} (live)"
                style = ("-", "--") if source == "recorded" else (LIVE_STYLE["linestyle"],) * 2
                ax.plot(x, [row["captured_us"] for row in rows], style[0], marker="o", ms=3,
                        color=COLOURS[name], alpha=alpha, label=label)
                ax.plot(x, [row["exact_us"] for row in rows], style[1], color=COLOURS[name], alpha=alpha)
        c = recorded[sweep]
        ax.set(xscale="log", yscale="log", xlabel=SWEEPS[sweep][0], ylabel="fwd+bwd replay (µs)",
               title=f"{sweep}: T={c['T']}, N={c['N']}")
        _log_ticks(ax)
    # One legend for every panel, right of the last: inside a panel it covers the curves.
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, title="solid: captured,\ndashed: exact", loc="upper left",
                    bbox_to_anchor=(1.0, 1.0))
    return fig


@_styled
def plot_throughput(recorded: dict):
    """Exact-shape TFLOP/s per implementation, forward and forward+backward, for each layout.

    Returns: the matplotlib ``Figure``.
    """
    tables = recorded["throughput"]
    # Two layouts a row: at the book's width, four side by side leave no room for the names.
    ncols = min(2, len(tables))
    nrows = -(-len(tables) // ncols)
    fig, axes = _figure(nrows, ncols, height=3.3 * nrows, sharey=True, squeeze=False)
    flat_axes = axes.ravel()
    for ax, (layout, table) in zip(flat_axes, tables.items()):
        names = list(table)
        x = np.arange(len(names))
        for offset, (metric, hatch) in zip((-0.2, 0.2), (("fwd", ""), ("fwd_bwd", "//"))):
            values = [table[n][f"{metric}_tflops"] for n in names]
            bars = ax.bar(x + offset, values, 0.4, color=[COLOURS[n] for n in names], hatch=hatch,
                          edgecolor="white", label=metric.replace("_", "+"))
            ax.bar_label(bars, fmt="%.0f", fontsize="x-small")
        ax.set_xticks(x, names, rotation=30, ha="right", rotation_mode="anchor")
        ax.grid(False, axis="x")
        ax.set_title(layout)
    for ax in flat_axes[len(tables):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("exact-shape graph (TFLOP/s)")
    flat_axes[0].legend()
    return fig


# ---------------------------------------------------------------------------------------------
# Data packing
# ---------------------------------------------------------------------------------------------

_RULE_COLOURS = {"in-order": "0.4", "first-fit": "tab:blue", "best-fit": "tab:orange"}


@_styled
def plot_length_distribution(lengths: Sequence[int], *, title: str = "", ax=None):
    """Histogram of document lengths on log-spaced bins, with the p50/p90/p99 lengths marked.

    Args:
        lengths: document lengths in tokens (documents of 0 tokens are not drawn).
        title: the axes title.
    Returns: the matplotlib ``Axes``.
    """
    ax = ax or _figure(height=3.0)[1]
    positive = [length for length in lengths if length > 0]
    edges = np.logspace(0, np.log10(max(positive)) + 0.05, 60)
    ax.hist(positive, bins=edges, color="0.45")
    for quantile, style in ((0.5, "-"), (0.9, "--"), (0.99, ":")):
        value = nearest_rank(positive, quantile)
        ax.axvline(value, color="black", linestyle=style, linewidth=1,
                   label=f"p{round(quantile * 100)} = {value:,} tokens")
    ax.set(xscale="log", xlabel="document length (tokens)", ylabel="documents", title=title)
    ax.legend(loc="upper left")
    return ax


@_styled
def plot_policy_batches(
    pieces: Sequence[int], policies: Sequence[PackingPolicy], token_capacity: int
):
    """Each policy's batches of the same pieces, one row per batch: coloured pieces, grey padding.

    A piece keeps its colour across panels, so reordering is visible.

    Returns: the matplotlib ``Figure``.
    """
    colours = plt.get_cmap("tab20").colors
    runs = [list(policy.batches(pieces, token_capacity)) for policy in policies]
    rows = max(len(batches) for batches in runs)
    fig, axes = _figure(1, len(policies), height=0.35 * rows + 1.4, sharey=True, squeeze=False)
    for ax, policy, batches in zip(axes[0], policies, runs):
        ax.grid(False, axis="y")
        padding = 0
        for row, batch in enumerate(batches):
            left = 0
            for position in batch:
                ax.barh(row, pieces[position], left=left, color=colours[position % len(colours)],
                        edgecolor="white", linewidth=0.8)
                left += pieces[position]
            ax.barh(row, token_capacity - left, left=left, color=SERIES_COLOURS["padding"], hatch="//",
                    edgecolor="0.7")
            padding += token_capacity - left
        ax.set(xlim=(0, token_capacity), xlabel="buffer row (tokens)",
               title=f"{policy.label}\n{len(batches)} batches, {padding} padding rows")
    axes[0][0].set(ylabel="batch (in order)", ylim=(rows - 0.5, -0.5))
    return fig


@_styled
def plot_packing_study(rows: Sequence[dict], *, seed_published: dict = SEED_PUBLISHED):
    """The study as two rows of panels, one column per ``T``.

    Top: mean padding as a percentage of ``T`` against the buffer size ``B`` (log scales; in
    order as a horizontal line). Bottom: p99 and max ``M`` against ``B``, with the guaranteed
    bound ``M <= B``. The seed article's published points are drawn where their ``T`` matches.

    Args:
        rows: :func:`~attn_gym_lite.data.study.packing_study` rows (live or recorded).
        seed_published: the seed's figures (:data:`~attn_gym_lite.book.seed.SEED_PUBLISHED`).
    Returns: the matplotlib ``Figure``.
    """
    capacities = sorted({row["T"] for row in rows})
    # One y scale per row: every T reads against the same padding and M axes.
    fig, axes = _figure(2, len(capacities), height=6.4, squeeze=False, sharex=True, sharey="row")
    markers = {"Dolma 3": "*", "FineWeb sample-10BT": "P"}
    for column, token_capacity in enumerate(capacities):
        top, bottom = axes[0][column], axes[1][column]
        here = [row for row in rows if row["T"] == token_capacity]
        sizes = sorted({row["B"] for row in here if row["B"] is not None})
        for name in ("first-fit", "best-fit"):
            series = sorted((row["B"], row) for row in here if row["policy"] == name)
            if not series:
                continue
            xs = [b for b, _ in series]
            top.plot(xs, [100 * (1 - r["mean_fill"]) for _, r in series], "o-",
                     color=_RULE_COLOURS[name], label=name)
            # The spread of M over the batches: median to max shaded, p99 and max drawn.
            bottom.fill_between(xs, [r["median_M"] for _, r in series], [r["max_M"] for _, r in series],
                                color=_RULE_COLOURS[name], alpha=0.12, linewidth=0,
                                label=f"{name} median to max M")
            bottom.plot(xs, [r["p99_M"] for _, r in series], "o-", color=_RULE_COLOURS[name],
                        label=f"{name} p99 M")
            bottom.plot(xs, [r["max_M"] for _, r in series], "x:", color=_RULE_COLOURS[name],
                        alpha=0.7, label=f"{name} max M")
        for row in here:
            if row["policy"] == "in-order":
                top.axhline(100 * (1 - row["mean_fill"]), color=_RULE_COLOURS["in-order"],
                            linestyle="--", label="in order")
        if sizes:
            bottom.plot(sizes, sizes, color="black", linewidth=0.8, label="bound M = B")
        for corpus, published in seed_published["corpora"].items():
            for point in published["rows"]:
                if point["T"] != token_capacity:
                    continue
                top.plot(point["B"], 100 * (1 - point["mean_fill"]), markers[corpus],
                         color="black", markersize=10, label=f"seed: {corpus}")
                if "p99_M" in point:
                    bottom.plot(point["B"], point["p99_M"], markers[corpus], color="black",
                                markersize=10, label=f"seed: {corpus} p99 M")
        top.set(xscale="log", yscale="log", title=f"T = {token_capacity}",
                ylabel="mean padding (% of T)" if column == 0 else None)
        bottom.set(xscale="log", yscale="log", xlabel="candidate buffer B (pieces)",
                   ylabel="sequences per batch M (sequences)" if column == 0 else None)
        for ax in (top, bottom):
            ax.set_xticks(sizes, [str(size) for size in sizes])
            ax.xaxis.set_minor_locator(NullLocator())
    # One legend per row, right of its last panel: every panel of a row draws the same series.
    for row in axes:
        unique: dict = {}
        for ax in row:
            handles, labels = ax.get_legend_handles_labels()
            unique.update({label: handle for label, handle in zip(labels, handles) if label not in unique})
        row[-1].legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


@_styled
def plot_packing_run(batch_lengths: Sequence[Sequence[int]], token_capacity: int, bound: int):
    """One packing run: the fill of every batch in order, and the histogram of ``M``.

    Args:
        batch_lengths: each batch's piece lengths (:func:`~attn_gym_lite.data.study.pack_lengths`).
        token_capacity: ``T``.
        bound: the policy's guaranteed bound on ``M``, drawn as a line.
    Returns: the matplotlib ``Figure``.
    """
    fill = [100 * sum(batch) / token_capacity for batch in batch_lengths]
    sizes = [len(batch) for batch in batch_lengths]
    fig, (left, right) = _figure(1, 2, height=3.0, gridspec_kw={"width_ratios": [2, 1]})
    left.plot(fill, linewidth=0.7, color="0.3")
    left.set(xlabel="batch (in order)", ylabel="fill L / T (%)", ylim=(0, 102), title="fill of each batch")
    right.hist(sizes, bins=np.arange(0.5, max(sizes) + 1.5), color="0.45")
    right.axvline(bound, color="black", linestyle="--", label=f"guaranteed bound {bound}")
    right.set(xlabel="M (sequences in the batch)", ylabel="batches (count)", title="M per batch",
              xlim=(0, max(max(sizes), min(bound, 4 * max(sizes))) + 1))
    right.legend()
    return fig


# ---------------------------------------------------------------------------------------------
# Putting it together: the end-to-end suite
# ---------------------------------------------------------------------------------------------

#: One colour per training stack of the ``end-to-end`` suite, in every figure of chapter 8.
#: Families share a hue with :data:`SERIES_COLOURS`: eager reds, torch.compile purples.
STACK_COLOURS = {
    "eager padded": "0.55", "eager packed": SERIES_COLOURS["eager"], "eager packed, L rows": "salmon",
    "compile": "plum", "compile reduce-overhead": SERIES_COLOURS["torch.compile"],
    "compile reduce-overhead, fixed capacity": "indigo",
    "graph varlen_attn": SERIES_COLOURS["varlen_attn"], "graph ours": SERIES_COLOURS["ours"],
    "buckets ours": SERIES_COLOURS["buckets"],
}


def by_workload(record: dict) -> dict:
    """``{workload: {stack: run}}`` from an ``end-to-end`` recording (or a live result), in the
    order the runs were recorded.

    Raises:
        KeyError: ``record`` has no ``runs``, or a run lacks ``workload`` or ``stack``.
    """
    table: dict = {}
    for run in record["runs"]:
        table.setdefault(run["workload"], {})[run["stack"]] = run
    return table


def running_mean(values: Sequence[float], window: int) -> np.ndarray:
    """Mean of each ``window`` consecutive values (``len - window + 1`` of them)."""
    window = max(1, min(window, len(values)))
    return np.convolve(np.asarray(values, dtype=float), np.ones(window) / window, mode="valid")


@_styled
def plot_end_to_end_losses(record: dict, window: int = 10):
    """Loss per step of every stack, one panel per workload (running mean of ``window`` steps):
    the same model, weights and batches, so the curves must lie on each other.

    Returns: the matplotlib ``Figure``.
    """
    table = by_workload(record)
    fig, axes = _figure(1, len(table), squeeze=False)
    for ax, (workload, runs) in zip(axes[0], table.items()):
        for stack, run in runs.items():
            trend = running_mean(run["losses"], window)
            ax.plot(np.arange(len(trend)) + len(run["losses"]) - len(trend), trend, color=STACK_COLOURS.get(stack),
                    label=stack, linewidth=1.2)
        ax.set(xlabel="training step", ylabel=f"loss, {window}-step mean (nats/token)", title=workload)
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


@_styled
def plot_end_to_end_throughput(record: dict, live: dict | None = None):
    """Real tokens per second of every stack, one panel per workload (live runs hatched beside
    the recorded ones when given).

    Returns: the matplotlib ``Figure``.
    """
    table = by_workload(record)
    live_table = by_workload(live) if live else {}
    fig, axes = _figure(1, len(table), height=3.8, squeeze=False)
    first_names = list(next(iter(table.values()), {}))
    for ax, (workload, runs) in zip(axes[0], table.items()):
        ax.grid(False, axis="y")
        names = list(runs)
        if ax is not axes[0][0] and names == first_names:
            ax.tick_params(labelleft=False)  # the same stacks in the same order: named once, on the left
        values = [runs[n]["tokens_per_s"] / 1e6 for n in names]
        bars = ax.barh(names, values, color=[STACK_COLOURS.get(n) for n in names])
        ax.bar_label(bars, fmt="%.2f", padding=2)
        ax.margins(x=0.15)  # room for the bar labels
        for i, name in enumerate(names):
            if name in live_table.get(workload, {}):
                ax.barh(i, live_table[workload][name]["tokens_per_s"] / 1e6, height=0.3, color="none",
                        edgecolor="black", hatch=LIVE_HATCH, label="live" if i == 0 else None)
        ax.invert_yaxis()
        ax.set(xlabel="throughput (million real tokens/s)", title=workload)
    return fig



# ---------------------------------------------------------------------------------------------
# Linear attention (KDA): overcapture at fixed capacity, the module-level Amdahl study
# ---------------------------------------------------------------------------------------------

#: Series of the ``linear-attention`` suite: the package's Triton KDA and fla's graph-safe chunk_kda.
KDA_COLOURS = {"ours": SERIES_COLOURS["ours"], "fla_graph": SERIES_COLOURS["fla"]}
KDA_LABELS = {"ours": "ours (kda_triton)", "fla_graph": "fla chunk_kda(use_graph=True)"}


@_styled
def plot_kda_overcapture(recorded: dict, live: dict | None = None, goal: float | None = 1.05):
    """The KDA overcapture sweep of the ``linear-attention`` suite: left, forward + backward µs per
    replay of the graph captured at capacity (solid) and of the exact-shape graph (dashed) against
    ``L``; right, their ratio (captured / exact). A live run, if given, is drawn dotted.

    Args:
        recorded: the suite's result, or its ``"overcapture"`` part
            (``{"config": {"T", "N", "M", ...}, "series": {impl: [rows]}, "errors": {...}}``, rows
            from :func:`attn_gym_lite.bench.linear_attention.overcapture_point`).
        live: the same, measured on this machine.
        goal: a ratio drawn as a dotted line (the issue's goal for ours, 1.05x), or ``None``.

    Returns: the matplotlib ``Figure``. A series that failed (its error in ``errors``) is named in
    the title instead of drawn.
    """
    record = recorded.get("overcapture", recorded)
    live_record = (live or {}).get("overcapture", live) if live else None
    fig, (times, ratios) = _figure(1, 2, height=4.0)
    sources = [("recorded", record, RECORDED_STYLE["alpha"], ("-", "--"))]
    if live_record:
        sources.append(("live", live_record, LIVE_STYLE["alpha"], (LIVE_STYLE["linestyle"],) * 2))
    for source, rec, alpha, (solid, dashed) in sources:
        for name, rows in rec.get("series", {}).items():
            colour = KDA_COLOURS.get(name)
            label = KDA_LABELS.get(name, name) + ("" if source == "recorded" else " (live)")
            L = [row["L"] for row in rows]
            times.plot(L, [row["captured_us"] for row in rows], solid, marker="o", ms=3, color=colour,
                       alpha=alpha, label=label)
            times.plot(L, [row["exact_us"] for row in rows], dashed, color=colour, alpha=alpha)
            ratios.plot(L, [row["ratio"] for row in rows], solid, marker="o", ms=3, color=colour, alpha=alpha,
                        label=label)
    ratios.axhline(1.0, color=SERIES_COLOURS["reference"], linewidth=0.8)
    if goal is not None:
        ratios.axhline(goal, color="0.3", linestyle=":", linewidth=1.0, label=f"goal {goal:.2f}x")
    c = record["config"]
    failed = sorted(record.get("errors", {}))
    times.set(xscale="log", yscale="log", xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (µs)",
              title=f"T={c['T']}, N={c['N']}, M={c['M']}, H={c['H']}, K=V={c['K']}"
                    + (f" (failed: {', '.join(failed)})" if failed else ""))
    ratios.set(xscale="log", xlabel="active tokens L (tokens)", ylabel="captured / exact (ratio of times)",
               title="cost of capturing once at capacity")
    _log_ticks(times)
    _log_ticks(ratios, "x")
    times.legend(title="solid: captured, dashed: exact")
    ratios.legend()
    return fig


@_styled
def plot_kda_amdahl(recorded: dict, live: dict | None = None):
    """The module-level Amdahl study of the ``linear-attention`` suite: left, forward + backward µs
    of the KDA core and of the rest of the layer (stacked: their sum is the whole layer) per token
    count ``T``; right, each time relative to its value at the largest ``T``, beside the
    proportional line ``T / T_max``: the gap between the layer's curve and that line is the part of
    its time that does not shrink with the tokens.

    Args:
        recorded: the suite's result, or its ``"amdahl"`` part (``{"config", "points": [rows],
            "summary", "errors"}``, rows from
            :func:`attn_gym_lite.bench.linear_attention.amdahl_point`).
        live: the same, measured on this machine (drawn as dotted lines on the right).

    Returns: the matplotlib ``Figure``.

    Raises:
        ValueError: the record holds no points (every size failed: see its ``errors``).
    """
    record = recorded.get("amdahl", recorded)
    points = sorted(record["points"], key=lambda p: p["T"])
    if not points:
        raise ValueError(f"plot_kda_amdahl: the record holds no points; errors: {record.get('errors')}")
    fig, (bars, scaling) = _figure(1, 2, height=4.0)
    bars.grid(False, axis="x")
    labels = [str(p["T"]) for p in points]
    core = np.array([p["core_us"] for p in points]) / 1e3
    rest = np.array([p["rest_us"] for p in points]) / 1e3
    bars.bar(labels, core, color=KDA_COLOURS["ours"], label="KDA core")
    bars.bar(labels, rest, bottom=core, color="0.7", label="rest of the layer")
    for i, p in enumerate(points):
        bars.text(i, (core[i] + rest[i]) * 1.01, f"core {p['core_share']:.0%}", ha="center", va="bottom")
    c = record["config"]
    bars.set(xlabel="tokens T (tokens, exact shape)", ylabel="fwd+bwd replay (ms)",
             title=f"KDAAttention, hidden {c['hidden_size']}, {c['num_heads']} heads of {c['head_dim']}")
    bars.legend()

    sources = [("recorded", points, RECORDED_STYLE["linestyle"])]
    if live:
        live_points = sorted(live.get("amdahl", live)["points"], key=lambda p: p["T"])
        if live_points:
            sources.append(("live", live_points, LIVE_STYLE["linestyle"]))
    for source, rows, style in sources:
        T = np.array([p["T"] for p in rows], dtype=float)
        for key, colour, name in (("module_us", "0.3", "whole layer"), ("core_us", KDA_COLOURS["ours"], "core")):
            values = np.array([p[key] for p in rows])
            scaling.plot(T, values / values[-1], style, marker="o", ms=3, color=colour,
                         label=name + ("" if source == "recorded" else " (live)"))
    T = np.array([p["T"] for p in points], dtype=float)
    scaling.plot(T, T / T[-1], "--", color=SERIES_COLOURS["reference"], label="proportional to T")
    scaling.set(xscale="log", yscale="log", xlabel="tokens T (tokens)",
                ylabel=f"time / time at T={points[-1]['T']} (ratio)", title="what shrinks with the tokens")
    _log_ticks(scaling)
    scaling.legend()
    return fig


# ---------------------------------------------------------------------------------------------
# Scaling out
# ---------------------------------------------------------------------------------------------

SCALE_OUT_COLOURS = {"eager": SERIES_COLOURS["eager"], "graph": SERIES_COLOURS["graph replay"]}


@_styled
def plot_scale_out(record: dict):
    """The ``scale-out`` suite as a figure: throughput per workload, and where the all-reduce ran.

    Left: tokens per second over all ranks (millions) for each workload, one bar per (mode,
    ``W``) at the median over the timed steps, whiskers from p10 to p90 of the per-step rates
    (the run's ``tokens_per_s_spread``): eager DDP red, captured DDP blue, the single-GPU bar
    lighter; bars at ``W > 1`` carry their scaling efficiency as the suite computed it (the
    record's ``"scaling"`` rows, :func:`attn_gym_lite.bench.scale_out.scaling`). Right, when the
    record holds profiled steps (``"traces"``): each rank's NCCL time per step, split into the part
    that ran beside other kernels (overlapped with the backward) and the part that ran alone.

    Args:
        record: the suite's result (recorded, or a live run: the CPU mode has no traces, and the
            figure then has one panel).

    Returns: the matplotlib ``Figure``.

    Raises:
        ValueError: the record holds no runs (every launch failed: see its ``errors``).
    """
    runs = record.get("runs") or []
    if not runs:
        raise ValueError(f"plot_scale_out: the record holds no runs; errors: {record.get('errors')}")
    workloads = sorted({r["workload"] for r in runs}, key=lambda w: (w != "pretraining", w))
    sizes = sorted({r["world_size"] for r in runs})
    modes = [m for m in ("eager", "graph") if any(r["mode"] == m for r in runs)]
    rate = {(r["workload"], r["world_size"], r["mode"]): r["tokens_per_s"] for r in runs}
    spread = {(r["workload"], r["world_size"], r["mode"]): r.get("tokens_per_s_spread") for r in runs}
    efficiency = {(row["workload"], row["world_size"], row["mode"]): row["efficiency"]
                  for row in record.get("scaling") or [] if "efficiency" in row}
    traces = {key: ranks for key, ranks in (record.get("traces") or {}).items()
              if all("error" not in summary for summary in ranks.values())}
    fig, axes = _figure(1, 2 if traces else 1, height=4.2, squeeze=False)
    bars = axes[0][0]
    bars.grid(False, axis="x")
    slots = [(mode, size) for mode in modes for size in sizes]
    width = 0.8 / len(slots)
    for i, workload in enumerate(workloads):
        for j, (mode, size) in enumerate(slots):
            if (workload, size, mode) not in rate:
                continue
            value = rate[workload, size, mode] / 1e6
            x = i - 0.4 + width * (j + 0.5)
            bars.bar(x, value, width, color=SCALE_OUT_COLOURS[mode], alpha=0.45 if size == 1 else 1.0,
                     label=f"{mode} DDP, {size} GPU{'s' if size > 1 else ''}" if i == 0 else None)
            top = value
            if spread[workload, size, mode] is not None:
                low, high = (spread[workload, size, mode][p] / 1e6 for p in ("p10", "p90"))
                _spread_bars(bars, [x], [low], [high])
                top = max(value, high)
            note = f"W={size}"
            if (workload, size, mode) in efficiency:
                note += f"\n{efficiency[workload, size, mode]:.0%}"
            bars.text(x, top, note, ha="center", va="bottom", fontsize="x-small")
    has_spread = any(v is not None for v in spread.values())
    bars.set(xticks=range(len(workloads)), xticklabels=workloads, xlabel="workload",
             ylabel="throughput, all ranks (million active tokens/s)",
             title="throughput: median step" + (", whiskers p10 to p90" if has_spread else "")
                   + "\n(and scaling efficiency)")
    bars.margins(y=0.25)  # room above the bars for the notes and the legend
    bars.legend(loc="upper left", ncols=2)
    if traces:
        overlap = axes[0][1]
        labels, row = [], 0
        for key, ranks in traces.items():
            for rank, summary in ranks.items():
                hidden = summary["overlap_us_per_step"] / 1e3
                exposed = max(summary["nccl_us_per_step"] / 1e3 - hidden, 0.0)
                colour = SCALE_OUT_COLOURS.get(key.rsplit("/ ", 1)[-1], "tab:blue")
                overlap.barh(row, hidden, color=colour)
                overlap.barh(row, exposed, left=hidden, color="0.3", hatch="//", edgecolor="white")
                labels.append(f"{key}, {rank}")
                row += 1
        overlap.set(yticks=range(len(labels)), yticklabels=labels, xlabel="NCCL kernel time per step (ms)",
                    title="the all-reduce: overlapped or exposed", ylim=(row + 0.7, -0.5))  # a free row for the legend
        overlap.grid(False, axis="y")
        overlap.legend(handles=[Patch(facecolor="0.65", label="beside other kernels (colour: the mode)"),
                                Patch(facecolor="0.3", hatch="//", edgecolor="white", label="alone")],
                       loc="lower center", ncols=2)
    return fig
