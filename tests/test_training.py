"""FixedCapacityTrainer: each step equals an independent loss + Adam step; one graph and graph
buckets equal eager (GPU); the graph key."""

import dataclasses

import pytest
import torch

from attn_gym_lite.data import packed_batch_loader
from attn_gym_lite.data.batch import batch_from_pieces
from attn_gym_lite.graph.training import FIELDS, FixedCapacityTrainer
from attn_gym_lite.models import PackedLM, PackedTransformer


def _batches(n=3):
    return list(packed_batch_loader(n, 128, 97, 4, seed=1))


def _train_beside_a_reference(freeze_embedding: bool = False):
    """An eager trainer beside a copy stepped by torch's unfused Adam: equal losses at every step."""
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
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r)


def _on_gpu(model_class, *args, **options):
    return lambda: model_class(*args, **options, device="cuda", dtype=torch.bfloat16)


# Each against the same model trained eagerly on the same batches.
STACKS = {
    "PackedLM, one graph": (_on_gpu(PackedLM, 512, 128, 2), {}),
    "PackedLM, buckets": (_on_gpu(PackedLM, 512, 128, 2), {"capacities": [256, 512, 1024]}),
    "PackedTransformer triton": (_on_gpu(PackedTransformer, 512, 128, 2, 2, impl="triton"), {}),
    "PackedTransformer varlen_attn": (_on_gpu(PackedTransformer, 512, 128, 2, 2, impl="varlen_attn"), {}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("stack", STACKS)
def test_graph_training_matches_eager_training(stack):
    build, options = STACKS[stack]
    batches = [b.pin_memory() for b in packed_batch_loader(6, 1024, 512, 8, seed=2)]
    losses = []
    for use_graph in (False, True):
        torch.manual_seed(0)
        trainer = FixedCapacityTrainer(build(), batches[0], use_graph=use_graph, **(options if use_graph else {}))
        losses.append(torch.stack([trainer.step(b) for b in batches]))
    torch.testing.assert_close(losses[1], losses[0], atol=2e-2, rtol=2e-2)
    if trainer.graph is not None:  # after a replay, the gradient outputs hold that batch's gradients
        batch = batches[0]
        trainer.static.copy_(batch)
        trainer.graph.replay()
        loss = trainer.model.loss(*(getattr(batch, n).cuda() for n in FIELDS), trainer.max_seqlen)
        for mine, expected in zip(trainer.graph_gradients, torch.autograd.grad(loss, trainer.parameters)):
            torch.testing.assert_close(mine.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_only_an_attention_that_reads_max_seqlen_keys_the_graph_by_it():
    # Captured with a bound below the first (full, Zipf) batch's longest sequence: the default
    # attention reads the layout on the device and trains on it; a bounded one is refused (below).
    batches = [b.pin_memory() for b in packed_batch_loader(3, 1024, 512, 8, seed=2)]
    bound = max(b.max_seqlen for b in batches[1:])
    assert bound < batches[0].max_seqlen
    model = PackedLM(512, 128, 2, device="cuda", dtype=torch.bfloat16)
    assert not model.needs_max_seqlen and PackedLM(512, 128, 2, impl="varlen_attn").needs_max_seqlen
    trainer = FixedCapacityTrainer(model, batches[1], use_graph=True, max_seqlen=bound)
    assert torch.isfinite(trainer.step(batches[0]))


def _capacity_16_3(lengths=(5, 4, 7), token_capacity=16, sequence_capacity=3):
    return batch_from_pieces([[i + 1] * n for i, n in enumerate(lengths)], token_capacity, sequence_capacity)


# What a trainer built on (T, N) = (16, 3) refuses rather than replay a graph with another key.
REFUSED = {
    "T": (lambda model, trainer: trainer.step(_capacity_16_3((5, 3), 8, 3)), "capacity"),
    "N": (lambda model, trainer: trainer.step(_capacity_16_3((5, 3), 16, 4)), "capacity"),
    "frozen later": (lambda model, trainer: (model.embedding.requires_grad_(False), trainer.step(_capacity_16_3())),
                     "frozen"),
    "capacities": (lambda model, trainer: FixedCapacityTrainer(model, _capacity_16_3(), use_graph=False,
                                                               capacities=[8]), "capacities"),
    # Captured with max_seqlen = 8 by an attention that sizes its grid by it: longer rows go unseen.
    "max_seqlen": (lambda model, trainer: trainer.step(_capacity_16_3((12, 2, 1))), "max_seqlen"),
}


@pytest.mark.parametrize("mode", ["eager", pytest.param("graph", marks=pytest.mark.gpu),
                                  pytest.param("buckets", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", REFUSED)
def test_the_trainer_refuses_a_batch_outside_its_graph_key(case, mode):
    cuda = mode != "eager"
    if case == "max_seqlen" and not cuda:
        pytest.skip("an eager step sizes its grid by each batch's own max_seqlen")
    torch.manual_seed(0)  # head dim 64 on the GPU: the Triton kernels, the graph-safe path
    model = PackedLM(11, 128 if cuda else 8, 2, device="cuda" if cuda else "cpu",
                     dtype=torch.bfloat16 if cuda else torch.float32,
                     **({"impl": "triton", "schedule": "rect"} if case == "max_seqlen" else {}))
    first = _capacity_16_3().pin_memory() if cuda else _capacity_16_3()
    trainer = FixedCapacityTrainer(model, first, use_graph=cuda, capacities=[8, 16] if mode == "buckets" else None,
                                   max_seqlen=8)
    before = [p.detach().clone() for p in model.parameters()]
    refused, match = REFUSED[case]
    with pytest.raises(ValueError, match=match):
        refused(model, trainer)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # nothing trained


def test_the_padded_baseline_trains_batches_of_their_own_capacity():
    # The end-to-end suite's padded stack: each batch at its own capacity M x S_max, the losses of
    # the packed stack on the same documents (padding after a token is unseen by a causal model).
    from attn_gym_lite.bench.end_to_end import _build
    g = torch.Generator().manual_seed(0)
    batches = [batch_from_pieces([torch.randint(0, 50, (n,), generator=g).tolist() for n in lengths], 32, 4)
               for lengths in ([5, 9, 3], [12, 2, 7, 4], [16])]
    config, model_args = {"seed": 0, "lr": 1e-2, "device": "cpu"}, {"vocab_size": 50, "dim": 16, "num_heads": 2,
                                                                    "num_layers": 1}
    losses = {}
    for stack in ("eager padded", "eager packed"):
        step, fed = _build(stack, model_args, batches, config)
        if stack == "eager padded":
            assert [(b.token_capacity, b.max_seqlen) for b in fed] == [(3 * 9, 9), (4 * 12, 12), (16, 16)]
        losses[stack] = torch.stack([step(b) for b in fed])
    torch.testing.assert_close(losses["eager padded"], losses["eager packed"], rtol=1e-5, atol=1e-5)


def test_the_suite_runs_a_workloads_stacks_in_one_process_from_the_same_start(tmp_path):
    # run_stacks: each stack from the same weights on the same batches (equal losses), a failing
    # stack is an error entry and the next stack still runs.
    from attn_gym_lite.bench.end_to_end import CONFIG, run_stacks, workload_batches
    config = {**CONFIG, "T": 128, "dim": 16, "num_heads": 2, "num_layers": 1, "steps": 5, "warmup": 2,
              "repeats": 1, "device": "cpu", "sft_documents": 3}
    path = tmp_path / "sft.pt"
    torch.save(workload_batches("sft", config["steps"], config), path)
    done = run_stacks("sft", ("eager padded", "no such stack", "eager packed"), str(path), config)
    assert list(done["errors"]) == ["sft / no such stack"]
    padded, packed = done["runs"]
    assert (padded["stack"], packed["stack"]) == ("eager padded", "eager packed")
    torch.testing.assert_close(torch.tensor(padded["losses"]), torch.tensor(packed["losses"]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("build", [lambda impl: PackedLM(64, 32, 2, impl=impl),
                                   lambda impl: PackedTransformer(64, 32, 2, 1, impl=impl)],
                         ids=["PackedLM", "PackedTransformer"])
def test_an_eager_step_on_a_batch_without_tokens_has_loss_0_and_zero_gradients(build, impl):
    # A replay computes zero gradients for an L = 0 batch and runs Adam on them; so does an eager
    # step, although the reference attention never reaches the projections then.
    torch.manual_seed(0)
    model = build(impl)
    first = batch_from_pieces([[1, 2, 3]], 16, 2)
    empty = dataclasses.replace(first, input_ids=torch.zeros_like(first.input_ids), labels=torch.zeros_like(first.labels),
                                loss_mask=torch.zeros_like(first.loss_mask), cu_seqlens=torch.zeros_like(first.cu_seqlens),
                                active_tokens=0, active_sequences=0, max_seqlen=0)
    trainer = FixedCapacityTrainer(model, first, use_graph=False, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    loss = trainer.step(empty)
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
    assert trainer.step(empty).item() == 0.0
    for p, r in zip(model.parameters(), reference):
        torch.testing.assert_close(p, r.detach())


def test_frozen_parameters_stay_and_the_others_train_exactly():
    torch.manual_seed(0)
    frozen = PackedLM(97, 16, 2).double().embedding.weight.detach().clone()  # the seed-0 model's embedding
    trainer, model, reference = _train_beside_a_reference(freeze_embedding=True)
    assert torch.equal(model.embedding.weight, frozen)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r)
