"""Benchmark suite ``scale-out``: chapter 8's model trained data-parallel on one and two GPUs,
eager DDP against DDP captured as one CUDA graph per rank.

The model and the two workloads are those of the end-to-end suite
(:mod:`attn_gym_lite.bench.end_to_end`): a :class:`~attn_gym_lite.models.PackedTransformer` in
bfloat16 with this package's kernels, ``T`` tokens per rank and step, ``pretraining`` (best-fit
packing, ``L`` close to ``T``) and ``sft`` (a fixed number of documents, ``L`` anywhere in 10-100 %
of ``T``), from the same builder (:func:`~attn_gym_lite.bench.end_to_end.workload_batches`). Every
rank reads its own shard of the corpus
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
  starts, after ``timed_warmup`` steps), tokens per second of every timed step (the step's active
  tokens over all ranks divided by its time) with their median and p10/p50/p90
  (:func:`throughput`), losses, set-up time, peak memory;
* ``scaling``: tokens/s at ``W = 2`` over twice that at ``W = 1`` (scaling efficiency) per
  workload and mode, and captured against eager DDP (:func:`scaling`; the chapter's goals read
  these ratios through :func:`goals`);
* ``gradient_check`` (``W = 2``): the gradient of the first step, eager and captured, against one
  process that trains on both ranks' batches packed together
  (:func:`~attn_gym_lite.data.sharding.global_batch`), as norm-wise relative differences with a
  tolerance set by the dtype; beside it, the same difference for the mean of the ranks' own
  means (the wrong loss), to show the check can fail. (That two ``gloo`` ranks give one process's
  gradient to float64 rounding is a unit test, ``tests/test_distributed.py``.);
* ``traces``: per rank, a profiled step of each mode reduced to numbers by
  :func:`communication_overlap`: how long NCCL kernels ran and how much of that time other
  kernels (the backward) ran beside them;
* ``fsdp2``: whether ``torch.distributed.fsdp.fully_shard`` (FSDP2) trains under the same
  whole-step capture, with its eager step time, or the error that stopped it;
* ``gpu_count``, the launches (command, seconds, exit status) and the environment they got.

The launches run one after another within :data:`SUITE_BUDGET_S` seconds
(:func:`~attn_gym_lite.isolation.run_within_budget`); each is a process group of its own that a
timeout ends whole, torchrun and its workers
(:func:`~attn_gym_lite.isolation.run_process_group`).

Source: PyTorch's CUDA semantics notes ("CUDA Graphs" -> "Usage with DistributedDataParallel"),
``torchrun`` (torch.distributed.elastic), FSDP2's ``fully_shard`` API reference.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

import attn_gym_lite

from ..checks import check_bool, check_choices, check_file, check_int_sequence, check_keys, check_real
from ..data import load_tokenizer
from ..data.sharding import global_batch
from ..graph.capture import StaticInputs
from ..graph.distributed import CAPTURE_ENVIRONMENT, DataParallelTrainer, global_token_mean_loss, token_loss_sum
from ..isolation import run_process_group, run_within_budget
from ..models import PackedTransformer
from ..profiling import device_events, profile
from ..profiling.intervals import busy_and_gaps
from .end_to_end import SFT_CORPUS_DOCUMENTS, workload_batches
from .timing import median, percentiles, step_intervals_us

MIB = 2**20
WORKLOADS = ("pretraining", "sft")
MODES = ("eager", "graph")

#: The GPU configuration: chapter 8's model and batches (``T``, width, depth, loaders as in the
#: end-to-end suite), ``steps`` batches per rank of which the first ``timed_warmup`` are not timed.
CONFIG = {
    "T": 4096, "dim": 512, "num_heads": 8, "num_layers": 4, "lr": 1e-3, "steps": 40, "timed_warmup": 8,
    "sft_documents": 16, "sft_min_fill": 0.1, "sft_corpus_documents": SFT_CORPUS_DOCUMENTS, "pretraining_buffer": 32, "seed": 0,
    "device": "cuda", "dtype": "bfloat16", "impl": "auto", "bucket_cap_mb": None,
    "gradient_workload": "sft", "profile_workload": "pretraining", "profile_steps": 2,
    "fsdp2_workload": "pretraining", "fsdp2_steps": 12,
}

#: A CPU configuration for CI and the chapter's demonstration: ``gloo``, eager, a tiny model in
#: float32 with the reference attention, a few small batches.
CPU_CONFIG = {
    **CONFIG, "T": 128, "dim": 32, "num_heads": 2, "num_layers": 1, "steps": 5, "timed_warmup": 2,
    "sft_documents": 4, "sft_corpus_documents": 40, "pretraining_buffer": 8, "device": "cpu", "dtype": "float32",
    "impl": "reference", "profile_workload": None, "fsdp2_workload": None,
}

#: The chapter's goal for captured DDP: tokens/s on two GPUs at least this many times those of one.
TWO_GPU_SPEEDUP_GOAL = 1.9

#: Seconds for all of a suite's launches, their batch building included (the recording script
#: gives the suite 480 s: this, a hung last launch's :data:`STOP_GRACE_S` twice, and the start).
SUITE_BUDGET_S = 420.0
#: A launch with less than this left of the budget is not started (seconds).
MIN_LAUNCH_S = 30.0
#: Seconds from a timed-out launch's SIGTERM to its SIGKILL (and from that to giving up on it).
STOP_GRACE_S = 10.0
#: Steps of each FSDP2 run (eager, then captured) that are not timed: the first, which warm up.
FSDP2_UNTIMED_STEPS = 2

#: Norm-wise relative tolerance of the gradient check, by the dtype the model trains in. bfloat16
#: keeps 8 significant bits (unit roundoff 2^-8): both gradients compared carry a rounding of every
#: activation and gradient tensor, in different orders (the two-rank side also sums its bucket in
#: bfloat16), so they differ by a few roundoffs; 2^-5 is 8 of them. float32 and float64 get the
#: same reasoning at their precision, with room for the longer chains of rounding a deeper model has.
GRADIENT_TOLERANCE = {"bfloat16": 2.0**-5, "float16": 2.0**-8, "float32": 1e-4, "float64": 1e-10}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


# ---------------------------------------------------------------------------------------------
# Batches: every rank's shard (end_to_end.workload_batches), built once in the parent.


def _batch_file(folder: Path | str, workload: str, rank: int, world_size: int) -> Path:
    return Path(folder) / f"{workload}_rank{rank}_of{world_size}.pt"


# ---------------------------------------------------------------------------------------------
# Reading a trace: does communication overlap computation?


def _busy(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``spans`` (the profiling layer's one interval sweep)."""
    return busy_and_gaps(spans)[0]


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

    nccl_events = [e for e in kernels if is_nccl(e)]
    compute_events = [e for e in kernels if not is_nccl(e)]
    nccl, compute = [span(e) for e in nccl_events], [span(e) for e in compute_events]
    compute_us = _busy(compute)

    def overlap_with_compute(spans: list[tuple[float, float]]) -> float:
        # |A ∩ B| = |A| + |B| - |A ∪ B|: the intersection from three unions.
        return _busy(spans) + compute_us - _busy(spans + compute)

    nccl_us, overlap = _busy(nccl), overlap_with_compute(nccl)
    origin = float(kernels[0]["ts"])
    listed = [{"name": str(e.get("name", ""))[:80], "start_us": float(e["ts"]) - origin, "dur_us": float(e["dur"]),
               "overlap_us": overlap_with_compute([span(e)])} for e in nccl_events[:16]]
    return {
        "steps": steps,
        "kernels_per_step": len(kernels) / steps,
        "nccl_kernels_per_step": len(nccl) / steps,
        "nccl_us_per_step": nccl_us / steps,
        "compute_us_per_step": compute_us / steps,
        "overlap_us_per_step": overlap / steps,
        "overlap_fraction": overlap / nccl_us if nccl_us > 0 else 0.0,
        "streams": {"nccl": sorted({str(e.get("tid")) for e in nccl_events}),
                    "compute": sorted({str(e.get("tid")) for e in compute_events})},
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
# Throughput and its ratios: computed once, here, for the record, the figure and the chapter.


def throughput(global_active_tokens: Sequence[int], step_ms: Sequence[float]) -> dict:
    """A run's timed steps as throughput: per step and summarised.

    Args:
        global_active_tokens: each timed step's active tokens ``L`` summed over all ranks.
        step_ms: each timed step's time (ms, > 0; see
            :func:`~attn_gym_lite.bench.timing.step_intervals_us`), as many as tokens.

    Returns:
        ``{"timed_steps", "step_ms", "median_step_ms", "tokens_per_s_steps" (each step's tokens
        over its time, tokens/s), "tokens_per_s" (their median), "tokens_per_s_spread" ({"p10",
        "p50", "p90"} of them, :func:`~attn_gym_lite.bench.timing.percentiles`),
        "tokens_per_s_overall" (all the tokens over all the time)}``.

    Raises:
        ValueError: no steps, the two lengths differ, or a step time is not > 0.
    """
    tokens, step_ms = [int(t) for t in global_active_tokens], [float(ms) for ms in step_ms]
    if not step_ms or len(tokens) != len(step_ms):
        raise ValueError(f"global_active_tokens and step_ms must hold one entry per timed step (at least one), "
                         f"got {len(tokens)} and {len(step_ms)}")
    if min(step_ms) <= 0:
        raise ValueError(f"step_ms must be > 0, got {min(step_ms)}")
    rates = [t / (ms / 1e3) for t, ms in zip(tokens, step_ms)]
    return {"timed_steps": len(rates), "step_ms": step_ms, "median_step_ms": median(step_ms),
            "tokens_per_s_steps": rates, "tokens_per_s": median(rates),
            "tokens_per_s_spread": percentiles(rates), "tokens_per_s_overall": sum(tokens) / (sum(step_ms) / 1e3)}


def scaling(runs: list[dict]) -> list[dict]:
    """Per workload and mode: tokens/s at each ``W > 1`` over ``W`` times that at ``W = 1``
    (scaling efficiency, 1.0 is perfect), and per workload and ``W`` captured over eager DDP.

    Args:
        runs: the suite's ``runs`` (each with ``workload``, ``world_size``, ``mode`` and
            ``tokens_per_s``, the median over its timed steps).

    Returns:
        Rows ``{"workload", "mode", "world_size", "speedup_over_one_gpu", "efficiency"}`` and
        ``{"workload", "world_size", "mode": "graph over eager", "speedup"}``: the suite stores
        them as ``"scaling"``; :func:`goals`, the chapter and its figure read them from there.

    Raises:
        TypeError / ValueError: ``runs`` is not a list of dicts with those four keys (the message
            names the entry and the missing keys).
    """
    if not isinstance(runs, (list, tuple)):
        raise TypeError(f"runs must be a list of run dicts (the suite's 'runs'), got {type(runs).__name__}")
    for i, run in enumerate(runs):
        check_keys(f"runs[{i}]", run, ("workload", "world_size", "mode", "tokens_per_s"))
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


def goals(record: dict) -> list[dict]:
    """The chapter's goals, per workload, read from a suite result's ``"scaling"`` rows.

    Captured DDP on two GPUs at least :data:`TWO_GPU_SPEEDUP_GOAL` times the tokens/s of one
    captured GPU, and ahead of eager DDP on two GPUs.

    Returns:
        One ``{"workload", "goal" (words), "value" (the ratio; NaN where a run it needs is
        missing), "target", "met" (bool, or None when the value is NaN)}`` per goal and workload
        of :data:`WORKLOADS`.

    Raises:
        TypeError / ValueError: ``record`` is not a dict, or its ``"scaling"`` is not a list of
            dicts with ``workload``, ``mode`` and ``world_size`` (as :func:`scaling` makes them).
    """
    if not isinstance(record, dict):
        raise TypeError(f"record must be a scale-out suite result (a dict), got {type(record).__name__}")
    scaling_rows = record.get("scaling") or []
    if not isinstance(scaling_rows, (list, tuple)):
        raise TypeError(f"record['scaling'] must be a list of rows (see scaling()), got {type(scaling_rows).__name__}")
    for i, row in enumerate(scaling_rows):
        check_keys(f"record['scaling'][{i}]", row, ("workload", "mode", "world_size"))
    rows = {(r["workload"], r["mode"], r["world_size"]): r for r in scaling_rows}
    wanted = (
        (f"captured DDP on 2 GPUs >= {TWO_GPU_SPEEDUP_GOAL}x captured on 1", "graph", "speedup_over_one_gpu",
         TWO_GPU_SPEEDUP_GOAL),
        ("captured DDP ahead of eager DDP on 2 GPUs", "graph over eager", "speedup", 1.0),
    )
    result = []
    for workload in WORKLOADS:
        for goal, mode, key, target in wanted:
            value = rows.get((workload, mode, 2), {}).get(key, math.nan)
            result.append({"workload": workload, "goal": goal, "value": value, "target": target,
                           "met": None if math.isnan(value) else value >= target})
    return result


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


def _model(config: dict, device: torch.device, **overrides) -> PackedTransformer:
    sizes = {"dim": config["dim"], "num_heads": config["num_heads"], "num_layers": config["num_layers"],
             "impl": config["impl"], "dtype": _DTYPES[config["dtype"]], **overrides}
    torch.manual_seed(config["seed"])  # the same initial weights on every rank and in every run
    return PackedTransformer(config["vocab_size"], sizes["dim"], sizes["num_heads"], sizes["num_layers"],
                             impl=sizes["impl"], device=device, dtype=sizes["dtype"])


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().to(torch.float32, copy=True) for name, p in model.named_parameters()}


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

    def step(indexed: tuple[int, object]) -> torch.Tensor:
        index, batch = indexed
        loss = trainer.step(batch)
        if index == 0 and keep_gradient and rank == 0:
            results.gradients[mode] = _grads(model)
        return loss

    step_us, losses = step_intervals_us(step, enumerate(batches), cuda=cuda)
    warm = config["timed_warmup"]
    run = {
        "workload": workload, "world_size": world_size, "mode": mode,
        **throughput(spec["global_tokens"][workload][warm:], [us / 1e3 for us in step_us[warm:]]),
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
    trainer = model = None  # dropped before freeing (the step above reads these names too)
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
        def on(batch) -> torch.Tensor:
            static.copy_(batch)
            return run()

        step_us, losses = step_intervals_us(on, batches, cuda=True)
        step_ms = [us / 1e3 for us in step_us[FSDP2_UNTIMED_STEPS:]]
        return {"step_ms": step_ms, "median_step_ms": median(step_ms),
                "losses": [float(x) for x in torch.stack(losses).float().cpu()]}

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


_PARTS = {"fsdp2": _fsdp2}


def worker_main(argv: list[str] | None = None) -> None:
    """One rank of a launch: ``python -m attn_gym_lite.bench.scale_out --spec SPEC.json`` under torchrun.

    Reads the launch's spec (config, workloads, modes, parts, where the batches are and where to
    write), joins the process group torchrun describes (``nccl`` on ``cuda:<LOCAL_RANK>``, or
    ``gloo`` on the CPU), runs the parts and has rank 0 write the result file. An error in one
    part is recorded and the next part still runs.

    Raises:
        SystemExit: ``argv`` without ``--spec`` (argparse's usage message).
        FileNotFoundError: no spec file there.
        ValueError: the spec is not JSON with the keys :func:`scale_out_suite` writes.
        RuntimeError: not started by torchrun (no ``RANK`` in the environment).
    """
    parser = argparse.ArgumentParser(description=worker_main.__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the launch's spec (JSON), written by scale_out_suite")
    path = check_file("--spec", parser.parse_args(argv).spec)
    try:
        spec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--spec {str(path)!r} must be the JSON spec scale_out_suite writes: {error}") from None
    check_keys(f"--spec {str(path)!r}", spec, ("config", "parts", "result", "collective_timeout_s"))
    if "RANK" not in os.environ:
        raise RuntimeError("worker_main is one rank of a torchrun launch (scale_out_suite starts it): RANK is not set")
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


def launch(world_size: int, spec: dict, folder: Path | str, tag: str, timeout_s: float) -> tuple[dict | None, dict]:
    """Run one launch: ``torchrun --standalone --nproc_per_node=W`` on :func:`worker_main`.

    torchrun runs as the leader of its own process group
    (:func:`~attn_gym_lite.isolation.run_process_group`): a timeout ends it and its workers
    (``SIGTERM``, then ``SIGKILL`` :data:`STOP_GRACE_S` later).

    Args:
        world_size: ``W``, processes (one per GPU in CUDA mode).
        spec: the launch's spec (its ``"result"`` is set here).
        folder: where the spec, the result and the launch's log go.
        tag: a name for this launch's files.
        timeout_s: seconds before torchrun and its workers are stopped (> 0).

    Returns:
        ``(result, info)``: what rank 0 wrote (``None`` if nothing), and ``{"command", "seconds",
        "returncode", "timed_out", "timeout_s"}`` plus ``"log_tail"`` when the launch did not exit
        with 0.

    Raises:
        TypeError, ValueError: ``timeout_s`` is not a finite number > 0.
    """
    folder = Path(folder)
    result_path, spec_path, log_path = (folder / f"{tag}.{suffix}" for suffix in ("result.json", "spec.json", "log"))
    spec = {**spec, "result": str(result_path)}
    spec_path.write_text(json.dumps(spec))
    module = "attn_gym_lite.bench.scale_out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
               "-m", module, "--spec", str(spec_path)]
    run = run_process_group(command, timeout_s=timeout_s, env=_child_environment(spec["config"]["device"] == "cuda"),
                            log=log_path, grace_s=STOP_GRACE_S)
    info = {"command": f"torchrun --standalone --nproc_per_node={world_size} -m {module} --spec <spec>",
            "seconds": run.seconds, "returncode": run.returncode, "timed_out": run.timed_out, "timeout_s": timeout_s}
    if run.returncode != 0:
        info["log_tail"] = log_path.read_text(errors="replace")[-3000:]
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    return result, info


def _traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))[-3000:]


