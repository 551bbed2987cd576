"""FixedCapacityTrainer: each step equals an independent loss + Adam step; graph equals eager (GPU)."""

import pytest
import torch

from attn_gym_lite.data import packed_batch_loader
from attn_gym_lite.graph.training import FixedCapacityTrainer
from attn_gym_lite.models import PackedLM


def _batches(n=3):
    return list(packed_batch_loader(n, 128, 97, 4, seed=1))


def _train_beside_a_reference(freeze_embedding: bool = False):
    """An eager trainer and an independent copy stepped by torch's unfused Adam on the same
    batches; asserts equal losses at every step and returns ``(trainer, model, reference)``."""
    torch.manual_seed(0)
    batches = _batches()
    model = PackedLM(97, 16, 2).double()
    reference = PackedLM(97, 16, 2).double()
    reference.load_state_dict(model.state_dict())
    for m in (model, reference):
        m.embedding.requires_grad_(not freeze_embedding)
    trainer = FixedCapacityTrainer(model, batches[0], use_graph=False, lr=1e-2)
    optimizer = torch.optim.Adam([p for p in reference.parameters() if p.requires_grad], lr=1e-2)
    for batch in batches:
        loss = trainer.step(batch)
        expected = reference.loss(batch.input_ids, batch.labels, batch.loss_mask, batch.cu_seqlens, batch.max_seqlen)
        torch.testing.assert_close(loss, expected.detach())
        optimizer.zero_grad()
        expected.backward()
        optimizer.step()
    return trainer, model, reference


def test_step_is_loss_then_adam_on_the_exact_gradients():
    trainer, model, reference = _train_beside_a_reference()
    with pytest.raises(RuntimeError, match="graph_gradients exist only with use_graph=True"):
        _ = trainer.graph_gradients
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r)


def test_arguments_are_checked():
    batch = _batches(1)[0]
    model = PackedLM(97, 16, 2)
    with pytest.raises(ValueError, match=r"max_seqlen must be an int in \[1, 128\], got 129"):
        FixedCapacityTrainer(model, batch, use_graph=False, max_seqlen=129)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_graph=True needs CUDA parameters, got cpu"):
            FixedCapacityTrainer(model, batch, use_graph=True)


@pytest.mark.gpu
def test_graph_training_matches_eager_training():
    batches = [b.pin_memory() for b in packed_batch_loader(6, 1024, 512, 8, seed=2)]
    losses = {}
    for use_graph in (False, True):
        torch.manual_seed(0)
        model = PackedLM(512, 128, 2, device="cuda", dtype=torch.bfloat16)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=use_graph)
        losses[use_graph] = torch.stack([trainer.step(b) for b in batches])
    torch.testing.assert_close(losses[True], losses[False], atol=1e-2, rtol=1e-2)
    # The captured gradient outputs hold, after a replay, the gradients of that batch's loss.
    batch = batches[0]
    trainer.static.copy_(batch)
    trainer.graph.replay()
    loss = trainer.model.loss(batch.input_ids.cuda(), batch.labels.cuda(), batch.loss_mask.cuda(),
                              batch.cu_seqlens.cuda(), trainer.max_seqlen)
    for mine, expected in zip(trainer.graph_gradients, torch.autograd.grad(loss, trainer.parameters)):
        torch.testing.assert_close(mine.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_a_model_without_loss_is_refused():
    with pytest.raises(TypeError, match="model must be an nn.Module with a loss"):
        FixedCapacityTrainer(torch.nn.Linear(2, 2), _batches(1)[0], use_graph=False)


def test_a_loss_that_is_not_a_scalar_and_a_meta_batch_are_named():
    """Reliability tail, round 3. Before: a model.loss returning a vector raised autograd's "grad
    can be implicitly created only for scalar outputs", one returning None "'NoneType' object is
    not iterable"; a batch on the meta device was accepted and failed inside the copy ("Cannot
    copy out of meta tensor")."""
    import dataclasses

    batch = _batches(1)[0]

    class Vector(PackedLM):
        def loss(self, *args):
            return super().loss(*args).repeat(3)

    class Nothing(PackedLM):
        def loss(self, *args):
            return None

    for model, got in ((Vector(97, 16, 2), r"a torch.float32 tensor of shape \(3,\)"), (Nothing(97, 16, 2), "NoneType")):
        trainer = FixedCapacityTrainer(model, batch, use_graph=False)
        with pytest.raises(TypeError, match=rf"^model.loss must return a floating scalar tensor \(one element\), got {got}$"):
            trainer.step(batch)
    meta = dataclasses.replace(batch, **{f: getattr(batch, f).to("meta") for f in ("input_ids", "labels", "loss_mask", "cu_seqlens")})
    with pytest.raises(ValueError, match=r"^first_batch must hold values \(a batch on the meta device has none to train on\)$"):
        FixedCapacityTrainer(PackedLM(97, 16, 2), meta, use_graph=False)
    trainer = FixedCapacityTrainer(PackedLM(97, 16, 2), batch, use_graph=False)
    with pytest.raises(ValueError, match=r"^batch must hold values \(a batch on the meta device has none to train on\)$"):
        trainer.step(meta)
    # A trainable parameter the loss never reaches (before: autograd's "One of the differentiated
    # Tensors appears to not have been used in the graph", naming none).
    spare = PackedLM(97, 16, 2)
    spare.unused = torch.nn.Linear(2, 2)
    trainer = FixedCapacityTrainer(spare, batch, use_graph=False)
    with pytest.raises(ValueError, match=r"^model.loss must reach every trainable parameter, got none for "
                                         r"\['unused.weight', 'unused.bias'\]: freeze them"):
        trainer.step(batch)
    spare.unused.requires_grad_(False)
    loss = FixedCapacityTrainer(spare, batch, use_graph=False).step(batch)  # frozen: trains as before
    assert torch.isfinite(loss)
    # Frozen after the trainer was built: refused (a replayed graph would still update it; an
    # eager step raised autograd's "One of the differentiated Tensors does not require grad").
    model = PackedLM(97, 16, 2)
    trainer = FixedCapacityTrainer(model, batch, use_graph=False)
    model.embedding.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^the model's trainable parameters must stay trainable after the trainer is built, "
                                         r"got \['embedding.weight'\] frozen since"):
        trainer.step(batch)


