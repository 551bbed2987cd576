"""Chapter 2, graph capture: eager against replay, as bars, loss curves and step timelines."""

import numpy as np
from matplotlib.patches import Patch

from .ch03_profiling import TIMELINE_COLOURS, plot_compact_timeline
from .style import LIVE_HATCH, SERIES_COLOURS, figure, legend_right, sources, spread_bars, styled

EAGER_AND_REPLAY = [SERIES_COLOURS["eager"], SERIES_COLOURS["graph replay"]]


def running_mean(values, window: int) -> np.ndarray:
    """Mean of each ``window`` consecutive values (``len - window + 1`` of them)."""
    window = max(1, min(window, len(values)))
    return np.convolve(np.asarray(values, dtype=float), np.ones(window) / window, mode="valid")


def _eager_and_replay_bars(ax, labels, values, fmt, padding=0):
    # Labels read "<mode>\n<recorded or live>": eager red, replay blue, a live run hatched.
    bars = ax.bar(labels, values, color=[EAGER_AND_REPLAY[0 if label.startswith("eager") else 1] for label in labels],
                  hatch=[LIVE_HATCH if label.endswith("live") else "" for label in labels], edgecolor="white")
    ax.bar_label(bars, fmt=fmt, padding=padding)
    ax.margins(y=0.15)  # room for the bar labels
    ax.grid(False, axis="x")


@styled
def plot_hello_world(recorded: dict, live: dict | None = None):
    """µs per forward + backward, eager against replay, a panel per model size (live bars hatched)."""
    runs = recorded["runs"]
    fig, axes = figure(1, len(runs), squeeze=False)
    for index, ax in enumerate(axes[0]):
        labels, values = [], []
        for name, record, _, _ in sources(recorded, live):
            labels += [f"eager\n{name}", f"replay\n{name}"]
            values += [record["runs"][index]["eager_wall_us"], record["runs"][index]["replay_wall_us"]]
        _eager_and_replay_bars(ax, labels, values, "%.0f")
        c = runs[index]["config"]
        ax.set(title=f"dim {c['dim']}, {c['num_heads']} heads, T={c['T']}, N={c['N']}", ylabel="fwd+bwd, wall clock (µs)")
    return fig


@styled
def plot_training_loop(recorded: dict, live: dict | None = None):
    """Loss per step, eager and graph on the same batches, and the step time (whiskers: its repeat)."""
    fig, (loss_ax, time_ax) = figure(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    labels, values, whiskers = [], [], []
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
                runs = [record[key]["step_us"] / 1e3 for key in (mode, f"{mode}_repeat") if record.get(key, {}).get("step_us") is not None]
                if len(runs) > 1:  # the suite runs each mode twice: the range of the runs
                    whiskers.append((len(labels), min(runs), max(runs)))
                labels.append(f"{mode}\n{name}")
                values.append(runs[0])
    loss_ax.set(xlabel="training step", ylabel="loss (nats/token)", title="same batches, same initial weights")
    loss_ax.legend()
    _eager_and_replay_bars(time_ax, labels, values, "%.2f", padding=4)
    if whiskers:
        spread_bars(time_ax, *zip(*whiskers))
    time_ax.set(ylabel="training step, wall clock (ms)",
                title="step time" + (" (bar: first run,\nwhisker: range of its repeats)" if whiskers else ""))
    return fig


@styled
def plot_hello_world_timelines(recorded: dict):
    """One eager forward + backward above one replay of the same step (``hello-world``'s timelines)."""
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
