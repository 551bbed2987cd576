"""Benchmark suite ``scale-out``: chapter 8's model trained data-parallel on one and two GPUs,
eager DDP against DDP captured as one CUDA graph per rank.

The end-to-end suite's model and workloads, every rank on its own shard (weak scaling), trained
by :class:`~attn_gym_lite.graph.distributed.DataParallelTrainer`. Per world size this process
builds every rank's batches and runs ``torchrun`` on this module (:func:`worker_main`); rank 0
writes what the ranks measured after every part, so a failed or hung launch still hands back
what it finished. Reported: ``runs``, ``scaling``, ``gradient_check`` (two ranks against one
process on their batches packed together), ``traces`` (:func:`communication_overlap`),
``fsdp2`` (does FSDP2 train under the same capture), ``launches`` and ``errors``.

Source: PyTorch's CUDA semantics notes ("CUDA Graphs" -> "Usage with DistributedDataParallel"),
``torchrun``, FSDP2's ``fully_shard`` API reference.
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
from pathlib import Path

import torch
import torch.distributed as dist

import attn_gym_lite

from ..data import load_tokenizer
from ..data.sharding import global_batch
from ..graph.capture import StaticInputs, capture_graph
from ..graph.distributed import CAPTURE_ENVIRONMENT, DataParallelTrainer, global_token_mean_loss, token_loss_sum
from ..isolation import run_process_group
from ..models import PackedTransformer
from ..profiling import device_events, profile
from ..profiling.intervals import busy_and_gaps
from .end_to_end import SFT_CORPUS_DOCUMENTS, workload_batches
from .harness import error_text, recorded, run_parts, throughput
from .timing import median, step_intervals_us

MIB = 2**20
WORKLOADS = ("pretraining", "sft")
MODES = ("eager", "graph")

#: The GPU configuration: chapter 8's model and batches, ``steps`` batches per rank of which the
#: first ``timed_warmup`` are not timed.
CONFIG = {
    "T": 4096, "dim": 512, "num_heads": 8, "num_layers": 4, "lr": 1e-3, "steps": 40, "timed_warmup": 8,
    "sft_documents": 16, "sft_min_fill": 0.1, "sft_corpus_documents": SFT_CORPUS_DOCUMENTS, "pretraining_buffer": 32, "seed": 0,
    "device": "cuda", "dtype": "bfloat16", "impl": "auto", "bucket_cap_mb": None,
    "gradient_workload": "sft", "profile_workload": "pretraining", "profile_steps": 2,
    "fsdp2_workload": "pretraining", "fsdp2_steps": 12,
}

#: For CI and the chapter's CPU demonstration: ``gloo``, eager, a tiny float32 model.
CPU_CONFIG = {
    **CONFIG, "T": 128, "dim": 32, "num_heads": 2, "num_layers": 1, "steps": 5, "timed_warmup": 2,
    "sft_documents": 4, "sft_corpus_documents": 40, "pretraining_buffer": 8, "device": "cpu", "dtype": "float32",
    "impl": "reference", "profile_workload": None, "fsdp2_workload": None,
}

#: The chapter's goal for captured DDP: tokens/s on two GPUs at least this many times those of one.
TWO_GPU_SPEEDUP_GOAL = 1.9

#: Seconds for all the launches, batch building included (the recording script gives the suite
#: 480 s: this, a hung last launch's STOP_GRACE_S twice, and the start).
SUITE_BUDGET_S = 420.0
MIN_LAUNCH_S = 30.0  # a launch with less left of the budget is not started
STOP_GRACE_S = 10.0  # from a timed-out launch's SIGTERM to its SIGKILL
FSDP2_TIMEOUT_S = 90.0
FSDP2_UNTIMED_STEPS = 2

#: Norm-wise relative tolerance of the gradient check, by dtype. bfloat16 has unit roundoff 2^-8;
#: both gradients carry a rounding of every activation and gradient, in different orders (the
#: two-rank side also sums its bucket in bfloat16), so they differ by a few roundoffs: 2^-5 is 8.
GRADIENT_TOLERANCE = {"bfloat16": 2.0**-5, "float16": 2.0**-8, "float32": 1e-4, "float64": 1e-10}

_FIELDS = ("input_ids", "labels", "loss_mask", "cu_seqlens")


def _batch_file(folder: Path | str, workload: str, rank: int, world_size: int) -> Path:
    return Path(folder) / f"{workload}_rank{rank}_of{world_size}.pt"


def communication_overlap(trace: dict, steps: int = 1) -> dict:
    """How much of the NCCL kernels' time other kernels (the backward) ran beside them, per step:
    the intersection of the union of ``nccl`` kernels' intervals with the union of the others'."""
    kernels = [e for e in device_events(trace) if e.get("cat") == "kernel"]
    busy = lambda spans: busy_and_gaps(spans)[0]  # the length of a union of intervals

    def is_nccl(event: dict) -> bool:
        return "nccl" in str(event.get("name", "")).lower()

    def span(event: dict) -> tuple[float, float]:
        return float(event["ts"]), float(event["ts"]) + float(event["dur"])

    nccl_events = [e for e in kernels if is_nccl(e)]
    compute_events = [e for e in kernels if not is_nccl(e)]
    nccl, compute = [span(e) for e in nccl_events], [span(e) for e in compute_events]
    compute_us = busy(compute)

    def overlap_with_compute(spans: list[tuple[float, float]]) -> float:
        # |A ∩ B| = |A| + |B| - |A ∪ B|: the intersection from three unions.
        return busy(spans) + compute_us - busy(spans + compute)

    nccl_us, overlap = busy(nccl), overlap_with_compute(nccl)
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


def relative_differences(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """Per parameter ``||g - r|| / ||r||`` and ``max |g - r| / max |r|``, in float64, and their maxima
    (element-wise relative differences would blow up wherever an entry crosses zero)."""
    normwise, scaled = {}, {}
    for name, expected in reference.items():
        got, expected = grads[name].double(), expected.double().to(grads[name].device)
        normwise[name] = float((got - expected).norm() / expected.norm().clamp_min(1e-300))
        scaled[name] = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-300))
    worst = max(normwise, key=normwise.get)
    return {"max_normwise": normwise[worst], "worst_parameter": worst,
            "max_elementwise_scaled": max(scaled.values()), "normwise": normwise}


def scaling(runs: list[dict]) -> list[dict]:
    """Per workload and mode, tokens/s at each ``W > 1`` over that at ``W = 1`` (speedup, and
    efficiency: over ``W`` times it); per workload and ``W``, captured over eager DDP."""
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
    """The chapter's goals per workload, from a result's ``scaling`` rows: captured DDP on two GPUs
    at least :data:`TWO_GPU_SPEEDUP_GOAL` times one captured GPU, and ahead of eager DDP on two.
    ``value`` is NaN (and ``met`` None) where a run it needs is missing."""
    rows = {(r["workload"], r["mode"], r["world_size"]): r for r in record.get("scaling") or []}
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
    """What rank 0 hands back, written (atomically) after every part, so a later hang loses nothing."""

    def __init__(self, path: str, rank: int) -> None:
        self.path, self.rank = Path(path), rank
        self.data: dict = {"runs": [], "errors": {}, "traces": {}}
        self.gradients: dict[str, dict[str, torch.Tensor]] = {}  # rank 0: first-step gradients, never written

    def describe(self, error: BaseException) -> str:
        return f"rank {self.rank}: {error_text(error)}"

    def save(self) -> None:
        if self.rank != 0:
            return
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1))
        os.replace(partial, self.path)


def _model(config: dict, device: torch.device) -> PackedTransformer:
    torch.manual_seed(config["seed"])  # the same initial weights on every rank and in every run
    return PackedTransformer(config["vocab_size"], config["dim"], config["num_heads"], config["num_layers"],
                             impl=config["impl"], device=device, dtype=getattr(torch, config["dtype"]))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().to(torch.float32, copy=True) for name, p in model.named_parameters()}


def _free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _load(spec: dict, workload: str, rank: int, world_size: int) -> list:
    return torch.load(_batch_file(spec["batches"], workload, rank, world_size), weights_only=False)


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
        first = [getattr(batches[0], name).to(device) for name in _FIELDS]
        total, count = trainer.ddp(*first, batches[0].max_seqlen)
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
    results.data["runs"].append({
        "workload": workload, "world_size": world_size, "mode": mode,
        **throughput(spec["global_tokens"][workload][warm:], [us / 1e3 for us in step_us[warm:]]),
        "losses": [float(x) for x in torch.stack(losses).float().cpu()],
        "setup_s": setup_s,
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
    })
    results.save()
    if cuda and workload == config["profile_workload"]:
        try:
            summary = _profiled(trainer.step, batches[1:], config["profile_steps"], cuda)
        except Exception as error:  # recorded, the run goes on
            summary = {"error": error_text(error, 2000, summary=True)}
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
    firsts = [_load(spec, workload, r, world_size)[0] for r in range(world_size)]
    both = global_batch(firsts)
    model = _model(config, device)
    input_ids, labels, loss_mask, cu_seqlens = (getattr(both, name).to(device) for name in _FIELDS)
    logits = model(input_ids, cu_seqlens, both.max_seqlen)
    total, count = token_loss_sum(logits, labels, loss_mask)
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
    """FSDP2 (``fully_shard`` per block and on the model) trained eagerly, then the same step
    captured whole, as DDP's is: the step times, or the error the capture raised."""
    from torch.distributed.fsdp import fully_shard

    config, world_size, rank = spec["config"], dist.get_world_size(), dist.get_rank()
    workload = config["fsdp2_workload"]
    batches = [b.pin_memory() for b in _load(spec, workload, rank, world_size)[: config["fsdp2_steps"]]]
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
    try:
        graph, captured_loss = capture_graph(step)  # 3 warm-up steps on the capturing stream
    except Exception as error:  # the finding is the error itself
        report.update(capture="failed", capture_error=error_text(error, 2000, summary=True))
        results.save()
        return
    report["capture"] = "ok"

    def replay() -> torch.Tensor:
        graph.replay()
        return captured_loss.clone()

    report["graph"] = timed(replay)
    results.save()


