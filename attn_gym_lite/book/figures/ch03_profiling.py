"""Chapter 3, profiling: a trace's GPU side, capture-order labelling, the compact step timeline, the
phases of one step."""

import matplotlib.pyplot as plt
from matplotlib.patches import ConnectionPatch, Patch

from ...profiling.annotate import REGION_CATEGORY, REGION_TRACK_OFFSET, annotate_trace
from ...profiling.summary import device_events
from ...profiling.trace import LANE_TID_BASE
from .style import figure, legend_right, styled

GREY = (0.6, 0.6, 0.6, 1.0)
#: Rows of a compact timeline: host ops, kernel launches, other runtime calls, device events.
TIMELINE_COLOURS = {"host": "tab:blue", "launch": "tab:orange", "runtime": "0.6", "device": "tab:green"}


def _row_order(tid) -> tuple:
    # Streams in id order, each with its region track first and its extra lanes after.
    if not isinstance(tid, int):
        return (float("inf"), 0, 0)
    lane, base = divmod(tid, LANE_TID_BASE)
    is_regions = base >= REGION_TRACK_OFFSET
    return (base - REGION_TRACK_OFFSET if is_regions else base, 0 if is_regions else 1, lane)


def _region_colours(regions) -> dict:
    # tab20 comes in dark/light pairs: a region is dark, its backward the light shade of it.
    bases = sorted({r.removesuffix(" backward") or r for r in regions})
    return {r: plt.get_cmap("tab20")((2 * bases.index(r.removesuffix(" backward") or r) + r.endswith(" backward")) % 20)
            for r in regions}


