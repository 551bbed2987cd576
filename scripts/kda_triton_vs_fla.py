"""Exploration (not a recording): ``kda_triton`` against flash-linear-attention's ``chunk_kda`` on
one GPU, same inputs: agreement of outputs, final states and gradients, and median times of the
forward and of forward + backward (``triton.testing.do_bench``).

    python scripts/kda_triton_vs_fla.py [--T 8192] [--H 16] [--D 128]

Needs CUDA and ``fla-core`` (``scripts/gpu_host_wheels.txt``). The package never imports fla.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from attn_gym_lite.ops.kda import kda_triton


def inputs(T: int, H: int, D: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, H, D, device="cuda", generator=gen)
    k = F.normalize(torch.randn(T, H, D, device="cuda", generator=gen), dim=-1)
    v = torch.randn(T, H, D, device="cuda", generator=gen)
    g = F.logsigmoid(torch.randn(T, H, D, device="cuda", generator=gen) + 3.0)  # decays near 1, as trained
    beta = torch.sigmoid(torch.randn(T, H, device="cuda", generator=gen))
    return [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v, g, beta)]


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    args = parser.parse_args()
    from fla.ops.kda import chunk_kda

    T, H, D = args.T, args.H, args.D
    lengths = {"one sequence": [T], "8 ragged": [3000, 1, 0, 1500, 777, 2000, 514, 400]}
    for name, lens in lengths.items():
        assert sum(lens) == T
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        x = inputs(T, H, D, seed=0)
        d_o = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)

        def ours(x=x, cu=cu):
            return kda_triton(*x, cu, output_final_state=True)

        def theirs(x=x, cu=cu):
            o, s = chunk_kda(*(t.unsqueeze(0) for t in x), cu_seqlens=cu.long(), output_final_state=True)
            return o.squeeze(0), s

        timings = {}
        for label, fn in (("kda_triton", ours), ("fla chunk_kda", theirs)):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            print(f"[{name}] {label}: first call (compiles, autotunes) {time.perf_counter() - start:.1f} s", flush=True)
            fwd = do_bench(lambda fn=fn: fn(), warmup=10, rep=50)
            both = do_bench(lambda fn=fn: torch.autograd.grad(fn()[0], x, d_o), warmup=10, rep=50)
            timings[label] = (fwd, both)
            print(f"[{name}] {label:14s} forward {fwd * 1e3:8.1f} us   forward+backward {both * 1e3:8.1f} us", flush=True)
        ratio = [a / b for a, b in zip(timings["kda_triton"], timings["fla chunk_kda"])]
        print(f"[{name}] kda_triton / fla: forward {ratio[0]:.2f}x, forward+backward {ratio[1]:.2f}x", flush=True)
        (o1, s1), (o2, s2) = ours(), theirs()
        g1 = torch.autograd.grad(o1, x, d_o)
        g2 = torch.autograd.grad(o2, x, d_o)
        print(f"[{name}] T={T} H={H} K=V={D} bf16: rel. difference ours vs fla: o {rel(o1, o2):.2e}, "
              f"final state {rel(s1, s2):.2e}, " + ", ".join(f"d{n} {rel(a, b):.2e}" for n, a, b in
                                                       zip(("q", "k", "v", "g", "beta"), g1, g2)), flush=True)

if __name__ == "__main__":
    main()
