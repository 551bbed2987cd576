"""Chapter 2, graph capture: eager against replay, as bars, loss curves and step timelines; one
captured training step's dataflow."""

import numpy as np
from matplotlib.patches import FancyBboxPatch, Patch

from .ch03_profiling import TIMELINE_COLOURS, plot_compact_timeline
from .style import LIVE_HATCH, SERIES_COLOURS, figure, legend_right, sources, spread_bars, styled

EAGER_AND_REPLAY = [SERIES_COLOURS["eager"], SERIES_COLOURS["graph replay"]]
# plot_step_dataflow: the captured region in the replay's blue, what runs eagerly in eager's red.
DATAFLOW_FILLS = {"host": "0.93", "device": "white", "graph": "#d6e6f5", "eager": "#fbe1dc"}


def running_mean(values, window: int) -> np.ndarray:
    """Mean of each ``window`` consecutive values (``len - window + 1`` of them)."""
    window = max(1, min(window, len(values)))
    return np.convolve(np.asarray(values, dtype=float), np.ones(window) / window, mode="valid")


def _eager_and_replay_bars(ax, labels, values, fmt, padding=0):
    # Labels read "<mode>\n<recorded or live>": eager red, replay blue, a live run hatched.
    bars = ax.bar(labels, values, color=[EAGER_AND_REPLAY[0 if label.startswith("eager") else 1] for label in labels],
                  hatch=[LIVE_HATCH if label.endswith("live") else "" for label in labels], edgecolor="white")
    ax.bar_label(bars, fmt=fmt, padding=padding)
    ax.margins(y=0.15)  # room for the bar labels
    ax.grid(False, axis="x")


@styled
def plot_hello_world(recorded: dict, live: dict | None = None):
    """µs per forward + backward, eager against replay, a panel per model size (live bars hatched)."""
    runs = recorded["runs"]
    fig, axes = figure(1, len(runs), squeeze=False)
    for index, ax in enumerate(axes[0]):
        labels, values = [], []
        for name, record, _, _ in sources(recorded, live):
            labels += [f"eager\n{name}", f"replay\n{name}"]
            values += [record["runs"][index]["eager_wall_us"], record["runs"][index]["replay_wall_us"]]
        _eager_and_replay_bars(ax, labels, values, "%.0f")
        c = runs[index]["config"]
        ax.set(title=f"dim {c['dim']}, {c['num_heads']} heads, T={c['T']}, N={c['N']}", ylabel="fwd+bwd, wall clock (µs)")
    return fig


