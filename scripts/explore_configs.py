"""Exploration (not a recording): forward and backward tile configs of the Triton kernels on the
H200, exact-shape graphs, TFLOP/s. Prints JSON lines. Run on the GPU host."""
import itertools
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_gym_lite.bench.schedulers import attention_flops, eager_host_us, throughput_layouts
from attn_gym_lite.bench.timing import cuda_event_us, median
from attn_gym_lite.graph.capture import capture_graph
from attn_gym_lite.ops.kernels import AttentionConfig, KernelConfig, default_config, varlen_attention_triton
from attn_gym_lite.ragged import cu_seqlens_from_lengths


def measure(lengths, causal, config, backward, schedule="auto", H=16, D=128, iters=20):
    cu = cu_seqlens_from_lengths(lengths, device="cuda")
    L = int(lengths.sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (x.requires_grad_(backward) for x in (q, k, v))
    def step():
        out = varlen_attention_triton(q, k, v, cu, causal=causal, schedule=schedule, config=config)
        return torch.autograd.grad(out, (q, k, v), do) if backward else out
    graph, _ = capture_graph(step)
    us = median(cuda_event_us(graph.replay, iters))
    flops = attention_flops(lengths, H, D, causal) * (3.5 if backward else 1.0)
    return us, flops / us / 1e6

base = default_config()
layouts = throughput_layouts(0)
fwd_configs = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 4),
               (128, 32, 4, 3), (64, 128, 4, 3), (128, 128, 8, 4)]
t0 = time.time()
for (bm, bn, w, st), (name, lengths), causal in itertools.product(fwd_configs, layouts.items(), (False, True)):
    if bm % bn:
        continue
    cfg = AttentionConfig(KernelConfig(bm, bn, num_warps=w, num_stages=st), base.dq, base.dkdv)
    try:
        us, tf = measure(lengths, causal, cfg, False)
        print(json.dumps({"kind": "fwd", "cfg": [bm, bn, w, st], "layout": name, "causal": causal, "us": round(us, 1),
                          "tflops": round(tf, 1)}), flush=True)
    except Exception as e:
        print(json.dumps({"kind": "fwd", "cfg": [bm, bn, w, st], "error": str(e)[:200]}), flush=True)
print("fwd sweep s", time.time() - t0, flush=True)
bwd_configs = [((128, 64, 8, 2), (64, 128, 8, 2)), ((64, 64, 4, 2), (64, 64, 4, 2)), ((128, 64, 8, 3), (64, 128, 8, 3)),
               ((64, 32, 4, 2), (32, 64, 4, 2)), ((128, 128, 8, 2), (128, 128, 8, 2)), ((64, 64, 4, 3), (64, 128, 4, 2)),
               ((128, 32, 8, 2), (32, 128, 8, 2))]
for (dq, dkdv), (name, lengths), causal in itertools.product(bwd_configs, layouts.items(), (False, True)):
    cfg = AttentionConfig(base.forward, KernelConfig(dq[0], dq[1], num_warps=dq[2], num_stages=dq[3]),
                          KernelConfig(dkdv[0], dkdv[1], num_warps=dkdv[2], num_stages=dkdv[3]))
    try:
        us, tf = measure(lengths, causal, cfg, True)
        print(json.dumps({"kind": "fwd_bwd", "cfg": [dq, dkdv], "layout": name, "causal": causal, "us": round(us, 1),
                          "tflops": round(tf, 1)}), flush=True)
    except Exception as e:
        print(json.dumps({"kind": "fwd_bwd", "cfg": [dq, dkdv], "error": str(e)[:200]}), flush=True)
print("bwd sweep s", time.time() - t0, flush=True)
for impl in ("varlen_attn", "default", "flat"):
    print(json.dumps({"kind": "eager", "impl": impl, **eager_host_us(impl, 200, 0)}), flush=True)
# dense SDPA per backend, uniform 16x1024
for causal in (False, True):
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            q, k, v, do = (torch.randn(16, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
            def f():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            def fb():
                return torch.autograd.grad(f(), (q, k, v), do)
            res = {}
            for nm, fn, mult in (("fwd", f, 1.0), ("fwd_bwd", fb, 3.5)):
                graph, _ = capture_graph(fn)
                us = median(cuda_event_us(graph.replay, 20))
                fl = attention_flops(torch.full((16,), 1024), 16, 128, causal) * mult
                res[nm] = round(fl / us / 1e6, 1)
            print(json.dumps({"kind": "dense", "backend": str(backend), "causal": causal, **res}), flush=True)
        except Exception as e:
            print(json.dumps({"kind": "dense", "backend": str(backend), "error": str(e)[:300]}), flush=True)
