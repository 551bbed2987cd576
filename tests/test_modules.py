"""VarLenAttention and the language models against independent computations, and the head sizes a
model refuses where it is built."""

import math

import pytest
import torch
import torch.nn.functional as F

from attn_gym_lite.models import PackedLM, PackedTransformer, VarLenAttention
from attn_gym_lite.ops.rotary import apply_rotary, rotary_tables
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens, positions_in_sequence


def test_varlen_attention_module_equals_per_document_computation():
    torch.manual_seed(0)
    module = VarLenAttention(16, 4, causal=True).double()
    cu = cu_seqlens_from_lengths([5, 1, 9])
    x = torch.randn(15, 16, dtype=torch.float64)
    out = module(x, cu, 9)
    # Each document alone, through plain matmuls and SDPA: documents must not see each other.
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        q, k, v = (x[start:end] @ module.qkv.weight.T).view(end - start, 3, 4, 4).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(1, 0, 2).reshape(end - start, 16)
        torch.testing.assert_close(out[start:end], attn @ module.out_proj.weight.T)


@pytest.mark.parametrize("build", [lambda: PackedLM(50, 16, 2), lambda: PackedTransformer(50, 32, 2, 2)],
                         ids=["PackedLM", "PackedTransformer"])
def test_language_models_are_causal_within_documents(build):
    torch.manual_seed(0)
    model = build().double()
    cu = cu_seqlens_from_lengths([4, 4])
    ids = torch.randint(50, (8,))
    changed = ids.clone()
    changed[7] = (ids[7] + 1) % 50  # the last token of the second document
    a, b = model(ids, cu, 4), model(changed, cu, 4)
    torch.testing.assert_close(a[:7], b[:7])  # nothing before it may see it
    assert not torch.allclose(a[7], b[7])


@pytest.mark.gpu
def test_cuda_module_matches_cpu_reference():
    torch.manual_seed(0)
    module = VarLenAttention(256, 4, causal=True)
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([100, 1, 400]), 8)
    x = torch.randn(600, 256)
    expected = module(x, cu, 400)  # CPU: reference path, float32
    cuda = VarLenAttention(256, 4, causal=True, device="cuda", dtype=torch.bfloat16)
    cuda.load_state_dict(module.state_dict())
    out = cuda(x.cuda().bfloat16(), cu.cuda(), 400)
    torch.testing.assert_close(out.float().cpu(), expected, atol=3e-2, rtol=3e-2)
    assert torch.equal(out[501:].float().cpu(), torch.zeros(99, 256))


def test_rotary_positions_restart_at_every_sequence():
    positions = positions_in_sequence(pad_cu_seqlens(cu_seqlens_from_lengths([3, 0, 2]), 4), 7)
    assert positions.tolist() == [0, 1, 2, 0, 1, 0, 1]  # rows 5, 6 are capacity: they count from L
    cos, sin = rotary_tables(positions, 4, base=100.0)
    # The published formula, element by element: angle = p * base^(-2j / D), pairs (j, j + D/2).
    x = torch.randn(7, 1, 4, dtype=torch.float64)
    out = apply_rotary(x, cos.double(), sin.double())
    for t, p in enumerate(positions.tolist()):
        for j in range(2):
            angle = p * 100.0 ** (-2 * j / 4)
            a, b = x[t, 0, j].item(), x[t, 0, j + 2].item()
            assert out[t, 0, j].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-6)
            assert out[t, 0, j + 2].item() == pytest.approx(b * math.cos(angle) + a * math.sin(angle), abs=1e-6)


@pytest.mark.parametrize("build", [
    lambda: VarLenAttention(10, 4),  # not a multiple
    lambda: VarLenAttention(16, 2, impl="triton"),  # head dim 8: no kernel for it
    lambda: PackedLM(100, 512, 2, impl="triton"),  # head dim 256
    lambda: PackedTransformer(100, 6, 2, 1),  # head dim 3: RoPE needs an even one
], ids=["multiple", "triton", "triton-lm", "rotary"])
def test_models_refuse_a_head_dim_they_cannot_use_where_they_are_built(build):
    with pytest.raises(ValueError, match="num_heads"):
        build()
    # Without those constraints the same sizes build: the reference attention takes any head dim.
    assert VarLenAttention(6, 2).head_dim == 3 and PackedLM(100, 16, 2, impl="auto").attention.head_dim == 8