@styled
def plot_timeline(trace: dict, ax=None, *, title: str | None = None, start_us: float | None = None,
                  end_us: float | None = None):
    """A Chrome trace's GPU side: a row per stream and region track, a box per event coloured by region."""
    events = device_events(trace)
    if not events:
        raise ValueError("plot_timeline: the trace has no kernel, memcpy or memset events (a trace recorded without a GPU has none)")
    origin = events[0]["ts"]
    every = trace.get("traceEvents", [])
    boxes = [e for e in every if e.get("cat") == REGION_CATEGORY and e.get("ph") == "X"]
    names = {e.get("tid"): str(e.get("args", {}).get("name")) for e in every if e.get("ph") == "M" and e.get("name") == "thread_name"}
    shown = events + boxes
    rows = {tid: row for row, tid in enumerate(sorted({e.get("tid") for e in shown}, key=_row_order, reverse=True))}
    regions = sorted({str(e["args"]["region"]) for e in shown if e.get("args", {}).get("region")})
    colours = _region_colours(regions)
    columns = 1 if len(regions) < 6 else 2
    if ax is None:  # tall enough for the rows and for the legend (about 0.2 inch an entry)
        ax = figure(height=max(1.0 + 0.5 * len(rows), 0.8 + 0.2 * -(-(len(regions) + 1) // columns) if regions else 0))[1]
    ax.grid(False, axis="y")
    for event in shown:
        region = event.get("args", {}).get("region")
        ax.broken_barh([(event["ts"] - origin, max(event["dur"], 1e-3))], (rows[event.get("tid")] - 0.4, 0.8),
                       facecolors=colours[str(region)] if region else GREY,
                       edgecolors="white" if event.get("cat") == REGION_CATEGORY else "none", linewidth=0.3)
    ax.set(yticks=list(rows.values()), yticklabels=[names.get(tid, f"stream {tid}") for tid in rows],
           xlabel="time from the first GPU event (µs)", title=title or "")
    ax.set_xlim(start_us, end_us)  # None keeps that side's limit
    if regions:
        legend_right(ax, handles=[Patch(color=colours[r], label=r) for r in regions] + [Patch(color=GREY, label="(unlabelled)")],
                     ncols=columns)
    return ax


@styled
def plot_timelines(traces, titles, *, start_us: float | None = None, end_us: float | None = None):
    """Several traces (:func:`plot_timeline`), one above the other on a shared time axis."""
    fig, axes = figure(len(traces), 1, height=2.3 * len(traces), sharex=True, squeeze=False)
    for ax, trace, title in zip(axes[:, 0], traces, titles):
        plot_timeline(trace, ax=ax, title=title, start_us=start_us, end_us=end_us)
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


@styled
def plot_compact_timeline(timeline: dict, ax=None, *, title: str | None = None):
    """A :func:`~attn_gym_lite.profiling.compact.compact_timeline`, a row per track; nested host slices thinner."""
    tracks, events = timeline["tracks"], timeline["events"]
    deepest = 1 + max(e[2] for e in events)
    ax = ax or figure(height=1.0 + 0.5 * len(tracks))[1]
    ax.grid(False, axis="y")
    for name, track, depth, start, duration in events:
        kind = tracks[track]
        colour = TIMELINE_COLOURS["device" if kind.startswith("GPU") else "host" if not kind.startswith("CUDA")
                                  else "launch" if "Launch" in name else "runtime"]
        height = 0.8 * (1 - depth / (deepest + 1))
        row = len(tracks) - 1 - track  # the first track on top
        ax.broken_barh([(start, max(duration, 1e-3))], (row - height / 2, height), facecolors=colour,
                       edgecolors="white", linewidth=0.2)
    ax.set(yticks=range(len(tracks)), yticklabels=tracks[::-1], xlabel="time from the first event (µs)", title=title or "")
    return ax


@styled
def plot_host_phases(phases: dict):
    """Each phase's host span (solid) and GPU span (hatched), and a flame chart of the longest one."""
    order, longest, flame = phases["order"], phases["longest"], phases["flame"]
    fig, (phase_ax, flame_ax) = figure(2, 1, height=5 + 0.4 * len(order), gridspec_kw={"height_ratios": [len(order) + 1, 6]})
    colours = plt.get_cmap("tab10")
    for row, name in enumerate(order):
        span, y = phases["phases"][name], len(order) - 1 - row
        phase_ax.broken_barh([(span["start_us"], max(span["dur_us"], 1e-3))], (y - 0.35, 0.35), facecolors=colours(row))
        if span["gpu_start_us"] is not None:
            phase_ax.broken_barh([(span["gpu_start_us"], max(span["gpu_end_us"] - span["gpu_start_us"], 1e-3))], (y, 0.35),
                                 facecolors="none", edgecolors=colours(row), hatch="///")
    phase_ax.set(yticks=range(len(order)), yticklabels=order[::-1], xlabel="time from the step's start (µs)",
                 title="host span (solid) and GPU span (hatched) per phase")
    duration = phases["phases"][longest]["dur_us"]
    for name, depth, start, length in flame:
        flame_ax.broken_barh([(start, length)], (-depth - 0.9, 0.9), facecolors=colours(order.index(longest)),
                             edgecolors="white", linewidth=0.3, alpha=0.55)
        if length > 0.12 * duration:
            flame_ax.text(start + length / 2, -depth - 0.45, name.rsplit("/", 1)[-1][:40], ha="center", va="center",
                          fontsize=6, clip_on=True)
    flame_ax.set(xlim=(0, duration), ylim=(-(1 + max((f[1] for f in flame), default=0)) - 0.2, 0.2), yticks=[])
    stacks = "Python frames and ops" if phases["stacks"] else "ops (no Python stacks recorded)"
    flame_ax.set(xlabel=f"time from the start of {longest!r} (µs)", title=f"longest phase, {longest!r}: {stacks}")
    for ax in (phase_ax, flame_ax):
        ax.grid(False, axis="y")
    return fig


@styled
def plot_capture_order(annotations, stock_trace: dict):
    """Capture-order labelling: the launches of the profiled capture in order, each with the region open
    around it; the first replay of the stock trace, whose kernels carry no names; the same replay after
    :func:`~attn_gym_lite.profiling.annotate_trace`. A line joins the k-th launch to the k-th replayed
    kernel, the label it hands on."""
    ops = annotations.graphs[0]["ops"]
    labelled = annotate_trace(stock_trace, annotations)
    first = min((e for e in labelled["traceEvents"] if e.get("name") == "cudaGraphLaunch"), key=lambda e: e["ts"])
    replay = sorted((e for e in device_events(labelled) if e["args"].get("correlation") == first["args"]["correlation"]),
                    key=lambda e: e["ts"])
    origin = replay[0]["ts"]
    colours = _region_colours(sorted({label for _, label in ops if label}))
    fig, (launches, stock, named) = figure(3, 1, height=4.6)
    for k, (_, label) in enumerate(ops):
        launches.broken_barh([(k, 0.8)], (0, 1), facecolors=colours.get(label, GREY))
    for event in replay:
        span = [(event["ts"] - origin, max(event["dur"], 0.5))]
        stock.broken_barh(span, (0, 1), facecolors=GREY)
        named.broken_barh(span, (0, 1), facecolors=colours.get(event["args"].get("region"), GREY))
    for k, event in enumerate(replay[:len(ops)]):  # the k-th launch labels the k-th replayed kernel
        fig.add_artist(ConnectionPatch((k + 0.4, 0), (event["ts"] - origin + event["dur"] / 2, 1), "data", "data",
                                       axesA=launches, axesB=stock, color="0.4", linewidth=0.4, alpha=0.6))
    launches.set(xlim=(0, len(ops)), xlabel="launch k, in capture order",
                 title="each captured launch hands its region to the kernel at the same position of every replay")
    for ax in (stock, named):
        ax.set_xlabel("time from the replay's first kernel (µs)")
    end = max(e["ts"] + e["dur"] for e in replay) - origin
    for ax, name in ((launches, "capture\n(profiled once)"), (stock, "one replay,\nstock trace"),
                     (named, "after\nannotate_trace")):
        ax.set(yticks=[0.5], yticklabels=[name], ylim=(0, 1))
        ax.grid(False)
    for ax in (stock, named):
        ax.set_xlim(0, end)
    legend_right(named, handles=[Patch(color=c, label=r) for r, c in colours.items()], ncols=2 if len(colours) > 6 else 1)
    return fig