@styled
def plot_training_loop(recorded: dict, live: dict | None = None):
    """Loss per step, eager and graph on the same batches, and the step time (whiskers: its repeat)."""
    fig, (loss_ax, time_ax) = figure(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    labels, values, whiskers = [], [], []
    for name, record, linestyle, _ in sources(recorded, live):
        for mode, colour in zip(("eager", "graph"), EAGER_AND_REPLAY):
            if mode not in record:
                continue
            losses = np.asarray(record[mode]["losses"])
            loss_ax.plot(losses, linestyle, color=colour, alpha=0.25, linewidth=0.8)
            window = max(1, min(20, len(losses) // 5))  # batches differ: the running mean shows the trend
            loss_ax.plot(np.arange(window - 1, len(losses)), running_mean(losses, window), linestyle, color=colour,
                         label=f"{mode} ({name}), {window}-step mean")
            if record[mode]["step_us"] is not None:
                runs = [record[key]["step_us"] / 1e3 for key in (mode, f"{mode}_repeat") if record.get(key, {}).get("step_us") is not None]
                if len(runs) > 1:  # the suite runs each mode twice: the range of the runs
                    whiskers.append((len(labels), min(runs), max(runs)))
                labels.append(f"{mode}\n{name}")
                values.append(runs[0])
    loss_ax.set(xlabel="training step", ylabel="loss (nats/token)", title="same batches, same initial weights")
    loss_ax.legend()
    _eager_and_replay_bars(time_ax, labels, values, "%.2f", padding=4)
    if whiskers:
        spread_bars(time_ax, *zip(*whiskers))
    time_ax.set(ylabel="training step, wall clock (ms)",
                title="step time" + (" (bar: first run,\nwhisker: range of its repeats)" if whiskers else ""))
    return fig


@styled
def plot_hello_world_timelines(recorded: dict):
    """One eager forward + backward above one replay of the same step (``hello-world``'s timelines)."""
    timelines = recorded["timelines"]
    modes = [m for m in ("eager", "replay") if m in timelines]
    heights = [len(timelines[m]["tracks"]) + 1 for m in modes]
    fig, axes = figure(len(modes), 1, height=0.5 * sum(heights) + 1.4, sharex=True,
                       gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        timeline = timelines[mode]
        counts, span = timeline["counts"], timeline["span_us"]
        busy = counts["device_busy_us"] / span if span else 0.0
        plot_compact_timeline(timeline, ax, title=f"{mode}: {counts['launches']} launches, {counts['device_events']} "
                                                  f"GPU events, GPU busy {busy:.0%} of {span:.0f} µs")
    legend_right(axes[0, 0], handles=[Patch(color=c, label=k) for k, c in TIMELINE_COLOURS.items()])
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


@styled
def plot_step_dataflow(buffers=("input_ids", "labels", "loss_mask", "cu_seqlens"), names=None):
    """One step of :class:`~attn_gym_lite.graph.training.FixedCapacityTrainer` with one graph: the
    pinned host batch copied into the static ``buffers``, one replay of the captured forward + backward
    (the shaded frame) writing the loss and the gradients at fixed addresses, then the eager fused
    Adam outside it, which updates the parameters in place. ``names`` renames the trainer's attributes
    drawn (``static``, ``loss``, ``graph``, ``graph_gradients``, ``parameters``, ``optimizer``); a box
    drawing one has the gid ``trainer.<attribute path>``, which a test resolves on a real trainer."""
    n = {a: f"trainer.{a}" for a in ("static", "loss", "graph", "graph_gradients", "parameters", "optimizer")}
    n.update({a: f"trainer.{name}" for a, name in (names or {}).items()})
    fig, ax = figure(height=4.8)
    ax.set(xlim=(0, 100), ylim=(0, 53), xticks=[], yticks=[])
    ax.axis("off")

    def box(x, y, w, h, text, fill, gid, **kw):
        ax.add_patch(FancyBboxPatch((x, y), w, h, "round,pad=0,rounding_size=0.8", fc=DATAFLOW_FILLS[fill], ec="0.4", gid=gid, **kw))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center")

    def arrow(start, end, head="-|>"):
        ax.annotate("", end, start, arrowprops={"arrowstyle": head, "color": "0.25", "lw": 1.1, "shrinkA": 0, "shrinkB": 0})

    # Host lane: the loader pins each batch; the host only queues work and never waits on the GPU.
    box(1, 44, 23, 7, "pinned host batch\n(PackedLoader: a PackedBatch)", "host", "batch")
    ax.text(27, 50, "step(batch): the key (T, N) and max_seqlen are checked on the batch's host ints", va="center")
    arrow((99, 45.5), (24, 45.5))
    ax.text(61, 46.2, "next step: the host queues copy, replay and Adam, then takes the next pinned batch", ha="center", va="bottom")
    ax.axhline(42, color="tab:red", linestyle="--", linewidth=1, gid="host | device")
    ax.text(99, 41.3, "device below: nothing is read back to the host (no .item(), .tolist(), .cpu())",
            ha="right", va="top", color="tab:red")
    # Device: buffers allocated once at capacity; each batch is copied in, never rebound. Buffers and
    # parameters join one bus into the forward: all are read at the addresses captured.
    arrow((12.5, 44), (12.5, 37.3))
    ax.text(14, 39.8, f"{n['static']}.copy_(batch), non_blocking=True", va="center")
    ax.text(12.5, 35.8, f"{n['static']} (StaticInputs)", ha="center", va="center")
    step = 26 / len(buffers)
    for i, name in enumerate(buffers):
        y = 33.5 - (i + 1) * step + step / 2
        box(1, y - 0.4 * step, 23, 0.8 * step, name, "device", f"{n['static']}.{name}")
        arrow((24, y), (25.3, y), head="-")
    box(1, 0.5, 23, 6, f"{n['parameters']}\n(updated in place)", "device", n["parameters"])
    arrow((24, 5.5), (25.3, 5.5), head="-")
    arrow((25.3, 5.5), (25.3, 30), head="-")
    arrow((25.3, 30), (28.5, 30))
    # The captured region: forward and backward only; their outputs live in the graph's pool.
    box(26, 8, 38, 30, "", "graph", n["graph"], lw=1.5, zorder=0)
    ax.text(45, 36, f"captured: {n['graph']}.replay(), one launch", ha="center", va="center", weight="bold")
    box(28.5, 26.5, 33.5, 7.5, f"forward: {n['loss']}(buffers, max_seqlen)\nmodel.loss, or torch.compile(model.loss)\n"
        "(compile=True: compiled in the warm-up)", "device", n["loss"])
    box(28.5, 17, 17, 6.5, "backward:\ntorch.autograd.grad\n(loss, parameters)", "device", "backward")
    box(48, 17, 14, 6.5, "loss\n(graph output)", "device", "loss output")
    box(28.5, 9.5, 33.5, 5.5, f"{n['graph_gradients']}:\nstatic gradient tensors in the graph's pool", "device", n["graph_gradients"])
    # Eager, outside the graph: attach (not copy) the gradients, fused Adam in place.
    ax.text(83, 31, "eager, outside the graph\n(a read-back here would stall the host)", ha="center", va="center")
    box(67, 17, 32, 6.5, "loss.detach().clone()\nreturned: a device scalar", "eager", "returned loss")
    box(67, 9.5, 32, 5.5, "p.grad = g for each parameter\n(attached, not copied)", "eager", "attach")
    box(67, 0.5, 32, 6, f"{n['optimizer']}.step(): fused Adam\nthen zero_grad(set_to_none=True)", "eager", n["optimizer"])
    for start, end in (((37, 26.5), (37, 23.5)), ((55, 26.5), (55, 23.5)), ((37, 17), (37, 15)), ((62, 20.25), (67, 20.25)),
                       ((62, 12.25), (67, 12.25)), ((83, 9.5), (83, 6.5)), ((67, 2.5), (24, 2.5))):
        arrow(start, end)
    ax.text(45, 3.2, "in place: the next replay reads the same addresses", ha="center", va="bottom")
    return fig
