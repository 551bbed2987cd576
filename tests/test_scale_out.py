"""The ``scale-out`` suite: its torchrun launches on the CPU with ``gloo``, the numbers it computes,
and on a GPU host the captured DDP step itself."""

from __future__ import annotations

import math
import re
import statistics
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torch.distributed as dist

from attn_gym_lite.bench import scale_out
from attn_gym_lite.bench.end_to_end import workload_batches
from attn_gym_lite.bench.scale_out import (
    CONFIG,
    CPU_CONFIG,
    GRADIENT_TOLERANCE,
    TWO_GPU_SPEEDUP_GOAL,
    communication_overlap,
    goals,
    launch,
    relative_differences,
    scale_out_suite,
    scaling,
    throughput,
)
from attn_gym_lite.book.figures.ch10_scale_out import plot_scale_out
from attn_gym_lite.data import batch_from_pieces, load_tokenizer

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")

TINY = {**CPU_CONFIG, "T": 96, "steps": 4, "timed_warmup": 1, "sft_documents": 3, "sft_corpus_documents": 24}


@needs_gloo
def test_the_suite_launches_torchrun_on_cpu_and_hands_back_every_run():
    result = scale_out_suite(world_sizes=(1, 2), config=TINY, modes=("eager",), fsdp2=False, timeout_s=60)
    assert result["errors"] == {}, result["errors"]
    assert result["gpu_count"] == 0
    assert result["environment"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert result["environment"]["NCCL_NVLS_ENABLE"] == "0"
    for key, world_size in (("W=1", 1), ("W=2", 2)):
        info = result["launches"][key]
        assert info["returncode"] == 0 and not info["timed_out"]
        assert info["ranks"] == {"world_size": world_size, "backend": "gloo", "device": "cpu", "nccl": None}
    runs = {(r["workload"], r["world_size"], r["mode"]): r for r in result["runs"]}
    assert set(runs) == {(w, n, "eager") for w in ("pretraining", "sft") for n in (1, 2)}

    tokenizer = load_tokenizer()
    config = {**TINY, "vocab_size": tokenizer.vocab_size}
    for (workload, world_size, _), run in runs.items():
        # The global tokens of each step, rebuilt here from every rank's batches.
        per_rank = [workload_batches(workload, TINY["steps"], config, rank=r, world_size=world_size, tokenizer=tokenizer)
                    for r in range(world_size)]
        tokens = [sum(batches[i].active_tokens for batches in per_rank) for i in range(TINY["steps"])]
        assert result["workloads"][f"W={world_size}"][workload]["global_active_tokens"] == tokens
        warm = TINY["timed_warmup"]
        assert run["timed_steps"] == len(run["step_ms"]) == TINY["steps"] - warm
        rates = [t / (ms / 1e3) for t, ms in zip(tokens[warm:], run["step_ms"])]
        assert run["tokens_per_s_steps"] == pytest.approx(rates, rel=1e-12)
        assert run["tokens_per_s"] == pytest.approx(statistics.median(rates), rel=1e-12)
        assert [run["tokens_per_s_spread"][p] for p in ("p10", "p50", "p90")] == pytest.approx(
            np.percentile(rates, [10, 50, 90]), rel=1e-12)
        assert len(run["losses"]) == TINY["steps"] and all(0 < loss < 20 for loss in run["losses"])

    # Two ranks against one process on the global batch: the right loss passes, the wrong one does not.
    check = result["gradient_check"]
    assert check["dtype"] == "float32" and check["tolerance_normwise"] == GRADIENT_TOLERANCE["float32"]
    assert check["comparisons"]["eager"]["within_tolerance"]
    assert check["comparisons"]["eager"]["max_normwise"] < 1e-5
    assert not check["comparisons"]["mean of rank means"]["within_tolerance"]
    assert check["comparisons"]["mean of rank means"]["max_normwise"] > 1e-2
    assert result["scaling"] == scaling(result["runs"])
    assert {row["workload"] for row in result["scaling"]} == {"pretraining", "sft"}

    # The chapter's figure draws one bar per run at its measured height, its whiskers at the run's
    # p10 and p90, and the suite's efficiencies (no traces on a CPU: one panel).
    figure = plot_scale_out(result)
    assert len(figure.axes) == 1
    heights = sorted(patch.get_height() for patch in figure.axes[0].patches)
    assert heights == pytest.approx(sorted(r["tokens_per_s"] / 1e6 for r in result["runs"]))
    whiskers = sorted((s[0][1], s[1][1]) for c in figure.axes[0].collections for s in c.get_segments())
    expected = sorted((r["tokens_per_s_spread"]["p10"] / 1e6, r["tokens_per_s_spread"]["p90"] / 1e6)
                      for r in result["runs"])
    assert [v for w in whiskers for v in w] == pytest.approx([v for w in expected for v in w])
    notes = {t.get_text() for t in figure.axes[0].texts}
    for row in result["scaling"]:
        if "efficiency" in row:
            assert f"W=2\n{row['efficiency']:.0%}" in notes
    plt.close(figure)


@needs_gloo
def test_a_launch_past_its_timeout_is_stopped_and_reported(tmp_path):
    spec = {"config": TINY, "workloads": [], "modes": [], "parts": ["train"], "batches": str(tmp_path),
            "global_tokens": {}, "collective_timeout_s": 30}
    start = time.monotonic()
    data, info = launch(1, spec, tmp_path, "slow", timeout_s=0.2)
    assert info["timed_out"] and info["returncode"] != 0
    assert "log_tail" in info
    assert time.monotonic() - start < 25
    assert data is None  # killed before rank 0 wrote anything


def test_launches_left_without_budget_are_not_started(monkeypatch):
    # The real budget fits the recording script's limit, with a hung last launch stopped and the tokenizer loaded.
    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_record.sh").read_text()
    limit = int(re.search(r"record scale-out (\d+)", script).group(1))
    assert scale_out.SUITE_BUDGET_S + 2 * scale_out.STOP_GRACE_S + 30 <= limit
    monkeypatch.setattr(scale_out, "SUITE_BUDGET_S", 10)
    result = scale_out_suite(world_sizes=(1, 2), config=TINY, modes=("eager",), fsdp2=False)
    assert result["launches"] == {} and result["runs"] == []
    for key in ("W=1", "W=2"):
        assert result["errors"][key].startswith("not run: 10 s left of the budget of 10 s")
    assert result["config"]["budget_s"] == 10


def _kernel(name, ts, dur, tid):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 0}


