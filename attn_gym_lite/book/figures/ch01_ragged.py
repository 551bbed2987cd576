"""Chapter 1, ragged tensors: one packed batch, and the lengths of a corpus's documents."""

import numpy as np

from ...data.study import nearest_rank
from .style import figure, packed_row, styled


@styled
def plot_packed_batch(cu_seqlens, token_capacity: int):
    """One packed batch (``cu_seqlens``, int32 ``[N + 1]``, any device) as a strip of ``T`` rows."""
    bounds = cu_seqlens.cpu().tolist()
    ax = figure(height=1.5)[1]
    ax.grid(False)  # the sequence boundaries are the lines to see
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    padding = packed_row(ax, 0, [(length, i) for i, length in enumerate(lengths)], token_capacity)
    ax.set(xlim=(0, token_capacity), yticks=[], xlabel="buffer row (tokens)")
    ax.set_title(f"T={token_capacity}, L={bounds[-1]}, N={len(lengths)}, M={sum(n > 0 for n in lengths)}, padding={padding}")
    return ax


@styled
def plot_length_distribution(lengths, *, title: str = ""):
    """Histogram of document lengths (tokens) on log-spaced bins, the p50/p90/p99 lengths marked."""
    ax = figure(height=3.0)[1]
    positive = [length for length in lengths if length > 0]
    ax.hist(positive, bins=np.logspace(0, np.log10(max(positive)) + 0.05, 60), color="0.45")
    for quantile, linestyle in ((0.5, "-"), (0.9, "--"), (0.99, ":")):
        value = nearest_rank(positive, quantile)
        ax.axvline(value, color="black", linestyle=linestyle, linewidth=1, label=f"p{round(quantile * 100)} = {value:,} tokens")
    ax.set(xscale="log", xlabel="document length (tokens)", ylabel="documents", title=title)
    ax.legend(loc="upper left")
    return ax
