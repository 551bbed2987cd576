"""Chapter 2, graph capture: eager against replay, as bars, loss curves and step timelines."""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from .ch03_profiling import TIMELINE_COLOURS, plot_compact_timeline
from .style import LIVE_HATCH, SERIES_COLOURS, figure, legend_right, sources, spread_bars, styled

EAGER_AND_REPLAY = [SERIES_COLOURS["eager"], SERIES_COLOURS["graph replay"]]


def running_mean(values, window: int) -> np.ndarray:
    """Mean of each ``window`` consecutive values (``len - window + 1`` of them)."""
    window = max(1, min(window, len(values)))
    return np.convolve(np.asarray(values, dtype=float), np.ones(window) / window, mode="valid")


@styled
def plot_hello_world(recorded: dict, live: dict | None = None):
    """µs per forward + backward, eager against graph replay, one panel per model size of the
    ``hello-world`` recording (a live run's bars hatched beside them)."""
    runs = recorded["runs"]
    fig, axes = figure(1, len(runs), squeeze=False)
    for index, ax in enumerate(axes[0]):
        labels, values, hatches = [], [], []
        for name, record, _, _ in sources(recorded, live):
            run = record["runs"][index]
            labels += [f"eager\n{name}", f"replay\n{name}"]
            values += [run["eager_wall_us"], run["replay_wall_us"]]
            hatches += [LIVE_HATCH if name == "live" else ""] * 2
        bars = ax.bar(labels, values, color=EAGER_AND_REPLAY * (len(labels) // 2), hatch=hatches, edgecolor="white")
        ax.bar_label(bars, fmt="%.0f")
        ax.margins(y=0.12)
        ax.grid(False, axis="x")
        c = runs[index]["config"]
        ax.set(title=f"dim {c['dim']}, {c['num_heads']} heads, T={c['T']}, N={c['N']}", ylabel="fwd+bwd, wall clock (µs)")
    return fig


@styled
def plot_training_loop(recorded: dict, live: dict | None = None):
    """Loss per step, eager and graph on the same batches (faint: per step, bold: running mean),
    and the step time, whiskers spanning a mode's repeated run (``<mode>_repeat``)."""
    fig, (loss_ax, time_ax) = figure(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    labels, values, ranges = [], [], []
    for name, record, linestyle, _ in sources(recorded, live):
        for mode, colour in zip(("eager", "graph"), EAGER_AND_REPLAY):
            if mode not in record:
                continue
            losses = np.asarray(record[mode]["losses"])
            loss_ax.plot(losses, linestyle, color=colour, alpha=0.25, linewidth=0.8)
            window = max(1, min(20, len(losses) // 5))  # batches differ: the running mean shows the trend
            loss_ax.plot(np.arange(window - 1, len(losses)), running_mean(losses, window), linestyle, color=colour,
                         label=f"{mode} ({name}), {window}-step mean")
            if record[mode]["step_us"] is not None:
                labels.append(f"{mode}\n{name}")
                values.append(record[mode]["step_us"] / 1e3)
                runs = [record[key]["step_us"] / 1e3 for key in (mode, f"{mode}_repeat")
                        if record.get(key, {}).get("step_us") is not None]
                ranges.append((min(runs), max(runs), len(runs)))
    loss_ax.set(xlabel="training step", ylabel="loss (nats/token)", title="same batches, same initial weights")
    loss_ax.legend()
    bars = time_ax.bar(labels, values, color=[EAGER_AND_REPLAY[0 if label.startswith("eager") else 1] for label in labels],
                       hatch=[LIVE_HATCH if "live" in label else "" for label in labels], edgecolor="white")
    repeated = [i for i, (_, _, count) in enumerate(ranges) if count > 1]
    if repeated:
        spread_bars(time_ax, repeated, [ranges[i][0] for i in repeated], [ranges[i][1] for i in repeated])
    time_ax.bar_label(bars, fmt="%.2f", padding=4)
    time_ax.margins(y=0.15)
    time_ax.grid(False, axis="x")
    time_ax.set(ylabel="training step, wall clock (ms)",
                title="step time" + (" (bar: first run,\nwhisker: range of its repeats)" if repeated else ""))
    return fig


@styled
def plot_hello_world_timelines(recorded: dict):
    """One eager forward + backward above one graph replay of the same step, on one time axis
    (``recorded["timelines"]`` of ``hello-world``), with launches and GPU busy time in the titles."""
    timelines = recorded["timelines"]
    modes = [m for m in ("eager", "replay") if m in timelines]
    heights = [len(timelines[m]["tracks"]) + 1 for m in modes]
    fig, axes = figure(len(modes), 1, height=0.5 * sum(heights) + 1.4, sharex=True,
                       gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        timeline = timelines[mode]
        counts, span = timeline["counts"], timeline["span_us"]
        busy = counts["device_busy_us"] / span if span else 0.0
        plot_compact_timeline(timeline, ax, title=f"{mode}: {counts['launches']} launches, {counts['device_events']} "
                                                  f"GPU events, GPU busy {busy:.0%} of {span:.0f} µs")
    legend_right(axes[0, 0], handles=[Patch(color=c, label=k) for k, c in TIMELINE_COLOURS.items()])
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig
