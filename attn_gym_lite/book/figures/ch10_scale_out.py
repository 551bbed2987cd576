"""Chapter 10, scaling out: throughput over the ranks, and where the all-reduce ran."""

from matplotlib.patches import Patch

from .style import SERIES_COLOURS, figure, spread_bars, styled

MODE_COLOURS = {"eager": SERIES_COLOURS["eager"], "graph": SERIES_COLOURS["graph replay"]}


@styled
def plot_scale_out(record: dict):
    """Throughput per (workload, mode, ``W``) with its spread and efficiency; each rank's NCCL time."""
    runs = record.get("runs") or []
    if not runs:
        raise ValueError(f"plot_scale_out: the record holds no runs; errors: {record.get('errors')}")
    workloads = sorted({r["workload"] for r in runs}, key=lambda w: (w != "pretraining", w))
    slots = sorted({(r["mode"], r["world_size"]) for r in runs})  # eager before graph, then by W
    efficiency = {(r["workload"], r["mode"], r["world_size"]): r["efficiency"] for r in record.get("scaling") or [] if "efficiency" in r}
    traces = {key: ranks for key, ranks in (record.get("traces") or {}).items() if all("error" not in s for s in ranks.values())}
    fig, axes = figure(1, 2 if traces else 1, height=4.2, squeeze=False)
    bars, width = axes[0][0], 0.8 / len(slots)
    bars.grid(False, axis="x")
    for run in sorted(runs, key=lambda r: (workloads.index(r["workload"]), slots.index((r["mode"], r["world_size"])))):
        mode, size, spread = run["mode"], run["world_size"], run.get("tokens_per_s_spread")
        x = workloads.index(run["workload"]) - 0.4 + width * (slots.index((mode, size)) + 0.5)
        value = run["tokens_per_s"] / 1e6
        bars.bar(x, value, width, color=MODE_COLOURS[mode], alpha=0.45 if size == 1 else 1.0,
                 label=f"{mode} DDP, {size} GPU{'s' if size > 1 else ''}" if run["workload"] == workloads[0] else None)
        if spread:
            spread_bars(bars, [x], [spread["p10"] / 1e6], [spread["p90"] / 1e6])
        gain = efficiency.get((run["workload"], mode, size))
        bars.text(x, max(value, spread["p90"] / 1e6) if spread else value, f"W={size}" + (f"\n{gain:.0%}" if gain is not None else ""),
                  ha="center", va="bottom", fontsize="x-small")
    whiskers = ", whiskers p10 to p90" if any(r.get("tokens_per_s_spread") for r in runs) else ""
    bars.set(xticks=range(len(workloads)), xticklabels=workloads, xlabel="workload",
             ylabel="throughput, all ranks (million active tokens/s)", title=f"throughput: median step{whiskers}\n(and scaling efficiency)")
    bars.margins(y=0.25)  # room above the bars for the notes and the legend
    bars.legend(loc="upper left", ncols=2)
    if traces:
        overlap, labels = axes[0][1], []
        for key, ranks in traces.items():
            for rank, summary in ranks.items():
                hidden = summary["overlap_us_per_step"] / 1e3
                overlap.barh(len(labels), hidden, color=MODE_COLOURS.get(key.rsplit("/ ", 1)[-1], "tab:blue"))
                overlap.barh(len(labels), max(summary["nccl_us_per_step"] / 1e3 - hidden, 0.0), left=hidden, color="0.3", hatch="//",
                             edgecolor="white")
                labels.append(f"{key}, {rank}")
        overlap.set(yticks=range(len(labels)), yticklabels=labels, xlabel="NCCL kernel time per step (ms)",
                    title="the all-reduce: overlapped or exposed", ylim=(len(labels) + 0.7, -0.5))  # a free row for the legend
        overlap.grid(False, axis="y")
        overlap.legend(handles=[Patch(facecolor="0.65", label="beside other kernels (colour: the mode)"),
                                Patch(facecolor="0.3", hatch="//", edgecolor="white", label="alone")], loc="lower center", ncols=2)
    return fig
