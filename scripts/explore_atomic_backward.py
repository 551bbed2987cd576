"""Exploration (not a recording): how much of the attention backward is the price of determinism?
Run on the GPU host:

    python3 scripts/explore_atomic_backward.py [seconds]

The package's backward runs two passes (dQ over query chunks, then dK/dV over key chunks), so every
gradient element has one writer: deterministic, but ``Q K^T`` and ``dO V^T`` are computed twice, 7
matrix products per tile pair instead of 5. FlashAttention-2's backward runs one pass over key
chunks and adds each query block's share of dQ into a float32 buffer with atomics: 5 products, plus
the atomic traffic, and a result whose last bits depend on the order the adds land in.

The variant here is that one pass, in the package's style (base-2 exponentials from the forward's
log-sum-exp, full blocks without masks, the causal diagonal and the ragged tail masked), on
FlashAttention-2's rectangle grid ``(ceil(max_seqlen / BLOCK_N), N * H)``. It prints one JSON line per
variant and layout, then a table: µs and TFLOP/s of the backward alone (2.5x the forward's FLOPs, as
the schedulers suite counts them), against the package's backward at its default tiles (rect, and the
default schedule), and the largest difference of each gradient from the package's. Nothing here is
used by the package. In Triton's interpreter (``TRITON_INTERPRET=1``, CPU) ``--check`` compares the
variant with the package's backward on small float32 ragged batches and exits.
"""

import json
import math
import sys
import time

import torch
import triton
import triton.language as tl

from attn_gym_lite.ops.kernels import default_config
from attn_gym_lite.ops.kernels.mma import INTERPRETED, dot

BUDGET_S = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--check" else 120.0
START = time.monotonic()


