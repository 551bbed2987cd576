"""ShortConvAttentionBlock: the computation it claims, and the proof that training it at padded
capacity gives exactly the gradients of training on the L real rows, with each mask necessary."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    EDGE_LAYOUTS,
    FAST,
    FILLS,
    assert_exact,
    attention_with_undefined_capacity,
    calling,
    contaminated,
    fill_inactive,
    filled_input_and_target,
    naive_short_conv,
    padded_and_exact,
    ragged_layouts,
)
from hypothesis import given
from hypothesis import strategies as st

from attn_gym_lite.models.block import MASK_SITES, ShortConvAttentionBlock
from attn_gym_lite.ops.masking import uninitialized_memory_as_nan
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens
from attn_gym_lite.testing.exactness import compare_gradients, exact_gradients, gradients_at_capacity

#: torch's varlen_attn contract (rows past L of the output and of ∇q/∇k/∇v undefined) on the CPU.
TORCH_CONTRACT = mock.patch("attn_gym_lite.models.block.varlen_attention", calling(attention_with_undefined_capacity))


def block(masks=MASK_SITES, seed=0):
    torch.manual_seed(seed)
    module = ShortConvAttentionBlock(8, 2, masks=masks, dtype=torch.float64)
    with torch.no_grad():  # non-trivial norm gains, so their gradients are tested for real
        module.norm_in.weight.uniform_(0.5, 1.5)
        module.norm_out.weight.uniform_(0.5, 1.5)
    return module


def test_block_computes_the_documented_composition_per_document():
    module = block()
    cu = cu_seqlens_from_lengths([5, 1, 7])
    x = torch.randn(13, 8, dtype=torch.float64)
    out = module(x, cu, 7)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        # Each document alone, from plain functional ops and a token loop for the convolution.
        xs = x[start:end]
        qkv = F.rms_norm(xs, (8,), module.norm_in.weight) @ module.qkv.weight.T
        qkv = F.silu(naive_short_conv(qkv, module.conv.weight, torch.tensor([0, end - start])))
        q, k, v = qkv.view(end - start, 3, 2, 4).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(1, 0, 2).reshape(end - start, 8)
        expected = xs + F.rms_norm(attn, (8,), module.norm_out.weight) @ module.out_proj.weight.T
        torch.testing.assert_close(out[start:end], expected, rtol=1e-12, atol=1e-12)


@FAST
@given(layout=ragged_layouts(max_tokens=14), fill=st.sampled_from(FILLS))
def test_padded_capacity_gives_the_exact_gradients(layout, fill):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 8, 8, seed=1)
    with TORCH_CONTRACT, uninitialized_memory_as_nan():
        assert_exact(padded_and_exact(block(), x, target, cu, tokens), rtol=1e-10)
        if int(cu[-1]) < tokens:  # the same test without the masks shows the contamination
            assert contaminated(padded_and_exact(block(masks=()), x, target, cu, tokens), rtol=1e-10)


@pytest.mark.parametrize("layout", EDGE_LAYOUTS.values(), ids=EDGE_LAYOUTS.keys())
@pytest.mark.parametrize("fill", FILLS)
def test_edge_layouts_are_exact(layout, fill):
    tokens, cu = layout
    x, target = filled_input_and_target(tokens, cu, fill, 8, 8, seed=2)
    with TORCH_CONTRACT, uninitialized_memory_as_nan():
        report = padded_and_exact(block(), x, target, cu, tokens)
        out = block()(x, cu, tokens)
    assert_exact(report, rtol=1e-10)
    assert torch.equal(out[int(cu[-1]):], torch.zeros_like(out[int(cu[-1]):]))  # output rows past L are 0


#: Drop one mask, and exactly these gradients go wrong (NaN in the inactive input rows).
WITHOUT_ONE_MASK = {
    "input": {"input", "norm_in.weight", "qkv.weight"},  # NaN rows reach both reductions
    "qkv_grad": {"norm_in.weight", "qkv.weight"},  # the conv's undefined ∇input reaches them
    "attention_output": {"norm_out.weight", "out_proj.weight"},  # undefined attention rows
}


@pytest.mark.parametrize("dropped", MASK_SITES)
def test_every_mask_is_necessary(dropped):
    tokens, cu = EDGE_LAYOUTS["M<N"]
    x, target = filled_input_and_target(tokens, cu, "nan", 8, 8, seed=3)
    with TORCH_CONTRACT, uninitialized_memory_as_nan():
        report = padded_and_exact(block(masks=set(MASK_SITES) - {dropped}), x, target, cu, tokens)
    assert contaminated(report, rtol=1e-10) == WITHOUT_ONE_MASK[dropped]


def test_masks_take_any_iterable_of_sites_and_refuse_unknown_ones():
    for masks in (["input"], ("input",), {"input"}, (m for m in ["input"])):
        assert ShortConvAttentionBlock(8, 2, masks=masks).masks == {"input"}
    assert ShortConvAttentionBlock(8, 2, masks=()).masks == frozenset()
    with pytest.raises(ValueError, match="masks"):
        ShortConvAttentionBlock(8, 2, masks=["input", "output"])  # "output" would silently mask nothing


# GPU: torch's varlen_attn in bfloat16, (T, N, dim) = (256, 32, 128).
GPU_LAYOUTS = {"L=T": [100, 28, 128], "L=0": [0], "M<N": [37, 0, 1, 90, 3], "one long": [201], "many short": [5] * 30}


def gpu_block(masks=MASK_SITES):
    torch.manual_seed(0)
    return ShortConvAttentionBlock(128, 2, masks=masks, device="cuda", dtype=torch.bfloat16)


def gpu_batch(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    cu = pad_cu_seqlens(cu_seqlens_from_lengths(lengths), 32)
    x, target = (fill_inactive(torch.randn(256, 128, generator=generator).bfloat16(), cu, "nan") for _ in range(2))
    return x.cuda(), target.cuda(), cu.cuda()


@pytest.mark.gpu
def test_cuda_block_matches_the_float64_cpu_block():
    cuda_module = gpu_block()
    reference = ShortConvAttentionBlock(128, 2, dtype=torch.float64)
    reference.load_state_dict({k: v.double().cpu() for k, v in cuda_module.state_dict().items()})
    x, _, cu = gpu_batch(GPU_LAYOUTS["M<N"])
    active = sum(GPU_LAYOUTS["M<N"])
    out, expected = cuda_module(x, cu, 256), reference(x.double().cpu(), cu.cpu(), 256)
    torch.testing.assert_close(out[:active].double().cpu(), expected[:active], rtol=5e-2, atol=5e-2)
    assert torch.equal(out[active:], torch.zeros_like(out[active:]))


@pytest.mark.gpu
@pytest.mark.parametrize("masks", [MASK_SITES, ()], ids=["masked", "unmasked"])
def test_cuda_graph_replay_with_new_layouts_gives_the_exact_gradients(masks):
    from attn_gym_lite.graph.capture import capture_graph

    module = gpu_block(masks)
    static_x, static_target, static_cu = gpu_batch(GPU_LAYOUTS["L=T"])
    graph, (loss, grads) = capture_graph(lambda: gradients_at_capacity(module, static_x, static_target, static_cu, 256))
    for seed, (name, lengths) in enumerate(GPU_LAYOUTS.items()):
        x, target, cu = gpu_batch(lengths, seed=seed)
        for static, new in ((static_x, x), (static_target, target), (static_cu, cu)):
            static.copy_(new)
        graph.replay()
        report = compare_gradients((loss, grads), exact_gradients(module, x, target, cu))
        if masks:
            assert_exact(report, rtol=5e-2)  # bfloat16: 8 mantissa bits, sums over up to T rows
        elif sum(lengths) < 256:  # the NaN input rows reach the first reductions
            assert {"norm_in.weight", "qkv.weight"} <= contaminated(report, 5e-2), name
