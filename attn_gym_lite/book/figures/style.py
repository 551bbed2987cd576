"""The one style of the book's figures: one width, one set of fonts, one colour per series. It is
applied per call (``@styled``), never globally: the reader's matplotlib settings stay theirs."""

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

FULL_WIDTH, ROW_HEIGHT = 10.0, 3.6  # inches: every figure as wide, so a font size reads the same everywhere

STYLE = {
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8,
    "legend.fontsize": 8, "legend.title_fontsize": 8, "legend.frameon": False, "figure.titlesize": 11,
    "lines.linewidth": 1.4, "lines.markersize": 4, "axes.linewidth": 0.8, "errorbar.capsize": 2.5,
    "axes.grid": True, "axes.axisbelow": True, "grid.alpha": 0.3, "grid.linewidth": 0.6,
    "axes.spines.top": False, "axes.spines.right": False,
    "figure.dpi": 100, "figure.figsize": (FULL_WIDTH, ROW_HEIGHT), "figure.constrained_layout.use": True,
}

#: The same series has the same colour in every chapter: eager red, a graph replay (and ours) blue.
SERIES_COLOURS = {
    "eager": "tab:red", "graph replay": "tab:blue", "ours": "tab:blue", "varlen_attn": "tab:orange",
    "torch.compile": "tab:purple", "fla": "tab:olive", "buckets": "tab:green", "reference": "0.5",
    "padding": "0.88",
}

#: A live run is drawn in its recording's colour, dotted and lighter (lines) or hatched (bars).
LIVE_LINE, LIVE_ALPHA, LIVE_HATCH = ":", 0.6, "//"


#: Decorates every plot function: the style holds while it runs (text sizes are fixed when a text is
#: made), and the reader's rcParams come back after it.
styled = mpl.rc_context(STYLE)


def figure(nrows=1, ncols=1, height=ROW_HEIGHT, **kw):
    """``plt.subplots`` at the book's width, ``height`` inches tall."""
    return plt.subplots(nrows, ncols, figsize=(FULL_WIDTH, height), layout="constrained", **kw)


def sources(recorded, live):
    """``[(name, record, linestyle, alpha)]``: the recording, then the live run when there is one."""
    return [("recorded", recorded, "-", 1.0)] + ([("live", live, LIVE_LINE, LIVE_ALPHA)] if live else [])


def captured_and_exact(ax, x, rows, colour, label, linestyle="-", alpha=1.0):
    """Overcapture rows: the graph captured at capacity solid, the exact-shape one dashed (live: dotted)."""
    ax.plot(x, [r["captured_us"] for r in rows], linestyle, marker="o", ms=3, color=colour, alpha=alpha, label=label)
    ax.plot(x, [r["exact_us"] for r in rows], "--" if linestyle == "-" else linestyle, color=colour, alpha=alpha,
            label=f"_{label} (exact)")  # "_": not in the legend, but named where a figure shows its values


def legend_right(ax, *args, **kw):
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.0, 1.0), **kw)


def log_ticks(ax, which="xy"):
    """Plain numbers at 1, 2 and 5 times each power of ten: ``2,000`` reads faster than ``2×10³``."""
    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        axis.set_minor_locator(NullLocator())


def spread_bars(ax, x, low, high):
    """Whiskers from ``low`` to ``high`` at ``x``, without markers: the bar stays the median."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    ax.errorbar(x, (low + high) / 2, yerr=(high - low) / 2, fmt="none", ecolor="black", elinewidth=1.0)


def packed_row(ax, y, pieces, token_capacity):
    """A buffer of ``token_capacity`` rows: ``(length, colour index)`` pieces, then hatched padding."""
    colours = plt.get_cmap("tab20").colors
    left = 0
    for length, index in pieces:
        if length > 0:
            ax.barh(y, length, left=left, color=colours[index % len(colours)], edgecolor="white", linewidth=0.6)
        left += length
    ax.barh(y, token_capacity - left, left=left, color=SERIES_COLOURS["padding"], hatch="//", edgecolor="0.6")
    return token_capacity - left
