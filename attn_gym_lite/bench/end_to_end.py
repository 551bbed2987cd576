"""Benchmark suite ``end-to-end``: a transformer trained with the whole stack, against the ways people
usually train it.

One model (:class:`~attn_gym_lite.models.PackedTransformer`), the same initial weights and the same
batches of real text, many ways to run its training step (forward, backward, fused Adam):

* ``eager padded``: each batch's documents right-padded to its longest, dense SDPA;
* ``eager packed``: all ``T`` rows at fixed shapes, torch's ``varlen_attn``;
* ``compile reduce-overhead, fixed capacity``: ``torch.compile`` with CUDA Graph Trees, every batch
  padded to ``T`` with ``max_seqlen = T`` (one shape: one recorded graph);
* ``graph ours``, ``buckets ours``: the package's trainer, one graph at ``T`` or graph buckets, with
  the package's kernels;
* ``compile + graph ours``, ``compile + buckets ours``: the same with the loss ``torch.compile`` d
  first, compiled before the capture, and ``compile + graph varlen_attn`` with torch's kernel at
  ``max_seqlen = T`` in the same place.

Two workloads: ``pretraining`` (best-fit packing of a shuffled corpus cut into pieces of at most
``pretraining_piece`` tokens, so batches hold several documents) and ``sft`` (a fixed number of
documents per batch, ``L`` anywhere in 10-100 % of ``T``, loss on the second half of each
document). Two model sizes: :data:`CONFIG` (chapter 8's, launch-bound) and :data:`LARGE` (dim 2048,
matmul-bound), and a sweep of ``T`` for the fastest stack. Each workload runs in a fresh process,
its stacks one after another (dynamo and its CUDA graph trees reset between them; a fresh process
per stack spent most of the suite starting interpreters and reloading compile caches), the profiled
replay last (the profiler slows every later launch of its process). Reported per run: real tokens per
second over ``repeats`` passes over the same timed batches (host clock, synchronised at both
ends), their median and spread, model FLOPs utilisation against the bf16 matmul rate measured on the same GPU, the loss of
every step, peak memory above what the process held before the stack was built, dynamo's counters
for the compiled stacks.
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import tempfile
import time

import torch

from ..data import BestFit, fixed_count_loader, load_tokenizer, plan_buckets, python_stdlib_corpus
from ..data.batch import padded_batch
from ..data.sharding import ShardedPackedLoader, shard_corpus
from ..graph.training import FixedCapacityTrainer
from ..isolation import IsolatedRunError, run_isolated
from ..models import PackedTransformer
from ..profiling import annotate_trace, profile, record_annotations, trace_summary
from .harness import error_text, recorded

MIB = 2**20
STACKS = ("eager padded", "eager packed", "compile reduce-overhead, fixed capacity", "graph ours", "buckets ours",
          "compile + graph varlen_attn", "compile + graph ours", "compile + buckets ours")
#: The stacks that are the package's own (the recipe picks the fastest of them).
OURS = ("graph ours", "buckets ours", "compile + graph ours", "compile + buckets ours")
WORKLOADS = ("pretraining", "sft")
#: Chapter 8's model and batches: small enough that launching kernels, not computing them, bounds
#: an eager step on an H200 (the regime CUDA graphs exist for), big enough to learn.
CONFIG = {"size": "chapter 8", "T": 4096, "dim": 512, "num_heads": 8, "num_layers": 4, "lr": 1e-3, "steps": 60,
          "warmup": 12, "repeats": 3, "sft_documents": 16, "sft_min_fill": 0.1, "pretraining_buffer": 32,
          "pretraining_piece": 1024, "buckets": 4, "bucket_align": 256, "seed": 0, "device": "cuda",
          "stacks": STACKS}
#: A matmul-bound size (438M parameters), for the fastest stacks of each kind.
LARGE = {**CONFIG, "size": "large", "T": 8192, "dim": 2048, "num_heads": 16, "num_layers": 8, "steps": 27,
         "warmup": 6, "sft_documents": 32,
         "stacks": ("compile reduce-overhead, fixed capacity", "compile + graph varlen_attn", "graph ours",
                    "buckets ours", "compile + graph ours", "compile + buckets ours")}
#: Documents of the standard-library corpus the ``sft`` workload draws from.
SFT_CORPUS_DOCUMENTS = 200


def workload_batches(workload: str, steps: int, config: dict = CONFIG, *, rank: int = 0, world_size: int = 1,
                     tokenizer=None) -> list:
    """``steps`` packed batches of capacity ``T`` of one workload for rank ``rank`` of ``world_size``
    (its shard of the corpus), on the CPU; deterministic. ``pretraining``: best-fit packing of the
    shard, repeated as needed, documents cut at ``config["pretraining_piece"]`` tokens (at ``T``
    without that key); ``sft``: ``config["sft_documents"]`` documents per batch, ``L >= sft_min_fill * T``."""
    tokenizer = tokenizer or load_tokenizer()
    if workload == "pretraining":
        loader = ShardedPackedLoader(config["T"], corpus=python_stdlib_corpus, tokenizer=tokenizer,
                                     policy=BestFit(config["pretraining_buffer"]), seed=config["seed"], epochs=None,
                                     max_piece_tokens=config.get("pretraining_piece"), prefetch=0, pin_memory=False,
                                     rank=rank, world_size=world_size)
        return list(itertools.islice(loader, steps))
    if workload == "sft":
        documents = list(python_stdlib_corpus(limit=config.get("sft_corpus_documents", SFT_CORPUS_DOCUMENTS)))
        ids = tokenizer.encode_batch(list(shard_corpus(documents, rank, world_size)()))
        stream = torch.tensor([t for doc in ids for t in doc], dtype=torch.int64)
        return list(fixed_count_loader(stream, steps, config["T"], config["sft_documents"],
                                       min_fill=config["sft_min_fill"], seed=config["seed"] + rank))
    raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")


class _LossStep:
    """The model's loss, ``torch.compile`` d with ``mode`` when ``compiled``, then backward and fused
    Adam. ``rows="active"`` feeds each batch's ``L`` rows and its own ``max_seqlen`` (new shapes every
    step); ``"capacity"`` all ``T`` rows and ``max_seqlen = T``. Takes batches of any capacity (the
    padded baseline's each have their own)."""

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
        for parameter, grad in zip(self.parameters, torch.autograd.grad(loss, self.parameters)):
            parameter.grad = grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()


def _dynamo_counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: dict(values) for group, values in counters.items()
            if group in ("stats", "graph_break", "recompiles", "frames")}