def scale_out_suite(world_sizes: tuple[int, ...] = (1, 2), workloads: tuple[str, ...] = WORKLOADS,
                    modes: tuple[str, ...] = MODES, config: dict = CONFIG, timeout_s: float = 150.0,
                    fsdp2: bool = True, fsdp2_timeout_s: float = 90.0,
                    budget_s: float | None = SUITE_BUDGET_S) -> dict:
    """Eager and captured DDP at each world size on each workload, one torchrun launch per world
    size (and one for FSDP2); see the module docstring for what is reported.

    Args:
        world_sizes: ``W`` values; on a GPU host one GPU per rank (a ``W`` above the GPU count is
            recorded as an error, not run).
        workloads, modes: subsets of :data:`WORKLOADS` and :data:`MODES` (``"graph"`` needs CUDA).
        config: :data:`CONFIG` (GPU) or :data:`CPU_CONFIG` (``gloo``, eager, tiny; for CI).
        timeout_s: per launch, seconds, building its batches included.
        fsdp2: also try FSDP2 under capture (GPU, ``W = 2``).
        fsdp2_timeout_s: that launch's timeout.
        budget_s: seconds for all the launches (:data:`SUITE_BUDGET_S`), or ``None`` for no bound:
            a launch's timeout is cut to what is left, and one with less than
            :data:`MIN_LAUNCH_S` left is not started (an entry of ``errors`` says so).

    Returns:
        A JSON-ready dict: ``config``, ``gpu_count``, ``environment``, ``workloads`` (per ``W``: the
        global active tokens of every step), ``runs``, ``scaling``, ``gradient_check``,
        ``traces``, ``fsdp2``, ``launches`` and ``errors`` (strings).

    Raises:
        TypeError / ValueError: ``world_sizes`` not a non-empty sequence of ints >= 1,
            ``workloads`` or ``modes`` not a non-empty sequence of names from theirs (the message
            names the entry), ``config`` not a dict with :data:`CONFIG`'s keys, ``fsdp2`` not a
            bool, a timeout not a finite number > 0, ``budget_s`` neither ``None`` nor > 0; all
            checked before anything is built or launched. What fails in a launch is recorded
            under ``errors``, not raised.
    """
    world_sizes = tuple(check_int_sequence("world_sizes", world_sizes, minimum=1))
    workloads = check_choices("workloads", workloads, WORKLOADS)
    modes = check_choices("modes", modes, MODES)
    check_keys("config", config, CONFIG)
    timeout_s = check_real("timeout_s", timeout_s, above=0.0)
    fsdp2 = check_bool("fsdp2", fsdp2)
    fsdp2_timeout_s = check_real("fsdp2_timeout_s", fsdp2_timeout_s, above=0.0)
    budget_s = None if budget_s is None else check_real("budget_s", budget_s, above=0.0)
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
                        "budget_s": budget_s,
                        "timing": "tokens/s of a step = active tokens over all ranks / time between consecutive step "
                                  "starts (CUDA events on rank 0); median and p10/p50/p90 over the timed steps"}
    with tempfile.TemporaryDirectory(prefix="scale_out.") as folder:
        built: set[tuple[str, int]] = set()

        def build(workload: str, world_size: int) -> list[int]:
            per_rank = [workload_batches(workload, config["steps"], config, rank=r, world_size=world_size,
                                         tokenizer=tokenizer) for r in range(world_size)]
            for rank, batches in enumerate(per_rank):
                torch.save(batches, _batch_file(folder, workload, rank, world_size))
            built.add((workload, world_size))
            return [sum(step) for step in zip(*[[b.active_tokens for b in batches] for batches in per_rank])]

        def launch_within(limit: float, began: float, world_size: int, spec: dict, key: str, tag: str) -> None:
            left = limit - (time.monotonic() - began)
            if left < MIN_LAUNCH_S:
                raise TimeoutError(f"building the batches took {limit - left:.0f} s of the launch's {limit:.0f} s: "
                                   f"not launched")
            data, result["launches"][key] = launch(world_size, {**spec, "collective_timeout_s": left}, folder, tag, left)
            _merge(result, data, key)

        def train_at(world_size: int):
            def part(limit: float) -> None:
                began, key = time.monotonic(), f"W={world_size}"
                tokens = {workload: build(workload, world_size) for workload in workloads}
                result["workloads"][key] = {w: {"global_active_tokens": t,
                                                "mean_fill": sum(t) / (len(t) * world_size * config["T"])}
                                            for w, t in tokens.items()}
                spec = {"config": config, "workloads": list(workloads), "modes": list(modes), "parts": ["train"],
                        "batches": folder, "global_tokens": tokens}
                launch_within(limit, began, world_size, spec, key, f"w{world_size}")
            return part

        def try_fsdp2(limit: float) -> None:
            began, workload = time.monotonic(), config["fsdp2_workload"]
            if (workload, 2) not in built:
                build(workload, 2)
            spec = {"config": config, "workloads": [], "modes": [], "parts": ["fsdp2"], "batches": folder,
                    "global_tokens": {}}
            launch_within(limit, began, 2, spec, "fsdp2", "fsdp2")

        parts, timeouts = {}, {}
        for world_size in world_sizes:
            if cuda and gpu_count < world_size:
                result["errors"][f"W={world_size}"] = f"needs {world_size} GPUs, this host has {gpu_count}: not run"
            else:
                parts[f"W={world_size}"], timeouts[f"W={world_size}"] = train_at(world_size), timeout_s
        if fsdp2 and cuda and config.get("fsdp2_workload"):
            if gpu_count < 2:
                result["fsdp2"] = {"not run": f"needs 2 GPUs, this host has {gpu_count}"}
            else:
                parts["fsdp2"], timeouts["fsdp2"] = try_fsdp2, fsdp2_timeout_s
        _, errors = run_within_budget(parts, timeout_s=timeouts, budget_s=budget_s, min_part_s=MIN_LAUNCH_S,
                                      describe=_traceback)
        result["errors"].update(errors)
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
    for name in ("gradient_check", "fsdp2"):
        if name in data:
            result[name] = data[name]
    result["launches"][key]["ranks"] = {k: data.get(k) for k in ("world_size", "backend", "device", "nccl")}


__all__ = ["CONFIG", "CPU_CONFIG", "FSDP2_UNTIMED_STEPS", "GRADIENT_TOLERANCE", "MIN_LAUNCH_S", "MODES",
           "STOP_GRACE_S", "SUITE_BUDGET_S", "TWO_GPU_SPEEDUP_GOAL", "WORKLOADS", "communication_overlap", "goals",
           "launch", "relative_differences", "scale_out_suite", "scaling", "throughput", "worker_main"]


if __name__ == "__main__":
    worker_main()
