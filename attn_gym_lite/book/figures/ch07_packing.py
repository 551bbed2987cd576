"""Chapter 7, data packing: what each policy does to the same pieces, the packing study, one run."""

import numpy as np
from matplotlib.ticker import NullLocator

from ..seed import SEED_PUBLISHED
from .ch01_ragged import plot_length_distribution as plot_length_distribution  # the chapter's histogram too
from .style import figure, legend_right, packed_row, styled

RULE_COLOURS = {"in-order": "0.4", "first-fit": "tab:blue", "best-fit": "tab:orange"}
SEED_MARKERS = {"Dolma 3": "*", "FineWeb sample-10BT": "P"}


@styled
def plot_policy_batches(pieces, policies, token_capacity: int):
    """Each policy's batches of the same pieces; a piece keeps its colour, so reordering shows."""
    runs = [list(policy.batches(pieces, token_capacity)) for policy in policies]
    rows = max(len(batches) for batches in runs)
    fig, axes = figure(1, len(policies), height=0.35 * rows + 1.4, sharey=True, squeeze=False)
    for ax, policy, batches in zip(axes[0], policies, runs):
        ax.grid(False, axis="y")
        padding = sum(packed_row(ax, row, [(pieces[i], i) for i in batch], token_capacity) for row, batch in enumerate(batches))
        ax.set(xlim=(0, token_capacity), xlabel="buffer row (tokens)",
               title=f"{policy.label}\n{len(batches)} batches, {padding} padding rows")
    axes[0][0].set(ylabel="batch (in order)", ylim=(rows - 0.5, -0.5))
    return fig


@styled
def plot_packing_study(rows, *, seed_published: dict = SEED_PUBLISHED):
    """The packing study, a column per ``T``: padding and ``M`` against ``B``, beside the seed's points."""
    capacities = sorted({row["T"] for row in rows})
    fig, axes = figure(2, len(capacities), height=6.4, squeeze=False, sharex=True, sharey="row")
    for column, capacity in enumerate(capacities):
        top, bottom = axes[0][column], axes[1][column]
        here = [row for row in rows if row["T"] == capacity]
        sizes = sorted({row["B"] for row in here if row["B"] is not None})
        for name in ("first-fit", "best-fit"):
            series = [r for _, r in sorted((r["B"], r) for r in here if r["policy"] == name)]
            if not series:
                continue
            xs, colour = [r["B"] for r in series], RULE_COLOURS[name]
            top.plot(xs, [100 * (1 - r["mean_fill"]) for r in series], "o-", color=colour, label=name)
            bottom.fill_between(xs, [r["median_M"] for r in series], [r["max_M"] for r in series], color=colour, alpha=0.12,
                                linewidth=0, label=f"{name} median to max M")
            bottom.plot(xs, [r["p99_M"] for r in series], "o-", color=colour, label=f"{name} p99 M")
            bottom.plot(xs, [r["max_M"] for r in series], "x:", color=colour, alpha=0.7, label=f"{name} max M")
        for row in here:
            if row["policy"] == "in-order":
                top.axhline(100 * (1 - row["mean_fill"]), color=RULE_COLOURS["in-order"], linestyle="--", label="in order")
        if sizes:
            bottom.plot(sizes, sizes, color="black", linewidth=0.8, label="bound M = B")
        for corpus, published in seed_published["corpora"].items():
            for point in (p for p in published["rows"] if p["T"] == capacity):
                top.plot(point["B"], 100 * (1 - point["mean_fill"]), SEED_MARKERS[corpus], color="black", markersize=10,
                         label=f"seed: {corpus}")
                if "p99_M" in point:
                    bottom.plot(point["B"], point["p99_M"], SEED_MARKERS[corpus], color="black", markersize=10,
                                label=f"seed: {corpus} p99 M")
        top.set(xscale="log", yscale="log", title=f"T = {capacity}", ylabel="mean padding (% of T)" if column == 0 else None)
        bottom.set(xscale="log", yscale="log", xlabel="candidate buffer B (pieces)",
                   ylabel="sequences per batch M (sequences)" if column == 0 else None)
        for ax in (top, bottom):
            ax.set_xticks(sizes, [str(size) for size in sizes])
            ax.xaxis.set_minor_locator(NullLocator())
    for row in axes:  # every panel of a row draws the same series: one legend, right of the row
        unique = {}
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                unique.setdefault(label, handle)
        legend_right(row[-1], unique.values(), unique.keys())
    return fig


@styled
def plot_packing_run(batch_lengths, token_capacity: int, bound: int):
    """One packing run: the fill of every batch, and the histogram of ``M`` beside its ``bound``."""
    fill = [100 * sum(batch) / token_capacity for batch in batch_lengths]
    sizes = [len(batch) for batch in batch_lengths]
    fig, (left, right) = figure(1, 2, height=3.0, gridspec_kw={"width_ratios": [2, 1]})
    left.plot(fill, linewidth=0.7, color="0.3")
    left.set(xlabel="batch (in order)", ylabel="fill L / T (%)", ylim=(0, 102), title="fill of each batch")
    right.hist(sizes, bins=np.arange(0.5, max(sizes) + 1.5), color="0.45")
    right.axvline(bound, color="black", linestyle="--", label=f"guaranteed bound {bound}")
    right.set(xlabel="M (sequences in the batch)", ylabel="batches (count)", title="M per batch",
              xlim=(0, max(max(sizes), min(bound, 4 * max(sizes))) + 1))
    right.legend()
    return fig