def _build(stack: str, model_args: dict, batches: list, config: dict):
    """(step function taking a batch, the batches it is fed) for one stack."""
    if stack not in STACKS:  # else a misspelt stack would run as a graph of torch's kernel
        raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
    torch.manual_seed(config["seed"])
    lr, device = config["lr"], torch.device(config["device"])
    impl = "sdpa" if stack == "eager padded" else "auto" if "ours" in stack else "varlen_attn"
    if device.type != "cuda" and impl == "varlen_attn":
        impl = "reference"  # a CPU smoke run: torch's kernel needs CUDA
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = PackedTransformer(**model_args, impl=impl, device=device, dtype=dtype)
    if stack == "eager padded":
        return _LossStep(model, None, "active", lr, compiled=False).step, [padded_batch(b) for b in batches]
    if stack == "eager packed":
        return FixedCapacityTrainer(model, batches[0], use_graph=False, lr=lr).step, batches
    if stack == "compile reduce-overhead, fixed capacity":
        return _LossStep(model, "reduce-overhead", "capacity", lr).step, batches
    capacities = None
    if "buckets" in stack:
        plan = plan_buckets([b.active_tokens for b in batches], config["buckets"], align=config["bucket_align"])
        capacities = sorted({*plan.capacities[:-1], config["T"]})
    trainer = FixedCapacityTrainer(model, batches[0], use_graph=True, capacities=capacities,
                                   compile=stack.startswith("compile +"), lr=lr)
    return trainer.step, batches