@pytest.mark.gpu
def test_the_graph_key_holds_max_seqlen_only_where_the_attention_needs_it():
    # The first batch is full (L = T) with Zipf lengths; later ones are shorter. Capture with a
    # bound below the first batch's longest sequence and feed that batch again.
    batches = [b.pin_memory() for b in packed_batch_loader(4, 1024, 512, 8, seed=2)]
    longest = batches[0].max_seqlen
    bound = max(b.max_seqlen for b in batches[1:])
    assert bound < longest
    for impl, schedule in (("varlen_attn", "auto"), ("triton", "rect")):
        torch.manual_seed(0)
        model = PackedLM(512, 128, 2, impl=impl, schedule=schedule, device="cuda", dtype=torch.bfloat16)
        assert model.needs_max_seqlen
        trainer = FixedCapacityTrainer(model, batches[1], use_graph=True, max_seqlen=bound)
        trainer.step(batches[2])  # within the bound: fine
        with pytest.raises(ValueError, match=f"batch.max_seqlen must be <= the max_seqlen = {bound} the graph was "
                                             f"captured with .*got {longest}"):
            trainer.step(batches[0])
    # The default attention reads the layout on the device: no bound, any batch of the capacity.
    model = PackedLM(512, 128, 2, device="cuda", dtype=torch.bfloat16)
    assert not model.needs_max_seqlen
    trainer = FixedCapacityTrainer(model, batches[1], use_graph=True, max_seqlen=bound)
    assert torch.isfinite(trainer.step(batches[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["triton", "varlen_attn"])
def test_a_transformer_trains_the_same_from_a_graph_and_eagerly(impl):
    from attn_gym_lite.models import PackedTransformer

    batches = [b.pin_memory() for b in packed_batch_loader(6, 1024, 512, 8, seed=3)]
    losses = {}
    for use_graph in (False, True):
        torch.manual_seed(0)
        model = PackedTransformer(512, 128, 2, 2, impl=impl, device="cuda", dtype=torch.bfloat16)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=use_graph)
        losses[use_graph] = torch.stack([trainer.step(b) for b in batches])
    torch.testing.assert_close(losses[True], losses[False], atol=2e-2, rtol=2e-2)


def test_capacities_are_graph_buckets_and_must_end_at_T():
    batch = _batches(1)[0]
    with pytest.raises(ValueError, match="capacities are graph buckets: they need use_graph=True"):
        FixedCapacityTrainer(PackedLM(97, 16, 2), batch, use_graph=False, capacities=[64, 128])


@pytest.mark.parametrize("eager_rows", ["capacity", "active"])
def test_an_eager_step_computes_the_rows_asked_for(monkeypatch, eager_rows):
    seen = []
    model = PackedLM(97, 16, 2)
    original = model.loss

    def spy(input_ids, *args):
        seen.append(input_ids.shape[0])
        return original(input_ids, *args)

    monkeypatch.setattr(model, "loss", spy)
    batches = _batches(3)
    trainer = FixedCapacityTrainer(model, batches[0], use_graph=False, eager_rows=eager_rows)
    for batch in batches:
        trainer.step(batch)
    if eager_rows == "active":
        assert seen == [b.active_tokens for b in batches] and seen[-1] < 128
    else:
        assert seen == [128] * len(batches)


@pytest.mark.gpu
def test_bucket_training_matches_one_graph():
    batches = [b.pin_memory() for b in packed_batch_loader(8, 1024, 512, 8, seed=4)]
    losses = {}
    for capacities in (None, [256, 512, 1024]):
        torch.manual_seed(0)
        model = PackedLM(512, 128, 2, device="cuda", dtype=torch.bfloat16)
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=True, capacities=capacities)
        losses[capacities is None] = torch.stack([trainer.step(b) for b in batches])
        if capacities:
            assert trainer.buckets.capacities == (256, 512, 1024)
    torch.testing.assert_close(losses[True], losses[False], atol=2e-2, rtol=2e-2)


