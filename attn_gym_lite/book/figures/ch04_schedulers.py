"""Chapter 4, schedulers: the grids each schedule launches, the overcapture sweeps and throughput."""

import numpy as np

from .style import SERIES_COLOURS, captured_and_exact, figure, legend_right, log_ticks, sources, styled

# torch's varlen_attn keeps its colour of every chapter; ours are the blues, dense kernels greys.
COLOURS = {"varlen_attn": SERIES_COLOURS["varlen_attn"], "rect": "tab:brown", "flat": "tab:green",
           "persistent": SERIES_COLOURS["ours"], "dynamic": "tab:cyan", "default": "black", "persistent+zero": "navy",
           "sdpa_flash": "0.35", "sdpa_cudnn": "0.55", "sdpa_efficient": "0.75"}

# The three sweeps of the ``schedulers`` suite: the x axis, and its value for a row.
SWEEPS = {
    "fragmentation": ("active sequences M (sequences; L fixed)", lambda record, row: row["M"]),
    "overcapture": ("active tokens L (tokens; M fixed)", lambda record, row: row["L"]),
    "constant": ("active fraction M/N = L/T (128 tokens each)", lambda record, row: row["M"] / record["N"]),
}


@styled
def plot_grid_sizes(sizes: dict):
    """CTAs each schedule launches (:func:`~attn_gym_lite.schedule.grid_sizes`): with work, or exiting at once."""
    ax = figure(height=3.0)[1]
    ax.grid(False, axis="y")
    names = ["rect", "flat", "persistent"]
    launched = np.array([sizes[n] for n in names], dtype=float)
    working = np.minimum(launched, sizes["active"])
    ax.barh(names, working, color=[COLOURS[n] for n in names], label="CTAs with work")
    ax.barh(names, launched - working, left=working, color=SERIES_COLOURS["padding"], hatch="//", edgecolor="0.6",
            label="CTAs that exit at once")
    for y, (total, busy) in enumerate(zip(launched, working)):
        ax.text(total, y, f" {int(total):,} launched, {int(total - busy):,} wasted", va="center")
    ax.set(xscale="log", xlim=(1, launched.max() * 30), xlabel=f"thread blocks launched (CTAs; active tasks: {sizes['active']:,})")
    ax.legend(loc="upper right")
    return ax


@styled
def plot_sweeps(recorded: dict, live: dict | None = None):
    """The ``schedulers`` sweeps, a panel each: replay µs captured at capacity (solid) and exact (dashed)."""
    sweeps = [sweep for sweep in SWEEPS if sweep in recorded]
    axes = figure(1, len(sweeps), height=4.2, squeeze=False)[1][0]
    for ax, sweep in zip(axes, sweeps):
        xlabel, x = SWEEPS[sweep]
        for name, record, linestyle, alpha in sources(recorded, live if live and sweep in live else None):
            for impl, rows in record[sweep]["series"].items():
                captured_and_exact(ax, [x(record[sweep], row) for row in rows], rows, COLOURS[impl],
                                   impl if name == "recorded" else f"{impl} (live)", linestyle, alpha)
        c = recorded[sweep]
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="fwd+bwd replay (µs)", title=f"{sweep}: T={c['T']}, N={c['N']}")
        log_ticks(ax)
    legend_right(axes[-1], *axes[0].get_legend_handles_labels(), title="solid: captured,\ndashed: exact")
    return axes[0].figure


@styled
def plot_throughput(recorded: dict):
    """Exact-shape TFLOP/s per implementation, forward and forward + backward, per layout."""
    tables = recorded["throughput"]
    ncols = min(2, len(tables))  # two layouts a row leave room for the names
    nrows = -(-len(tables) // ncols)
    fig, axes = figure(nrows, ncols, height=3.3 * nrows, sharey=True, squeeze=False)
    for ax, (layout, table) in zip(axes.ravel(), tables.items()):
        names = list(table)
        x = np.arange(len(names))
        for offset, metric, hatch in ((-0.2, "fwd", ""), (0.2, "fwd_bwd", "//")):
            bars = ax.bar(x + offset, [table[n][f"{metric}_tflops"] for n in names], 0.4, color=[COLOURS[n] for n in names],
                          hatch=hatch, edgecolor="white", label=metric.replace("_", "+"))
            ax.bar_label(bars, fmt="%.0f", fontsize="x-small")
        ax.set_xticks(x, names, rotation=30, ha="right", rotation_mode="anchor")
        ax.grid(False, axis="x")
        ax.set_title(layout)
    for ax in axes.ravel()[len(tables):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("exact-shape graph (TFLOP/s)")
    axes[0, 0].legend()
    return fig
