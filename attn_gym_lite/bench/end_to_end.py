"""Benchmark suite ``end-to-end``: a small transformer trained with the whole stack, against the
ways people usually train it.

One model (:class:`~attn_gym_lite.models.PackedTransformer`: RMSNorm, attention with RoPE
positions that restart at every document, SwiGLU MLP), the same initial weights and the same
batches of real text (the Python standard library, byte-level BPE), nine ways to run its
training step (forward, backward, eager fused Adam):

1. ``eager padded``: each batch's documents right-padded to its longest (``M x S_max``), dense SDPA;
2. ``eager packed``: the packed batch at its capacity ``T`` (fixed shapes), torch's ``varlen_attn``;
   and ``eager packed, L rows``: only the ``L`` real rows (shapes change every step);
3. ``compile``: ``torch.compile`` (default mode) of the packed model's loss (``varlen_attn``);
4. ``compile reduce-overhead``: CUDA Graph Trees on the same shapes (each batch its own ``L`` and
   ``max_seqlen``), and
5. ``compile reduce-overhead, fixed capacity``: the same at fixed shapes (every batch padded to
   ``T``, ``max_seqlen = T``), what it takes to give Graph Trees one graph;
6. ``graph varlen_attn``: one CUDA graph at capacity ``T`` with torch's kernel at ``max_seqlen = T``;
7. ``graph ours``: one CUDA graph with this package's kernels (its default path);
8. ``buckets ours``: graph buckets chosen by ``plan_buckets`` on the workload's ``L``, our kernels.

Two workloads: ``pretraining`` (best-fit packing of a shuffled corpus, ``L`` close to ``T``) and
``sft`` (a fixed number of documents per batch, ``L`` anywhere in 10-100 % of ``T``, loss on the
second half of each document). Every (workload, stack) runs in a fresh process. Reported per run:
real tokens per second over the timed steps (host wall clock, synchronised at both ends), the
loss of every step, peak allocated memory, and for the compiled stacks dynamo's and Graph Trees'
counters. For ``graph ours`` a profiled, labelled replay gives where the step time goes.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time

import torch

from ..checks import check_choice, check_choices, check_file, check_keys, check_real
from ..data import BestFit, fixed_count_loader, load_tokenizer, plan_buckets, python_stdlib_corpus
from ..data.batch import padded_batch
from ..data.sharding import ShardedPackedLoader, shard_corpus
from ..graph.training import FixedCapacityTrainer
from ..isolation import IsolatedRunError, run_isolated
from ..models import PackedTransformer
from ..profiling import annotate_trace, profile, record_annotations, trace_summary

MIB = 2**20
STACKS = ("eager padded", "eager packed", "eager packed, L rows", "compile", "compile reduce-overhead",
          "compile reduce-overhead, fixed capacity", "graph varlen_attn", "graph ours", "buckets ours")
WORKLOADS = ("pretraining", "sft")
#: The model and the batches: small enough that launching kernels, not computing them, bounds an
#: eager step on an H200 (the regime CUDA graphs exist for), big enough to learn.
CONFIG = {"T": 4096, "dim": 512, "num_heads": 8, "num_layers": 4, "lr": 1e-3, "steps": 60, "warmup": 10,
          "sft_documents": 16, "sft_min_fill": 0.1, "pretraining_buffer": 32, "buckets": 4, "bucket_align": 256,
          "seed": 0, "device": "cuda"}


#: Documents of the standard-library corpus the ``sft`` workload draws from (a config may set
#: ``"sft_corpus_documents"``; recordings made before that key existed used this many).
SFT_CORPUS_DOCUMENTS = 200


def workload_batches(workload: str, steps: int, config: dict = CONFIG, *, rank: int = 0, world_size: int = 1,
                     tokenizer=None) -> list:
    """``steps`` packed batches of one workload for rank ``rank`` of ``world_size``, on the CPU.

    ``pretraining``: best-fit packing (``config["pretraining_buffer"]`` documents to choose from)
    of the rank's shard of the standard-library corpus
    (:class:`~attn_gym_lite.data.sharding.ShardedPackedLoader`, repeating it as needed); ``sft``:
    :func:`~attn_gym_lite.data.fixed_count_loader` with ``config["sft_documents"]`` documents per
    batch and ``L >= config["sft_min_fill"] * T``, drawn from the rank's shard
    (:func:`~attn_gym_lite.data.sharding.shard_corpus`) of the first
    ``config.get("sft_corpus_documents", SFT_CORPUS_DOCUMENTS)`` documents, seed
    ``config["seed"] + rank``. The single-GPU suites use ``rank = 0, world_size = 1``, the whole
    corpus; the ``scale-out`` suite gives every rank its own shard. Deterministic: the same
    arguments give the same batches.

    Args:
        workload: one of :data:`WORKLOADS`.
        steps: batches to make (int >= 1).
        config: ``T``, ``seed`` and the workload's keys above (e.g. :data:`CONFIG`).
        rank, world_size: which shard (``0 <= rank < world_size``).
        tokenizer: the tokenizer to use (default: :func:`~attn_gym_lite.data.load_tokenizer`).

    Returns:
        A list of ``steps`` :class:`~attn_gym_lite.data.PackedBatch` es of capacity ``T``.

    Raises:
        ValueError: unknown ``workload``; a ``rank`` or ``world_size`` the sharding refuses.
    """
    tokenizer = tokenizer or load_tokenizer()
    token_capacity = config["T"]
    if workload == "pretraining":
        loader = ShardedPackedLoader(token_capacity, corpus=python_stdlib_corpus, tokenizer=tokenizer,
                                     policy=BestFit(config["pretraining_buffer"]), seed=config["seed"], epochs=None,
                                     prefetch=0, pin_memory=False, rank=rank, world_size=world_size)
        return list(itertools.islice(loader, steps))
    if workload == "sft":
        documents = list(python_stdlib_corpus(limit=config.get("sft_corpus_documents", SFT_CORPUS_DOCUMENTS)))
        ids = tokenizer.encode_batch(list(shard_corpus(documents, rank, world_size)()))
        stream = torch.tensor([t for doc in ids for t in doc], dtype=torch.int64)
        return list(fixed_count_loader(stream, steps, token_capacity, config["sft_documents"],
                                       min_fill=config["sft_min_fill"], seed=config["seed"] + rank))
    raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")


class _LossStep:
    """The model's loss, ``torch.compile``'d (with ``mode``) when ``compiled``, then the same
    backward and fused Adam as the trainer.

    ``rows="active"`` feeds each batch's ``L`` real rows and its own ``max_seqlen`` (shapes change
    every step); ``rows="capacity"`` feeds all ``T`` rows and ``max_seqlen = T`` (fixed shapes).
    Unlike :class:`~attn_gym_lite.graph.training.FixedCapacityTrainer` it takes batches of any
    capacity: the padded baseline's each have their own, ``M x S_max``.
    """

    def __init__(self, model, mode: str | None, rows: str, lr: float, *, compiled: bool = True) -> None:
        self.model, self.rows = model, rows
        self.loss = torch.compile(model.loss, mode=mode) if compiled else model.loss
        self.parameters = tuple(model.parameters())
        self.optimizer = torch.optim.Adam(self.parameters, lr=lr, fused=True)

    def step(self, batch) -> torch.Tensor:
        count = batch.active_tokens if self.rows == "active" else batch.token_capacity
        width = batch.max_seqlen if self.rows == "active" else batch.token_capacity
        device = self.parameters[0].device
        ids, labels, mask = (getattr(batch, n)[:count].to(device, non_blocking=True)
                             for n in ("input_ids", "labels", "loss_mask"))
        loss = self.loss(ids, labels, mask, batch.cu_seqlens.to(device, non_blocking=True), width)
        grads = torch.autograd.grad(loss, self.parameters)
        for parameter, grad in zip(self.parameters, grads):
            parameter.grad = grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()


def _dynamo_counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: dict(values) for group, values in counters.items() if group in ("stats", "inductor", "graph_break")}


def _build(stack: str, model_args: dict, batches: list, config: dict):
    """(step function taking a batch, the batches it is fed) for one stack."""
    torch.manual_seed(config["seed"])
    lr, device = config["lr"], torch.device(config["device"])
    impl = {"eager padded": "sdpa", "graph ours": "auto", "buckets ours": "auto"}.get(stack, "varlen_attn")
    if device.type != "cuda" and impl == "varlen_attn":
        impl = "reference"  # a CPU smoke run: torch's kernel needs CUDA
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = PackedTransformer(**model_args, impl=impl, device=device, dtype=dtype)
    if stack == "eager padded":
        # Each padded batch has its own capacity (M x S_max, all of it real rows or padding the
        # loss masks): an eager step over all of its rows, at its own max_seqlen.
        return _LossStep(model, None, "active", lr, compiled=False).step, [padded_batch(b) for b in batches]
    if stack.startswith("eager packed"):
        rows = "active" if stack.endswith("L rows") else "capacity"
        return FixedCapacityTrainer(model, batches[0], use_graph=False, lr=lr, eager_rows=rows).step, batches
    if stack.startswith("compile"):
        mode = "reduce-overhead" if "reduce-overhead" in stack else None
        rows = "capacity" if "fixed capacity" in stack else "active"
        return _LossStep(model, mode, rows, lr).step, batches
    if stack in ("graph varlen_attn", "graph ours"):
        return FixedCapacityTrainer(model, batches[0], use_graph=True, lr=lr).step, batches
    if stack == "buckets ours":
        plan = plan_buckets([b.active_tokens for b in batches], config["buckets"], align=config["bucket_align"])
        capacities = sorted({*plan.capacities[:-1], config["T"]})
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=True, capacities=capacities, lr=lr)
        return trainer.step, batches
    raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")


def run_stack(workload: str, stack: str, batches_path: str, config: dict = CONFIG) -> dict:
    """Train one stack on one workload in this process; see the module docstring for what is reported.

    Args:
        workload: one of :data:`WORKLOADS` (a label: the batches say what is trained).
        stack: one of :data:`STACKS`.
        batches_path: a file of the workload's batches as :func:`end_to_end_suite` saves them
            (``torch.save`` of a list of :class:`~attn_gym_lite.data.PackedBatch`).
        config: :data:`CONFIG`, or a dict with its keys.

    Raises:
        TypeError / ValueError: ``workload`` or ``stack`` not one of its names, ``config`` not a
            dict with :data:`CONFIG`'s keys.
        FileNotFoundError: no file at ``batches_path``.
    """
    check_choice("workload", workload, WORKLOADS)
    check_choice("stack", stack, STACKS)
    check_keys("config", config, CONFIG)
    batches = torch.load(check_file("batches_path", batches_path), weights_only=False)
    if torch.device(config["device"]).type == "cuda":
        batches = [b.pin_memory() for b in batches]
    tokenizer = load_tokenizer()
    model_args = {"vocab_size": tokenizer.vocab_size, "dim": config["dim"], "num_heads": config["num_heads"],
                  "num_layers": config["num_layers"]}
    start = time.perf_counter()
    step, fed = _build(stack, model_args, batches, config)
    warmup = config["warmup"]
    cuda = torch.device(config["device"]).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = [step(b) for b in fed[:warmup]]  # compiles, captures, the first replays
    sync()
    setup_s = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    losses += [step(b) for b in fed[warmup:]]
    sync()
    seconds = time.perf_counter() - began
    real_tokens = sum(b.active_tokens for b in batches[warmup:])
    result = {
        "workload": workload, "stack": stack,
        "losses": torch.stack(losses).float().tolist(),
        "timed_steps": len(fed) - warmup,
        "step_us": seconds / max(1, len(fed) - warmup) * 1e6,
        "tokens_per_s": real_tokens / seconds,
        "setup_s": setup_s,
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
        "reserved_mib": torch.cuda.memory_reserved() / MIB if cuda else None,
    }
    if stack.startswith("compile"):
        result["dynamo"] = _dynamo_counters()
    if stack == "graph ours":
        result["regions"] = _profiled_regions(model_args, batches, config)
    return result


def _profiled_regions(model_args: dict, batches: list, config: dict, steps: int = 3) -> dict:
    """Where a replayed step's GPU time goes: one labelled capture, ``steps`` profiled replays."""
    torch.manual_seed(config["seed"])
    model = PackedTransformer(**model_args, device="cuda", dtype=torch.bfloat16)
    with record_annotations(["train step"]) as annotations:
        trainer = FixedCapacityTrainer(model, batches[0], use_graph=True, lr=config["lr"])
    for batch in batches[1:4]:
        trainer.step(batch)
    with profile(None, warmup=1) as profiled:
        for batch in batches[4:5 + steps]:
            trainer.step(batch)
            torch.cuda.synchronize()
            profiled.step()
    summary = trace_summary(annotate_trace(profiled.trace, annotations))
    per_step = summary["steps"] or steps
    return {"steps": per_step, "region_us_per_step": {k: v / per_step for k, v in summary["region_us"].items()},
            "gpu_busy_fraction": summary["busy_fraction"], "kernels_per_step": summary["kernels_per_step"]}


