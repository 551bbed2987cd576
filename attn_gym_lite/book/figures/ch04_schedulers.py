"""Chapter 4, schedulers: the grids each schedule launches, the overcapture sweeps and throughput."""

import numpy as np
from matplotlib.patches import Rectangle

from ...ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from ...schedule import chunk_capacity, chunk_offsets, decode_chunk, persistent_workers
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


def cta_maps(lengths: list[int], T: int, N: int, C: int, num_sms: int) -> dict[str, list[list[tuple[int, int]]]]:
    """For one head: every CTA each schedule launches, in launch order, and the (sequence, chunk)
    tasks it runs (none: it exits at once). rect is sized for ``max_seqlen = T``, as under a graph."""
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), N)
    offsets = chunk_offsets(cu, C)
    # The flat list, decoded the way the kernels do (binary search over chunk_offsets).
    tasks = [decode_chunk(offsets, cu, f, C)[:2] for f in range(int(offsets[-1]))]
    sizes = [int(s) for s in cu.diff()]
    rect = [[(i, j)] if j * C < sizes[i] else [] for i in range(N) for j in range(-(-T // C))]
    flat = [[tasks[f]] if f < len(tasks) else [] for f in range(chunk_capacity(T, N, C))]
    # A persistent worker strides over the list: w, w + workers, ... (dynamic hands the same list
    # out through a counter instead, so its order is decided at run time).
    workers = persistent_workers(len(flat), num_sms, 1)
    persistent = [tasks[w::workers] for w in range(workers)]
    return {"rect": rect, "flat": flat, "persistent": persistent}


@styled
def plot_cta_maps(maps: dict):
    """One row of boxes per schedule, a box per CTA labelled with the chunks it runs (sequence s,
    chunk c) and coloured by sequence; hatched grey: a CTA that launches only to exit."""
    fig, axes = figure(len(maps), 1, height=0.9 * len(maps) + 0.6)
    widest = max(len(ctas) for ctas in maps.values())
    for ax, (name, ctas) in zip(np.atleast_1d(axes), maps.items()):
        for x, runs in enumerate(ctas):
            idle = not runs
            colour = SERIES_COLOURS["padding"] if idle else f"C{runs[0][0] % 10}"
            ax.add_patch(Rectangle((x + 0.05, 0.05), 0.9, 0.9, facecolor=colour, hatch="//" if idle else None,
                                   edgecolor="0.6" if idle else "white", alpha=1 if idle else 0.45))
            label = "\n".join(f"s{s} c{c}" for s, c in runs) if runs else ""
            ax.text(x + 0.5, 0.5, label, ha="center", va="center", fontsize=7)
        busy = sum(bool(runs) for runs in ctas)
        ax.set(xlim=(0, widest), ylim=(0, 1), xticks=[], yticks=[])
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
        ax.set_title(f"{len(ctas)} CTAs launched, {busy} with work", loc="left", fontsize=8)
        ax.grid(False)
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
    return fig


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
