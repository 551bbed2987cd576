"""Figures for the Schedulers chapter: grid sizes of the three schedules, and the recorded sweeps of
the ``schedulers`` benchmark suite (captured graph solid, exact-shape graph dashed)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .schedule import G_active, G_rect, chunk_capacity, persistent_workers

# One colour per implementation, the same in every figure.
COLOURS = {"varlen_attn": "tab:red", "rect": "tab:orange", "flat": "tab:green", "persistent": "tab:blue",
           "persistent+zero": "tab:purple"}

# The three sweeps: what the x axis is, and how to read it from a row.
SWEEPS = {
    "fragmentation": ("active sequences M (L fixed)", lambda row: row["M"]),
    "overcapture": ("active tokens L (M fixed)", lambda row: row["L"]),
    "constant": ("active fraction M/N = L/T (128 tokens each)", None),
}


def grid_sizes(T: int, N: int, lengths, C: int, heads: int, num_sms: int, ctas_per_sm: int = 1) -> dict:  # noqa: N803
    """CTAs each schedule launches for one layout, and how many of them have work.

    Args:
        T, N: token and sequence capacity of the captured graph.
        lengths: the active sequence lengths (``M`` ints, ``sum <= T``).
        C: chunk size; heads: attention heads; num_sms, ctas_per_sm: the persistent grid's cap.

    Returns:
        ``{"active": G_active * heads, "rect": ..., "flat": ..., "persistent": ...}`` in CTAs, where
        rect is sized with ``max_seqlen = T`` as a graph captured for the worst case must be.
    """
    active = G_active(lengths, C) * heads
    return {
        "active": active,
        "rect": G_rect(N, T, C) * heads,
        "flat": chunk_capacity(T, N, C) * heads,
        "persistent": persistent_workers(chunk_capacity(T, N, C) * heads, num_sms, ctas_per_sm),
    }


def plot_grid_sizes(sizes: dict, ax=None):
    """Bars of launched CTAs per schedule (log scale), split into CTAs with work and CTAs that exit
    at once. A persistent worker runs several tasks, so it has no idle part while tasks remain.

    Returns: the matplotlib ``Axes``.
    """
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    names = ["rect", "flat", "persistent"]
    launched = np.array([sizes[n] for n in names], dtype=float)
    working = np.minimum(launched, sizes["active"])
    ax.barh(names, working, color=[COLOURS[n] for n in names], label="CTAs with work")
    ax.barh(names, launched - working, left=working, color="0.85", hatch="//", edgecolor="0.6",
            label="CTAs that exit at once")
    for y, (total, busy) in enumerate(zip(launched, working)):
        ax.text(total, y, f" {int(total):,} launched, {int(total - busy):,} wasted", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(1, launched.max() * 30)
    ax.set_xlabel(f"CTAs (active tasks: {sizes['active']:,})")
    ax.legend(loc="upper right", fontsize=8)
    return ax


def _x(sweep: str, record: dict, row: dict) -> float:
    if sweep == "constant":
        return row["M"] / record[sweep]["N"]
    return SWEEPS[sweep][1](row)


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
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.3 * len(sweeps), 4.5), squeeze=False)
    axes = axes[0]
    for ax, sweep in zip(axes, sweeps):
        sources = [("recorded", recorded, 1.0)] + ([("live", live, 0.5)] if live and sweep in live else [])
        for source, record, alpha in sources:
            for name, rows in record[sweep]["series"].items():
                if implementations and name not in implementations:
                    continue
                x = [_x(sweep, record, row) for row in rows]
                label = name if source == "recorded" else f"{name} (live)"
                style = ("-", "--") if source == "recorded" else (":", ":")
                ax.plot(x, [row["captured_us"] for row in rows], style[0], marker="o", ms=3,
                        color=COLOURS[name], alpha=alpha, label=label)
                ax.plot(x, [row["exact_us"] for row in rows], style[1], color=COLOURS[name], alpha=alpha)
        c = recorded[sweep]
        ax.set(xscale="log", yscale="log", xlabel=SWEEPS[sweep][0], ylabel="µs per fwd+bwd replay",
               title=f"{sweep}: T={c['T']}, N={c['N']}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, title="solid: captured, dashed: exact", title_fontsize=8)
    fig.tight_layout()
    return fig


def plot_throughput(recorded: dict):
    """Exact-shape TFLOP/s per implementation, forward and forward+backward, for each layout.

    Returns: the matplotlib ``Figure``.
    """
    tables = recorded["throughput"]
    fig, axes = plt.subplots(1, len(tables), figsize=(4 * len(tables), 3.5), sharey=True)
    for ax, (layout, table) in zip(np.atleast_1d(axes), tables.items()):
        names = list(table)
        x = np.arange(len(names))
        for offset, (metric, hatch) in zip((-0.2, 0.2), (("fwd", ""), ("fwd_bwd", "//"))):
            values = [table[n][f"{metric}_tflops"] for n in names]
            bars = ax.bar(x + offset, values, 0.4, color=[COLOURS[n] for n in names], hatch=hatch,
                          edgecolor="white", label=metric.replace("_", "+"))
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(x, names, rotation=20)
        ax.set_title(layout, fontsize=9)
    np.atleast_1d(axes)[0].set_ylabel("TFLOP/s (exact-shape graph)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    return fig
