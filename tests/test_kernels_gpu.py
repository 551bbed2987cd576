"""The Triton ragged-attention kernels at real sizes on the GPU: every schedule against a float64
reference, deterministic gradients, and one graph per schedule replayed on new layouts."""

import pytest
import torch
from helpers import assert_attention_close, reference_and_grads

from attn_gym_lite.graph.capture import capture_graph
from attn_gym_lite.ops.kernels import varlen_attention_triton
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths

pytestmark = pytest.mark.gpu

H = 4
RTOL = 2e-2  # max error relative to the largest reference value, bfloat16 / float16 inputs


def zipf_cu(tokens, sequences, slots, seed=0):
    lengths = zipf_lengths(tokens, sequences, generator=torch.Generator().manual_seed(seed))
    return pad_cu_seqlens(cu_seqlens_from_lengths(lengths, device="cuda"), slots), int(lengths.max())


def random_qkvo(rows, head_dim, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(rows, H, head_dim, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ["rect", "flat", "persistent", "dynamic", "auto"])
@pytest.mark.parametrize("head_dim,dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=["d128-bf16", "d64-fp16"])
def test_real_sizes_match_reference(head_dim, dtype, schedule, causal):
    T, L = 4096, 3500
    cu, s_max = zipf_cu(L, 24, 32)
    q, k, v, do = random_qkvo(T, head_dim, dtype)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    options = {"max_seqlen": s_max} if schedule == "rect" else {}
    zeroed = schedule in ("rect", "auto")  # both contracts, on a few schedules each
    out = varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule, zero_inactive=zeroed, **options)
    ours = [out, *torch.autograd.grad(out, (q, k, v), do)]
    assert_attention_close(ours, reference_and_grads(q, k, v, do, cu, causal), L, RTOL, zeroed, schedule)


def test_backward_is_deterministic():
    cu, _ = zipf_cu(3000, 40, 48, seed=3)
    q, k, v, do = random_qkvo(4096, 128, torch.bfloat16, seed=3)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    for schedule in ("persistent", "dynamic"):  # dynamic: the order of tasks varies, not their arithmetic
        runs = []
        for _ in range(2):
            out = varlen_attention_triton(q, k, v, cu, causal=True, schedule=schedule)
            runs.append([out, *torch.autograd.grad(out, (q, k, v), do)])
        for first, second in zip(*runs):
            assert torch.equal(first[:3000], second[:3000]), schedule


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ["rect", "flat", "persistent", "dynamic"])
def test_capture_then_replay_new_layouts(schedule, causal):
    T, N = 2048, 16
    q, k, v, do = random_qkvo(T, 128, torch.bfloat16, seed=1)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([T], device="cuda"), N)  # the static buffer
    options = {"max_seqlen": T} if schedule == "rect" else {}  # the worst case, fixed at capture

    def step():
        out = varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule, **options)
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    graph, outputs = capture_graph(step)
    layouts = {"zipf_M<N": zipf_lengths(T - 300, 9, generator=torch.Generator().manual_seed(7)).tolist(),
               "empty_middle": [700, 0, 0, 129, 1, 0, 511], "no_tokens": [0], "single_tokens": [1] * 16,
               "one_sequence_of_T": [T]}
    for name, lengths in layouts.items():
        cu.copy_(pad_cu_seqlens(cu_seqlens_from_lengths(lengths, device="cuda"), N))
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_close(outputs, reference_and_grads(q, k, v, do, cu, causal), sum(lengths), RTOL,
                               what=f"{schedule}/{name}")
