"""The package's kernels (attention, KDA, short convolution) inside torch.compile: one graph, no
graph break, no recompile when the layout changes, values equal to eager; and a compiled step
captured by the trainer (on a GPU)."""

import pytest
import torch
from torch._dynamo.utils import counters

from attn_gym_lite.data import PackedBatch
from attn_gym_lite.graph.training import FixedCapacityTrainer
from attn_gym_lite.models import PackedTransformer

VOCAB, T, N = 61, 64, 6
LAYOUTS = ([30, 20, 9], [1, 2, 0, 50], [7])


def _batch(lengths, device="cpu"):
    L = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()] + [L] * (N - len(lengths)), dtype=torch.int32)
    ids = torch.randint(0, VOCAB, (T,))
    mask = torch.zeros(T, dtype=torch.bool)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        mask[start:max(start, end - 1)] = True  # a sequence's last token has no target
    labels = torch.where(mask, torch.roll(ids, -1), 0)
    return PackedBatch(ids, labels, mask, cu, L, sum(s > 0 for s in lengths), max(lengths))


def _loss_and_grads(loss_fn, model, batch, device):
    fields = [getattr(batch, n).to(device) for n in ("input_ids", "labels", "loss_mask", "cu_seqlens")]
    loss = loss_fn(*fields)
    return loss.detach(), torch.autograd.grad(loss, list(model.parameters()))


def _layers(device, dtype):
    """The package's layers, each as (module, loss of a batch): the LM's own loss; the KDA layer
    (KDA kernels and short convolution) and the short-conv block, a weighted sum of their real rows."""
    from attn_gym_lite.models import ShortConvAttentionBlock
    from attn_gym_lite.models.kda import KDAAttention

    factory = {"device": device, "dtype": dtype}
    torch.manual_seed(0)
    lm = PackedTransformer(VOCAB, 32, 2, 1, **factory)
    weights = torch.randn(T, 32, **factory)

    def rows_loss(module):
        def loss(ids, labels, mask, cu):
            x = torch.nn.functional.embedding(ids, weights)  # a fixed input per batch
            return (module(x, cu) * weights * mask[:, None]).sum()
        return loss

    kda, block = KDAAttention(32, 2, head_dim=16, **factory), ShortConvAttentionBlock(32, 2, **factory)
    return {"lm": (lm, lm.loss), "kda": (kda, rows_loss(kda)), "block": (block, rows_loss(block))}


def _compiled_layouts(name, device, dtype, backend, tolerance):
    model, loss_fn = _layers(device, dtype)[name]
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)  # fullgraph: a break would raise
    for lengths in LAYOUTS:
        batch = _batch(lengths)
        loss, grads = _loss_and_grads(compiled, model, batch, device)
        expected, expected_grads = _loss_and_grads(loss_fn, model, batch, device)
        torch.testing.assert_close(loss, expected, atol=tolerance, rtol=tolerance)
        for g, e in zip(grads, expected_grads):
            torch.testing.assert_close(g, e, atol=tolerance, rtol=tolerance)
    # One graph compiled for every layout: the cu_seqlens values never reach the host.
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


@pytest.mark.parametrize("name", ["lm", "kda", "block"])
def test_the_kernels_compile_into_one_graph_over_changing_layouts(name):
    pytest.importorskip("triton")
    from attn_gym_lite.ops.attention import resolve_impl

    assert resolve_impl("auto", torch.zeros(1, 1, 16)) == "triton"  # the interpreter runs the kernels here
    _compiled_layouts(name, "cpu", torch.float32, "aot_eager", 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lm", "kda", "block"])
def test_the_kernels_compile_with_inductor_on_the_gpu(name):
    _compiled_layouts(name, "cuda", torch.bfloat16, "inductor", 3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("capacities", [None, [32, 64]], ids=["one graph", "buckets"])
def test_a_compiled_step_captured_by_the_trainer_trains_like_eager(capacities):
    batches = [_batch(lengths) for lengths in LAYOUTS]
    losses = {}
    for mode in ("eager", "compiled graph"):
        torch.manual_seed(0)
        model = PackedTransformer(VOCAB, 64, 4, 2, device="cuda", dtype=torch.bfloat16)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=mode != "eager", compile=mode != "eager",
                                       capacities=capacities if mode != "eager" else None)
        losses[mode] = torch.stack([trainer.step(b) for b in batches])
    torch.testing.assert_close(losses["compiled graph"], losses["eager"], atol=2e-2, rtol=2e-2)
