"""capture_graph and StaticInputs: argument checks on CPU, capture and replay on the GPU."""

import inspect
from itertools import islice

import pytest
import torch

from attn_gym_lite.data import PackedLoader
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


def test_static_inputs_take_dataclass_batches():
    batch = next(iter(PackedLoader(64, 4, corpus=["def f(x):\n    return x + 1\n"] * 6,
                                   tokenizer=_tiny_tokenizer(), prefetch=0)))
    static = StaticInputs(batch, "cpu")
    assert set(static.keys()) == {"input_ids", "labels", "loss_mask", "cu_seqlens"}
    assert torch.equal(static.cu_seqlens, batch.cu_seqlens)


def test_static_inputs_reject_new_shapes_and_copy_nothing():
    static = StaticInputs({"a": torch.zeros(4), "b": torch.zeros(2)}, "cpu")
    with pytest.raises(ValueError, match=r"field 'b' must have shape \(2,\) and dtype torch.float32 .*got shape \(3,\)"):
        static.copy_({"a": torch.ones(4), "b": torch.ones(3)})
    assert torch.equal(static.a, torch.zeros(4)), "a rejected batch must leave every buffer untouched"
    with pytest.raises(ValueError, match="batch has no tensor field 'b'"):
        static.copy_({"a": torch.ones(4)})
    with pytest.raises(ValueError, match="dtype torch.float32.*got shape \\(4,\\) and dtype torch.float64"):
        static.copy_({"a": torch.ones(4, dtype=torch.float64), "b": torch.ones(2)})
    # A missing buffer by either spelling names what there is (reliability tail: ["foo"] was a bare
    # KeyError: 'foo').
    with pytest.raises(AttributeError, match=r"^StaticInputs has no buffer 'foo'; it has \['a', 'b'\]$"):
        _ = static.foo
    with pytest.raises(KeyError, match=r"StaticInputs has no buffer 'foo'; it has \['a', 'b'\]"):
        static["foo"]
    assert static["a"] is static.a


def test_static_inputs_refuse_a_meta_field_and_copy_nothing():
    # The meta field failed inside Tensor.copy_ (NotImplementedError) after 'a' had been overwritten.
    static = StaticInputs({"a": torch.zeros(3), "b": torch.zeros(2)}, "cpu")
    with pytest.raises(ValueError, match=r"field 'b' must hold values .*got a meta tensor of shape \(2,\)"):
        static.copy_({"a": torch.ones(3), "b": torch.ones(2, device="meta")})
    assert torch.equal(static.a, torch.zeros(3)), "a rejected batch must leave every buffer untouched"
    with pytest.raises(ValueError, match=r"field 'a' must hold values .*got a meta tensor of shape \(3,\)"):
        StaticInputs({"a": torch.zeros(3, device="meta")}, "cpu")


def test_static_inputs_name_a_bad_device():
    # torch.device(device) raised torch's bare RuntimeError ("Expected one of cpu, cuda, ...") for
    # "foo"; "cuda" without a GPU failed in empty_like with "Torch not compiled with CUDA enabled";
    # "meta" built buffers that hold no values, which copy_ then silently "filled".
    template = {"a": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"device must be a torch.device, a device string .*, got 'foo'"):
        StaticInputs(template, "foo")
    with pytest.raises(TypeError, match=r"device must be a torch.device, a device string .*, got NoneType None"):
        StaticInputs(template, None)
    with pytest.raises(ValueError, match=r"device must be a device that holds values \(not 'meta'\), got meta"):
        StaticInputs(template, torch.device("meta"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device must be an available device; CUDA is not available here"):
            StaticInputs(template, "cuda")
    assert StaticInputs(template, torch.device("cpu")).device == torch.device("cpu")


def test_static_inputs_reject_non_batches():
    with pytest.raises(TypeError, match="template must be a mapping of tensors or a dataclass instance, got list"):
        StaticInputs([torch.zeros(2)], "cpu")
    with pytest.raises(TypeError, match="at least one Tensor field"):
        StaticInputs({"n": 3}, "cpu")
    with pytest.raises(AttributeError, match="has no buffer 'y'"):
        _ = StaticInputs({"x": torch.zeros(1)}, "cpu").y


def test_capture_graph_checks_its_arguments():
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        capture_graph(3)
    with pytest.raises(TypeError, match="warmup must be an int >= 0, got 1.5"):
        capture_graph(lambda: None, warmup=1.5)
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        capture_graph(lambda: None, warmup=-1)


def test_capture_options_refuses_what_torch_cuda_graph_would_refuse_at_capture():
    with capture_options(capture_error_mode="relaxed"):
        with capture_options(capture_error_mode="global"):
            assert _CAPTURE_OPTIONS.get() == {"capture_error_mode": "global"}
        assert _CAPTURE_OPTIONS.get() == {"capture_error_mode": "relaxed"}
    with pytest.raises(ValueError, match=r"capture_error_mode must be one of \('global', 'thread_local', 'relaxed'\), "
                                         r"got 'nope'"):
        with capture_options(capture_error_mode="nope"):
            pass
    with pytest.raises(ValueError, match=r"capture_options: option must be one of \('capture_error_mode', .*\), "
                                         r"got 'bogus'"):
        with capture_options(bogus=1):
            pass
    with pytest.raises(ValueError, match=r"capture_options: option must be one of .*, got 'pool'"):
        with capture_options(pool=None):
            pass
    if "enable_annotations" in inspect.signature(torch.cuda.graph.__init__).parameters:
        with pytest.raises(TypeError, match=r"enable_annotations must be a bool, got 1"):
            with capture_options(enable_annotations=1):
                pass
    assert _CAPTURE_OPTIONS.get() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_capture_graph_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        capture_graph(lambda: None)


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attn_gym_lite.data import HFTokenizer

    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["\n"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=" "))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return HFTokenizer(tok, "chars")


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