def model_flops(batch, config: dict, vocab_size: int) -> float:
    """Model FLOPs of one training step on ``batch``'s real tokens (forward + backward, the 3x of the
    PaLM convention): ``6 * L * matmul parameters`` (projections, MLP, LM head; not the embedding
    lookup) plus causal attention, ``6 * layers * dim * sum(s_i^2)``."""
    dim, layers = config["dim"], config["num_layers"]
    hidden = -(-int(8 / 3 * dim) // 64) * 64
    matmul_params = layers * (4 * dim * dim + 3 * dim * hidden) + dim * vocab_size
    lengths = batch.cu_seqlens.diff().to(torch.float64)
    return 6.0 * batch.active_tokens * matmul_params + 6.0 * layers * dim * float((lengths**2).sum())


def matmul_tflops(size: int = 8192, iters: int = 20) -> float:
    """The bf16 dense matmul rate of this GPU (``size``-square ``torch.mm``, median), TFLOP/s."""
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * size**3 / statistics.median(times) / 1e12


def run_stack(workload: str, stack: str, batches_path: str, config: dict = CONFIG) -> dict:
    """Train one stack on one workload in this process (the batches as :func:`end_to_end_suite`
    saves them); see the module docstring for what is reported."""
    batches = torch.load(batches_path, weights_only=False)
    cuda = torch.device(config["device"]).type == "cuda"
    if cuda:
        batches = [b.pin_memory() for b in batches]
    vocab_size = load_tokenizer().vocab_size
    model_args = {"vocab_size": vocab_size, "dim": config["dim"], "num_heads": config["num_heads"],
                  "num_layers": config["num_layers"]}
    held = torch.cuda.memory_allocated() if cuda else 0  # what earlier stacks of this process left
    start = time.perf_counter()
    step, fed = _build(stack, model_args, batches, config)
    warmup = config["warmup"]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = [step(b) for b in fed[:warmup]]  # compiles, captures, the first replays
    sync()
    setup_s = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timed = fed[warmup:]
    tokens = sum(b.active_tokens for b in batches[warmup:])
    seconds = []
    for repeat in range(config["repeats"]):  # the same timed batches each time: the spread is the noise
        began = time.perf_counter()
        pass_losses = [step(b) for b in timed]
        sync()
        seconds.append(time.perf_counter() - began)
        if repeat == 0:
            losses += pass_losses
        if seconds[0] > 5:  # a slow stack, far from the fast ones: one pass says enough
            break
    rates = [tokens / s for s in seconds]
    flops = statistics.mean(model_flops(b, config, vocab_size) for b in batches[warmup:])
    result = {
        "workload": workload, "stack": stack, "size": config["size"],
        "losses": torch.stack(losses).float().tolist(),
        "timed_steps": len(timed),
        "repeats": rates,
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_spread": (max(rates) - min(rates)) / statistics.median(rates),
        "step_us": statistics.median(seconds) / len(timed) * 1e6,
        "model_tflops_per_step": flops / 1e12,
        "setup_s": setup_s,
        "peak_allocated_mib": (torch.cuda.max_memory_allocated() - held) / MIB if cuda else None,
        "reserved_mib": torch.cuda.memory_reserved() / MIB if cuda else None,
    }
    if cuda:
        result["matmul_tflops"] = matmul_tflops()
        result["mfu"] = flops / (result["step_us"] / 1e6) / (result["matmul_tflops"] * 1e12)
    if stack.startswith("compile"):
        result["dynamo"] = _dynamo_counters()
    return result


def run_stacks(workload: str, stacks: tuple[str, ...], batches_path: str, config: dict = CONFIG) -> dict:
    """:func:`run_stack` for each of ``stacks`` in this process, each from a clean slate (dynamo,
    its counters and CUDA graph trees reset, memory returned); a stack that raises is an entry of
    ``errors``. Then, at chapter 8's size, where a replayed ``graph ours`` step spends its time."""
    from torch._dynamo.utils import counters

    runs, errors = [], {}
    for stack in stacks:
        torch._dynamo.reset()
        counters.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        began = time.perf_counter()
        try:
            runs.append(run_stack(workload, stack, batches_path, config))
        except Exception as error:  # one stack failing is a result; the others still run
            errors[f"{workload} / {stack}"] = error_text(error)
        # Progress on stdout, so that a run stopped at its time limit shows where the time went.
        print(f"end-to-end: {config['size']} / {workload} / {stack}: {time.perf_counter() - began:.0f} s", flush=True)
    graph_ours = [run for run in runs if run["stack"] == "graph ours"]
    if graph_ours and config["size"] == CONFIG["size"] and torch.cuda.is_available():
        batches = torch.load(batches_path, weights_only=False)
        model_args = {"vocab_size": load_tokenizer().vocab_size, "dim": config["dim"],
                      "num_heads": config["num_heads"], "num_layers": config["num_layers"]}
        with recorded(errors, f"{workload} / graph ours / regions"):
            graph_ours[0]["regions"] = _profiled_regions(model_args, [b.pin_memory() for b in batches], config)
    return {"runs": runs, "errors": errors}


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


def capacity_sweep(config: dict = CONFIG, capacities=(1024, 2048, 4096, 8192),
                   stack: str = "compile + graph ours") -> list[dict]:
    """``stack`` on the pretraining workload at each token capacity ``T``, in this process: tokens
    per second and peak memory, to choose ``T`` (the smallest at which the step stops speeding up)."""
    points = []
    for T in capacities:
        sized = {**config, "T": T, "steps": 24, "warmup": 8, "repeats": 2}
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "batches.pt")
            torch.save(workload_batches("pretraining", sized["steps"], sized), path)
            run = run_stack("pretraining", stack, path, sized)
        points.append({"T": T, **{k: run.get(k) for k in ("tokens_per_s", "step_us", "peak_allocated_mib", "mfu")}})
        torch._dynamo.reset()
    return points


