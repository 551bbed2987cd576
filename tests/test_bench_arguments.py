"""The benchmark suites' public entry points (the ones the notebooks call) refuse bad arguments by
name before they build or launch anything; the scale-out summaries compute their ratios as written."""

from __future__ import annotations

import json

import pytest

from attn_gym_lite.bench.end_to_end import CONFIG as E2E_CONFIG
from attn_gym_lite.bench.end_to_end import end_to_end_suite, run_stack
from attn_gym_lite.bench.scale_out import CPU_CONFIG, goals, scale_out_suite, scaling, worker_main


@pytest.mark.parametrize(("arguments", "error", "match"), [
    (dict(stacks="graph ours"), TypeError, r"stacks must be a sequence of names from .*, got the string 'graph ours'"),
    (dict(stacks=("graph ours", "graph theirs")), ValueError, r"stacks\[1\] must be one of .*, got 'graph theirs'"),
    (dict(workloads=()), ValueError, r"workloads must name at least one of \('pretraining', 'sft'\), got none"),
    (dict(config={"T": 128}), ValueError, r"config must be a dict with the keys .*, missing \['bucket_align'"),
    (dict(config=None), TypeError, r"config must be a dict with the keys .*, got NoneType"),
    (dict(timeout_s=0), ValueError, r"timeout_s must be a finite real number > 0.0, got 0.0"),
])
def test_end_to_end_suite_refuses_bad_arguments_before_it_runs(arguments, error, match):
    with pytest.raises(error, match=match):
        end_to_end_suite(**arguments)


def test_run_stack_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"workload must be one of \('pretraining', 'sft'\), got 'rl'"):
        run_stack("rl", "graph ours", str(tmp_path / "b.pt"))
    with pytest.raises(ValueError, match=r"stack must be one of .*, got 'graph'"):
        run_stack("sft", "graph", str(tmp_path / "b.pt"))
    with pytest.raises(FileNotFoundError, match=r"batches_path"):
        run_stack("sft", "graph ours", str(tmp_path / "missing.pt"), E2E_CONFIG)


@pytest.mark.parametrize(("arguments", "error", "match"), [
    (dict(world_sizes=(1, 0)), ValueError, r"world_sizes\[1\] must be an int >= 1, got 0"),
    (dict(world_sizes=2), TypeError, r"world_sizes must be a sequence of ints, got int"),
    (dict(modes=("graphs",)), ValueError, r"modes\[0\] must be one of \('eager', 'graph'\), got 'graphs'"),
    (dict(workloads="sft"), TypeError, r"workloads must be a sequence of names .* got the string 'sft'"),
    (dict(config={"device": "cpu"}), ValueError, r"config must be a dict with the keys .*, missing \["),
    (dict(fsdp2=1), TypeError, r"fsdp2 must be a bool, got 1"),
    (dict(timeout_s=-1), ValueError, r"timeout_s must be a finite real number > 0.0, got -1.0"),
    (dict(budget_s=0), ValueError, r"budget_s must be a finite real number > 0.0, got 0.0"),
])
def test_scale_out_suite_refuses_bad_arguments_before_it_launches(arguments, error, match):
    with pytest.raises(error, match=match):
        scale_out_suite(**{"config": CPU_CONFIG, **arguments})


def test_scaling_ratios_are_the_rates_over_one_gpu_and_over_eager():
    runs = [
        {"workload": "sft", "world_size": 1, "mode": "eager", "tokens_per_s": 100.0},
        {"workload": "sft", "world_size": 2, "mode": "eager", "tokens_per_s": 150.0},
        {"workload": "sft", "world_size": 1, "mode": "graph", "tokens_per_s": 120.0},
        {"workload": "sft", "world_size": 2, "mode": "graph", "tokens_per_s": 228.0},
    ]
    rows = {(r["mode"], r["world_size"]): r for r in scaling(runs)}
    assert rows["eager", 2]["speedup_over_one_gpu"] == pytest.approx(1.5)
    assert rows["eager", 2]["efficiency"] == pytest.approx(0.75)
    assert rows["graph", 2]["speedup_over_one_gpu"] == pytest.approx(1.9)
    assert rows["graph over eager", 1]["speedup"] == pytest.approx(1.2)
    assert rows["graph over eager", 2]["speedup"] == pytest.approx(228 / 150)
    met = {(g["workload"], g["target"]): g for g in goals({"scaling": scaling(runs)})}
    assert met["sft", 1.0]["value"] == pytest.approx(228 / 150) and met["sft", 1.0]["met"] is True


def test_scaling_and_goals_refuse_malformed_records():
    with pytest.raises(TypeError, match=r"runs must be a list of run dicts"):
        scaling({"runs": []})
    with pytest.raises(ValueError, match=r"runs\[0\] must be a dict with the keys .*, missing \['tokens_per_s'\]"):
        scaling([{"workload": "sft", "world_size": 1, "mode": "eager"}])
    with pytest.raises(TypeError, match=r"record must be a scale-out suite result \(a dict\), got list"):
        goals([])
    with pytest.raises(ValueError, match=r"record\['scaling'\]\[0\] must be a dict with the keys .*, missing \['world_size'\]"):
        goals({"scaling": [{"workload": "sft", "mode": "graph"}]})


def test_worker_main_refuses_what_is_not_a_launch(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"--spec"):
        worker_main(["--spec", str(tmp_path / "missing.json")])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"must be the JSON spec scale_out_suite writes"):
        worker_main(["--spec", str(bad)])
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"config": {}}))
    with pytest.raises(ValueError, match=r"missing \['collective_timeout_s', 'parts', 'result'\]"):
        worker_main(["--spec", str(partial)])
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"config": {}, "parts": [], "result": str(tmp_path / "r.json"), "collective_timeout_s": 1}))
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match=r"RANK is not set"):
        worker_main(["--spec", str(whole)])