@triton.jit
def _one_pass_query_blocks(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, cols, seq_len, lo, hi,
                           stride_t, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query blocks ``[lo, hi)``: their share of dV and dK into the registers, of dQ into memory."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        offsets = rows[:, None] * stride_t + offs_d[None, :]  # [BLOCK_M, HEAD_DIM] of one head
        if MASKED:
            row_ok = rows < seq_len
            q = tl.load(q_base + offsets, mask=row_ok[:, None], other=0.0)
            do = tl.load(do_base + offsets, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        else:
            q = tl.load(q_base + offsets)
            do = tl.load(do_base + offsets)
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        # Transposed, keys along rows: P^T and dS^T are [BLOCK_N, BLOCK_M].
        pT = tl.math.exp2(dot(k, tl.trans(q), None, None) * qk_scale - lse[None, :])
        if MASKED:
            visible = row_ok[None, :]
            if CAUSAL:
                visible = visible & (rows[None, :] >= cols[:, None])
            pT = tl.where(visible, pT, 0.0)
        dv = dot(pT.to(do.dtype), do, dv, None)
        dsT = pT * (dot(v, tl.trans(do), None, None) - delta[None, :])
        dk = dot(dsT.to(q.dtype), q, dk, None)
        # The fifth product: this key block's share of dQ for these rows, added in float32. Relaxed:
        # the adds only need to be atomic, not ordered.
        dq = dot(tl.trans(dsT.to(k.dtype)), k, None, None)
        if MASKED:
            tl.atomic_add(dq_base + offsets, dq, mask=row_ok[:, None], sem="relaxed")
        else:
            tl.atomic_add(dq_base + offsets, dq, sem="relaxed")
    return dk, dv


@triton.jit
def one_pass_backward_kernel(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, cu_seqlens, stride_t, num_heads, token_capacity,
                             qk_scale, sm_scale, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV (stored) and dQ (float32, accumulated) for key rows ``chunk * BLOCK_N ..`` of one
    sequence and head. Q, K, V, DO, DK, DV: ``[T, H, HEAD_DIM]`` sharing ``stride_t``; DQ float32 of
    the same shape; LSE, DELTA float32 ``[H, T]``."""
    chunk = tl.program_id(0)
    seq = tl.program_id(1) // num_heads
    head = tl.program_id(1) % num_heads
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    if chunk * BLOCK_N >= seq_len:
        return
    offs_d = tl.arange(0, HEAD_DIM)
    base = seq_start.to(tl.int64) * stride_t + head * HEAD_DIM
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < seq_len
    kv_offsets = cols[:, None] * stride_t + offs_d[None, :]
    k = tl.load(K + base + kv_offsets, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + base + kv_offsets, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lse_base = LSE + head * token_capacity + seq_start
    delta_base = DELTA + head * token_capacity + seq_start
    full_end = seq_len // BLOCK_M * BLOCK_M
    if CAUSAL:
        # Queries before the block's first key see none of it; the next BLOCK_N form the diagonal.
        full_start = chunk * BLOCK_N + BLOCK_N
        dk, dv = _one_pass_query_blocks(dk, dv, k, v, Q + base, DO + base, DQ + base, lse_base, delta_base, cols,
                                        seq_len, chunk * BLOCK_N, tl.minimum(seq_len, full_start), stride_t, qk_scale,
                                        True, CAUSAL, HEAD_DIM, BLOCK_M)
        full_end = tl.maximum(full_start, full_end)
    else:
        full_start = 0
    dk, dv = _one_pass_query_blocks(dk, dv, k, v, Q + base, DO + base, DQ + base, lse_base, delta_base, cols,
                                    seq_len, full_start, full_end, stride_t, qk_scale, False, CAUSAL, HEAD_DIM, BLOCK_M)
    dk, dv = _one_pass_query_blocks(dk, dv, k, v, Q + base, DO + base, DQ + base, lse_base, delta_base, cols,
                                    seq_len, full_end, seq_len, stride_t, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_M)
    tl.store(DK + base + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + base + kv_offsets, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def one_pass_backward(do, q, k, v, out, lse, cu, max_seqlen, causal, block_m, block_n, warps, stages):
    """The one-pass backward with its two small torch steps: delta = rowsum(dO * O) before, the float32
    dQ scaled and cast after (both counted in the timings)."""
    T, H, D = q.shape
    delta = (do.float() * out.float()).sum(-1).t().contiguous()
    dq = torch.zeros(T, H, D, device=q.device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(D)
    grid = (triton.cdiv(max_seqlen, block_n), (cu.numel() - 1) * H)
    one_pass_backward_kernel[grid](q, k, v, do, dq, dk, dv, lse, delta, cu, q.stride(0), H, T,
                                   sm_scale * 1.4426950408889634, sm_scale, CAUSAL=causal, HEAD_DIM=D,
                                   BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    return (dq * sm_scale).to(q.dtype), dk, dv


def package_forward(q, k, v, cu, causal):
    return torch.ops.attn_gym_lite.varlen_attention_forward(q, k, v, cu, causal, "auto", None, False,
                                                            default_config().flat())


def package_backward(do, q, k, v, out, lse, cu, causal, schedule="auto", max_seqlen=None):
    return torch.ops.attn_gym_lite.varlen_attention_backward(do, q, k, v, out, lse, cu, causal, schedule, max_seqlen,
                                                             False, default_config().flat())


def check():
    """Interpreter: the variant's gradients against the package's on ragged float32 batches."""
    from attn_gym_lite.ragged import cu_seqlens_from_lengths

    for lengths, causal in [([5, 33, 16, 1], False), ([5, 33, 16, 1], True), ([40, 0, 17], True)]:
        g = torch.Generator().manual_seed(len(lengths))
        T, H, D = sum(lengths), 2, 16
        q, k, v, do = (torch.randn(T, H, D, generator=g) for _ in range(4))
        cu = cu_seqlens_from_lengths(lengths)
        out, lse = package_forward(q, k, v, cu, causal)
        expected = package_backward(do, q, k, v, out, lse, cu, causal)
        got = one_pass_backward(do, q, k, v, out, lse, cu, max(lengths), causal, 16, 16, 4, 1)
        for name, a, b in zip(("dq", "dk", "dv"), got, expected):
            err = float((a - b).abs().max())
            assert err < 1e-4, (lengths, causal, name, err)
    print("one-pass backward matches the package's in the interpreter")


def main():
    from explore_hopper_forward import event_us  # back-to-back calls between two events (scripts/ is on sys.path)

    from attn_gym_lite.bench.schedulers import attention_flops, throughput_layouts
    from attn_gym_lite.ragged import cu_seqlens_from_lengths

    H, D = 16, 128
    rows = []
    variants = [("pkg_default", None), ("pkg_rect", None), ("one_pass", (64, 128, 8, 2)), ("one_pass", (64, 128, 8, 3)),
                ("one_pass", (32, 128, 8, 2)), ("one_pass", (64, 64, 4, 2)), ("one_pass", (128, 128, 8, 2))]
    for (name, lengths), causal in [(x, c) for x in throughput_layouts(0).items() for c in (False, True)]:
        cu = cu_seqlens_from_lengths(lengths, device="cuda")
        L, S = int(lengths.sum()), int(lengths.max())
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        out, lse = package_forward(q, k, v, cu, causal)
        reference = package_backward(do, q, k, v, out, lse, cu, causal)
        flops = 2.5 * attention_flops(lengths, H, D, causal)
        for kind, tile in variants:
            if time.monotonic() - START > BUDGET_S:
                print(json.dumps({"stopped": "budget", "s": BUDGET_S}), flush=True)
                return rows
            row = {"layout": name, "causal": causal, "variant": kind, "tile": list(tile or [])}
            try:
                if kind == "pkg_default":
                    def fn():
                        return package_backward(do, q, k, v, out, lse, cu, causal)
                elif kind == "pkg_rect":
                    def fn():
                        return package_backward(do, q, k, v, out, lse, cu, causal, "rect", S)
                else:
                    def fn():
                        return one_pass_backward(do, q, k, v, out, lse, cu, S, causal, *tile)
                got = fn()
                row["max_abs_diff"] = [round(float((a.float() - b.float()).abs().max()), 5) for a, b in zip(got, reference)]
                us = event_us(fn)
                row.update(us=round(us, 1), tflops=round(flops / us / 1e6, 1))
            except Exception as exc:  # an exploration: record why a variant did not run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    if "--check" in sys.argv or INTERPRETED:
        check()
        sys.exit(0)
    rows = main()
    print("\nlayout              causal variant      tile               bwd us  TFLOP/s  max |diff| dq, dk, dv")
    for r in rows:
        print(f"{r['layout']:<19} {r['causal']!s:<6} {r['variant']:<12} {str(r.get('tile', '')):<18} "
              f"{r.get('us', '-')!s:>7} {r.get('tflops', '-')!s:>8}  {r.get('max_abs_diff', r.get('error', ''))!s:.70}")
    print(f"total {time.monotonic() - START:.0f} s")
