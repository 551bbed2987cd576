"""The ``linear-attention`` suite's CPU-testable pieces (layouts, comparisons, the exactness harness,
the region table, the budget, the output folder) and, on a GPU, its parts at small shapes."""

import re
from pathlib import Path

import pytest
import torch
from helpers import CPU_KERNELS

from attn_gym_lite.bench import harness
from attn_gym_lite.bench import linear_attention as la
from attn_gym_lite.isolation import IsolatedRunError
from attn_gym_lite.models.kda import KDA_REGIONS
from attn_gym_lite.ops.kda import kda_chunked
from attn_gym_lite.profiling import load_trace
from attn_gym_lite.testing.exactness import error_stats


@pytest.mark.parametrize(("T", "N", "C"), [(64, 6, 16), (1024, 16, 64), (200, 5, 64)])
def test_exactness_layouts_hold_every_hard_case(T, N, C):
    layouts = la.exactness_layouts(T, N, count=5, seed=3, chunk_size=C)
    assert len(layouts) == 5
    assert sum(layouts[0]) == T  # the first one fills the capacity
    for lengths in layouts:
        assert len(lengths) == N and all(n >= 0 for n in lengths)
        assert sum(lengths) <= T
        assert 1 in lengths
        last_active = max(i for i, n in enumerate(lengths) if n)
        assert 0 in lengths[:last_active], "an empty sequence among the active ones"
        assert any(n % C for n in lengths if n), "a partial last chunk"
    assert any(sum(lengths) < T for lengths in layouts), "some rows inactive"
    assert layouts == la.exactness_layouts(T, N, count=5, seed=3, chunk_size=C)


def test_error_stats_against_direct_computation():
    reference = torch.tensor([[1.0, -4.0], [0.5, 2.0]], dtype=torch.float64)
    ours = reference + torch.tensor([[0.0, 0.25], [-0.5, 0.0]], dtype=torch.float64)
    stats = error_stats(ours.float(), reference)
    assert stats["nonfinite"] == 0 and stats["max_abs_ref"] == 4.0
    assert stats["max_abs_diff"] == pytest.approx(float((ours - reference).abs().max()))
    assert stats["rel_err"] == pytest.approx(stats["max_abs_diff"] / stats["max_abs_ref"])
    ours[0, 0] = float("nan")
    broken = error_stats(ours, reference)
    assert broken["nonfinite"] == 1 and broken["max_abs_diff"] is None and broken["rel_err"] is None
    # A non-finite reference gives None, not NaN (JSON has none); empty tensors give zeros.
    infinite = error_stats(torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("inf")], dtype=torch.float64))
    assert infinite == {"nonfinite": 0, "max_abs_diff": None, "max_abs_ref": None, "rel_err": None}
    empty = torch.zeros(0, 3)
    assert error_stats(empty, empty) == {"nonfinite": 0, "max_abs_diff": 0.0, "max_abs_ref": 0.0, "rel_err": 0.0}


def test_kda_inputs_are_reproducible_nan_past_L_and_take_a_chosen_decay():
    a = la.kda_inputs(16, 2, 8, 4, dtype=torch.float32, device="cpu", seed=1, active_tokens=10)
    b = la.kda_inputs(16, 2, 8, 4, dtype=torch.float32, device="cpu", seed=1, active_tokens=10)
    for name, x in a.items():
        assert torch.equal(x[:10], b[name][:10])
        assert torch.isnan(x[10:]).all()
    assert torch.allclose(a["q"][:10].norm(dim=-1), torch.ones(10, 2))
    assert (a["g"][:10] <= 0).all() and ((a["beta"][:10] > 0) & (a["beta"][:10] < 1)).all()
    assert a["g"].dtype == torch.float32
    # g uniform in [min_log_decay, 0] (q, k, v are drawn before it: the same ones) and rows past L holding fill.
    plain = la.kda_inputs(64, 2, 8, 4, dtype=torch.float64, device="cpu", seed=2)
    mild = la.kda_inputs(64, 2, 8, 4, dtype=torch.float64, device="cpu", seed=2, active_tokens=50, fill=0.0, min_log_decay=-3.0)
    g = mild["g"][:50]
    assert (g <= 0).all() and (g >= -3.0).all() and g.min() < -2.0 and g.max() > -1.0
    for name in ("q", "k", "v"):
        assert torch.equal(mild[name][:50], plain[name][:50]), name
    assert all(torch.equal(x[50:], torch.zeros_like(x[50:])) for x in mild.values())
    assert list(mild) == ["q", "k", "v", "g", "beta", "grad_o"]  # the order callers unpack


