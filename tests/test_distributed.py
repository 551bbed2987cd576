"""Data parallelism: the global token mean through DDP is exactly the single-process mean over both
ranks' tokens; sharded loading.

The two-rank test starts this file twice as a script (``python tests/test_distributed.py worker
RANK ...``), each a ``gloo`` rank on the CPU; the parent compares what they saved with one process.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attn_gym_lite.data import PackedBatch, PackedLoader, batch_from_pieces
from attn_gym_lite.data.sharding import ShardedPackedLoader, global_batch, shard_corpus
from attn_gym_lite.graph.distributed import DataParallelTrainer, global_token_mean_loss
from attn_gym_lite.graph.training import FixedCapacityTrainer
from attn_gym_lite.models import PackedLM, PackedTransformer

HAS_GLOO = dist.is_available() and dist.is_gloo_available()
needs_gloo = pytest.mark.skipif(not HAS_GLOO, reason="torch.distributed with the gloo backend is not available")

#: Environment of every process started here (NVLink multicast off on the GPU host; harmless on CPU).
PROCESS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

VOCAB, T = 11, 16
#: Each rank's sequences: 8 tokens (6 loss-masked) on rank 0, 13 tokens (10 loss-masked) on rank 1.
PIECES = (
    [[5, 9, 2, 7, 1], [3, 3, 8]],
    [[4, 1, 6, 2, 9, 0, 5], [7, 7], [2, 8, 1, 3]],
)
LR = 1e-2


def tiny_model() -> PackedTransformer:
    torch.manual_seed(0)
    return PackedTransformer(VOCAB, 16, 2, 2, impl="reference", dtype=torch.float64)


def rank_batch(rank: int):
    return batch_from_pieces(PIECES[rank], T, 4)


# ---------------------------------------------------------------------------------------------
# The worker: one gloo rank.


def worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    # A rank that hangs writes every thread's stack to its log and exits, well before the parent's limit.
    faulthandler.dump_traceback_later(120, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        # DDP and its reducer live in _train_and_save's frame, released before the group is destroyed:
        # alive at destroy_process_group, they made about one rank in ten hang.
        _train_and_save(rank, out)
    finally:
        dist.destroy_process_group()


def _train_and_save(rank: int, out: str) -> None:
    model = tiny_model()
    batch = rank_batch(rank)
    trainer = DataParallelTrainer(model, batch, lr=LR)
    fields = (batch.input_ids, batch.labels, batch.loss_mask, batch.cu_seqlens, batch.max_seqlen)

    # What DDP gives with each rank's own mean (packed_lm_loss's reduction), for contrast.
    total, count = trainer.ddp(*fields)
    (total / count).backward()
    local_mean_grads = {name: p.grad.clone() for name, p in model.named_parameters()}

    loss = trainer.forward_backward(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    trainer.optimizer.step()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    second_loss = trainer.step(batch)
    torch.save({"loss": loss, "grads": grads, "local_mean_grads": local_mean_grads, "params": params,
                "second_loss": second_loss, "count": count}, Path(out) / f"rank{rank}.pt")


def run_ranks(tmp_path: Path, world_size: int = 2, timeout: float = 150.0, attempts: int = 2) -> list[dict]:
    """Start ``world_size`` workers on a fresh file store and load what they saved. A loaded machine
    has, rarely, left gloo ranks silent past the limit: a hung attempt is retried once."""
    env = {**os.environ, **PROCESS_ENV, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # stay on the loopback interface
    hung = []
    for attempt in range(attempts):
        folder = tmp_path / f"attempt{attempt}"
        folder.mkdir()
        # Output to files, not pipes: a rank blocked on a full pipe would stall the others' collectives.
        logs = [folder / f"rank{rank}.log" for rank in range(world_size)]
        processes = [subprocess.Popen([sys.executable, __file__, "worker", str(rank), str(world_size),
                                       str(folder / "store"), str(folder)],
                                      env=env, stdout=log.open("w"), stderr=subprocess.STDOUT) for rank, log in enumerate(logs)]
        deadline, finished = time.monotonic() + timeout, True
        for process in processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                finished = False
                break
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        text = "\n".join(f"--- rank {r}:\n{log.read_text()[-3000:]}" for r, log in enumerate(logs))
        # A rank stopped by the worker's faulthandler timer hung too.
        if finished and not any("Timeout (" in log.read_text() for log in logs):
            for rank, process in enumerate(processes):
                assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{text}"
            return [torch.load(folder / f"rank{rank}.pt") for rank in range(world_size)]
        hung.append(f"=== attempt {attempt}\n{text}")
    raise AssertionError(f"the ranks did not finish within {timeout:.0f} s, {attempts} times:\n" + "\n".join(hung))


def single_process_reference():
    """Loss, gradients and one Adam step on the concatenation of both ranks' batches, plain mean."""
    model = tiny_model()
    both = batch_from_pieces([*PIECES[0], *PIECES[1]], 2 * T, 8)
    logits = model(both.input_ids, both.cu_seqlens, both.max_seqlen)
    loss = F.cross_entropy(logits[both.loss_mask], both.labels[both.loss_mask])
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    torch.optim.Adam(model.parameters(), lr=LR).step()  # unfused: independent of the trainer's
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, params


