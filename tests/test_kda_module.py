"""KDAAttention: against a naive per-sequence float64 layer built on kda_recurrent, inactive rows that
never leak (NaN in them, undefined memory as NaN), the masks that make it so, and gradients equal
across the three cores."""

import pytest
import torch
from helpers import CPU_KERNELS, naive_short_conv

from attn_gym_lite.models.kda import KDA_MASK_SITES, KDA_REGIONS, KDAAttention
from attn_gym_lite.ops.kda import kda_recurrent
from attn_gym_lite.ops.kernels import INTERPRETED
from attn_gym_lite.ops.masking import uninitialized_memory_as_nan
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.testing.exactness import compare_gradients, exact_gradients, gradients_at_capacity

IMPLS = ["chunked", "recurrent", "triton"]
IMPL_PARAMS = ["chunked", "recurrent", pytest.param("triton", marks=CPU_KERNELS)]
IMPLS_HERE = [impl for impl in IMPLS if impl != "triton" or INTERPRETED]  # for the tests that loop over them
HIDDEN, HEADS, K, C = 32, 2, 16, 16  # small (the kernel's smallest tiles): the interpreter runs it on a CPU


def _layer(impl: str, dtype=torch.float64, seed: int = 0, **options) -> KDAAttention:
    torch.manual_seed(seed)
    layer = KDAAttention(HIDDEN, HEADS, K, impl=impl, chunk_size=C, dtype=dtype, **options)
    with torch.no_grad():  # non-trivial values for the parameters that start at 0 or 1
        layer.dt_bias.normal_()
        layer.o_norm_weight.uniform_(0.5, 1.5)
        layer.g_proj[1].bias.normal_()
    return layer