def test_communication_overlap_against_a_grid_count():
    events = [
        _kernel("gemm", 0, 10, 7), _kernel("gemm", 8, 10, 8),          # compute 0-18 (overlapping)
        _kernel("ncclDevKernel_AllReduce", 5, 10, 9),                 # 5-15: all of it beside compute
        _kernel("elementwise", 30, 5, 7),                              # compute 30-35
        _kernel("ncclDevKernel_AllReduce", 25, 7, 9),                 # 25-32: 2 of 7 beside compute
        _kernel("ncclKernel_AllReduce_tail", 40, 4, 9),               # 40-44: alone
        {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 0, "dur": 50, "tid": 1, "pid": 0},
    ]
    summary = communication_overlap({"traceEvents": events}, steps=2)
    # Independent count on a 1 µs grid (all boundaries are integers).
    nccl = {t for e in events if e["cat"] == "kernel" and "nccl" in e["name"].lower() for t in range(e["ts"], e["ts"] + e["dur"])}
    compute = {t for e in events if e["cat"] == "kernel" and "nccl" not in e["name"].lower()
               for t in range(e["ts"], e["ts"] + e["dur"])}
    assert summary["nccl_us_per_step"] == len(nccl) / 2 == 10.5
    assert summary["compute_us_per_step"] == len(compute) / 2
    assert summary["overlap_us_per_step"] == len(nccl & compute) / 2 == 6.0
    assert summary["overlap_fraction"] == pytest.approx(12 / 21)
    assert summary["nccl_kernels_per_step"] == 1.5 and summary["kernels_per_step"] == 3.0
    assert [k["overlap_us"] for k in summary["nccl_kernels"]] == [10.0, 2.0, 0.0]
    assert summary["streams"] == {"nccl": ["9"], "compute": ["7", "8"]}