def _capacity_16_3(lengths=(5, 4, 7), token_capacity=16, sequence_capacity=3):
    from attn_gym_lite.data.batch import batch_from_pieces

    return batch_from_pieces([[i + 1] * n for i, n in enumerate(lengths)], token_capacity, sequence_capacity)


# (T, N) of a batch the trainer built on T = 16, N = 3 must refuse, in every mode.
OTHER_CAPACITIES = [(8, 3), (16, 4), (32, 3)]


def _refuses_other_capacities(trainer):
    for token_capacity, sequence_capacity in OTHER_CAPACITIES:
        other = _capacity_16_3((5, 3), token_capacity, sequence_capacity)
        with pytest.raises(ValueError, match=rf"batch must have the trainer's capacity T = 16 token rows and N = 3 "
                                             rf"sequence slots \(those of first_batch\), got T = {token_capacity} "
                                             rf"and N = {sequence_capacity}"):
            trainer.step(other)
    with pytest.raises(TypeError, match="batch must be a PackedBatch, got dict"):
        trainer.step({"input_ids": torch.zeros(16, dtype=torch.int64)})


@pytest.mark.parametrize("eager_rows", ["capacity", "active"])
def test_an_eager_step_refuses_another_capacity_like_a_graph(eager_rows):
    """Before: with use_graph=False a batch of T = 8, N = 3 trained fine on a trainer built on
    T = 16, N = 3, although step's docstring said it raises ValueError."""
    torch.manual_seed(0)
    model = PackedLM(11, 8, 2)
    trainer = FixedCapacityTrainer(model, _capacity_16_3(), use_graph=False, eager_rows=eager_rows)
    before = [p.detach().clone() for p in model.parameters()]
    _refuses_other_capacities(trainer)
    # Nothing was trained by the refused steps; a batch of the capacity still trains.
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert torch.isfinite(trainer.step(_capacity_16_3((2, 9, 1))))
    with pytest.raises(TypeError, match="first_batch must be a PackedBatch, got dict"):
        FixedCapacityTrainer(model, {"input_ids": torch.zeros(16, dtype=torch.int64)}, use_graph=False)


@pytest.mark.gpu
@pytest.mark.parametrize("capacities", [None, [8, 16]])
def test_a_graph_step_refuses_another_capacity(capacities):
    model = PackedLM(11, 128, 2, device="cuda", dtype=torch.bfloat16)  # head dim 64: the Triton path, the graph-safe one
    trainer = FixedCapacityTrainer(model, _capacity_16_3().pin_memory(), use_graph=True, capacities=capacities)
    _refuses_other_capacities(trainer)
    assert torch.isfinite(trainer.step(_capacity_16_3((2, 9, 1)).pin_memory()))


