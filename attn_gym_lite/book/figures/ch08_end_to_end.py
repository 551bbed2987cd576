"""Chapter 8, putting it together: the ``end-to-end`` suite's losses and throughput per stack."""

import numpy as np

from .ch02_capture import running_mean
from .style import LIVE_HATCH, SERIES_COLOURS, figure, legend_right, styled

# Families share a hue with SERIES_COLOURS: eager reds, torch.compile purples, ours blue and green
# (darker when compiled), varlen_attn in our trainer orange.
STACK_COLOURS = {
    "eager padded": "0.55", "eager packed": SERIES_COLOURS["eager"], "compile": "plum",
    "compile reduce-overhead": SERIES_COLOURS["torch.compile"], "compile reduce-overhead, fixed capacity": "indigo",
    "graph ours": SERIES_COLOURS["ours"], "buckets ours": SERIES_COLOURS["buckets"],
    "compile + graph varlen_attn": SERIES_COLOURS["varlen_attn"], "compile + graph ours": "navy",
    "compile + buckets ours": "darkgreen",
}


def by_workload(record: dict) -> dict:
    """``{workload: {stack: run}}`` of an ``end-to-end`` result, in the order the runs were recorded."""
    table: dict = {}
    for run in record["runs"]:
        table.setdefault(run["workload"], {})[run["stack"]] = run
    return table


@styled
def plot_series(series: dict, *, ylabel: str, title: str, ylim=None, markers: bool = False):
    """One line per named series (values in order) against its index; ``ylabel`` names the unit."""
    fig, ax = figure(height=3.0)
    for name, values in series.items():
        ax.plot(np.asarray(values, dtype=float), "o-" if markers else "-", markersize=3, label=name)
    ax.set(xlabel="step", ylabel=ylabel, title=title, ylim=ylim)
    ax.legend()
    return fig


@styled
def plot_end_to_end_losses(record: dict):
    """Loss per step of every stack, a panel per workload: the same batches, so the curves must agree."""
    table = by_workload(record)
    fig, axes = figure(1, len(table), squeeze=False)
    for ax, (workload, runs) in zip(axes[0], table.items()):
        for stack, run in runs.items():
            trend = running_mean(run["losses"], 10)
            ax.plot(np.arange(len(trend)) + len(run["losses"]) - len(trend), trend, color=STACK_COLOURS.get(stack, "0.7"), label=stack,
                    linewidth=1.2)
        ax.set(xlabel="training step", ylabel="loss, 10-step mean (nats/token)", title=workload)
    legend_right(axes[0][-1])
    return fig


@styled
def plot_end_to_end_throughput(record: dict, live: dict | None = None):
    """Real tokens per second of every stack, a panel per workload (live hatched over it)."""
    table, live_table = by_workload(record), by_workload(live) if live else {}
    fig, axes = figure(1, len(table), height=3.8, squeeze=False)
    first_names = list(next(iter(table.values()), {}))
    for ax, (workload, runs) in zip(axes[0], table.items()):
        ax.grid(False, axis="y")
        names = list(runs)
        if ax is not axes[0][0] and names == first_names:
            ax.tick_params(labelleft=False)  # the same stacks in the same order: named once, on the left
        rates = np.array([runs[n]["tokens_per_s"] for n in names]) / 1e6
        # Whiskers: the slowest and fastest of the repeated passes over the same batches.
        low = [rates[i] - min(runs[n].get("repeats", [rates[i] * 1e6])) / 1e6 for i, n in enumerate(names)]
        high = [max(runs[n].get("repeats", [rates[i] * 1e6])) / 1e6 - rates[i] for i, n in enumerate(names)]
        bars = ax.barh(names, rates, xerr=[low, high], color=[STACK_COLOURS.get(n, "0.7") for n in names])
        ax.bar_label(bars, fmt="%.2f", padding=4)
        ax.margins(x=0.15)
        for i, name in enumerate(names):
            if name in live_table.get(workload, {}):
                ax.barh(i, live_table[workload][name]["tokens_per_s"] / 1e6, height=0.3, color="none", edgecolor="black",
                        hatch=LIVE_HATCH, label="live" if i == 0 else None)
        ax.invert_yaxis()
        ax.set(xlabel="throughput (million real tokens/s)", title=workload)
    return fig
