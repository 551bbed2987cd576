"""StaticInputs and capture options on the CPU; capture and replay on the GPU."""

from itertools import islice

import pytest
import torch

from attn_gym_lite.data import PackedLoader
from attn_gym_lite.data.batch import batch_from_pieces
from attn_gym_lite.graph.capture import _CAPTURE_OPTIONS, StaticInputs, capture_graph, capture_options
from attn_gym_lite.models import PackedLM


def test_static_inputs_copy_into_the_same_buffers():
    template = {"x": torch.zeros(4, 3), "cu_seqlens": torch.zeros(3, dtype=torch.int32)}
    static = StaticInputs(template, "cpu")
    address = static.x.data_ptr()
    batch = {"x": torch.arange(12.0).view(4, 3), "cu_seqlens": torch.tensor([0, 2, 4], dtype=torch.int32)}
    static.copy_(batch)
    assert static.x.data_ptr() == address, "the buffer must be refilled, not replaced"
    assert torch.equal(static.x, batch["x"]) and torch.equal(static["cu_seqlens"], batch["cu_seqlens"])
    assert static.keys() == ["x", "cu_seqlens"]
    packed = StaticInputs(batch_from_pieces([[1, 2, 3], [4, 5]], 8, 3), "cpu")  # a dataclass: its tensor fields
    assert packed.keys() == ["input_ids", "labels", "loss_mask", "cu_seqlens"] and packed.cu_seqlens.tolist() == [0, 3, 5, 5]


@pytest.mark.parametrize("b", [torch.ones(3), torch.ones(2, dtype=torch.float64)], ids=["shape", "dtype"])
def test_static_inputs_refuse_a_new_shape_or_dtype_and_copy_nothing(b):
    static = StaticInputs({"a": torch.zeros(4), "b": torch.zeros(2)}, "cpu")
    with pytest.raises(ValueError, match="b must be"):
        static.copy_({"a": torch.ones(4), "b": b})
    assert torch.equal(static.a, torch.zeros(4)), "a refused batch must leave every buffer untouched"


def test_capture_options_nest_and_restore():
    with capture_options(capture_error_mode="relaxed"):
        with capture_options(enable_annotations=True):
            assert dict(_CAPTURE_OPTIONS.get()) == {"capture_error_mode": "relaxed", "enable_annotations": True}
        assert dict(_CAPTURE_OPTIONS.get()) == {"capture_error_mode": "relaxed"}
    assert _CAPTURE_OPTIONS.get() == ()


@pytest.mark.gpu
def test_replayed_training_graph_matches_eager_on_a_new_batch():
    """Capture forward+backward on batch 0, copy batch 1 into the static buffers, replay:
    loss and every gradient must equal an eager run on batch 1 at the same capacity."""
    torch.manual_seed(0)
    batches = list(islice(PackedLoader(1024, 8), 3))
    model = PackedLM(8192, 256, 2, device="cuda", dtype=torch.bfloat16)
    parameters = tuple(model.parameters())
    static = StaticInputs(batches[0], "cuda")

    def forward_backward():
        loss = model.loss(static.input_ids, static.labels, static.loss_mask, static.cu_seqlens, 1024)
        return loss, torch.autograd.grad(loss, parameters)

    graph, (loss, grads) = capture_graph(forward_backward)
    for batch in batches[1:]:
        static.copy_(batch.pin_memory())
        graph.replay()
        eager_loss, eager_grads = forward_backward()
        torch.testing.assert_close(loss, eager_loss)
        for g, e in zip(grads, eager_grads):
            assert not g.isnan().any()
            torch.testing.assert_close(g, e)


@pytest.mark.gpu
def test_capture_succeeds_while_another_thread_pins_memory():
    """The package's loader pins batches in a background thread; capture_graph's thread-local mode
    lets it (torch's global mode refuses capture-unsafe calls such as pinned allocations in every
    thread). Both the captures and the pinning thread must run without an error."""
    import threading

    stop, errors, pinned = threading.Event(), [], []

    def pin():
        try:  # kept alive, so each is a new pinned allocation, not a block the host cache hands back
            while not stop.is_set() and len(pinned) < 4000:
                pinned.append(torch.empty(1 << 18, dtype=torch.uint8).pin_memory())
        except Exception as error:  # reported to the main thread below
            errors.append(error)

    worker = threading.Thread(target=pin, daemon=True)
    worker.start()
    try:
        x = torch.randn(4096, device="cuda")
        for _ in range(20):
            graph, out = capture_graph(lambda: (x * 2).sin())
            graph.replay()
            torch.testing.assert_close(out, (x * 2).sin())
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert pinned
