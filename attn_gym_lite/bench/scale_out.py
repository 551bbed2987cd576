"""Benchmark suite ``scale-out``: chapter 8's model trained data-parallel on one and two GPUs,
eager DDP against DDP captured as one CUDA graph per rank.

The model and the two workloads are those of the end-to-end suite
(:mod:`attn_gym_lite.bench.end_to_end`): a :class:`~attn_gym_lite.models.PackedTransformer` in
bfloat16 with this package's kernels, ``T`` tokens per rank and step, ``pretraining`` (best-fit
packing, ``L`` close to ``T``) and ``sft`` (a fixed number of documents, ``L`` anywhere in 10-100 %
of ``T``). Every rank reads its own shard of the corpus
(:class:`~attn_gym_lite.data.sharding.ShardedPackedLoader`; for ``sft`` a shard of the documents
and a seed per rank), so ``W`` GPUs train on ``W`` times the tokens per step (weak scaling). The
training step is :class:`~attn_gym_lite.graph.distributed.DataParallelTrainer`: the loss is the
mean over every rank's loss-masked tokens, its count all-reduced on the device.

How it runs: this process builds every rank's batches on the CPU and starts, for each world size
``W``, ``torchrun --standalone --nproc_per_node=W`` on this module (:func:`worker_main`), with
:data:`~attn_gym_lite.graph.distributed.CAPTURE_ENVIRONMENT` (NVLink multicast off, DDP's
asynchronous error handling off) in the environment, and a timeout. Rank 0 writes what the ranks
measured to a JSON file after every part, so a launch that fails or hangs still hands back the
parts it finished; any error becomes a string under ``"errors"``, never a crash of the suite.

Reported:

* ``runs``: per (workload, ``W``, mode) the step times (CUDA events between consecutive step
  starts, after ``timed_warmup`` steps), tokens per second (the step's active tokens over all
  ranks divided by its time; median over the timed steps), losses, set-up time, peak memory;
* ``scaling``: tokens/s at ``W = 2`` over twice that at ``W = 1`` (scaling efficiency) per
  workload and mode, and captured against eager DDP;
* ``gradient_check`` (``W = 2``): the gradient of the first step, eager and captured, against one
  process that trains on both ranks' batches packed together
  (:func:`~attn_gym_lite.data.sharding.global_batch`), as norm-wise relative differences with a
  tolerance set by the dtype; beside it, the same difference for the mean of the ranks' own
  means (the wrong loss), to show the check can fail; and an exact float64 check (a small model,
  reference attention, eager DDP);
* ``traces``: per rank, a profiled step of each mode reduced to numbers by
  :func:`communication_overlap`: how long NCCL kernels ran and how much of that time other
  kernels (the backward) ran beside them;
* ``fsdp2``: whether ``torch.distributed.fsdp.fully_shard`` (FSDP2) trains under the same
  whole-step capture, with its eager step time, or the error that stopped it;
* ``gpu_count``, the launches (command, seconds, exit status) and the environment they got.

Source: PyTorch's CUDA semantics notes ("CUDA Graphs" -> "Usage with DistributedDataParallel"),
``torchrun`` (torch.distributed.elastic), FSDP2's ``fully_shard`` API reference.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

import attn_gym_lite

from ..data import BestFit, fixed_count_loader, load_tokenizer, python_stdlib_corpus
from ..data.sharding import ShardedPackedLoader, global_batch, shard_corpus
from ..graph.capture import StaticInputs
from ..graph.distributed import CAPTURE_ENVIRONMENT, DataParallelTrainer, global_token_mean_loss, token_loss_sum
from ..models import PackedTransformer
from ..profiling import device_events, profile

MIB = 2**20
WORKLOADS = ("pretraining", "sft")
MODES = ("eager", "graph")

#: The GPU configuration: chapter 8's model and batches (``T``, width, depth, loaders as in the
#: end-to-end suite), ``steps`` batches per rank of which the first ``timed_warmup`` are not timed.
CONFIG = {
    "T": 4096, "dim": 512, "num_heads": 8, "num_layers": 4, "lr": 1e-3, "steps": 40, "timed_warmup": 8,
    "sft_documents": 16, "sft_min_fill": 0.1, "sft_corpus_documents": 200, "pretraining_buffer": 32, "seed": 0,
    "device": "cuda", "dtype": "bfloat16", "impl": "auto", "bucket_cap_mb": None,
    "gradient_workload": "sft", "profile_workload": "pretraining", "profile_steps": 2,
    "exact_check": {"dim": 64, "num_heads": 2, "num_layers": 2},
    "fsdp2_workload": "pretraining", "fsdp2_steps": 12,
}

#: A CPU configuration for CI and the chapter's demonstration: ``gloo``, eager, a tiny model in
#: float32 with the reference attention, a few small batches.
CPU_CONFIG = {
    **CONFIG, "T": 128, "dim": 32, "num_heads": 2, "num_layers": 1, "steps": 5, "timed_warmup": 2,
    "sft_documents": 4, "sft_corpus_documents": 40, "pretraining_buffer": 8, "device": "cpu", "dtype": "float32",
    "impl": "reference", "profile_workload": None, "exact_check": None, "fsdp2_workload": None,
}

#: Norm-wise relative tolerance of the gradient check, by the dtype the model trains in. bfloat16
#: keeps 8 significant bits (unit roundoff 2^-8): both gradients compared carry a rounding of every
#: activation and gradient tensor, in different orders (the two-rank side also sums its bucket in
#: bfloat16), so they differ by a few roundoffs; 2^-5 is 8 of them. float32 and float64 get the
#: same reasoning at their precision, with room for the longer chains of rounding a deeper model has.
GRADIENT_TOLERANCE = {"bfloat16": 2.0**-5, "float16": 2.0**-8, "float32": 1e-4, "float64": 1e-10}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


# ---------------------------------------------------------------------------------------------
# Batches: every rank's shard, built once in the parent.


def rank_batches(workload: str, rank: int, world_size: int, steps: int, config: dict, tokenizer=None) -> list:
    """Rank ``rank`` of ``world_size``'s ``steps`` batches of ``workload``, on the CPU.

    ``pretraining``: :class:`~attn_gym_lite.data.sharding.ShardedPackedLoader` over the standard
    library (best-fit, as in the end-to-end suite); ``sft``: :func:`~attn_gym_lite.data.fixed_count_loader`
    over the rank's shard of the first ``sft_corpus_documents`` documents, seed ``seed + rank``.
    With ``world_size = 1`` both are the end-to-end suite's batches. Deterministic.

    Raises:
        ValueError: unknown ``workload``.
    """
    tokenizer = tokenizer or load_tokenizer()
    if workload == "pretraining":
        loader = ShardedPackedLoader(config["T"], corpus=python_stdlib_corpus, tokenizer=tokenizer,
                                     policy=BestFit(config["pretraining_buffer"]), seed=config["seed"], epochs=None,
                                     prefetch=0, pin_memory=False, rank=rank, world_size=world_size)
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == steps:
                return batches
    if workload == "sft":
        documents = list(python_stdlib_corpus(limit=config["sft_corpus_documents"]))
        ids = tokenizer.encode_batch(list(shard_corpus(documents, rank, world_size)()))
        stream = torch.tensor([t for doc in ids for t in doc], dtype=torch.int64)
        return list(fixed_count_loader(stream, steps, config["T"], config["sft_documents"],
                                       min_fill=config["sft_min_fill"], seed=config["seed"] + rank))
    raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")


def _batch_file(folder: Path | str, workload: str, rank: int, world_size: int) -> Path:
    return Path(folder) / f"{workload}_rank{rank}_of{world_size}.pt"


# ---------------------------------------------------------------------------------------------
# Reading a trace: does communication overlap computation?


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists (two pointers)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def communication_overlap(trace: dict, steps: int = 1) -> dict:
    """How much of the NCCL kernels' time other kernels ran beside them, from a profiler trace.

    A kernel whose name contains ``"nccl"`` (case-insensitive) is communication; every other
    kernel is computation. Overlap is the length of the intersection of the union of the
    communication intervals with the union of the computation intervals: the time the GPU did
    both at once. In a data-parallel step the gradient all-reduces are launched during the
    backward, so an overlapped all-reduce runs beside backward kernels; the all-reduce of the last
    bucket (and of the loss) has nothing left to hide behind.

    Args:
        trace: a Chrome trace dict (``attn_gym_lite.profiling.profile(...).trace``), times in µs.
        steps: steps the trace covers (int >= 1); per-step figures are divided by it.

    Returns:
        ``{"steps", "kernels_per_step", "nccl_kernels_per_step", "nccl_us_per_step" (union of
        communication time), "compute_us_per_step" (union of computation time),
        "overlap_us_per_step", "overlap_fraction" (overlap / communication, 0.0 without any),
        "streams": {"nccl": [...], "compute": [...]}, "nccl_kernels": [first 16 as {"name",
        "start_us" (from the first kernel), "dur_us", "overlap_us"}]}``.

    Raises:
        TypeError: ``trace`` is not a trace dict.
        ValueError: ``steps`` is not an int >= 1, or the trace has no kernel.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    kernels = [e for e in device_events(trace) if e.get("cat") == "kernel"]
    if not kernels:
        raise ValueError("the trace has no kernel events (a trace recorded without a GPU has none)")

    def is_nccl(event: dict) -> bool:
        return "nccl" in str(event.get("name", "")).lower()

    def span(event: dict) -> tuple[float, float]:
        return float(event["ts"]), float(event["ts"]) + float(event["dur"])

    nccl = [e for e in kernels if is_nccl(e)]
    compute = [e for e in kernels if not is_nccl(e)]
    nccl_union, compute_union = _union([span(e) for e in nccl]), _union([span(e) for e in compute])
    overlap = _intersection_length(nccl_union, compute_union)
    nccl_us = sum(b - a for a, b in nccl_union)
    origin = float(kernels[0]["ts"])
    listed = [{"name": str(e.get("name", ""))[:80], "start_us": float(e["ts"]) - origin, "dur_us": float(e["dur"]),
               "overlap_us": _intersection_length([span(e)], compute_union)} for e in nccl[:16]]
    return {
        "steps": steps,
        "kernels_per_step": len(kernels) / steps,
        "nccl_kernels_per_step": len(nccl) / steps,
        "nccl_us_per_step": nccl_us / steps,
        "compute_us_per_step": sum(b - a for a, b in compute_union) / steps,
        "overlap_us_per_step": overlap / steps,
        "overlap_fraction": overlap / nccl_us if nccl_us > 0 else 0.0,
        "streams": {"nccl": sorted({str(e.get("tid")) for e in nccl}),
                    "compute": sorted({str(e.get("tid")) for e in compute})},
        "nccl_kernels": listed,
    }