def _merged(q, k, v, g, beta, cu):
    # A bug a ragged kernel could have: the state never reset (every boundary ignored).
    return kda_chunked(q, k, v, g, beta, torch.stack([cu[0], cu[-1]]))[0]


def _crash(*args):
    raise RuntimeError("no-such-kernel")


@pytest.mark.parametrize(("kernel", "verdict"), [("recurrent", "ok"), (_merged, "wrong"), (_crash, "error")])
def test_the_exactness_harness_passes_catches_and_records(monkeypatch, kernel, verdict):
    real = la.kda_function
    monkeypatch.setattr(la, "kda_function", lambda implementation, n: (
        real(kernel, n) if isinstance(kernel, str) else kernel) if implementation == "ours" else real(implementation, n))
    result = la.exactness(64, 6, 2, 16, 8, dtypes=("float32",), layouts=3, modes=("eager",), device="cpu")
    if verdict == "error":
        assert "no-such-kernel" in result["errors"]["float32/eager"]
        return
    assert result["errors"] == {} and len(result["entries"]) == 3
    assert all(entry["ok"] for entry in result["entries"]) == (verdict == "ok")
    for entry in result["entries"]:
        assert set(entry["errors"]) == {"o", *la.GRADIENTS}
        assert entry["L"] == sum(result["config"]["layouts"][entry["layout"]])


@CPU_KERNELS
def test_exactness_of_the_triton_kernel_in_the_interpreter():
    result = la.exactness(48, 5, 1, 16, 16, dtypes=("float32",), layouts=2, modes=("eager",), device="cpu")
    assert result["errors"] == {}
    assert all(entry["ok"] for entry in result["entries"]), result["entries"]


def test_suite_records_a_failed_part_as_its_bounded_error(monkeypatch):
    def crash(function, *args, timeout_s):
        raise IsolatedRunError(f"{function.__name__} exited with code 1", "Traceback\n" + "x" * 5000)

    monkeypatch.setattr(harness, "run_isolated", crash)
    result = la.linear_attention_suite()
    message = result["errors"]["exactness"]
    assert message.startswith("IsolatedRunError: exactness exited with code 1\nTraceback\nxxx")
    assert len(message) == 2000 and "exactness" not in result


def test_row_builders_and_summary():
    point = la.overcapture_point(512, 32, 30.0, 20.0)
    assert point["ratio"] == pytest.approx(1.5) and point["L"] == 512
    rows = [la.amdahl_point(4096, 32, 1230.0, 3430.0), la.amdahl_point(2048, 32, 770.0, 2910.0)]
    assert rows[0]["core_share"] == pytest.approx(1230 / 3430)
    assert rows[1]["rest_us"] == pytest.approx(2140.0)
    summary = la.amdahl_summary(rows)
    assert summary["T_full"] == 4096 and summary["T_half"] == 2048
    assert summary["core_drop"] == pytest.approx(1 - 770 / 1230)
    assert summary["module_drop"] == pytest.approx(1 - 2910 / 3430)
    assert la.amdahl_summary(rows[:1]) == {} and la.amdahl_summary([]) == {}
    seed = la.amdahl_summary(rows, {**la.amdahl_point(4096, 32, 770.0, 2910.0), "L": 2048})
    assert seed["overcaptured_core_drop"] == summary["core_drop"] and seed["overcaptured_module_drop"] == summary["module_drop"]


@pytest.mark.gpu
def test_exactness_on_the_gpu_eager_and_replayed():
    result = la.exactness(256, 8, 2, 64, 64, layouts=3)
    assert result["errors"] == {}
    assert {(e["dtype"], e["mode"]) for e in result["entries"]} == {
        (d, m) for d in ("float32", "bfloat16") for m in ("eager", "graph")}
    assert all(entry["ok"] for entry in result["entries"]), result["entries"]