def _naive_layer(layer: KDAAttention, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The layer written out one sequence at a time in float64, from its parameters: the convolution
    by the token loop, the gate and the norms by their formulas, the core by kda_recurrent."""
    p = {name: w.detach().double() for name, w in layer.named_parameters()}
    H, Kd, V = layer.num_heads, layer.head_dim, layer.head_v_dim
    out, start = [], 0
    for n in lengths:
        xs = x[start:start + n].double()
        start += n
        if n == 0:
            continue
        conv = naive_short_conv(xs @ p["qkv_proj.weight"].T, p["conv.weight"], torch.tensor([0, n]))
        conv = conv * torch.sigmoid(conv)
        q, k, v = conv.split([H * Kd, H * Kd, H * V], dim=-1)
        q = q.view(n, H, Kd)
        k = k.view(n, H, Kd)
        q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        f = (xs @ p["f_proj.0.weight"].T @ p["f_proj.1.weight"].T).view(n, H, Kd)
        g = -p["A_log"].exp()[:, None] * torch.log1p(torch.exp(f + p["dt_bias"].view(H, Kd)))
        beta = torch.sigmoid(xs @ p["b_proj.weight"].T)
        o, _ = kda_recurrent(q, k, v.reshape(n, H, V), g, beta, torch.tensor([0, n], dtype=torch.int32))
        gate = (xs @ p["g_proj.0.weight"].T @ p["g_proj.1.weight"].T + p["g_proj.1.bias"]).view(n, H, V)
        rms = (o.pow(2).mean(-1, keepdim=True) + layer.norm_eps).sqrt()
        o = o / rms * p["o_norm_weight"] * torch.sigmoid(gate)
        out.append(o.reshape(n, H * V) @ p["o_proj.weight"].T)
    return torch.cat(out)


@pytest.mark.parametrize("impl", IMPL_PARAMS)
def test_layer_matches_the_naive_per_sequence_layer(impl):
    lengths = [20, 0, 1, 9, 33]
    T = sum(lengths) + 4
    layer = _layer(impl, dtype=torch.float64 if impl != "triton" else torch.float32)
    x = torch.randn(T, HIDDEN, dtype=torch.float64)
    cu = cu_seqlens_from_lengths(lengths)
    y = layer(x.to(layer.qkv_proj.weight.dtype), cu)
    expected = _naive_layer(layer, x, lengths)
    L = sum(lengths)
    tol = 1e-10 if impl != "triton" else 1e-4
    torch.testing.assert_close(y[:L].double(), expected, rtol=tol, atol=tol)
    assert torch.equal(y[L:], torch.zeros_like(y[L:]))


@pytest.mark.parametrize("impl", IMPL_PARAMS)
def test_inactive_rows_never_leak(impl):
    """NaN and huge values in the inactive input and target rows, undefined memory read as NaN:
    every gradient at capacity equals the one on the L real rows alone, and rows past L are 0."""
    dtype = torch.float64 if impl != "triton" else torch.float32
    layer = _layer(impl, dtype=dtype)
    lengths = [17, 1, 0, 7]
    L, T = sum(lengths), sum(lengths) + 5
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 6)
    x = torch.randn(T, HIDDEN, dtype=dtype)
    target = torch.randn(T, HIDDEN, dtype=dtype)
    x[L:L + 2], x[L + 2:] = float("nan"), 1e30
    target[L:] = float("nan")
    with uninitialized_memory_as_nan():
        y = layer(x, cu)
        report = compare_gradients(gradients_at_capacity(layer, x, target, cu, T), exact_gradients(layer, x, target, cu))
    assert torch.equal(y[L:], torch.zeros_like(y[L:]))
    assert report["loss_at_capacity"] == pytest.approx(report["loss_exact"], rel=1e-6)
    for name, g in report["gradients"].items():
        assert g["nonfinite"] == 0, name
        assert g["max_abs_diff"] <= 1e-6 * max(g["max_abs_exact"], 1.0), (name, g)


@pytest.mark.parametrize(("impl", "dropped", "poisoned"), [
    ("chunked", KDA_MASK_SITES, {"qkv_proj.weight", "f_proj.0.weight", "b_proj.weight"}),
    pytest.param("triton", ("output",), {"o_proj.weight"}, marks=CPU_KERNELS)])  # its rows past L: undefined
def test_without_masks_the_inactive_rows_poison_the_weight_gradients(impl, dropped, poisoned):
    """The test above can fail: leave masks out and NaN in the inactive rows reaches gradients."""
    dtype = torch.float64 if impl == "chunked" else torch.float32
    layer = _layer(impl, dtype, masks=[site for site in KDA_MASK_SITES if site not in dropped])
    lengths = [6, 1, 7]
    L, T = sum(lengths), sum(lengths) + 3
    cu = cu_seqlens_from_lengths(lengths)
    x = torch.randn(T, HIDDEN, dtype=dtype)
    x[L:] = float("nan")
    target = torch.randn(T, HIDDEN, dtype=dtype)
    with uninitialized_memory_as_nan():
        report = compare_gradients(gradients_at_capacity(layer, x, target, cu, T), exact_gradients(layer, x, target, cu))
    assert poisoned <= {name for name, g in report["gradients"].items() if g["nonfinite"]}


def test_gradients_agree_between_the_cores():
    lengths = [7, 0, 1, 35]
    T = sum(lengths) + 3
    cu = cu_seqlens_from_lengths(lengths)
    x = torch.randn(T, HIDDEN, dtype=torch.float64)
    target = torch.randn(T, HIDDEN, dtype=torch.float64)
    results = {}
    for impl in IMPLS_HERE:
        dtype = torch.float64 if impl != "triton" else torch.float32
        layer = _layer(impl).to(dtype)  # the same float64 weights, rounded for the float32 kernel
        _, grads = gradients_at_capacity(layer, x.to(dtype), target.to(dtype), cu, T)
        assert all(torch.isfinite(g).all() for g in grads.values()), impl
        results[impl] = grads
    for impl in IMPLS_HERE[1:]:
        tol = 1e-9 if impl != "triton" else 1e-4
        for name, g in results["chunked"].items():
            torch.testing.assert_close(results[impl][name].double(), g, rtol=tol, atol=tol, msg=f"{impl}: {name}")


def _forward_and_gradients(layer: KDAAttention, x: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    leaf = x.clone().requires_grad_(True)
    y = layer(leaf, cu)
    return [y, *torch.autograd.grad((y * y).sum(), [leaf, *layer.parameters()])]


@pytest.mark.parametrize("impl", ["chunked", pytest.param("triton", marks=CPU_KERNELS)])
def test_layer_marks_its_stages_as_regions_in_forward_order(impl):
    """Each of KDA_REGIONS is entered once per forward, in forward order, as a record_function range
    holding the layer's own torch ops; nothing else is entered."""
    from attn_gym_lite.profiling import profile
    from attn_gym_lite.regions import collect_region_names

    layer = _layer(impl, dtype=torch.float32)
    x, cu = torch.randn(40, HIDDEN), cu_seqlens_from_lengths([17, 0, 20])
    with collect_region_names() as names:
        _forward_and_gradients(layer, x, cu)
    assert names == set(KDA_REGIONS)
    with profile(None) as recording:
        _forward_and_gradients(layer, x, cu)
    events = recording.trace["traceEvents"]
    ranges = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"] in KDA_REGIONS), key=lambda e: e["ts"])
    assert [r["name"] for r in ranges] == list(KDA_REGIONS)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    linear = {r["name"] for r in ranges for o in ops
              if o["name"] == "aten::linear" and o["tid"] == r["tid"] and r["ts"] <= o["ts"] <= r["ts"] + r["dur"]}
    assert linear == {"kda.qkv_proj", "kda.gates", "kda.norm_gate", "kda.out_proj"}  # the layer's projections


def test_layer_shapes_dtypes_and_parameters_any_width_for_eager_cores_and_known_mask_sites():
    layer = KDAAttention(32, 2, 8, head_v_dim=4, gate_rank=3, impl="chunked", dtype=torch.bfloat16)
    assert layer.A_log.dtype == torch.float32 and layer.dt_bias.shape == (16,)
    assert layer.qkv_proj.weight.shape == (2 * 16 + 8, 32)
    assert layer.f_proj[0].weight.shape == (3, 32) and layer.g_proj[1].weight.shape == (8, 3)
    x = torch.randn(10, 32, dtype=torch.bfloat16)
    y = layer(x, torch.tensor([0, 4, 8], dtype=torch.int32))
    assert y.shape == (10, 32) and y.dtype == torch.bfloat16
    q, k, v, g, beta = layer.core_inputs(x, torch.tensor([0, 4, 8], dtype=torch.int32))
    assert q.shape == k.shape == g.shape == (10, 2, 8) and v.shape == (10, 2, 4) and beta.shape == (10, 2)
    assert (g[:8] <= 0).all() and g.dtype == torch.float32
    torch.testing.assert_close(q[:8].float().norm(dim=-1), torch.ones(8, 2), rtol=1e-2, atol=1e-2)
    assert layer.masks == set(KDA_MASK_SITES)  # all of them by default
    layer = KDAAttention(16, 2, 8, head_v_dim=12, chunk_size=5, impl="chunked", dtype=torch.float64)
    assert layer(torch.randn(6, 16, dtype=torch.float64), torch.tensor([0, 6], dtype=torch.int32)).shape == (6, 16)
    with pytest.raises(ValueError, match="masks"):
        KDAAttention(16, 2, 8, masks=("input", "outputs"))  # a misspelt site would silently mask nothing


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bounds", [(0, 3, 9), (1, 3, 6), (0, 5, 3)])
def test_malformed_host_cu_seqlens_is_refused_before_the_core_indexes_memory(impl, bounds):
    """Refused by the core, naming cu_seqlens, before any kernel indexes memory with the values."""
    layer = KDAAttention(16, 2, 16, impl=impl, chunk_size=16)
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(8, 16), torch.tensor(bounds, dtype=torch.int32))


@pytest.mark.gpu
def test_captured_layer_replays_changing_layouts_like_eager():
    from attn_gym_lite.graph.capture import capture_graph

    torch.manual_seed(0)
    layer = KDAAttention(256, 2, 64, device="cuda", dtype=torch.bfloat16)
    T, N = 512, 8
    x = torch.randn(T, 256, device="cuda", dtype=torch.bfloat16)
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([T], device="cuda"), N)
    graph, y = capture_graph(lambda: layer(x, cu))
    for lengths in ([100, 0, 1, 300], [512], [64, 64, 3]):
        L = sum(lengths)
        cu.copy_(pad_cu_seqlens(cu_seqlens_from_lengths(lengths, device="cuda"), N))
        x[L:] = float("nan")
        graph.replay()
        eager = layer(x[:L].clone(), cu_seqlens_from_lengths(lengths, device="cuda"))
        torch.testing.assert_close(y[:L].float(), eager.float(), rtol=2e-2, atol=2e-2)
        assert torch.equal(y[L:], torch.zeros_like(y[L:]))
        x.normal_()
