"""Chapter 2's picture of one captured training step draws what FixedCapacityTrainer does. The
drawing is checked against a real trainer on the CPU, built on its one-graph path with
``capture_graph`` replaced by a stand-in that keeps a graph's contract (the captured function's
outputs are rewritten in place by each replay): every box named after a trainer attribute names
one the trainer holds, the static buffers drawn are exactly the ones it copies each batch into,
what runs inside the replay is inside the shaded frame and the optimizer, which the trainer steps
after the replay, is outside it; no arrow carries a value from the device up to the host."""

import dataclasses
import functools

import matplotlib
import pytest
import torch
from matplotlib.patches import FancyBboxPatch
from matplotlib.text import Annotation

from attn_gym_lite.book.figures.ch02_capture import plot_step_dataflow
from attn_gym_lite.data import packed_batch_loader
from attn_gym_lite.graph import training
from attn_gym_lite.models import PackedLM

matplotlib.use("Agg")


class _Replayed:
    """A CPU stand-in for a CUDA graph: ``replay`` reruns the function and copies its outputs into
    the first call's, as a replay rewrites the captured outputs at their addresses. ``inside`` is
    True while the captured function runs."""

    inside = False

    def __init__(self, fn):
        self.fn = fn

    def __call__(self):
        _Replayed.inside = True
        try:
            return self.fn()
        finally:
            _Replayed.inside = False

    def replay(self):
        loss, grads = self()
        self.outputs[0].copy_(loss)
        for kept, new in zip(self.outputs[1], grads):
            kept.copy_(new)


def _fake_capture(fn, **_):
    graph = _Replayed(fn)
    graph.outputs = graph()
    return graph, graph.outputs


@pytest.fixture
def trainer(monkeypatch):
    """A one-graph trainer on the CPU, with a record of where the loss and the optimizer ran."""
    monkeypatch.setattr(training, "capture_graph", _fake_capture)
    torch.manual_seed(0)
    model = PackedLM(97, 16, 2).double()
    calls = []
    loss = model.loss
    model.loss = lambda *args: calls.append(("loss", _Replayed.inside)) or loss(*args)
    batches = list(packed_batch_loader(3, 128, 97, 4, seed=1))
    trainer = training.FixedCapacityTrainer(model, batches[0], use_graph=True, lr=1e-2)

    def before_adam(optimizer, *_):
        calls.append(("optimizer", _Replayed.inside))
        grads = [p.grad for p in trainer.parameters]
        calls.append(("attached", all(g is kept for g, kept in zip(grads, trainer.graph_gradients))))

    trainer.optimizer.register_step_pre_hook(before_adam)
    addresses = {name: trainer.static[name].data_ptr() for name in trainer.static.keys()}
    calls.clear()  # the capture's own call
    for batch in batches[1:]:
        trainer.step(batch)
    assert {name: trainer.static[name].data_ptr() for name in trainer.static.keys()} == addresses  # copied, not rebound
    for name in trainer.static.keys():
        assert torch.equal(trainer.static[name], getattr(batches[-1], name))
    return trainer, calls


@pytest.fixture
def drawn():
    fig = plot_step_dataflow()
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = {p.get_gid(): p.get_window_extent() for p in ax.patches if isinstance(p, FancyBboxPatch)}
    return ax, boxes


def _inside(inner, outer):
    return outer.x0 <= inner.x0 and inner.x1 <= outer.x1 and outer.y0 <= inner.y0 and inner.y1 <= outer.y1


def test_the_boxes_name_what_the_trainer_holds(trainer, drawn):
    trainer, _ = trainer
    _, boxes = drawn
    named = [gid for gid in boxes if gid.startswith("trainer.")]
    assert len(named) >= 8
    for gid in named:  # each resolves on the trainer: an attribute, or a static buffer
        path = gid.removeprefix("trainer.").split(".")
        holder = functools.reduce(getattr, path[:-1], trainer)
        assert hasattr(holder, path[-1]), gid
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    assert isinstance(trainer.static, training.StaticInputs) and trainer.graph is not None
    # The buffers drawn are exactly the ones each step copies into, the batch's tensor fields.
    drawn_buffers = sorted(gid.removeprefix("trainer.static.") for gid in named if gid.startswith("trainer.static."))
    batch = next(packed_batch_loader(1, 128, 97, 4))
    tensor_fields = sorted(f.name for f in dataclasses.fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor))
    assert drawn_buffers == sorted(trainer.static.keys()) == tensor_fields == sorted(training.FIELDS)


def test_the_frame_holds_what_replays_and_not_the_optimizer(trainer, drawn):
    _, calls = trainer
    _, boxes = drawn
    # On the trainer: the loss runs only inside the replay, the optimizer only outside it, on the
    # graph's own gradient tensors attached as .grad.
    assert sorted(set(calls)) == [("attached", True), ("loss", True), ("optimizer", False)]
    assert calls.count(("optimizer", False)) == calls.count(("loss", True)) == 2
    # In the picture: the same.
    frame = boxes["trainer.graph"]
    for gid in ("trainer.loss", "backward", "loss output", "trainer.graph_gradients"):
        assert _inside(boxes[gid], frame), gid
    for gid in ("batch", "trainer.optimizer", "attach", "returned loss", "trainer.parameters",
                *(f"trainer.static.{name}" for name in training.FIELDS)):
        assert not boxes[gid].overlaps(frame), gid


def test_no_arrow_goes_from_the_device_up_to_the_host(drawn):
    ax, boxes = drawn
    divider = next(line for line in ax.lines if line.get_gid() == "host | device").get_ydata()[0]
    arrows = [a for a in ax.texts if isinstance(a, Annotation) and a.arrow_patch is not None]
    crossing = [(a.xyann, a.xy) for a in arrows if (a.xyann[1] - divider) * (a.xy[1] - divider) < 0]
    assert crossing and all(start[1] > end[1] for start, end in crossing)  # the copy: host down to device
    assert boxes["batch"].y0 > ax.transData.transform((0, divider))[1]
    assert all(boxes[gid].y1 < ax.transData.transform((0, divider))[1] for gid in boxes if gid != "batch")


def test_names_are_data():
    fig = plot_step_dataflow(buffers=("tokens", "cu_seqlens"), names={"optimizer": "adam", "static": "buffers"})
    gids = {p.get_gid() for p in fig.axes[0].patches}
    assert {"trainer.buffers.tokens", "trainer.buffers.cu_seqlens", "trainer.adam", "trainer.graph"} <= gids
    assert "trainer.optimizer" not in gids
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "trainer.adam.step()" in texts and "tokens" in texts


def test_the_compiled_loss_is_named_where_it_is_captured(drawn):
    ax, boxes = drawn
    forward = next(t for t in ax.texts if t.get_text().startswith("forward:"))
    assert "torch.compile(model.loss)" in forward.get_text()
    x, y = forward.get_position()
    assert boxes["trainer.loss"].contains(*ax.transData.transform((x, y)))
    assert boxes["trainer.graph"].contains(*ax.transData.transform((x, y)))