def end_to_end_suite(config: dict = CONFIG, *, stacks: tuple[str, ...] | None = None,
                     workloads: tuple[str, ...] = WORKLOADS, timeout_s: float = 600) -> dict:
    """Every stack of ``config`` (or ``stacks``) on every workload, a fresh process per workload (see
    :func:`run_stacks`): a fault or a hang is recorded under ``"errors"`` and the next workload still runs."""
    stacks = tuple(stacks or config["stacks"])
    runs, errors, workload_info = [], {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for workload in workloads:
            batches = workload_batches(workload, config["steps"], config)
            path = os.path.join(folder, f"{workload}.pt")
            torch.save(batches, path)
            workload_info[workload] = {
                "active_tokens": [b.active_tokens for b in batches],
                "active_sequences": [b.active_sequences for b in batches],
                "max_seqlen": [b.max_seqlen for b in batches],
                "mean_fill": sum(b.active_tokens for b in batches) / (len(batches) * config["T"]),
                "loss_tokens": [int(b.loss_mask.sum()) for b in batches],
            }
            try:
                done = run_isolated(run_stacks, workload, stacks, path, config, timeout_s=timeout_s)
                runs += done["runs"]
                errors.update(done["errors"])
            except IsolatedRunError as error:  # a fault or a hang ends the workload's process
                errors[workload] = str(error)[-3000:]
    sweep = None
    if config["size"] == CONFIG["size"] and stacks == CONFIG["stacks"]:
        began = time.perf_counter()
        try:
            sweep = run_isolated(capacity_sweep, config, timeout_s=timeout_s)
        except IsolatedRunError as error:
            errors["capacity sweep"] = str(error)[-3000:]
        print(f"end-to-end: capacity sweep: {time.perf_counter() - began:.0f} s", flush=True)
    return {"config": {**config, "stacks": list(stacks), "workloads": list(workloads),
                       "timing": "real (active) tokens of the timed batches / host wall clock of one pass over them, "
                                 "synchronised at both ends; the median of the repeated passes"},
            "workloads": workload_info, "runs": runs, "capacity_sweep": sweep, "errors": errors}


def end_to_end_large_suite() -> dict:
    """The suite at the :data:`LARGE`, matmul-bound size, for the fastest stacks of each kind."""
    return end_to_end_suite(LARGE)


__all__ = ["CONFIG", "LARGE", "OURS", "SFT_CORPUS_DOCUMENTS", "STACKS", "WORKLOADS", "end_to_end_large_suite",
           "end_to_end_suite", "model_flops", "run_stack", "run_stacks", "workload_batches"]