def worker_main(argv: list[str] | None = None) -> None:
    """One rank of a launch: ``python -m attn_gym_lite.bench.scale_out --spec SPEC.json`` under torchrun.

    Joins the process group torchrun describes (``nccl`` on ``cuda:<LOCAL_RANK>``, or ``gloo``),
    runs the spec's parts and has rank 0 write the result file; a failing part is recorded.
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
    errors = results.data["errors"]
    try:
        results.data.update({
            "world_size": world_size, "backend": options["backend"],
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        })
        results.save()
        if "fsdp2" in spec["parts"]:
            with recorded(errors, f"fsdp2 / W={world_size}", results.describe):
                _fsdp2(spec, device, results)
            _free(cuda)
            results.save()
        if "train" in spec["parts"]:
            for workload in spec["workloads"]:
                batches = _load(spec, workload, rank, world_size)
                batches = [b.pin_memory() for b in batches] if cuda else batches
                for mode in spec["modes"]:
                    with recorded(errors, f"{workload} / W={world_size} / {mode}", results.describe):
                        _train(workload, mode, batches, spec, device, results)
                    _free(cuda)
                    results.save()
            if rank == 0 and results.gradients:
                with recorded(errors, f"gradient check / W={world_size}", results.describe):
                    _gradient_check(spec, device, results)
                results.gradients = {}
                results.save()
    finally:
        results.save()
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The suite: build the batches, launch torchrun per world size, collect.


def launch(world_size: int, spec: dict, folder: Path | str, tag: str, timeout_s: float) -> tuple[dict | None, dict]:
    """One launch, ``torchrun --standalone --nproc_per_node=W`` on :func:`worker_main`, as a process
    group of its own that a timeout ends whole. Returns what rank 0 wrote (``None`` if nothing) and
    ``{"command", "seconds", "returncode", "timed_out", "timeout_s"}`` (and ``"log_tail"`` if it failed)."""
    folder, cuda = Path(folder), spec["config"]["device"] == "cuda"
    result_path, spec_path, log_path = (folder / f"{tag}.{suffix}" for suffix in ("result.json", "spec.json", "log"))
    spec_path.write_text(json.dumps({**spec, "result": str(result_path)}))
    env = {**os.environ, **CAPTURE_ENVIRONMENT}
    # The workers import the same package as this process, installed or from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(attn_gym_lite.__file__).resolve().parents[1]),
                                                    env.get("PYTHONPATH", "")) if p)
    if not cuda:
        env["OMP_NUM_THREADS"] = "1"
        if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
            env["GLOO_SOCKET_IFNAME"] = "lo"  # stay on the loopback interface
    module = "attn_gym_lite.bench.scale_out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
               "-m", module, "--spec", str(spec_path)]
    run = run_process_group(command, timeout_s=timeout_s, env=env, log=log_path, grace_s=STOP_GRACE_S)
    info = {"command": f"torchrun --standalone --nproc_per_node={world_size} -m {module} --spec <spec>",
            "seconds": run.seconds, "returncode": run.returncode, "timed_out": run.timed_out, "timeout_s": timeout_s}
    if run.returncode != 0:
        info["log_tail"] = log_path.read_text(errors="replace")[-3000:]
    return (json.loads(result_path.read_text()) if result_path.is_file() else None), info


def scale_out_suite(world_sizes: tuple[int, ...] = (1, 2), config: dict = CONFIG, modes: tuple[str, ...] = MODES,
                    timeout_s: float = 150.0, fsdp2: bool = True) -> dict:
    """Eager and captured DDP at each world size, one torchrun launch each (and one for FSDP2), within
    :data:`SUITE_BUDGET_S`; ``config`` is :data:`CONFIG` or :data:`CPU_CONFIG` (``gloo``, tiny)."""
    cuda = config["device"] == "cuda"
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    result: dict = {"gpu_count": gpu_count, "environment": dict(CAPTURE_ENVIRONMENT), "workloads": {}, "runs": [],
                    "traces": {}, "launches": {}, "errors": {}}
    try:
        tokenizer = load_tokenizer()
    except Exception as error:  # recorded, not raised
        result["errors"]["tokenizer"] = f"{type(error).__name__}: {error}"
        return {"config": dict(config), **result}
    config = {**config, "vocab_size": tokenizer.vocab_size}
    result["config"] = {**config, "world_sizes": list(world_sizes), "workloads": list(WORKLOADS), "modes": list(modes),
                        "budget_s": SUITE_BUDGET_S,
                        "timing": "tokens/s of a step = active tokens over all ranks / time between consecutive step "
                                  "starts (CUDA events on rank 0); median and p10/p50/p90 over the timed steps"}
    with tempfile.TemporaryDirectory(prefix="scale_out.") as folder:
        built: dict[tuple[str, int], list[int]] = {}

        def build(workload: str, world_size: int) -> list[int]:
            """Every rank's batches, saved for the workers; the active tokens of each step over all ranks."""
            if (workload, world_size) not in built:
                per_rank = [workload_batches(workload, config["steps"], config, rank=r, world_size=world_size,
                                             tokenizer=tokenizer) for r in range(world_size)]
                for rank, batches in enumerate(per_rank):
                    torch.save(batches, _batch_file(folder, workload, rank, world_size))
                built[workload, world_size] = [sum(b.active_tokens for b in step) for step in zip(*per_rank)]
            return built[workload, world_size]

        def part(key: str, world_size: int, workloads: tuple[str, ...]):
            def run(limit: float) -> None:
                began = time.monotonic()
                tokens = {workload: build(workload, world_size) for workload in workloads}
                if key != "fsdp2":
                    result["workloads"][key] = {w: {"global_active_tokens": t,
                                                    "mean_fill": sum(t) / (len(t) * world_size * config["T"])}
                                                for w, t in tokens.items()}
                left = limit - (time.monotonic() - began)
                if left < MIN_LAUNCH_S:
                    result["errors"][key] = f"building the batches took {limit - left:.0f} s of the launch's {limit:.0f} s"
                    return
                spec = {"config": config, "workloads": list(workloads), "modes": list(modes), "batches": folder,
                        "parts": ["fsdp2"] if key == "fsdp2" else ["train"], "global_tokens": tokens,
                        "collective_timeout_s": left}
                data, info = launch(world_size, spec, folder, key.replace("W=", "w"), left)
                result["launches"][key] = info
                if data is None:
                    result["errors"].setdefault(f"result {key}", "rank 0 wrote no result")
                    return
                result["runs"] += data.get("runs", [])
                result["traces"].update(data.get("traces", {}))
                result["errors"].update(data.get("errors", {}))
                result.update({name: data[name] for name in ("gradient_check", "fsdp2") if name in data})
                info["ranks"] = {k: data.get(k) for k in ("world_size", "backend", "device", "nccl")}
            return run

        parts, timeouts = {}, {}
        for world_size in world_sizes:
            if cuda and gpu_count < world_size:
                result["errors"][f"W={world_size}"] = f"needs {world_size} GPUs, this host has {gpu_count}: not run"
            else:
                parts[f"W={world_size}"], timeouts[f"W={world_size}"] = part(f"W={world_size}", world_size, WORKLOADS), timeout_s
        if fsdp2 and cuda and config.get("fsdp2_workload"):
            if gpu_count < 2:
                result["fsdp2"] = {"not run": f"needs 2 GPUs, this host has {gpu_count}"}
            else:
                parts["fsdp2"], timeouts["fsdp2"] = part("fsdp2", 2, (config["fsdp2_workload"],)), FSDP2_TIMEOUT_S
        result["errors"].update(run_parts(parts, timeout_s=timeouts, budget_s=SUITE_BUDGET_S, min_part_s=MIN_LAUNCH_S)[1])
    for key, info in result["launches"].items():
        if info["timed_out"] or info["returncode"] != 0:
            reason = f"timed out after {info['timeout_s']:.0f} s" if info["timed_out"] else f"exited with {info['returncode']}"
            result["errors"][f"launch {key}"] = f"{reason}; end of its log:\n{info.get('log_tail', '')}"
    result["scaling"] = scaling(result["runs"])
    return result


if __name__ == "__main__":
    worker_main()