def test_the_padded_baseline_trains_batches_of_their_own_capacity():
    """The end-to-end suite's 'eager padded' stack feeds each batch at its own capacity M x S_max,
    so it no longer goes through the trainer (which now refuses that); its losses equal those of
    the packed stacks on the same documents (a causal model: padding after a token is unseen)."""
    from attn_gym_lite.bench.end_to_end import _build
    from attn_gym_lite.data.batch import batch_from_pieces

    g = torch.Generator().manual_seed(0)
    batches = [batch_from_pieces([torch.randint(0, 50, (n,), generator=g).tolist() for n in lengths], 32, 4)
               for lengths in ([5, 9, 3], [12, 2, 7, 4], [16])]
    config, model_args = {"seed": 0, "lr": 1e-2, "device": "cpu"}, {"vocab_size": 50, "dim": 16, "num_heads": 2,
                                                                    "num_layers": 1}
    losses = {}
    for stack in ("eager padded", "eager packed", "eager packed, L rows"):
        step, fed = _build(stack, model_args, batches, config)
        if stack == "eager padded":
            assert [(b.token_capacity, b.max_seqlen) for b in fed] == [(3 * 9, 9), (4 * 12, 12), (16, 16)]
        losses[stack] = torch.stack([step(b) for b in fed])
    torch.testing.assert_close(losses["eager padded"], losses["eager packed"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(losses["eager packed, L rows"], losses["eager packed"], rtol=1e-5, atol=1e-5)


def _empty_batch(token_capacity=16, sequence_capacity=2):
    """A batch with no real tokens (L = 0), which PackedBatch allows."""
    from attn_gym_lite.data import PackedBatch

    zeros = torch.zeros
    return PackedBatch(zeros(token_capacity, dtype=torch.long), zeros(token_capacity, dtype=torch.long),
                       zeros(token_capacity, dtype=torch.bool), zeros(sequence_capacity + 1, dtype=torch.int32),
                       0, 0, 0)


@pytest.mark.parametrize("eager_rows", ["capacity", "active"])
@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("model_name", ["PackedLM", "PackedTransformer"])
def test_an_eager_step_on_a_batch_without_tokens_has_loss_0_and_zero_gradients(eager_rows, impl, model_name):
    """Before: with the reference attention (the CPU's default outside the interpreter) an eager
    step on an L = 0 batch raised 'RuntimeError: The differentiated Tensor at index 1 appears to
    not have been used in the graph' (the empty sequences never reach the projections). A replay
    computes zero gradients for such a batch and runs Adam on them; the eager step does the same."""
    from attn_gym_lite.data.batch import batch_from_pieces
    from attn_gym_lite.models import PackedTransformer

    torch.manual_seed(0)
    if model_name == "PackedLM":
        model = PackedLM(64, 32, 2, impl=impl)
    else:
        model = PackedTransformer(64, 32, 2, 1, impl=impl)
    first = batch_from_pieces([[1, 2, 3]], 16, 2)
    trainer = FixedCapacityTrainer(model, first, use_graph=False, eager_rows=eager_rows, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    loss = trainer.step(_empty_batch())
    assert loss.item() == 0.0
    # Zero gradients on fresh Adam state: nothing moves.
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    # After a real step, an L = 0 step is Adam's momentum-only update on zero gradients.
    trainer.step(first)
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.Adam(reference, lr=1e-2)
    for r, p in zip(reference, model.parameters()):
        r.grad = torch.zeros_like(r)
        optimizer.state[r] = {k: v.clone() for k, v in trainer.optimizer.state[p].items()}
    optimizer.step()
    assert trainer.step(_empty_batch()).item() == 0.0
    for p, r in zip(model.parameters(), reference):
        torch.testing.assert_close(p, r.detach())


class _NoParameters(torch.nn.Module):
    def loss(self, *args):
        return torch.zeros(())


def test_a_model_the_trainer_cannot_step_is_refused_by_name():
    # Before: no parameters gave a bare StopIteration (next(model.parameters())); all frozen, the
    # first step's "element 0 of tensors does not require grad"; meta parameters a cu_seqlens error.
    batch = _batches(1)[0]
    cases = [
        (_NoParameters(), "got 0 parameters, none trainable"),
        (PackedLM(97, 16, 2).requires_grad_(False), "got 6 parameters, none trainable"),
        (PackedLM(97, 16, 2, device="meta"), r"got parameters on \['meta'\]"),
    ]
    for model, message in cases:
        with pytest.raises(ValueError, match=f"model must .*{message}"):
            FixedCapacityTrainer(model, batch, use_graph=False)


def test_frozen_parameters_stay_and_the_others_train_exactly():
    # Before: a partly frozen model (a frozen embedding) failed at the first step with autograd's
    # "One of the differentiated Tensors does not require grad".
    torch.manual_seed(0)
    frozen = PackedLM(97, 16, 2).double().embedding.weight.detach().clone()  # the seed-0 model's embedding
    trainer, model, reference = _train_beside_a_reference(freeze_embedding=True)
    assert torch.equal(model.embedding.weight, frozen)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r)
