"""Data parallelism (attn_gym_lite.graph.distributed): the global token mean through DDP is exactly
the single-process mean over both ranks' tokens; sharded loading; argument checks.

The two-rank test starts this file twice as a script (``python tests/test_distributed.py worker
RANK ...``), each process a ``gloo`` rank on the CPU joined through a file store; the parent
compares what they saved with a single process's computation. CUDA-graph capture of the step is
for a GPU host and is not tested here.
"""

from __future__ import annotations

import dataclasses
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
from attn_gym_lite.graph.distributed import DataParallelTrainer, global_token_mean_loss, token_loss_sum
from attn_gym_lite.graph.training import FixedCapacityTrainer
from attn_gym_lite.models import PackedLM, PackedTransformer, packed_lm_loss

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
        # Everything that uses the process group (DDP, its reducer) lives in _train_and_save's frame and
        # is released when it returns, before the group is destroyed. With the objects still alive at
        # destroy_process_group (they were locals here), about one rank in ten hung as this frame was
        # torn down: faulthandler's dump showed the call line, no Python frame below it, and one native
        # thread of the group.
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


def _run_ranks_once(folder: Path, world_size: int, timeout: float) -> tuple[list[dict] | None, str]:
    """One attempt: start ``world_size`` workers on a fresh file store in ``folder`` and wait at most
    ``timeout`` s in all. Returns the ranks' results (``None`` if any rank hung: still running at the
    limit, or stopped by its faulthandler timer) and their logs."""
    folder.mkdir()
    env = {**os.environ, **PROCESS_ENV, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # stay on the loopback interface
    # Each rank's output goes to a file, not a pipe: a rank blocked on a full pipe that nobody is
    # reading (the parent waits on rank 0 first) would stall rank 0's collectives too.
    log_paths = [folder / f"rank{rank}.log" for rank in range(world_size)]
    processes = []
    for rank, log_path in enumerate(log_paths):
        with open(log_path, "w") as log:
            processes.append(subprocess.Popen(
                [sys.executable, __file__, "worker", str(rank), str(world_size), str(folder / "store"), str(folder)],
                env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    finished = True
    try:
        for process in processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                finished = False
                break
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    logs = "\n".join(f"--- rank {r}:\n{p.read_text()[-3000:]}" for r, p in enumerate(log_paths))
    # A rank stopped by the worker's faulthandler timer hung too (it exits non-zero after its dump).
    if not finished or any("Timeout (" in p.read_text() for p in log_paths):
        return None, logs
    for rank, process in enumerate(processes):
        assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{logs}"
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(world_size)], logs


def run_ranks(tmp_path: Path, world_size: int = 2, timeout: float = 150.0, attempts: int = 2) -> tuple[list[dict], float]:
    """Run the workers (:func:`_run_ranks_once`) and load their results; returns them and the seconds the
    attempt that finished took.

    On a loaded CI machine the gloo ranks have, rarely, started and then stayed silent past the limit
    (empty logs, in a run where every other test passed). A rank that hangs now dumps its threads'
    stacks into its log and exits (the worker's faulthandler), and the harness tries once more on a
    fresh store; a second hang fails the test with both attempts' logs. A rank that fails outright
    fails the test at once."""
    hung = []
    for attempt in range(attempts):
        begin = time.monotonic()
        results, logs = _run_ranks_once(tmp_path / f"attempt{attempt}", world_size, timeout)
        if results is not None:
            return results, time.monotonic() - begin
        hung.append(f"=== attempt {attempt}\n{logs}")
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
    ranks, seconds = run_ranks(tmp_path)
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
    assert seconds < 120


@needs_gloo
def test_the_two_rank_harness_retries_a_hang_once_then_fails_with_both_logs(tmp_path):
    # Far too little time for a rank to start: every attempt is killed, each on a fresh store.
    with pytest.raises(AssertionError, match=r"(?s)did not finish within 0 s, 2 times:\n=== attempt 0\n.*=== attempt 1"):
        run_ranks(tmp_path, timeout=0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt0", "attempt1"]


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


def test_token_loss_sum_over_its_count_is_packed_lm_loss():
    torch.manual_seed(1)
    logits = torch.randn(T, VOCAB)
    batch = rank_batch(1)
    total, count = token_loss_sum(logits, batch.labels, batch.loss_mask)
    assert total.dtype == torch.float32 and count.dtype == torch.int64 and int(count) == 10
    torch.testing.assert_close(total / count, packed_lm_loss(logits, batch.labels, batch.loss_mask))
    # float64 logits stay float64; half precision is summed in float32, as packed_lm_loss does.
    assert token_loss_sum(logits.double(), batch.labels, batch.loss_mask)[0].dtype == torch.float64
    assert token_loss_sum(logits.bfloat16(), batch.labels, batch.loss_mask)[0].dtype == torch.float32
    # Inactive rows are selected away: garbage there changes nothing.
    garbage = logits.clone()
    garbage[~batch.loss_mask] = float("nan")
    assert torch.equal(token_loss_sum(garbage, batch.labels, batch.loss_mask)[0], total)


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


def test_trainer_arguments_are_checked(world_of_one):
    batch = rank_batch(0)
    model = PackedLM(VOCAB, 16, 2, impl="reference")
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        DataParallelTrainer("model", batch)
    with pytest.raises(TypeError, match="first_batch must be a PackedBatch, got dict"):
        DataParallelTrainer(model, {})
    with pytest.raises(TypeError, match="use_graph must be a bool"):
        DataParallelTrainer(model, batch, use_graph=1)
    with pytest.raises(ValueError, match="lr must be a finite real number >= 0"):
        DataParallelTrainer(model, batch, lr=-1.0)
    with pytest.raises(ValueError, match=r"max_seqlen must be an int in \[1, 16\], got 17"):
        DataParallelTrainer(model, batch, max_seqlen=17)
    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup or None, got str"):
        DataParallelTrainer(model, batch, process_group="world")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_graph=True needs CUDA parameters, got parameters on cpu"):
            DataParallelTrainer(model, batch, use_graph=True)
    with pytest.raises(TypeError, match="batch must be a PackedBatch, got list"):
        DataParallelTrainer(model, batch).forward_backward([])


def test_loss_arguments_are_checked():
    scalar, count = torch.tensor(1.0), torch.tensor(3)
    cases = [
        ((1.0, count), TypeError, r"token_loss_sum must be a torch.Tensor of shape \[\] \(a scalar\), got float"),
        ((count, count), TypeError, "token_loss_sum must have dtype float16, bfloat16, float32, float64, got torch.int64"),
        ((torch.ones(2), count), ValueError, r"token_loss_sum must have shape \[\] \(a scalar\), got shape \(2,\)"),
        ((scalar, 3), TypeError, "active_tokens must be a torch.Tensor"),
        ((scalar, torch.tensor(3.0)), TypeError, "active_tokens must have dtype int32, int64, got torch.float32"),
        ((scalar, torch.ones(2, dtype=torch.int64)), ValueError, "active_tokens must have shape"),
        ((scalar, count, "world"), TypeError, "group must be a torch.distributed.ProcessGroup or None, got str"),
    ]
    for arguments, error, message in cases:
        with pytest.raises(error, match=message):
            global_token_mean_loss(*arguments)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            global_token_mean_loss(scalar, count)

    logits, labels, mask = torch.zeros(4, VOCAB), torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.bool)
    with pytest.raises(TypeError, match="logits must have dtype float16, bfloat16, float32, float64, got torch.int64"):
        token_loss_sum(labels.reshape(4, 1), labels, mask)
    with pytest.raises(ValueError, match=r"logits must have shape \[T, V\], got shape \(4,\)"):
        token_loss_sum(labels.double(), labels, mask)
    with pytest.raises(TypeError, match="labels must have dtype int64, got torch.int32"):
        token_loss_sum(logits, labels.int(), mask)
    with pytest.raises(TypeError, match="loss_mask must have dtype bool, got torch.int64"):
        token_loss_sum(logits, labels, labels)
    with pytest.raises(ValueError, match="must have the same T rows"):
        token_loss_sum(logits, labels[:3], mask[:3])


def test_token_loss_sum_ignores_unselected_labels_and_refuses_an_ignorable_selected_one():
    """Before: a label outside [0, V) on an unselected row (stale data, -1) raised IndexError from
    inside cross_entropy, and a -100 on a selected row silently counted as a zero loss."""
    torch.manual_seed(2)
    logits = torch.randn(6, VOCAB, dtype=torch.float64)
    labels = torch.tensor([3, 0, 10, 4, -1, 99])
    mask = torch.tensor([True, True, True, True, False, False])
    total, count = token_loss_sum(logits, labels, mask)
    # Independent: log-sum-exp minus the target logit, row by row, over the selected rows.
    expected = sum(torch.logsumexp(logits[t], 0) - logits[t, labels[t]] for t in range(4))
    torch.testing.assert_close(total, expected)
    assert count.item() == 4
    with pytest.raises(ValueError, match=r"got labels\[1\] = -100 where loss_mask\[1\] is True"):
        token_loss_sum(logits, torch.tensor([3, -100, 10, 4, 0, 0]), mask)
    with pytest.raises(ValueError, match=r"logits must have shape \[T, V\] with V >= 1 .*got shape \(6, 0\)"):
        token_loss_sum(logits[:, :0], labels, mask)


def test_trainer_refuses_models_ddp_cannot_train_by_name(world_of_one):
    """Before: no parameters gave a bare StopIteration, frozen ones DDP's RuntimeError, meta ones
    a RuntimeError from .item() inside DDP's broadcast; a warmup of the wrong type passed unseen."""
    batch = rank_batch(0)
    cases = [
        (torch.nn.Identity(), "got 0 parameters, none trainable"),
        (torch.nn.Linear(2, 2).requires_grad_(False), "got 2 parameters, none trainable"),
        (PackedLM(VOCAB, 16, 2, impl="reference").to("meta"), r"got parameters on \['meta'\]"),
    ]
    for model, message in cases:
        with pytest.raises(ValueError, match=f"model must .*{message}"):
            DataParallelTrainer(model, batch)
    with pytest.raises(TypeError, match="warmup must be an int >= 0, got 'x'"):
        DataParallelTrainer(PackedLM(VOCAB, 16, 2, impl="reference"), batch, warmup="x")


def test_global_batch_keeps_a_sequence_after_an_empty_one():
    """Before: a rank batch with an empty sequence between two others ([0, 3, 3, 4]) lost its last
    sequence's end: taking cu_seqlens[1 : M + 1] merged it into the next rank's first sequence."""
    with_gap = PackedBatch(
        input_ids=torch.tensor([5, 9, 2, 7, 0, 0]), labels=torch.tensor([9, 2, 0, 0, 0, 0]),
        loss_mask=torch.tensor([True, True, False, False, False, False]),
        cu_seqlens=torch.tensor([0, 3, 3, 4, 4], dtype=torch.int32), active_tokens=4, active_sequences=2, max_seqlen=3)
    other = batch_from_pieces([[4, 1, 6], [3, 3]], 8, 3)
    merged = global_batch([with_gap, other])
    assert sequences(merged) == sequences(with_gap) + sequences(other) == [[5, 9, 2], [7], [4, 1, 6], [3, 3]]
    assert merged.active_sequences == 4 and merged.active_tokens == 9
    # A batch whose L contradicts its cu_seqlens cannot reach global_batch: PackedBatch refuses it.
    with pytest.raises(ValueError, match=r"PackedBatch.active_tokens must equal cu_seqlens\[-1\] = 4 .*got 3"):
        dataclasses.replace(with_gap, active_tokens=3)


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


def test_shard_arguments_are_checked():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\], got 2"):
        shard_corpus(DOCUMENTS, 2, 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        shard_corpus(DOCUMENTS, 0, 0)
    with pytest.raises(TypeError, match="corpus must be a sequence of documents"):
        shard_corpus(42, 0, 1)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\], got 5"):
        ShardedPackedLoader(32, corpus=DOCUMENTS, rank=5, world_size=2)


def test_corpora_that_cannot_feed_every_rank_are_refused_up_front():
    """Before: an empty corpus, or fewer documents than ranks, failed only when a rank's loader
    was iterated; a non-document was named by its index within the shard, not the corpus; a
    corpus function returning None gave a bare "'NoneType' object is not iterable"."""
    with pytest.raises(ValueError, match="corpus must hold at least one document, got an empty sequence"):
        ShardedPackedLoader(32, corpus=[], rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"world_size must be at most the number of documents in corpus \(2\).*got 3"):
        shard_corpus(DOCUMENTS[:2], 0, 3)
    with pytest.raises(TypeError, match="corpus\\[2\\] must be a document string or a list/tuple of token ids, got int: 7"):
        shard_corpus(["a b", "c d", 7, "e"], 1, 2)
    shard = shard_corpus(lambda: iter(["a b", "c d", 7, "e"]), 0, 2)
    with pytest.raises(TypeError, match="corpus\\[2\\] must be a document string or a list/tuple of token ids, got int: 7"):
        list(shard())
    with pytest.raises(TypeError, match="corpus\\(\\) must return an iterable of documents, got NoneType"):
        list(shard_corpus(lambda: None, 0, 1)())


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
    with pytest.raises(ValueError, match=r"state must be saved by the shard \{'rank': 0, 'world_size': 2\}"):
        loader(0).load_state_dict(state)
    with pytest.raises(ValueError, match="got shard None"):
        loader(1).load_state_dict({k: v for k, v in state.items() if k != "shard"})
    # Reliability tail, round 2: False == 0, so rank False passed for rank 0.
    with pytest.raises(ValueError, match=r"state must be saved by the shard \{'rank': 0, 'world_size': 2\}, got shard "
                                         r"\{'rank': False, 'world_size': 2\}"):
        loader(0).load_state_dict(state | {"shard": {"rank": False, "world_size": 2}})
    with pytest.raises(TypeError, match="state must be a dict"):
        loader(1).load_state_dict([])


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