# ---------------------------------------------------------------------------------------------
# Gradient comparison.


def relative_differences(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """Per parameter, ``||g - r|| / ||r||`` (norm-wise) and ``max |g - r| / max |r|``; their maxima.

    Computed in float64 on the tensors' device. Element-wise relative differences are not used:
    they blow up wherever a gradient entry crosses zero.

    Returns:
        ``{"max_normwise": float, "worst_parameter": str, "max_elementwise_scaled": float,
        "normwise": {name: float}}``.

    Raises:
        ValueError: the two dicts name different parameters or shapes differ.
    """
    if grads.keys() != reference.keys():
        raise ValueError(f"grads and reference must name the same parameters, got {sorted(grads)} and {sorted(reference)}")
    normwise, scaled = {}, {}
    for name, expected in reference.items():
        got, expected = grads[name].double(), expected.double().to(grads[name].device)
        if got.shape != expected.shape:
            raise ValueError(f"{name}: shapes differ, {tuple(got.shape)} and {tuple(expected.shape)}")
        normwise[name] = float((got - expected).norm() / expected.norm().clamp_min(1e-300))
        scaled[name] = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-300))
    worst = max(normwise, key=normwise.get)
    return {"max_normwise": normwise[worst], "worst_parameter": worst,
            "max_elementwise_scaled": max(scaled.values()), "normwise": normwise}


