"""Chapter 2's picture of one captured training step names what FixedCapacityTrainer holds: each
box tagged with a trainer attribute resolves on a real trainer (built on CPU, its capture replaced
by a plain call), the buffers drawn are the ones each step copies into, and what runs in the replay
sits inside the captured frame while the optimizer does not."""

import functools
from types import SimpleNamespace

import matplotlib
import torch
from matplotlib.patches import FancyBboxPatch

from attn_gym_lite.book.figures.ch02_capture import plot_step_dataflow
from attn_gym_lite.data import packed_batch_loader
from attn_gym_lite.graph import training
from attn_gym_lite.models import PackedLM

matplotlib.use("Agg")


def test_the_picture_names_the_trainers_parts_and_frames_the_replay(monkeypatch):
    monkeypatch.setattr(training, "capture_graph", lambda fn, **_: (SimpleNamespace(replay=fn), fn()))
    torch.manual_seed(0)
    batch = next(packed_batch_loader(1, 128, 97, 4, seed=1))
    trainer = training.FixedCapacityTrainer(PackedLM(97, 16, 2).double(), batch, use_graph=True, lr=1e-2)
    fig = plot_step_dataflow()
    fig.canvas.draw()
    boxes = {p.get_gid(): p.get_window_extent() for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)}
    named = [gid for gid in boxes if gid.startswith("trainer.")]
    for gid in named:
        *holder, attribute = gid.removeprefix("trainer.").split(".")
        assert hasattr(functools.reduce(getattr, holder, trainer), attribute), gid
    drawn = sorted(gid.removeprefix("trainer.static.") for gid in named if gid.startswith("trainer.static."))
    assert drawn == sorted(trainer.static.keys()) == sorted(training.FIELDS)
    frame = boxes["trainer.graph"]
    inside = lambda box: frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    assert all(inside(boxes[gid]) for gid in ("trainer.loss", "backward", "loss output", "trainer.graph_gradients"))
    assert not any(boxes[gid].overlaps(frame) for gid in ("batch", "trainer.optimizer", "trainer.parameters"))


def test_the_names_drawn_are_the_callers():
    gids = {p.get_gid() for p in plot_step_dataflow(buffers=("tokens",), names={"optimizer": "adam"}).axes[0].patches}
    assert {"trainer.static.tokens", "trainer.adam"} <= gids and "trainer.optimizer" not in gids