@needs_gloo
def test_two_ranks_with_uneven_tokens_get_the_gradient_of_the_global_mean(tmp_path):
    ranks = run_ranks(tmp_path)
    loss, grads, params = single_process_reference()
    assert [int(r["count"]) for r in ranks] == [6, 10]  # different numbers of loss-masked tokens
    exact = {"rtol": 0.0, "atol": 1e-10}
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["loss"], loss, rtol=0.0, atol=1e-12, msg=f"rank {rank} loss")
        assert result["grads"].keys() == grads.keys()
        for name, expected in grads.items():
            assert result["grads"][name].dtype == torch.float64
            torch.testing.assert_close(result["grads"][name], expected, **exact, msg=f"rank {rank}: grad of {name}")
            torch.testing.assert_close(result["params"][name], params[name], **exact,
                                       msg=f"rank {rank}: {name} after Adam")
    # The ranks stay identical after a second step, and report the same loss.
    torch.testing.assert_close(ranks[0]["second_loss"], ranks[1]["second_loss"], rtol=0.0, atol=0.0)
    # Averaging each rank's own mean (what packed_lm_loss would give) is measurably another gradient.
    difference = max((ranks[0]["local_mean_grads"][n] - g).abs().max().item() for n, g in grads.items())
    assert difference > 1e-4


# ---------------------------------------------------------------------------------------------
# One process: a world of one, and the argument checks.


@pytest.fixture
def world_of_one(tmp_path):
    if not HAS_GLOO:
        pytest.skip("torch.distributed with the gloo backend is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_in_a_world_of_one_the_loss_is_the_local_mean(world_of_one):
    total, count = torch.tensor(6.0, dtype=torch.float64, requires_grad=True), torch.tensor(4)
    loss = global_token_mean_loss(total, count)
    assert loss.dtype == torch.float64 and loss.item() == 1.5
    loss.backward()
    assert total.grad.item() == 0.25
    assert count.item() == 4  # the all-reduce works on a copy
    assert global_token_mean_loss(torch.tensor(0.0), torch.tensor(0, dtype=torch.int32)).item() == 0.0  # no NaN


def test_in_a_world_of_one_the_trainer_trains_like_fixed_capacity_trainer(world_of_one):
    batches = [rank_batch(0), rank_batch(1), rank_batch(0)]
    torch.manual_seed(0)
    model = PackedLM(VOCAB, 16, 2, impl="reference")
    reference = PackedLM(VOCAB, 16, 2, impl="reference")
    reference.load_state_dict(model.state_dict())
    trainer = DataParallelTrainer(model, batches[0], lr=LR)
    expected = FixedCapacityTrainer(reference, batches[0], use_graph=False, lr=LR)
    for batch in batches:
        torch.testing.assert_close(trainer.step(batch), expected.step(batch))
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r)


