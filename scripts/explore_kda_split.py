"""Exploration (not a recording): launch options of KDA's sub-block kernels. Run on the GPU host:

    python3 scripts/explore_kda_split.py [--budget SECONDS]

``scripts/explore_kda.py`` found ``kda_intra_kernel``, the UT-transform kernel and
``kda_pairwise_backward_kernel`` at 5-7x the time of flash-linear-attention's matching kernels,
each with one CTA of 8 warps per (chunk, head) walking a chunk's four 16-row sub-blocks in turn.
An earlier version of this script timed them cut into more, smaller CTAs (one per sub-block; the
solve apart from the products) on the H200, T = 8192 in 32 sequences, H = 16, K = V = 128, bf16:

    forward                 1,783 -> 1,044 us   (intra 897 -> 432, UT transform 534 -> 78 + 185)
    forward + backward      4,530 -> 3,370 us   (pairwise backward 1,190 -> 756 + 42)

fla's ``chunk_kda(use_graph=True)``: 651 and 2,902 us. The package now launches those cuts; cutting
the per-chunk backward's key blocks into CTAs of their own gained nothing (1,001 -> 614 + 366 us).
This version times the package's forward + backward with other warp and stage counts for the
sub-block kernels (the package's launch options are module constants, set here for the run), and
prints each variant's median replay and kernel breakdown. Its run on the H200 (kernel µs, the
options the package then took first):

    kda_intra_kernel              2 warps, 1 stage 382;  2 warps, 2 stages 432;  4 warps 510;  1 warp 622
    kda_pairwise_backward_kernel  4 warps, 1 stage 743;  2 stages 757;  3 stages 768;  2 warps 1,080
    kda_chunk_backward_kernel     4 warps 734;  8 warps, 3 stages 924;  8 warps, 2 stages 1,002

With them the package's forward took 960 µs and forward + backward 3,020 µs (fla: 651 and 2,902).
Nothing here is a recorded result.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch
from explore_kda import capture, kernel_breakdown, ours, time_replays

from attn_gym_lite.bench.linear_attention import kda_inputs
from attn_gym_lite.ops.kda import chunked_triton as kt
from attn_gym_lite.ops.kda import kda_triton
from attn_gym_lite.ragged import cu_seqlens_from_lengths, zipf_lengths

T, M, H, K, V = 8192, 32, 16, 128, 128
NAMES = ("q", "k", "v", "g", "beta")
OPTIONS = ("_INTRA", "_PAIRWISE", "_SOLVE", "_WY", "_CHUNK_BACKWARD")
PACKAGE = {name: dict(getattr(kt, name)) for name in OPTIONS}
VARIANTS = {
    "package": {},
    "intra_w1": {"_INTRA": dict(num_warps=1, num_stages=2)},
    "intra_w2_s1": {"_INTRA": dict(num_warps=2, num_stages=1)},
    "intra_w2_s3": {"_INTRA": dict(num_warps=2, num_stages=3)},
    "intra_w4": {"_INTRA": dict(num_warps=4, num_stages=2)},
    "pairwise_w4_s1": {"_PAIRWISE": dict(num_warps=4, num_stages=1)},
    "pairwise_w4_s3": {"_PAIRWISE": dict(num_warps=4, num_stages=3)},
    "pairwise_w2": {"_PAIRWISE": dict(num_warps=2, num_stages=2)},
    "wy_w4": {"_WY": dict(num_warps=4, num_stages=2)},
    "wy_w8_s1": {"_WY": dict(num_warps=8, num_stages=1)},
    "chunk_backward_w4": {"_CHUNK_BACKWARD": dict(num_warps=4, num_stages=2)},
    "chunk_backward_w8_s1": {"_CHUNK_BACKWARD": dict(num_warps=8, num_stages=1)},
    "chunk_backward_w8_s3": {"_CHUNK_BACKWARD": dict(num_warps=8, num_stages=3)},
    "package_again": {},
}


def use(variant: str) -> None:
    for name in OPTIONS:
        setattr(kt, name, VARIANTS[variant].get(name, PACKAGE[name]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=150.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    lengths = zipf_lengths(T, M, generator=torch.Generator().manual_seed(0))
    cu_seqlens = cu_seqlens_from_lengths(lengths, device="cuda")
    inputs = kda_inputs(T, H, K, V, dtype=torch.bfloat16, device="cuda", seed=0)
    reference = None
    for variant in VARIANTS:
        if time.monotonic() > deadline:
            print(json.dumps({"variant": variant, "skipped": "time budget spent"}), flush=True)
            continue
        use(variant)
        try:
            leaves = [inputs[n].detach().clone().requires_grad_() for n in NAMES]
            o = kda_triton(*leaves, cu_seqlens)[0]
            values = [o, *torch.autograd.grad(o, leaves, inputs["grad_o"])]
            reference = reference or [x.float() for x in values]
            diff = max((x.float() - r).abs().max().item() for x, r in zip(values, reference))
            graph, _ = capture(ours, leaves, cu_seqlens, inputs["grad_o"], True)
            median_us, _ = time_replays(graph)
            kernels = kernel_breakdown(graph.replay)
            print(json.dumps({"variant": variant, "max_abs_diff_vs_package": diff, "median_us": round(median_us, 1),
                              "kernels_us": [[n[:48], round(us, 1)] for n, us in kernels[:14]]}), flush=True)
            del graph
        except Exception as error:  # record and go on
            print(json.dumps({"variant": variant, "error": f"{type(error).__name__}: {error}"[:800],
                              "trace": traceback.format_exc()[-800:]}), flush=True)
    use("package")


if __name__ == "__main__":
    main()
