"""Chapter 6, graph buckets: replay time against ``L``, padding per plan, the shared pool, memory at the optimizer step."""

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from .style import SERIES_COLOURS, figure, legend_right, log_ticks, sources, styled

MIB = 2**20
# The bands of plot_boundary_memory, bottom to top.
MEMORY_BANDS = {"parameters": "tab:blue", "Adam state": "tab:purple", "captured gradient buffers": "tab:orange",
                "fresh gradients": "tab:red", "activations and other": "0.75"}
# The tensors of plot_shared_pool, one colour each in both panels: the output buffer and the last
# intermediate are different memory, so they get different colours.
TENSOR_COLOURS = ("tab:cyan", "tab:olive", "tab:blue", "tab:orange", "tab:purple", "tab:brown")


@styled
def plot_bucket_compute(recorded: dict, live: list[dict] | None = None):
    """Replay time against ``L``: one graph at ``T`` against the smallest bucket that fits ``L``."""
    fig, ax = figure()
    for name, points, linestyle, alpha in sources(recorded["compute"], live):
        ls = [p["L"] for p in points]
        for key, colour, label in (("one_graph_us", "graph replay", "one graph at T"), ("bucket_us", "buckets", "smallest bucket >= L")):
            ax.plot(ls, [p[key] / 1e3 for p in points], linestyle, marker="o", color=SERIES_COLOURS[colour], alpha=alpha,
                    label=f"{label} ({name})")
    ax.set(xscale="log", yscale="log", xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (ms)",
           title="the projection tax, and what buckets take back")
    log_ticks(ax)
    ax.legend()
    return fig


@styled
def plot_padding_versus_buckets(plans: list, samples_mean: float):
    """The expected padding of bucket plans with k = 1, 2, ... buckets, and the capacities each chose."""
    fig, (ax, ladder) = figure(1, 2, height=3.4, gridspec_kw={"width_ratios": [3, 2]})
    ks = list(range(1, len(plans) + 1))
    padding = [1 - p.expected_fill for p in plans]
    ax.plot(ks, padding, "o-", color=SERIES_COLOURS["buckets"])
    for k, value in zip(ks, padding):
        ax.annotate(f"{value:.1%}", (k, value), textcoords="offset points", xytext=(0, 7), ha="center")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set(xlabel="buckets k", ylabel="padded rows (% of replayed rows)", xticks=ks, xlim=(0.5, len(ks) + 0.5),
           ylim=(0, max(padding) * 1.25 or 1), title=f"plan_buckets on the loader's L\n(mean {samples_mean:.0f} tokens)")
    for k, plan in zip(ks, plans):
        ladder.scatter([k] * len(plan.capacities), plan.capacities, marker="_", s=300, color=SERIES_COLOURS["buckets"])
    ladder.set(xlabel="buckets k", ylabel="capacity T (tokens)", xticks=ks, xlim=(0.5, len(ks) + 0.5), title="the capacities chosen")
    return fig