def test_the_global_batch_is_the_concatenation_of_the_ranks_sequences():
    pieces = ([[5, 9, 2, 7, 1], [3, 3, 8]], [[4, 1, 6, 2, 9, 0, 5], [7, 7], [2, 8, 1, 3]], [[6, 6, 6]])
    expected = batch_from_pieces([s for p in pieces for s in p], 48, 12)
    got = global_batch([batch_from_pieces(p, 16, 4) for p in pieces])
    for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert (got.active_tokens, got.active_sequences, got.max_seqlen) == (24, 6, 7)
    # A rank batch with an empty sequence between two others keeps its last sequence's end.
    with_gap = PackedBatch(
        input_ids=torch.tensor([5, 9, 2, 7, 0, 0]), labels=torch.tensor([9, 2, 0, 0, 0, 0]),
        loss_mask=torch.tensor([True, True, False, False, False, False]),
        cu_seqlens=torch.tensor([0, 3, 3, 4, 4], dtype=torch.int32), active_tokens=4, active_sequences=2, max_seqlen=3)
    other = batch_from_pieces([[4, 1, 6], [3, 3]], 8, 3)
    merged = global_batch([with_gap, other])
    assert sequences(merged) == [[5, 9, 2], [7], [4, 1, 6], [3, 3]]
    assert merged.active_sequences == 4 and merged.active_tokens == 9


# ---------------------------------------------------------------------------------------------
# Sharded loading.


DOCUMENTS = [[(7 * i + j) % 50 + 1 for j in range(3 + (5 * i) % 11)] for i in range(23)]


def test_shards_are_disjoint_cover_the_corpus_and_are_rereadable():
    for world_size in (1, 2, 3):
        shards = [shard_corpus(DOCUMENTS, rank, world_size) for rank in range(world_size)]
        from_function = [shard_corpus(lambda: iter(DOCUMENTS), rank, world_size) for rank in range(world_size)]
        for shard, streamed in zip(shards, from_function):
            assert list(shard()) == list(shard()) == list(streamed())
        read = [doc for shard in shards for doc in shard()]
        assert sorted(read) == sorted(DOCUMENTS)
    assert list(shard_corpus(DOCUMENTS, 1, 2)()) == DOCUMENTS[1::2]


def loader(rank: int, world_size: int = 2) -> ShardedPackedLoader:
    return ShardedPackedLoader(32, corpus=DOCUMENTS, rank=rank, world_size=world_size, shuffle_buffer=4, prefetch=0,
                               pin_memory=False)


def sequences(batch) -> list[list[int]]:
    bounds = batch.cu_seqlens.tolist()
    return [batch.input_ids[a:b].tolist() for a, b in zip(bounds, bounds[1:]) if b > a]


def test_each_rank_packs_its_own_shard_and_resumes_from_its_own_state():
    per_rank = [list(loader(rank)) for rank in range(2)]
    packed = [sorted(s for b in batches for s in sequences(b)) for batches in per_rank]
    assert packed[0] == sorted(DOCUMENTS[0::2]) and packed[1] == sorted(DOCUMENTS[1::2])
    # Same batches as a plain PackedLoader over the shard.
    plain = PackedLoader(32, corpus=DOCUMENTS[1::2], shuffle_buffer=4, prefetch=0, pin_memory=False)
    assert [sequences(b) for b in plain] == [sequences(b) for b in per_rank[1]]
    # Resume rank 1 after two batches.
    first = loader(1)
    iterator = iter(first)
    next(iterator), next(iterator)
    state = first.state_dict()
    assert state["shard"] == {"rank": 1, "world_size": 2}
    resumed = loader(1)
    resumed.load_state_dict(state)
    assert [sequences(b) for b in resumed] == [sequences(b) for b in per_rank[1][2:]]
    with pytest.raises(ValueError, match="state"):  # another rank's state
        loader(0).load_state_dict(state)


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
