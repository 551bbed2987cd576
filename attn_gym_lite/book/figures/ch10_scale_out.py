"""Chapter 10, scaling out: throughput over the ranks, and where the all-reduce ran."""

from __future__ import annotations

from matplotlib.patches import Patch

from .style import SERIES_COLOURS, figure, spread_bars, styled

MODE_COLOURS = {"eager": SERIES_COLOURS["eager"], "graph": SERIES_COLOURS["graph replay"]}


@styled
def plot_scale_out(record: dict):
    """The ``scale-out`` suite. Left: tokens per second over all ranks for each workload, a bar per
    (mode, ``W``) at the median step, whiskers from p10 to p90 of the per-step rates, the scaling
    efficiency the suite computed over bars at ``W > 1``. Right, when the record holds profiled
    steps (``"traces"``): each rank's NCCL time per step, overlapped with other kernels or alone."""
    runs = record.get("runs") or []
    if not runs:
        raise ValueError(f"plot_scale_out: the record holds no runs; errors: {record.get('errors')}")
    workloads = sorted({r["workload"] for r in runs}, key=lambda w: (w != "pretraining", w))
    sizes = sorted({r["world_size"] for r in runs})
    slots = [(mode, size) for mode in ("eager", "graph") if any(r["mode"] == mode for r in runs) for size in sizes]
    by_key = {(r["workload"], r["mode"], r["world_size"]): r for r in runs}
    efficiency = {(row["workload"], row["mode"], row["world_size"]): row["efficiency"]
                  for row in record.get("scaling") or [] if "efficiency" in row}
    traces = {key: ranks for key, ranks in (record.get("traces") or {}).items()
              if all("error" not in summary for summary in ranks.values())}
    fig, axes = figure(1, 2 if traces else 1, height=4.2, squeeze=False)
    bars = axes[0][0]
    bars.grid(False, axis="x")
    width = 0.8 / len(slots)
    for i, workload in enumerate(workloads):
        for j, (mode, size) in enumerate(slots):
            run = by_key.get((workload, mode, size))
            if run is None:
                continue
            x, value = i - 0.4 + width * (j + 0.5), run["tokens_per_s"] / 1e6
            bars.bar(x, value, width, color=MODE_COLOURS[mode], alpha=0.45 if size == 1 else 1.0,
                     label=f"{mode} DDP, {size} GPU{'s' if size > 1 else ''}" if i == 0 else None)
            top = value
            if run.get("tokens_per_s_spread") is not None:
                low, high = (run["tokens_per_s_spread"][p] / 1e6 for p in ("p10", "p90"))
                spread_bars(bars, [x], [low], [high])
                top = max(value, high)
            note = f"W={size}" + (f"\n{efficiency[workload, mode, size]:.0%}" if (workload, mode, size) in efficiency else "")
            bars.text(x, top, note, ha="center", va="bottom", fontsize="x-small")
    spread = any(r.get("tokens_per_s_spread") is not None for r in runs)
    bars.set(xticks=range(len(workloads)), xticklabels=workloads, xlabel="workload",
             ylabel="throughput, all ranks (million active tokens/s)",
             title="throughput: median step" + (", whiskers p10 to p90" if spread else "") + "\n(and scaling efficiency)")
    bars.margins(y=0.25)  # room above the bars for the notes and the legend
    bars.legend(loc="upper left", ncols=2)
    if traces:
        overlap, labels = axes[0][1], []
        for key, ranks in traces.items():
            for rank, summary in ranks.items():
                hidden = summary["overlap_us_per_step"] / 1e3
                exposed = max(summary["nccl_us_per_step"] / 1e3 - hidden, 0.0)
                overlap.barh(len(labels), hidden, color=MODE_COLOURS.get(key.rsplit("/ ", 1)[-1], "tab:blue"))
                overlap.barh(len(labels), exposed, left=hidden, color="0.3", hatch="//", edgecolor="white")
                labels.append(f"{key}, {rank}")
        overlap.set(yticks=range(len(labels)), yticklabels=labels, xlabel="NCCL kernel time per step (ms)",
                    title="the all-reduce: overlapped or exposed", ylim=(len(labels) + 0.7, -0.5))  # a free row for the legend
        overlap.grid(False, axis="y")
        overlap.legend(handles=[Patch(facecolor="0.65", label="beside other kernels (colour: the mode)"),
                                Patch(facecolor="0.3", hatch="//", edgecolor="white", label="alone")], loc="lower center", ncols=2)
    return fig
