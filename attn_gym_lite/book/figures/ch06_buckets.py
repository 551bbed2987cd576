"""Chapter 6, graph buckets: replay time against ``L``, padding per plan, memory at the optimizer step."""

import numpy as np
from matplotlib.ticker import PercentFormatter

from .style import SERIES_COLOURS, figure, legend_right, log_ticks, sources, styled

MIB = 2**20
# The bands of plot_boundary_memory, bottom to top.
MEMORY_BANDS = {"parameters": "tab:blue", "Adam state": "tab:purple", "captured gradient buffers": "tab:orange",
                "fresh gradients": "tab:red", "activations and other": "0.75"}


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
