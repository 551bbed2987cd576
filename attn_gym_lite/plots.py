"""Figures for the book, drawn from recorded results (and, on a GPU, the reader's live run)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch


def plot_packed_batch(cu_seqlens: torch.Tensor, token_capacity: int, ax=None):
    """Draw one packed batch as a strip of ``T`` rows: one colour per sequence, grey padding.

    Args:
        cu_seqlens: int32 ``[N + 1]`` (tail repeating ``L``), any device.
        token_capacity: ``T``, the strip's length in tokens.
    Returns: the matplotlib ``Axes``.
    """
    bounds = cu_seqlens.cpu().tolist()
    ax = ax or plt.subplots(figsize=(10, 1.4))[1]
    colours = plt.get_cmap("tab20").colors
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            ax.barh(0, end - start, left=start, color=colours[i % len(colours)], edgecolor="white", linewidth=0.5)
    active = bounds[-1]
    ax.barh(0, token_capacity - active, left=active, color="0.85", hatch="//", edgecolor="0.6")
    m = sum(e > s for s, e in zip(bounds[:-1], bounds[1:]))
    ax.set(xlim=(0, token_capacity), yticks=[], xlabel="token row")
    ax.set_title(f"T={token_capacity}, L={active}, N={len(bounds) - 1}, M={m}, padding={token_capacity - active}")
    return ax


def plot_hello_world(recorded: dict, live: dict | None = None):
    """Bars of µs per forward+backward, eager versus graph replay, per model size.

    Args:
        recorded: the ``hello_world`` result from ``results/``.
        live: the same suite run on this machine's GPU, drawn beside it when given.
    Returns: the matplotlib ``Figure``.
    """
    sources = [("recorded", recorded)] + ([("live", live)] if live else [])
    runs = recorded["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.5))
    for ax, index in zip(np.atleast_1d(axes), range(len(runs))):
        config = runs[index]["config"]
        labels, values = [], []
        for name, record in sources:
            run = record["runs"][index]
            labels += [f"eager\n{name}", f"replay\n{name}"]
            values += [run["eager_wall_us"], run["replay_wall_us"]]
        bars = ax.bar(labels, values, color=["tab:red", "tab:blue"] * len(sources))
        ax.bar_label(bars, fmt="%.0f")
        ax.set(title=f"dim {config['dim']}, {config['num_heads']} heads, T={config['T']}, N={config['N']}",
               ylabel="µs per fwd+bwd (wall clock)")
    fig.tight_layout()
    return fig


def plot_training_loop(recorded: dict, live: dict | None = None):
    """Loss per step (eager and graph, same batches; faint: per step, bold: running mean) and
    step time, recorded and live.

    Returns: the matplotlib ``Figure``.
    """
    fig, (loss_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 3.5), gridspec_kw={"width_ratios": [2, 1]})
    labels, values = [], []
    for name, record, style in [("recorded", recorded, "-")] + ([("live", live, ":")] if live else []):
        for mode, colour in (("eager", "tab:red"), ("graph", "tab:blue")):
            if mode in record:
                losses = np.asarray(record[mode]["losses"])
                loss_ax.plot(losses, style, color=colour, alpha=0.25, linewidth=0.8)
                # Batches differ (a test file, a parser): a running mean shows the trend.
                window = max(1, min(20, len(losses) // 5))
                trend = np.convolve(losses, np.ones(window) / window, mode="valid")
                loss_ax.plot(np.arange(window - 1, len(losses)), trend, style, color=colour,
                             label=f"{mode} ({name}), {window}-step mean")
                if record[mode]["step_us"] is not None:
                    labels.append(f"{mode}\n{name}")
                    values.append(record[mode]["step_us"] / 1e3)
    loss_ax.set(xlabel="step", ylabel="loss (nats/token)", title="same batches, same initial weights")
    loss_ax.legend()
    bars = time_ax.bar(labels, values, color=["tab:red" if "eager" in l else "tab:blue" for l in labels])
    time_ax.bar_label(bars, fmt="%.2f")
    time_ax.set(ylabel="ms per training step", title="step time (wall clock)")
    fig.tight_layout()
    return fig


def plot_bucket_compute(recorded: dict, live: list[dict] | None = None):
    """Forward + backward replay time versus active tokens ``L``: one graph at ``T`` (flat) versus
    the bucket that fits ``L``. ``recorded`` is the ``buckets`` result; ``live`` a ``compute()``
    list from this machine.

    Returns: the matplotlib ``Figure``.
    """
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, points, style in [("recorded", recorded["compute"], "-")] + ([("live", live, ":")] if live else []):
        ls = [p["L"] for p in points]
        ax.plot(ls, [p["one_graph_us"] / 1e3 for p in points], style + "o", color="tab:red", label=f"one graph at T ({name})")
        ax.plot(ls, [p["bucket_us"] / 1e3 for p in points], style + "o", color="tab:blue", label=f"smallest bucket >= L ({name})")
    ax.set(xscale="log", yscale="log", xlabel="active tokens L", ylabel="ms per fwd+bwd replay",
           title="the projection tax, and what buckets take back")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_padding_versus_buckets(plans: list, samples_mean: float):
    """Expected padded rows (as a fraction of all replayed rows) versus the number of buckets,
    for a list of :class:`attn_gym_lite.buckets.BucketPlan` with k = 1, 2, ...

    Returns: the matplotlib ``Figure``.
    """
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ks = range(1, len(plans) + 1)
    ax.plot(ks, [1 - p.expected_fill for p in plans], "o-")
    for k, plan in zip(ks, plans):
        ax.annotate(",".join(str(c) for c in plan.capacities), (k, 1 - plan.expected_fill),
                    textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.set(xlabel="buckets k", ylabel="padding / replayed rows", xticks=list(ks),
           title=f"plan_buckets on the loader's L (mean {samples_mean:.0f} tokens)")
    fig.tight_layout()
    return fig
