"""The masking suite's ablation runs on a CPU too (the "Masking" chapter calls it there)."""

import pytest
import torch

from attn_gym_lite.bench.masking import ablation_verdicts, block_ablation
from attn_gym_lite.models.block import MASK_SITES


def test_block_ablation_on_cpu_finds_what_each_missing_mask_ruins():
    result = block_ablation(48, 6, 30, 4, 16, 2, impl="reference", device="cpu", dtype=torch.float64)
    assert result["config"] | {"T": 48, "L": 30, "N": 6, "dtype": "float64", "device": "cpu"} == result["config"]
    runs = {run["variant"]: run for run in result["runs"]}
    assert list(runs) == ["all", "none", *(f"without {site}" for site in MASK_SITES)]
    # with every mask: finite and equal to the exact computation on the L real rows (float64)
    for g in runs["all"]["gradients"].values():
        assert g["nonfinite"] == 0 and g["max_abs_diff"] <= 1e-10 * max(g["max_abs_exact"], 1.0)
    assert runs["all"]["loss_at_capacity"] == pytest.approx(runs["all"]["loss_exact"], rel=1e-12)
    verdicts = ablation_verdicts(result)
    ruined = {variant: sorted(name for name, v in row.items() if v != "ok") for variant, row in verdicts.items()}
    assert ruined["all"] == []
    assert ruined["without input"] == ruined["none"] == ["input", "norm_in.weight", "qkv.weight"]
    assert ruined["without qkv_grad"] == ["norm_in.weight", "qkv.weight"]
    assert ruined["without attention_output"] == []  # the reference attention writes zeros there
    # a non-finite count names the entries: the QKV weight is [3 * dim, dim]
    assert verdicts["none"]["qkv.weight"] == f"{3 * 16 * 16} non-finite"


def test_ablation_verdicts_threshold():
    def run(variant, diff, exact, nonfinite=0):
        return {"variant": variant, "gradients": {"w": {"nonfinite": nonfinite, "max_abs_diff": diff,
                                                        "max_abs_exact": exact}}}
    result = {"runs": [run("a", 0.049, 1.0), run("b", 0.051, 1.0), run("c", 4e-5, 1e-6), run("d", 6e-5, 1e-6),
                       run("e", None, 1.0, nonfinite=3)]}
    assert ablation_verdicts(result) == {"a": {"w": "ok"}, "b": {"w": "WRONG"}, "c": {"w": "ok"},
                                         "d": {"w": "WRONG"}, "e": {"w": "3 non-finite"}}
    assert ablation_verdicts(result, rtol=0.06)["b"] == {"w": "ok"}