def end_to_end_suite(stacks: tuple[str, ...] = STACKS, workloads: tuple[str, ...] = WORKLOADS,
                     config: dict = CONFIG, timeout_s: float = 600) -> dict:
    """Every stack on every workload, each in a fresh process (a fault or a hang in one is recorded
    under ``"errors"`` and the others still run).

    Args:
        stacks: names from :data:`STACKS`, run in this order.
        workloads: names from :data:`WORKLOADS`.
        config: :data:`CONFIG`, or a dict with its keys (``"device": "cpu"`` for a smoke run).
        timeout_s: per stack and workload, seconds (> 0).

    Returns:
        ``{"config", "workloads", "runs", "errors"}``: see the module docstring.

    Raises:
        TypeError / ValueError: ``stacks`` or ``workloads`` not a non-empty sequence of those
            names (the message names the entry), ``config`` not a dict with :data:`CONFIG`'s keys,
            ``timeout_s`` not a finite number > 0; all checked before anything runs.
    """
    stacks = check_choices("stacks", stacks, STACKS)
    workloads = check_choices("workloads", workloads, WORKLOADS)
    check_keys("config", config, CONFIG)
    timeout_s = check_real("timeout_s", timeout_s, above=0.0)
    runs, errors, workload_info = [], {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for workload in workloads:
            batches = workload_batches(workload, config["steps"], config)
            path = os.path.join(folder, f"{workload}.pt")
            torch.save(batches, path)
            fills = [b.active_tokens / b.token_capacity for b in batches]
            workload_info[workload] = {
                "active_tokens": [b.active_tokens for b in batches],
                "active_sequences": [b.active_sequences for b in batches],
                "max_seqlen": [b.max_seqlen for b in batches],
                "mean_fill": sum(fills) / len(fills),
                "loss_tokens": [int(b.loss_mask.sum()) for b in batches],
            }
            for stack in stacks:
                try:
                    runs.append(run_isolated(run_stack, workload, stack, path, config, timeout_s=timeout_s))
                except IsolatedRunError as error:
                    errors[f"{workload} / {stack}"] = str(error)[-3000:]
    return {"config": {**config, "stacks": list(stacks), "workloads": list(workloads),
                       "timing": "real (active) tokens over the timed steps / host wall clock, synchronised at both ends"},
            "workloads": workload_info, "runs": runs, "errors": errors}


__all__ = ["CONFIG", "SFT_CORPUS_DOCUMENTS", "STACKS", "WORKLOADS", "end_to_end_suite", "run_stack", "workload_batches"]