@pytest.mark.gpu
def test_overcapture_graphs_agree_with_exact_graphs(monkeypatch):
    # Ours only: on a fresh H200 (2026-12-01) this test, with fla too, used the rest of a 180 s GPU
    # test run twice; fla's first-call autotuning is the likely cause (not yet confirmed). The
    # suite, not this test, measures fla.
    monkeypatch.setattr(la, "CAPTURABLE", ("ours",))
    result = la.overcapture(1024, 16, 4, (256, 1024), heads=2, key_dim=64, value_dim=64, iters=3)
    assert "ours" in result["series"], result["errors"]
    for point in result["series"]["ours"]:
        assert point["captured_us"] > 0 and point["exact_us"] > 0
        assert all(diff is not None and diff < 1e-2 for diff in point["output_diff"].values()), point


@pytest.mark.gpu
def test_amdahl_measures_core_and_module():
    result = la.amdahl(256, 2, 64, 4, (512, 256), iters=3)
    assert result["errors"] == {}
    assert [p["T"] for p in result["points"]] == [512, 256]
    assert all(0 < p["core_us"] < p["module_us"] for p in [*result["points"], result["overcaptured"]])
    assert result["overcaptured"]["T"] == 512 and result["overcaptured"]["L"] == 256
    assert set(result["summary"]) == {"T_full", "T_half", "core_drop", "module_drop", "overcaptured_core_drop",
                                      "overcaptured_module_drop"}


def test_suite_parts_share_a_budget_under_the_recording_limit(monkeypatch):
    # A fake clock and a fake isolated run that takes 100 s per part: the parts get what is left of
    # the budget as their timeout, and a part with less than MIN_PART_S left is not started.
    now, calls = [1000.0], []

    def fake_run(function, *args, timeout_s):
        calls.append((function.__name__, timeout_s))
        now[0] += 100.0
        return {"part": function.__name__}

    monkeypatch.setattr(harness, "monotonic", lambda: now[0])
    monkeypatch.setattr(harness, "run_isolated", fake_run)
    monkeypatch.delenv(la.BUDGET_ENV, raising=False)
    assert la.default_budget_s() == la.SUITE_BUDGET_S
    monkeypatch.setenv(la.BUDGET_ENV, "270")
    result = la.linear_attention_suite()
    assert calls == [("exactness", 270), ("exact_shape", 170), ("overcapture", 70)]
    assert [name for name in la.PARTS if name in result] == ["exactness", "exact_shape", "overcapture"]
    assert set(result["errors"]) == {"amdahl", "trace"}
    assert all(result["errors"][name].startswith("not run: 0 s left of the budget of 270 s") for name in ("amdahl", "trace"))
    assert result["config"]["budget_s"] == 270
    # The default budget ends before the recording script kills the suite (its limit read from the script).
    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_record.sh").read_text()
    default, margin = map(int, re.search(r"ATTN_GYM_LITE_LA_BUDGET_S:-(\d+)\} \+ (\d+) \)\)", script).groups())
    assert default == la.SUITE_BUDGET_S and la.MIN_PART_S <= margin


# ---- the trace part: its region table, its output folder ---------------------------------------

STREAM = 7


def _device(cat, ts, dur, correlation=7, region=None):
    args = {"correlation": correlation, "stream": STREAM, **({"region": region} if region else {})}
    return {"ph": "X", "cat": cat, "name": f"{cat}@{ts}", "pid": 0, "tid": STREAM, "ts": ts, "dur": dur, "args": args}