# ---------------------------------------------------------------------------------------------
# The worker: one rank, started by torchrun.


class _Results:
    """What rank 0 hands back: written (atomically) after every part, so a later hang loses nothing."""

    def __init__(self, path: str, rank: int) -> None:
        self.path, self.rank = Path(path), rank
        self.data: dict = {"runs": [], "errors": {}, "traces": {}}
        self.gradients: dict[str, dict[str, torch.Tensor]] = {}  # rank 0: first-step gradients, never written

    def error(self, key: str, error: BaseException) -> None:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self.data["errors"][key] = f"rank {self.rank}: {text[-3000:]}"
        self.save()

    def save(self) -> None:
        if self.rank != 0:
            return
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1))
        os.replace(partial, self.path)


class _Clock:
    """Step start times: CUDA events on the GPU (no synchronisation between steps), wall clock on a CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.marks = cuda, []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def _model(config: dict, device: torch.device, **overrides) -> PackedTransformer:
    sizes = {"dim": config["dim"], "num_heads": config["num_heads"], "num_layers": config["num_layers"],
             "impl": config["impl"], "dtype": _DTYPES[config["dtype"]], **overrides}
    torch.manual_seed(config["seed"])  # the same initial weights on every rank and in every run
    return PackedTransformer(config["vocab_size"], sizes["dim"], sizes["num_heads"], sizes["num_layers"],
                             impl=sizes["impl"], device=device, dtype=sizes["dtype"])


def _grads(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().to(dtype, copy=True) for name, p in model.named_parameters()}


def _free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _profiled(step, batches: list, steps: int, cuda: bool) -> dict:
    """``steps`` profiled steps (after one discarded) reduced by :func:`communication_overlap`."""
    with profile(None, warmup=1) as profiled:
        for batch in batches[: steps + 1]:
            step(batch)
            if cuda:
                torch.cuda.synchronize()
            profiled.step()
    return communication_overlap(profiled.trace, steps)


def _train(workload: str, mode: str, batches: list, spec: dict, device: torch.device, results: _Results) -> None:
    """One (workload, mode) run on every rank: train, time, keep the first gradient, maybe profile."""
    config, cuda = spec["config"], device.type == "cuda"
    world_size, rank = dist.get_world_size(), dist.get_rank()
    model = _model(config, device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    trainer = DataParallelTrainer(model, batches[0], use_graph=mode == "graph", lr=config["lr"],
                                  bucket_cap_mb=config["bucket_cap_mb"])
    setup_s = time.perf_counter() - began
    keep_gradient = world_size > 1 and workload == config["gradient_workload"]
    if keep_gradient and mode == "eager":
        # The wrong loss for contrast: DDP averaging each rank's own mean (packed_lm_loss's reduction).
        first = {name: getattr(batches[0], name).to(device) for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
        total, count = trainer.ddp(first["input_ids"], first["labels"], first["loss_mask"], first["cu_seqlens"],
                                   batches[0].max_seqlen)
        (total / count.clamp_min(1)).backward()
        if rank == 0:
            results.gradients["mean of rank means"] = _grads(model)
    clock, losses = _Clock(cuda), []
    for index, batch in enumerate(batches):
        clock.mark()
        losses.append(trainer.step(batch))
        if index == 0 and keep_gradient and rank == 0:
            results.gradients[mode] = _grads(model)
    clock.mark()
    step_ms = clock.intervals_ms()
    warm = config["timed_warmup"]
    global_tokens = spec["global_tokens"][workload]
    rates = [tokens / (ms / 1e3) for tokens, ms in zip(global_tokens[warm:], step_ms[warm:])]
    run = {
        "workload": workload, "world_size": world_size, "mode": mode,
        "timed_steps": len(rates),
        "step_ms": step_ms[warm:],
        "median_step_ms": statistics.median(step_ms[warm:]),
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_overall": sum(global_tokens[warm:]) / (sum(step_ms[warm:]) / 1e3),
        "losses": [float(x) for x in torch.stack(losses).float().cpu()],
        "setup_s": setup_s,
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
    }
    results.data["runs"].append(run)
    results.save()
    if cuda and workload == config["profile_workload"]:
        try:
            summary = _profiled(trainer.step, batches[1:], config["profile_steps"], cuda)
        except Exception as error:  # recorded, the run goes on
            summary = {"error": f"{type(error).__name__}: {error}"[-2000:]}
        gathered = [None] * world_size
        dist.all_gather_object(gathered, summary)
        results.data["traces"][f"W={world_size} / {mode}"] = {f"rank {r}": s for r, s in enumerate(gathered)}
        results.save()
    del trainer, model
    _free(cuda)


def _gradient_check(spec: dict, device: torch.device, results: _Results) -> None:
    """Rank 0: one process trains on the ranks' first batches packed together; compare gradients."""
    config, world_size = spec["config"], dist.get_world_size()
    workload = config["gradient_workload"]
    firsts = [torch.load(_batch_file(spec["batches"], workload, r, world_size), weights_only=False)[0]
              for r in range(world_size)]
    both = global_batch(firsts)
    model = _model(config, device)
    fields = {name: getattr(both, name).to(device) for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
    logits = model(fields["input_ids"], fields["cu_seqlens"], both.max_seqlen)
    total, count = token_loss_sum(logits, fields["labels"], fields["loss_mask"])
    (total / count).backward()
    reference = _grads(model)
    tolerance = GRADIENT_TOLERANCE[config["dtype"]]
    check = {"workload": workload, "dtype": config["dtype"], "tolerance_normwise": tolerance,
             "loss_tokens_per_rank": [int(b.loss_mask.sum()) for b in firsts],
             "reference": f"one process, the {world_size} ranks' first batches packed into one of T = {both.token_capacity}",
             "comparisons": {}}
    for name, grads in results.gradients.items():
        diff = relative_differences(grads, reference)
        check["comparisons"][name] = {k: v for k, v in diff.items() if k != "normwise"}
        check["comparisons"][name]["within_tolerance"] = diff["max_normwise"] <= tolerance
    results.data["gradient_check"] = check
    results.gradients = {}
    del model, logits
    _free(device.type == "cuda")


def _exact_check(spec: dict, device: torch.device, results: _Results) -> None:
    """Every rank: eager DDP in float64 (reference attention) against one process; rank 0 compares."""
    config, world_size, rank = spec["config"], dist.get_world_size(), dist.get_rank()
    small = {**config, **config["exact_check"], "dtype": "float64", "impl": "reference"}
    workload = config["gradient_workload"]
    batches = [torch.load(_batch_file(spec["batches"], workload, r, world_size), weights_only=False)[0]
               for r in range(world_size)]
    model = _model(small, device)
    trainer = DataParallelTrainer(model, batches[rank], lr=config["lr"])
    loss = trainer.forward_backward(batches[rank])
    grads = _grads(model, torch.float64)
    del trainer, model
    if rank == 0:
        both = global_batch(batches)
        reference_model = _model(small, device)
        fields = {name: getattr(both, name).to(device) for name in ("input_ids", "labels", "loss_mask", "cu_seqlens")}
        logits = reference_model(fields["input_ids"], fields["cu_seqlens"], both.max_seqlen)
        total, count = token_loss_sum(logits, fields["labels"], fields["loss_mask"])
        reference_loss = total / count
        reference_loss.backward()
        diff = relative_differences(grads, _grads(reference_model, torch.float64))
        results.data["exact_check"] = {
            "dtype": "float64", "attention": "reference", "sizes": config["exact_check"], "workload": workload,
            "tolerance_normwise": GRADIENT_TOLERANCE["float64"],
            "loss_difference": abs(float(loss) - float(reference_loss)),
            **{k: v for k, v in diff.items() if k != "normwise"},
            "within_tolerance": diff["max_normwise"] <= GRADIENT_TOLERANCE["float64"],
        }
        results.save()
    _free(device.type == "cuda")


def _fsdp2(spec: dict, device: torch.device, results: _Results) -> None:
    """FSDP2 (``fully_shard``, one unit per block and the root) trained eagerly, then the same step
    captured whole, as DDP's is; records the step times or the error the capture raised."""
    from torch.distributed.fsdp import fully_shard

    config, world_size, rank = spec["config"], dist.get_world_size(), dist.get_rank()
    workload = config["fsdp2_workload"]
    batches = torch.load(_batch_file(spec["batches"], workload, rank, world_size), weights_only=False)
    batches = [b.pin_memory() for b in batches[: config["fsdp2_steps"]]]
    report: dict = {"workload": workload, "world_size": world_size, "steps": len(batches),
                    "sharding": "fully_shard on every TransformerBlock, then on the model"}
    results.data["fsdp2"] = report
    model = _model(config, device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    parameters = list(model.parameters())
    optimizer = torch.optim.Adam(parameters, lr=config["lr"], capturable=True)
    static = StaticInputs(batches[0], device)

    def step() -> torch.Tensor:
        for parameter in parameters:  # in place: FSDP2 then accumulates into the same shards
            if parameter.grad is not None:
                parameter.grad.zero_()
        logits = model(static.input_ids, static.cu_seqlens, config["T"])
        total, count = token_loss_sum(logits, static.labels, static.loss_mask)
        # FSDP2's reduce-scatter averages over the ranks like DDP, so DDP's loss scaling holds.
        loss = global_token_mean_loss(total, count)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def timed(run) -> dict:
        clock, losses = _Clock(True), []
        for batch in batches:
            clock.mark()
            static.copy_(batch)
            losses.append(run())
        clock.mark()
        step_ms = clock.intervals_ms()[2:]
        return {"median_step_ms": statistics.median(step_ms), "losses": [float(x) for x in torch.stack(losses).float().cpu()]}

    report["eager"] = timed(step)
    results.save()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            captured_loss = step()
    except Exception as error:  # the finding is the error itself
        report["capture"] = "failed"
        report["capture_error"] = f"{type(error).__name__}: {error}"[-2000:]
        results.save()
        return
    report["capture"] = "ok"

    def replay() -> torch.Tensor:
        graph.replay()
        return captured_loss.clone()

    report["graph"] = timed(replay)
    results.save()


_PARTS = {"exact": _exact_check, "fsdp2": _fsdp2}


def worker_main(argv: list[str] | None = None) -> None:
    """One rank of a launch: ``python -m attn_gym_lite.bench.scale_out --spec SPEC.json`` under torchrun.

    Reads the launch's spec (config, workloads, modes, parts, where the batches are and where to
    write), joins the process group torchrun describes (``nccl`` on ``cuda:<LOCAL_RANK>``, or
    ``gloo`` on the CPU), runs the parts and has rank 0 write the result file. An error in one
    part is recorded and the next part still runs.
    """
    parser = argparse.ArgumentParser(description=worker_main.__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the launch's spec (JSON), written by scale_out_suite")
    spec = json.loads(Path(parser.parse_args(argv).spec).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    results = _Results(spec["result"], rank)
    cuda = spec["config"]["device"] == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    options = {"backend": "nccl" if cuda else "gloo",
               "timeout": datetime.timedelta(seconds=spec["collective_timeout_s"])}
    if cuda:
        torch.cuda.set_device(device)
        options["device_id"] = device
    else:
        torch.set_num_threads(1)
    dist.init_process_group(**options)
    world_size = dist.get_world_size()
    try:
        results.data.update({
            "world_size": world_size, "backend": options["backend"],
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        })
        results.save()
        for part in spec["parts"]:
            if part != "train":
                try:
                    _PARTS[part](spec, device, results)
                except Exception as error:  # recorded; the next part runs
                    results.error(f"{part} / W={world_size}", error)
                _free(cuda)
                continue
            for workload in spec["workloads"]:
                batches = torch.load(_batch_file(spec["batches"], workload, rank, world_size), weights_only=False)
                batches = [b.pin_memory() for b in batches] if cuda else batches
                for mode in spec["modes"]:
                    try:
                        _train(workload, mode, batches, spec, device, results)
                    except Exception as error:  # recorded; the next run goes on
                        results.error(f"{workload} / W={world_size} / {mode}", error)
                        _free(cuda)
            if rank == 0 and results.gradients:
                try:
                    _gradient_check(spec, device, results)
                except Exception as error:  # recorded, not raised
                    results.error(f"gradient check / W={world_size}", error)
                results.gradients = {}
            results.save()
    finally:
        results.save()
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The suite: build the batches, launch torchrun per world size, collect.


def _child_environment(cuda: bool) -> dict[str, str]:
    env = {**os.environ, **CAPTURE_ENVIRONMENT}
    # The workers import the same package as this process, installed or from a checkout.
    package_parent = str(Path(attn_gym_lite.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    if not cuda:
        env["OMP_NUM_THREADS"] = "1"
        if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
            env["GLOO_SOCKET_IFNAME"] = "lo"  # stay on the loopback interface
    return env


def _stop(process: subprocess.Popen) -> None:
    """End torchrun and its workers: the launch runs in its own session, one process group."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(world_size: int, spec: dict, folder: Path | str, tag: str, timeout_s: float) -> tuple[dict | None, dict]:
    """Run one launch: ``torchrun --standalone --nproc_per_node=W`` on :func:`worker_main`.

    Args:
        world_size: ``W``, processes (one per GPU in CUDA mode).
        spec: the launch's spec (its ``"result"`` is set here).
        folder: where the spec, the result and the launch's log go.
        tag: a name for this launch's files.
        timeout_s: seconds before torchrun and its workers are stopped (SIGTERM, then SIGKILL).

    Returns:
        ``(result, info)``: what rank 0 wrote (``None`` if nothing), and ``{"command", "seconds",
        "returncode", "timed_out"}`` plus ``"log_tail"`` when the launch did not exit with 0.
    """
    folder = Path(folder)
    result_path, spec_path, log_path = (folder / f"{tag}.{suffix}" for suffix in ("result.json", "spec.json", "log"))
    spec = {**spec, "result": str(result_path)}
    spec_path.write_text(json.dumps(spec))
    module = "attn_gym_lite.bench.scale_out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
               "-m", module, "--spec", str(spec_path)]
    began = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=_child_environment(spec["config"]["device"] == "cuda"), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode, timed_out = process.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            _stop(process)
            returncode, timed_out = process.returncode, True
    info = {"command": f"torchrun --standalone --nproc_per_node={world_size} -m {module} --spec <spec>",
            "seconds": time.perf_counter() - began, "returncode": returncode, "timed_out": timed_out,
            "timeout_s": timeout_s}
    if returncode != 0:
        info["log_tail"] = log_path.read_text(errors="replace")[-3000:]
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    return result, info


def scaling(runs: list[dict]) -> list[dict]:
    """Per workload and mode: tokens/s at the largest ``W`` over ``W`` times that at ``W = 1``
    (scaling efficiency, 1.0 is perfect), and per workload and ``W`` captured over eager DDP."""
    rate = {(r["workload"], r["world_size"], r["mode"]): r["tokens_per_s"] for r in runs}
    rows = []
    for workload, world_size, mode in sorted(rate):
        if world_size > 1 and (workload, 1, mode) in rate:
            single = rate[workload, 1, mode]
            rows.append({"workload": workload, "mode": mode, "world_size": world_size,
                         "speedup_over_one_gpu": rate[workload, world_size, mode] / single,
                         "efficiency": rate[workload, world_size, mode] / (world_size * single)})
        if mode == "graph" and (workload, world_size, "eager") in rate:
            rows.append({"workload": workload, "world_size": world_size, "mode": "graph over eager",
                         "speedup": rate[workload, world_size, "graph"] / rate[workload, world_size, "eager"]})
    return rows


def scale_out_suite(world_sizes: tuple[int, ...] = (1, 2), workloads: tuple[str, ...] = WORKLOADS,
                    modes: tuple[str, ...] = MODES, config: dict = CONFIG, timeout_s: float = 150.0,
                    fsdp2: bool = True, fsdp2_timeout_s: float = 90.0) -> dict:
    """Eager and captured DDP at each world size on each workload, one torchrun launch per world
    size (and one for FSDP2); see the module docstring for what is reported.

    Args:
        world_sizes: ``W`` values; on a GPU host one GPU per rank (a ``W`` above the GPU count is
            recorded as an error, not run).
        workloads, modes: subsets of :data:`WORKLOADS` and :data:`MODES` (``"graph"`` needs CUDA).
        config: :data:`CONFIG` (GPU) or :data:`CPU_CONFIG` (``gloo``, eager, tiny; for CI).
        timeout_s: per launch, seconds.
        fsdp2: also try FSDP2 under capture (GPU, ``W = 2``).
        fsdp2_timeout_s: that launch's timeout.

    Returns:
        A JSON-ready dict: ``config``, ``gpu_count``, ``environment``, ``workloads`` (per ``W``: the
        global active tokens of every step), ``runs``, ``scaling``, ``gradient_check``,
        ``exact_check``, ``traces``, ``fsdp2``, ``launches`` and ``errors`` (strings).
    """
    cuda = config["device"] == "cuda"
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    result: dict = {"gpu_count": gpu_count, "environment": dict(CAPTURE_ENVIRONMENT), "workloads": {}, "runs": [],
                    "traces": {}, "launches": {}, "errors": {}}
    try:
        tokenizer = load_tokenizer()
        config = {**config, "vocab_size": tokenizer.vocab_size}
    except Exception as error:  # recorded, not raised
        result["errors"]["tokenizer"] = f"{type(error).__name__}: {error}"
        return {"config": dict(config), **result}
    result["config"] = {**config, "world_sizes": list(world_sizes), "workloads": list(workloads), "modes": list(modes),
                        "timing": "tokens/s of a step = active tokens over all ranks / time between consecutive step "
                                  "starts (CUDA events on rank 0); median over the timed steps"}
    with tempfile.TemporaryDirectory(prefix="scale_out.") as folder:
        built: set[tuple[str, int]] = set()

        def build(workload: str, world_size: int) -> list[int]:
            per_rank = [rank_batches(workload, r, world_size, config["steps"], config, tokenizer) for r in range(world_size)]
            for rank, batches in enumerate(per_rank):
                torch.save(batches, _batch_file(folder, workload, rank, world_size))
            built.add((workload, world_size))
            return [sum(step) for step in zip(*[[b.active_tokens for b in batches] for batches in per_rank])]

        for world_size in world_sizes:
            key = f"W={world_size}"
            if cuda and gpu_count < world_size:
                result["errors"][key] = f"needs {world_size} GPUs, this host has {gpu_count}: not run"
                continue
            try:
                tokens = {workload: build(workload, world_size) for workload in workloads}
            except Exception as error:  # recorded, not raised
                result["errors"][f"batches / {key}"] = "".join(traceback.format_exception(error))[-3000:]
                continue
            result["workloads"][key] = {w: {"global_active_tokens": t, "mean_fill": sum(t) / (len(t) * world_size * config["T"])}
                                        for w, t in tokens.items()}
            parts = ["train"] + (["exact"] if world_size > 1 and cuda and config.get("exact_check") else [])
            spec = {"config": config, "workloads": list(workloads), "modes": list(modes), "parts": parts,
                    "batches": folder, "global_tokens": tokens, "collective_timeout_s": timeout_s}
            data, result["launches"][key] = launch(world_size, spec, folder, f"w{world_size}", timeout_s)
            _merge(result, data, key)
        if fsdp2 and cuda and config.get("fsdp2_workload"):
            if gpu_count < 2:
                result["fsdp2"] = {"not run": f"needs 2 GPUs, this host has {gpu_count}"}
            else:
                try:
                    workload = config["fsdp2_workload"]
                    if (workload, 2) not in built:
                        build(workload, 2)
                    spec = {"config": config, "workloads": [], "modes": [], "parts": ["fsdp2"], "batches": folder,
                            "global_tokens": {}, "collective_timeout_s": fsdp2_timeout_s}
                    data, result["launches"]["fsdp2"] = launch(2, spec, folder, "fsdp2", fsdp2_timeout_s)
                    _merge(result, data, "fsdp2")
                except Exception as error:  # recorded, not raised
                    result["errors"]["fsdp2"] = "".join(traceback.format_exception(error))[-3000:]
    for key, info in result["launches"].items():
        if info["timed_out"] or info["returncode"] != 0:
            reason = f"timed out after {info['timeout_s']:.0f} s" if info["timed_out"] else f"exited with {info['returncode']}"
            result["errors"][f"launch {key}"] = f"{reason}; end of its log:\n{info.get('log_tail', '')}"
    result["scaling"] = scaling(result["runs"])
    return result


def _merge(result: dict, data: dict | None, key: str) -> None:
    if data is None:
        result["errors"].setdefault(f"result {key}", "rank 0 wrote no result")
        return
    result["runs"] += data.get("runs", [])
    result["traces"].update(data.get("traces", {}))
    result["errors"].update(data.get("errors", {}))
    for name in ("gradient_check", "exact_check", "fsdp2"):
        if name in data:
            result[name] = data[name]
    result["launches"][key]["ranks"] = {k: data.get(k) for k in ("world_size", "backend", "device", "nccl")}


__all__ = ["CONFIG", "CPU_CONFIG", "GRADIENT_TOLERANCE", "MODES", "WORKLOADS", "communication_overlap", "launch",
           "rank_batches", "relative_differences", "scale_out_suite", "scaling", "worker_main"]


if __name__ == "__main__":
    worker_main()