def test_throughput_and_goals_against_hand_computation():
    # Hand-computed: rates 1000/0.002 = 500k, 3000/0.004 = 750k, 1000/0.001 = 1M, 2000/0.008 = 250k tokens/s.
    row = throughput([1000, 3000, 1000, 2000], [2.0, 4.0, 1.0, 8.0])
    assert row["tokens_per_s_steps"] == [500e3, 750e3, 1e6, 250e3]
    assert row["tokens_per_s"] == 625e3 and row["median_step_ms"] == 3.0 and row["timed_steps"] == 4
    # linear percentiles of [250k, 500k, 750k, 1M]: p10 at rank 0.3, p90 at rank 2.7
    assert row["tokens_per_s_spread"] == pytest.approx({"p10": 325e3, "p50": 625e3, "p90": 925e3})
    assert row["tokens_per_s_overall"] == pytest.approx(7000 / 0.015)

    runs = [{"workload": w, "world_size": n, "mode": m, "tokens_per_s": rate}
            for w, n, m, rate in (("pretraining", 1, "graph", 100.0), ("pretraining", 2, "graph", 195.0),
                                  ("pretraining", 2, "eager", 200.0), ("sft", 1, "graph", 100.0))]
    table = {(g["workload"], g["goal"]): g for g in goals({"scaling": scaling(runs)})}
    speedup = f"captured DDP on 2 GPUs >= {TWO_GPU_SPEEDUP_GOAL}x captured on 1"
    assert table["pretraining", speedup]["value"] == 1.95 and table["pretraining", speedup]["met"] is True
    ahead = table["pretraining", "captured DDP ahead of eager DDP on 2 GPUs"]
    assert ahead["value"] == 0.975 and ahead["met"] is False and ahead["target"] == 1.0
    assert math.isnan(table["sft", speedup]["value"]) and table["sft", speedup]["met"] is None  # no W=2 run
    assert len(table) == 4


def test_relative_differences_and_scaling():
    reference = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, -1.0, 0.0])}
    grads = {"a": torch.tensor([3.0, 4.5]), "b": torch.tensor([1.0, -1.0, 0.0])}
    diff = relative_differences(grads, reference)
    assert diff["max_normwise"] == pytest.approx(0.5 / 5.0) and diff["worst_parameter"] == "a"
    assert diff["max_elementwise_scaled"] == pytest.approx(0.5 / 4.0)
    assert diff["normwise"]["b"] == 0.0

    runs = [{"workload": "sft", "world_size": w, "mode": m, "tokens_per_s": rate}
            for w, m, rate in ((1, "eager", 100.0), (2, "eager", 150.0), (1, "graph", 300.0), (2, "graph", 570.0))]
    rows = {(r["mode"], r["world_size"]): r for r in scaling(runs)}
    assert rows["graph", 2]["efficiency"] == pytest.approx(570 / 600) and rows["graph", 2]["speedup_over_one_gpu"] == 1.9
    assert rows["eager", 2]["efficiency"] == pytest.approx(0.75)
    assert rows["graph over eager", 2]["speedup"] == pytest.approx(3.8)
    assert rows["graph over eager", 1]["speedup"] == pytest.approx(3.0)
    met = {(g["workload"], g["target"]): g for g in goals({"scaling": scaling(runs)})}
    assert met["sft", 1.0]["value"] == pytest.approx(3.8) and met["sft", 1.0]["met"] is True


# ---------------------------------------------------------------------------------------------
# GPU host: the captured step, for real.

GPU_SMALL = {**CONFIG, "T": 1024, "dim": 128, "num_heads": 2, "num_layers": 2, "steps": 14, "timed_warmup": 4,
             "sft_documents": 8, "sft_corpus_documents": 60, "profile_steps": 1, "fsdp2_steps": 6}


def _close_losses(runs, world_size, workload):
    eager = next(r for r in runs if (r["world_size"], r["workload"], r["mode"]) == (world_size, workload, "eager"))
    graph = next(r for r in runs if (r["world_size"], r["workload"], r["mode"]) == (world_size, workload, "graph"))
    # Same initial weights and batches: the captured step trains like the eager one, up to bfloat16 rounding.
    assert max(abs(a - b) for a, b in zip(eager["losses"], graph["losses"])) < 0.05
    assert abs(eager["losses"][0] - graph["losses"][0]) < 1e-2