def _host(name, ts, dur, cat="cpu_op", tid=10, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_region_table_against_a_hand_computation():
    """A labelled trace of one replay: forward and backward kernels of two regions, a memset, an
    unlabelled kernel and one of a node created outside every region; a region box (not device
    work) and the profiler's step ranges around it."""
    events = [
        _device("kernel", 100, 10, region="kda.qkv_proj"),
        _device("kernel", 112, 30, region="kda.core"),
        _device("gpu_memset", 143, 2, region="kda.core"),
        _device("kernel", 150, 50, region="kda.core backward"),
        _device("kernel", 201, 4, region="kda.qkv_proj backward"),
        _device("kernel", 206, 3),
        _device("kernel", 210, 6, region="backward"),
        {"ph": "X", "cat": "graph_region", "name": "kda.core", "pid": 0, "tid": 500_007, "ts": 112, "dur": 88,
         "args": {"region": "kda.core"}},
        _host("ProfilerStep#1", 0, 50), _host("cudaGraphLaunch", 1, 2, cat="cuda_runtime", correlation=7),
        _host("ProfilerStep#2", 50, 1),
    ]
    table = la.region_table({"traceEvents": events})
    total = 10 + 30 + 2 + 50 + 4 + 3 + 6
    assert table["device_us"] == total and table["kernels"] == 6 and table["device_events"] == 7
    assert table["window_us"] == 216 - 100 and table["busy_us"] == total  # no two events overlap

    def row(us, kernels, count):
        return {"us": us, "share": pytest.approx(us / total), "kernels": kernels, "device_events": count}

    assert table["regions"] == {"kda.core backward": row(50, 1, 1), "kda.core": row(32, 1, 2), "kda.qkv_proj": row(10, 1, 1),
                                "backward": row(6, 1, 1), "kda.qkv_proj backward": row(4, 1, 1),
                                la.UNLABELLED: row(3, 1, 1)}
    assert list(table["regions"]) == ["kda.core backward", "kda.core", "kda.qkv_proj", "backward", "kda.qkv_proj backward", la.UNLABELLED]
    assert table["stages"] == {"kda.core": row(82, 2, 3), "kda.qkv_proj": row(14, 2, 2), "backward": row(6, 1, 1),
                               la.UNLABELLED: row(3, 1, 1)}
    assert [la.region_stage(n) for n in ("kda.core backward", "kda.core", "backward", la.UNLABELLED)] == [
        "kda.core", "kda.core", "backward", la.UNLABELLED]


def test_the_trace_part_runs_last_and_alone_gets_the_output_folder(monkeypatch, tmp_path):
    assert la.PARTS == ("exactness", "exact_shape", "overcapture", "amdahl", "trace")
    calls = []
    monkeypatch.setattr(harness, "run_isolated", lambda function, *args, timeout_s: calls.append((function.__name__, args)) or {})
    la.linear_attention_suite(out=tmp_path)
    assert calls == [(name, ()) for name in la.PARTS[:-1]] + [("trace", (str(tmp_path),))]  # a string: JSON
    calls.clear()
    la.linear_attention_suite()
    assert calls[-1] == ("trace", (None,))


@pytest.mark.gpu
def test_trace_labels_every_stage_of_one_layer_replay(tmp_path):
    result = la.trace(str(tmp_path), 256, 2, 64, 4, 512, warmup=2)
    assert result["errors"] == {}, result["errors"]
    assert result["annotation"]["replays"] == 1 and result["annotation"]["unmatched_replays"] == []
    assert result["trace_file"] == f"{la.TRACE_FOLDER}/{la.TRACE_FILE}"
    written = load_trace(tmp_path / result["trace_file"])
    assert la.region_table(written)["regions"] == result["regions"]  # the numbers are the file's
    regions = result["regions"]
    for region in KDA_REGIONS:  # every stage launched forward kernels of its own, labelled as such
        assert regions.get(region, {}).get("kernels", 0) >= 1, (region, regions)
    assert regions["kda.core backward"]["kernels"] >= 1 and regions["kda.qkv_proj backward"]["kernels"] >= 1
    assert sum(r["us"] for r in regions.values()) == pytest.approx(result["device_us"])
    assert sum(r["share"] for r in result["stages"].values()) == pytest.approx(1.0)
    assert sum(r["kernels"] for r in regions.values()) == result["kernels"]
    # annotate_trace's own count of labelled events against the table's.
    labelled = sum(r["device_events"] for name, r in regions.items() if name != la.UNLABELLED)
    assert labelled == result["annotation"]["labelled_events"]
    assert 0 < result["busy_us"] <= result["window_us"]
    assert la.trace(None, 256, 2, 64, 4, 256, warmup=1)["trace_file"] is None
