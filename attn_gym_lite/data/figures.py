"""The data chapter's figures: document lengths, packed batches, and the packing study."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullLocator

from .packing import PackingPolicy
from .study import SEED_PUBLISHED, nearest_rank

__all__ = [
    "plot_length_distribution",
    "plot_policy_batches",
    "plot_packing_study",
    "plot_packing_run",
]

_RULE_COLOURS = {"in-order": "0.4", "first-fit": "tab:blue", "best-fit": "tab:orange"}


def plot_length_distribution(lengths: Sequence[int], *, title: str = "", ax=None):
    """Histogram of document lengths on log-spaced bins, with the p50/p90/p99 lengths marked.

    Args:
        lengths: document lengths in tokens (documents of 0 tokens are not drawn).
        title: the axes title.
    Returns: the matplotlib ``Axes``.
    """
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    positive = [length for length in lengths if length > 0]
    edges = np.logspace(0, np.log10(max(positive)) + 0.05, 60)
    ax.hist(positive, bins=edges, color="tab:blue", alpha=0.8)
    for quantile, style in ((0.5, "-"), (0.9, "--"), (0.99, ":")):
        value = nearest_rank(positive, quantile)
        ax.axvline(value, color="black", linestyle=style, linewidth=1,
                   label=f"p{round(quantile * 100)} = {value:,} tokens")
    ax.set(xscale="log", xlabel="document length (tokens)", ylabel="documents", title=title)
    ax.legend(loc="upper left", fontsize="small")
    return ax


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
    fig, axes = plt.subplots(1, len(policies), figsize=(4 * len(policies), 0.35 * rows + 1.2),
                             sharey=True, squeeze=False)
    for ax, policy, batches in zip(axes[0], policies, runs):
        padding = 0
        for row, batch in enumerate(batches):
            left = 0
            for position in batch:
                ax.barh(row, pieces[position], left=left, color=colours[position % len(colours)],
                        edgecolor="white", linewidth=0.8)
                left += pieces[position]
            ax.barh(row, token_capacity - left, left=left, color="0.9", hatch="//", edgecolor="0.7")
            padding += token_capacity - left
        ax.set(xlim=(0, token_capacity), xlabel="token row",
               title=f"{policy.label}\n{len(batches)} batches, {padding} padding rows")
    axes[0][0].set(ylabel="batch", ylim=(rows - 0.5, -0.5))
    fig.tight_layout()
    return fig


def plot_packing_study(rows: Sequence[dict], *, seed_published: dict = SEED_PUBLISHED):
    """The study as two rows of panels, one column per ``T``.

    Top: mean padding as a percentage of ``T`` against the buffer size ``B`` (log scales; in
    order as a horizontal line). Bottom: p99 and max ``M`` against ``B``, with the guaranteed
    bound ``M <= B``. The seed article's published points are drawn where their ``T`` matches.

    Args:
        rows: :func:`~attn_gym_lite.data.study.packing_study` rows (live or recorded).
        seed_published: the seed's figures (:data:`~attn_gym_lite.data.study.SEED_PUBLISHED`).
    Returns: the matplotlib ``Figure``.
    """
    capacities = sorted({row["T"] for row in rows})
    fig, axes = plt.subplots(2, len(capacities), figsize=(4.2 * len(capacities), 6.4),
                             squeeze=False, sharex=True)
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
        bottom.set(xscale="log", yscale="log", xlabel="candidate buffer B",
                   ylabel="sequences per batch M" if column == 0 else None)
        for ax in (top, bottom):
            ax.set_xticks(sizes, [str(size) for size in sizes])
            ax.xaxis.set_minor_locator(NullLocator())
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles))
            ax.legend(unique.values(), unique.keys(), fontsize="x-small")
    fig.tight_layout()
    return fig


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
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3), gridspec_kw={"width_ratios": [2, 1]})
    left.plot(fill, linewidth=0.7)
    left.set(xlabel="batch", ylabel="L / T (%)", ylim=(0, 102), title="fill of each batch")
    right.hist(sizes, bins=np.arange(0.5, max(sizes) + 1.5), color="tab:orange")
    right.axvline(bound, color="black", linestyle="--", label=f"guaranteed bound {bound}")
    right.set(xlabel="M (sequences in the batch)", ylabel="batches", title="M per batch",
              xlim=(0, max(max(sizes), min(bound, 4 * max(sizes))) + 1))
    right.legend(fontsize="small")
    fig.tight_layout()
    return fig
