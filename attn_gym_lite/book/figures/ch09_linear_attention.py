"""Chapter 9, linear attention (KDA): the chunked form on a packed batch, overcapture at a fixed capacity,
and the module-level Amdahl study."""

import numpy as np
from matplotlib.patches import Rectangle

from ...schedule import chunk_offsets, decode_chunk
from .style import SERIES_COLOURS, captured_and_exact, figure, log_ticks, sources, styled

KDA_COLOURS = {"ours": SERIES_COLOURS["ours"], "fla_graph": SERIES_COLOURS["fla"]}
KDA_LABELS = {"ours": "ours (kda_triton)", "fla_graph": "fla chunk_kda(use_graph=True)"}
GOAL = 1.05  # captured / exact, the goal for ours


@styled
def plot_kda_chunks(cu_seqlens, C: int, T: int):
    """The chunked KDA forward on one packed batch: every chunk of the flat list (decoded as the
    kernels do) as a box over its rows, labelled with its flat index; the state S handed from chunk
    to chunk within a sequence (arrows), and zero at every sequence's first chunk."""
    offsets = chunk_offsets(cu_seqlens, C)
    chunks = [decode_chunk(offsets, cu_seqlens, f, C) for f in range(int(offsets[-1]))]
    ends = cu_seqlens.tolist()[1:]
    ax = figure(height=1.9)[1]
    ax.grid(False)
    for f, (seq, local, start) in enumerate(chunks):
        # Chunking restarts at each sequence start, so a sequence's last chunk may be partial.
        end = min(start + C, ends[seq])
        ax.add_patch(Rectangle((start, 0), end - start, 1, facecolor=f"C{seq % 10}", alpha=0.45, edgecolor="white", gid="chunk"))
        ax.text((start + end) / 2, 0.5, f"chunk {f}\n(seq {seq})", ha="center", va="center", fontsize=7)
        if local == 0:
            ax.annotate("S = 0", (start, 1.0), (start, 1.45), ha="center", fontsize=7,
                        arrowprops={"arrowstyle": "->", "color": "0.4"})
        else:  # the only sequential step: the previous chunk's final state enters this one
            ax.annotate("", (start + 0.15 * C, 1.05), (start - 0.15 * C, 1.05),
                        arrowprops={"arrowstyle": "->", "connectionstyle": "arc3,rad=-0.5", "color": "black"})
    ax.axvspan(ends[-1], T, color=SERIES_COLOURS["padding"], label="inactive rows (no chunk)")
    ax.set(xlim=(0, T), ylim=(0, 1.8), yticks=[], xlabel="packed row (tokens)",
           title=f"chunks of C = {C}: the intra-chunk work runs in parallel; S passes only between chunks of one sequence")
    ax.legend(loc="upper right")
    return ax.figure


@styled
def plot_kda_overcapture(recorded: dict, live: dict | None = None):
    """The KDA overcapture sweep: replay µs captured at capacity (solid) and exact (dashed), and their ratio."""
    record = recorded.get("overcapture", recorded)
    fig, (times, ratios) = figure(1, 2, height=4.0)
    for name, rec, linestyle, alpha in sources(record, live and live.get("overcapture", live)):
        for impl, rows in rec.get("series", {}).items():
            L, colour = [row["L"] for row in rows], KDA_COLOURS.get(impl)
            label = KDA_LABELS.get(impl, impl) + ("" if name == "recorded" else " (live)")
            captured_and_exact(times, L, rows, colour, label, linestyle, alpha)
            ratios.plot(L, [row["ratio"] for row in rows], linestyle, marker="o", ms=3, color=colour, alpha=alpha, label=label)
    ratios.axhline(1.0, color=SERIES_COLOURS["reference"], linewidth=0.8)
    ratios.axhline(GOAL, color="0.3", linestyle=":", linewidth=1.0, label=f"goal {GOAL:.2f}x")
    c, failed = record["config"], ", ".join(sorted(record.get("errors", {})))
    times.set(xscale="log", yscale="log", xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (µs)",
              title=f"T={c['T']}, N={c['N']}, M={c['M']}, H={c['H']}, K=V={c['K']}" + (f" (failed: {failed})" if failed else ""))
    ratios.set(xscale="log", xlabel="active tokens L (tokens)", ylabel="captured / exact (ratio of times)",
               title="cost of capturing once at capacity")
    log_ticks(times)
    log_ticks(ratios, "x")
    times.legend(title="solid: captured, dashed: exact")
    ratios.legend()
    return fig


@styled
def plot_kda_amdahl(recorded: dict, live: dict | None = None):
    """The module-level Amdahl study: the KDA core and the rest of the layer per ``T``, and each
    time relative to the largest ``T`` beside ``T / T_max``: the gap does not shrink with the tokens."""
    record = recorded.get("amdahl", recorded)
    points = sorted(record["points"], key=lambda p: p["T"])
    fig, (bars, scaling) = figure(1, 2, height=4.0)
    bars.grid(False, axis="x")
    core, rest = (np.array([p[key] for p in points]) / 1e3 for key in ("core_us", "rest_us"))
    bars.bar([str(p["T"]) for p in points], core, color=KDA_COLOURS["ours"], label="KDA core")
    bars.bar([str(p["T"]) for p in points], rest, bottom=core, color="0.7", label="rest of the layer")
    for i, p in enumerate(points):
        bars.text(i, (core[i] + rest[i]) * 1.01, f"core {p['core_share']:.0%}", ha="center", va="bottom")
    c = record["config"]
    bars.set(xlabel="tokens T (tokens, exact shape)", ylabel="fwd+bwd replay (ms)",
             title=f"KDAAttention, hidden {c['hidden_size']}, {c['num_heads']} heads of {c['head_dim']}")
    bars.legend()
    live_record = live.get("amdahl", live) if live else None
    for name, rec, linestyle, _ in sources(record, live_record if live_record and live_record["points"] else None):
        rows = sorted(rec["points"], key=lambda p: p["T"])
        for key, colour, label in (("module_us", "0.3", "whole layer"), ("core_us", KDA_COLOURS["ours"], "core")):
            values = np.array([p[key] for p in rows])
            scaling.plot([p["T"] for p in rows], values / values[-1], linestyle, marker="o", ms=3, color=colour,
                         label=label + ("" if name == "recorded" else " (live)"))
    T = np.array([p["T"] for p in points], dtype=float)
    scaling.plot(T, T / T[-1], "--", color=SERIES_COLOURS["reference"], label="proportional to T")
    scaling.set(xscale="log", yscale="log", xlabel="tokens T (tokens)", ylabel=f"time / time at T={points[-1]['T']} (ratio)",
                title="what shrinks with the tokens")
    log_ticks(scaling)
    scaling.legend()
    return fig