@pytest.mark.gpu
def test_captured_ddp_in_a_world_of_one_trains_like_eager_ddp():
    result = scale_out_suite(world_sizes=(1,), config=GPU_SMALL, fsdp2=False, timeout_s=300)
    assert result["errors"] == {}, result["errors"]
    assert result["launches"]["W=1"]["ranks"]["backend"] == "nccl"
    for workload in ("pretraining", "sft"):
        _close_losses(result["runs"], 1, workload)
    trace = result["traces"]["W=1 / graph"]["rank 0"]
    assert "error" not in trace and trace["kernels_per_step"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one per rank)")
def test_captured_ddp_on_two_gpus_gets_the_global_gradient_and_overlaps_its_all_reduce():
    result = scale_out_suite(world_sizes=(2,), config=GPU_SMALL, fsdp2=True, timeout_s=300)
    errors = {k: v for k, v in result["errors"].items() if not k.startswith(("fsdp2", "launch fsdp2", "result fsdp2"))}
    assert errors == {}, errors
    assert result["gpu_count"] >= 2
    check = result["gradient_check"]["comparisons"]
    assert check["eager"]["within_tolerance"] and check["graph"]["within_tolerance"], check
    assert not check["mean of rank means"]["within_tolerance"]
    for workload in ("pretraining", "sft"):
        _close_losses(result["runs"], 2, workload)
    for mode in ("eager", "graph"):
        for rank in ("rank 0", "rank 1"):
            trace = result["traces"][f"W=2 / {mode}"][rank]
            assert "error" not in trace, trace
            assert trace["nccl_kernels_per_step"] >= 2  # the token count, the gradient buckets, the loss
    assert result["fsdp2"]["capture"] in ("ok", "failed")  # either is a finding; it must be recorded


@pytest.fixture
def nccl_world_of_one(tmp_path, monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    from attn_gym_lite.graph.distributed import CAPTURE_ENVIRONMENT

    # Before init: NCCL reads the environment when the communicator is created.
    for name, value in CAPTURE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _random_batches(count, T=256, vocab=97, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.randint(8, 64, (5,), generator=generator).tolist()
        pieces = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]
        batches.append(batch_from_pieces(pieces, T, 8).pin_memory())
    return batches


@pytest.mark.gpu
def test_the_captured_trainer_steps_like_the_eager_one_in_a_world_of_one(nccl_world_of_one, monkeypatch):
    from attn_gym_lite.graph.distributed import DataParallelTrainer
    from attn_gym_lite.models import PackedTransformer

    batches = _random_batches(4)
    trainers = {}
    for mode in ("eager", "graph"):
        torch.manual_seed(0)
        model = PackedTransformer(97, 64, 2, 2, device="cuda", dtype=torch.bfloat16)
        trainers[mode] = DataParallelTrainer(model, batches[0], use_graph=mode == "graph", lr=1e-3)
    initial = [p.detach().clone() for p in trainers["eager"].parameters]
    # The warm-up moved the captured trainer's parameters; it put them back.
    for p, q in zip(trainers["graph"].parameters, initial):
        assert torch.equal(p, q)
    for index, batch in enumerate(batches):
        losses = {mode: float(trainer.step(batch)) for mode, trainer in trainers.items()}
        assert abs(losses["eager"] - losses["graph"]) < 2e-2 * abs(losses["eager"]), (index, losses)
        if index == 0:  # .grad holds the gradient the step applied, in both modes
            diff = relative_differences({str(i): p.grad for i, p in enumerate(trainers["graph"].parameters)},
                                        {str(i): p.grad for i, p in enumerate(trainers["eager"].parameters)})
            assert diff["max_normwise"] < GRADIENT_TOLERANCE["bfloat16"], diff
    moved = max(float((p.detach().float() - q.float()).abs().max()) for p, q in zip(trainers["graph"].parameters, initial))
    assert moved > 0  # the replays trained: Adam is inside the graph
    for p, q in zip(trainers["graph"].parameters, trainers["eager"].parameters):
        torch.testing.assert_close(p.float(), q.float(), rtol=0.0, atol=2e-2)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # the recipe's step 1 undone: capture refused
    with pytest.raises(RuntimeError, match="TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        DataParallelTrainer(model, batches[0], use_graph=True)