@styled
def plot_shared_pool(capacities, buffers: dict[str, int], intermediates: dict[str, int], pool_bytes: int | None = None):
    """GraphBuckets' memory, a row per bucket in capture order (largest first). Left: the max-sized
    input and output ``buffers`` (bytes per token), outside the pool, each bucket a prefix view
    ``[:T]``. Right: each capture's ``intermediates`` (bytes per token) in the one shared pool, drawn
    packed from its start (which freed blocks the allocator hands each tensor is its choice); the
    pool is the largest capture's, or ``pool_bytes`` where a measurement gives it."""
    order = sorted(set(capacities), reverse=True)  # GraphBuckets captures reversed(sorted(capacities))
    top, last = order[0], len(order) - 1
    spans = {"buffers": sum(buffers.values()) * top, "pool": max(sum(intermediates.values()) * top, pool_bytes or 0)}
    fig, (left, right) = figure(1, 2, height=0.45 * len(order) + 1.6, sharey=True,
                                gridspec_kw={"width_ratios": list(spans.values())})
    colours = dict(zip([*buffers, *intermediates], TENSOR_COLOURS * 2))
    for row, capacity in enumerate(order):
        start = 0  # separate allocations, drawn side by side, each from its own row 0
        for name, per_token in buffers.items():
            left.barh(row, per_token * top / MIB, left=start / MIB, color=SERIES_COLOURS["padding"], edgecolor="0.6",
                      gid="unused rows", label="buffer rows past the view" if (row, start) == (last, 0) else None)
            left.barh(row, per_token * capacity / MIB, left=start / MIB, color=colours[name], gid=name, label=name if row == 0 else None)
            start += per_token * top
        # A later capture finds the pool already reserved: what it does not use stays held, idle.
        right.barh(row, spans["pool"] / MIB, color=SERIES_COLOURS["padding"], hatch="//", edgecolor="0.6", gid="pool",
                   label="pool held, idle in this bucket" if row == last else None)
        start = 0
        for name, per_token in intermediates.items():
            right.barh(row, per_token * capacity / MIB, left=start / MIB, color=colours[name], gid=name,
                       label=name if row == 0 else None)
            start += per_token * capacity
    if pool_bytes:
        right.axvline(pool_bytes / MIB, color="black", linestyle=":", linewidth=1, label=f"pool measured: {pool_bytes / MIB:,.0f} MiB")
    left.set(yticks=range(len(order)), yticklabels=[f"{i + 1}. T = {c:,}" for i, c in enumerate(order)], ylim=(last + 0.5, -0.5),
             ylabel="bucket, in capture order", xlabel="offset in the buffers (MiB)",
             title="input and output buffers, outside the pool:\nevery bucket a prefix view [:T]")
    right.set(xlabel="offset in the shared pool (MiB)",
              title="one pool, sized by the first capture:\nthe later ones reuse its freed blocks")
    for ax in (left, right):
        ax.grid(False, axis="y")
    handles = [h for ax in (left, right) for h in ax.get_legend_handles_labels()[0]]
    legend_right(right, handles=sorted(handles, key=lambda h: isinstance(h, Line2D)))  # the tensors first, as drawn
    return fig


def boundary_memory_bands(mode_record: dict) -> dict[str, np.ndarray]:
    """Bytes per timeline point of each band: what was allocated before the step stays flat, the
    fresh gradients are the tagged allocations, the rest of the total is everything else."""
    before, timeline = mode_record["before"], mode_record["timeline"]
    total = before["allocated_bytes"] + np.asarray(timeline["allocated_bytes"], dtype=np.float64)
    flat = {"parameters": "parameter_bytes", "Adam state": "optimizer_state_bytes", "captured gradient buffers": "captured_gradient_bytes"}
    bands = {name: np.full_like(total, before[key]) for name, key in flat.items()}
    bands["fresh gradients"] = np.asarray(timeline["tags"]["fresh gradients"], dtype=np.float64)
    bands["activations and other"] = np.clip(total - sum(bands.values()), 0, None)
    return bands


@styled
def plot_boundary_memory(recorded: dict):
    """Allocated MiB over one step at the optimizer boundary, a panel per mode (red over orange: gradients twice)."""
    record = recorded.get("optimizer_boundary_memory", recorded)
    modes = [m for m in record if isinstance(record[m], dict) and "timeline" in record[m]]
    fig, axes = figure(1, len(modes), height=3.8, sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        bands = boundary_memory_bands(record[mode])
        ax.stackplot(record[mode]["timeline"]["entry"], *[bands[name] / MIB for name in MEMORY_BANDS], labels=list(MEMORY_BANDS),
                     colors=list(MEMORY_BANDS.values()), step="post")
        ax.axvline(record[mode]["marked_entry"], color="black", linestyle=":", linewidth=1)
        ax.set(xlabel="allocator event (index in the step)", title=f"{mode}\npeak {record[mode]['peak_allocated_bytes'] / MIB:,.0f} MiB")
    axes[0, 0].set_ylabel("allocated (MiB)")
    legend_right(axes[0, -1])
    return fig
