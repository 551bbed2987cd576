"""Exploration (not a recording): the ragged attention backward with TMA descriptors and Triton's
warp specialization on the H200, against the package's backward (about three quarters of
forward + backward). Run on the GPU host:

    python3 scripts/explore_hopper_backward.py [seconds]
    python3 scripts/explore_hopper_backward.py --compile   # on any machine: what Triton builds for sm_90
    TRITON_INTERPRET=1 python3 scripts/explore_hopper_backward.py --check   # values, on a CPU

``--check`` needs the interpreter of Triton 3.8 or newer (3.6's raises a TypeError in these kernels,
seen here); the GPU host's 3.6 compiles them for sm_90 (``--compile`` shows it).

The algorithm is the package's (``attn_gym_lite/ops/kernels/backward.py``): a dQ pass over query
chunks and a dK/dV pass over key chunks, no atomics. What changes is what
``scripts/explore_hopper_forward.py`` found Triton needs to warp-specialize a loop on sm_90: tiles
through per-sequence tensor descriptors, 4 warps, one loop per kernel that masks every block, no
early return and no ``while`` before the loop. Two more things, found by compiling for sm_90 with
Triton 3.6 (``--compile``): the dQ kernel specializes only with 64 x 64 tiles and with
``delta = rowsum(dO * O)`` computed beforehand (``delta_kernel``; the package's dQ pass computes it in
its prologue), and the dK/dV kernel at 64 x 128 (the package's tiles) but not 128 x 128. ``ws_rect``,
``ws_flat`` and ``ws_persistent`` run them in one task kernel on the package's rect, flat and
persistent grids (tasks as a ``for`` loop, as in the forward exploration), against the package's
``pkg_rect``, ``pkg_flat`` and ``pkg_auto``.
"""

import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl
from explore_hopper_forward import _find_sequence_unrolled, event_us  # scripts/ is on sys.path

from attn_gym_lite.bench.schedulers import attention_flops, throughput_layouts
from attn_gym_lite.ops.kernels import default_config
from attn_gym_lite.ops.kernels.offsets import launch_chunk_offsets
from attn_gym_lite.ops.kernels.tasks import sequence_bounds
from attn_gym_lite.ragged import cu_seqlens_from_lengths
from attn_gym_lite.schedule import launch_grid, num_sms

BUDGET_S = float(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else 120.0
START = time.monotonic()


@triton.jit
def delta_kernel(O, DO, DELTA, stride_t, token_capacity, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    # DELTA[h, t] = rowsum(dO * O) for BLOCK rows of one head, every row of the capacity: no layout
    # to read, and rows past the batch are never read back (the passes load only active rows).
    rows, head = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), tl.program_id(1)
    ok = rows < token_capacity
    at = rows[:, None].to(tl.int64) * stride_t + head * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(O + at, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + head * token_capacity + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _descriptor(ptr, offset, seq_len, stride_t, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One sequence's rows of one head, [seq_len, HEAD_DIM]: loads past the end read zeros, stores
    # past it are dropped, so no tile load or store needs a mask.
    return tl.make_tensor_descriptor(ptr + offset, [seq_len, HEAD_DIM], [stride_t, 1], [ROWS, HEAD_DIM])


@triton.jit
def _ws_dq_chunk(Q, K, V, DO, DQ, LSE, DELTA, seq_start, seq_len, chunk, head, stride_t, token_capacity, qk_scale,
                 sm_scale, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offset = seq_start.to(tl.int64) * stride_t + head * HEAD_DIM
    k_desc = _descriptor(K, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM)
    v_desc = _descriptor(V, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM)
    rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    q = _descriptor(Q, offset, seq_len, stride_t, BLOCK_M, HEAD_DIM).load([chunk * BLOCK_M, 0])
    do = _descriptor(DO, offset, seq_len, stride_t, BLOCK_M, HEAD_DIM).load([chunk * BLOCK_M, 0])
    stats = head * token_capacity + seq_start + rows
    lse = tl.load(LSE + stats, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + stats, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(seq_len, chunk * BLOCK_M + BLOCK_M) if CAUSAL else seq_len
    hi = tl.where(chunk * BLOCK_M < seq_len, hi, 0)  # a chunk past the sequence: no iteration, no return
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse[:, None])
        visible = (cols < seq_len)[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, p, 0.0)
        ds = p * (tl.dot(do, v.T) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    _descriptor(DQ, offset, seq_len, stride_t, BLOCK_M, HEAD_DIM).store([chunk * BLOCK_M, 0],
                                                                        (dq * sm_scale).to(DQ.dtype.element_ty))


@triton.jit
def _ws_dkdv_chunk(Q, K, V, DO, DK, DV, LSE, DELTA, seq_start, seq_len, chunk, head, stride_t, token_capacity,
                   qk_scale, sm_scale, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    offset = seq_start.to(tl.int64) * stride_t + head * HEAD_DIM
    q_desc = _descriptor(Q, offset, seq_len, stride_t, BLOCK_M, HEAD_DIM)
    do_desc = _descriptor(DO, offset, seq_len, stride_t, BLOCK_M, HEAD_DIM)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    k = _descriptor(K, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM).load([chunk * BLOCK_N, 0])
    v = _descriptor(V, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM).load([chunk * BLOCK_N, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = chunk * BLOCK_N if CAUSAL else 0  # causal: queries before the chunk's first key see none of it
    hi = tl.where(chunk * BLOCK_N < seq_len, seq_len, 0)
    stats = head * token_capacity + seq_start
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=True):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < seq_len
        q = q_desc.load([start_m, 0])
        do = do_desc.load([start_m, 0])
        lse = tl.load(LSE + stats + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + stats + rows, mask=row_ok, other=0.0)
        pT = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse[None, :])  # [BLOCK_N, BLOCK_M]
        visible = row_ok[None, :]
        if CAUSAL:
            visible = visible & (rows[None, :] >= cols[:, None])
        pT = tl.where(visible, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dsT = pT * (tl.dot(v, do.T) - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    _descriptor(DK, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM).store([chunk * BLOCK_N, 0],
                                                                        (dk * sm_scale).to(DK.dtype.element_ty))
    _descriptor(DV, offset, seq_len, stride_t, BLOCK_N, HEAD_DIM).store([chunk * BLOCK_N, 0], dv.to(DV.dtype.element_ty))


@triton.jit
def ws_backward_task_kernel(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, cu_seqlens, chunk_offsets, stride_t, num_seqs,
                            num_heads, token_capacity, qk_scale, sm_scale, PASS: tl.constexpr, CAUSAL: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            SCHEDULE: tl.constexpr, LOG2_SEQS: tl.constexpr):
    # Both passes under the package's rect, flat or persistent schedule, tasks as a for loop (see
    # explore_hopper_forward.tma_ws_task_kernel): dQ over chunks of BLOCK_M queries, dK/dV over
    # chunks of BLOCK_N keys (chunk_offsets built with that chunk size).
    active = tl.load(chunk_offsets + num_seqs)
    if SCHEDULE == "rect":  # a slot past its sequence runs the chunk's loop zero times
        first, end, step = 0, 1, 1
    elif SCHEDULE == "flat":
        first, end, step = tl.where(tl.program_id(0) < active, 0, 1), 1, 1
    else:
        first, end, step = tl.program_id(0), active * num_heads, tl.num_programs(0)
    for task in range(first, end, step):
        if SCHEDULE == "rect":
            seq, head = tl.program_id(1), tl.program_id(2)
            seq_start, seq_len = sequence_bounds(cu_seqlens, seq, token_capacity)
            chunk = tl.program_id(0)
        else:
            flat = tl.program_id(0) if SCHEDULE == "flat" else task % active
            head = tl.program_id(1) if SCHEDULE == "flat" else task // active
            seq = _find_sequence_unrolled(chunk_offsets, flat, num_seqs, LOG2_SEQS)
            seq_start, seq_len = sequence_bounds(cu_seqlens, seq, token_capacity)
            chunk = flat - tl.load(chunk_offsets + seq)
        if PASS == "dq":
            _ws_dq_chunk(Q, K, V, DO, DQ, LSE, DELTA, seq_start, seq_len, chunk, head, stride_t, token_capacity,
                         qk_scale, sm_scale, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N)
        else:
            _ws_dkdv_chunk(Q, K, V, DO, DK, DV, LSE, DELTA, seq_start, seq_len, chunk, head, stride_t,
                           token_capacity, qk_scale, sm_scale, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N)


TILES = {"dq": (64, 64, 4, 2), "dkdv": (64, 128, 4, 2)}  # BLOCK_M, BLOCK_N, warps, stages


def ws_backward(do, q, k, v, out, lse, cu, causal, schedule, max_seqlen=None, tiles=TILES):
    """dQ, dK, dV of the package's forward (``out``, base-2 ``lse`` [H, T]): ``delta_kernel``, then
    both passes of ``ws_backward_task_kernel`` on the package's grid for ``schedule`` (rect reads
    ``max_seqlen``)."""
    T, H, D = q.shape
    N = cu.numel() - 1
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    delta = torch.empty(H, T, device=q.device, dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(D)
    delta_kernel[(triton.cdiv(T, 64), H)](out, do, delta, q.stride(0), T, HEAD_DIM=D, BLOCK=64)
    sms = num_sms(q.device) if q.is_cuda else 4
    for name in ("dq", "dkdv"):
        bm, bn, w, st = tiles[name]
        chunk = bm if name == "dq" else bn
        grid = launch_grid(schedule, T=T, N=N, C=chunk, heads=H, max_seqlen=max_seqlen, num_sms=sms, ctas_per_sm=1)
        ws_backward_task_kernel[grid](q, k, v, do, dq, dk, dv, lse, delta, cu,
                                      launch_chunk_offsets(cu, chunk, token_capacity=T), q.stride(0), N, H, T,
                                      sm_scale * math.log2(math.e), sm_scale, PASS=name, CAUSAL=causal, HEAD_DIM=D,
                                      BLOCK_M=bm, BLOCK_N=bn, SCHEDULE=schedule, LOG2_SEQS=max(N, 1).bit_length(),
                                      num_warps=w, num_stages=st)
    return dq, dk, dv


def package_forward(q, k, v, cu, causal, schedule="auto", max_seqlen=None, config=None):
    """The package's forward op: ``(out, lse)``."""
    config = (config or default_config()).flat()
    return torch.ops.attn_gym_lite.varlen_attention_forward(q, k, v, cu, causal, schedule, max_seqlen, False, config)


def package_backward(do, q, k, v, out, lse, cu, causal, schedule, max_seqlen=None):
    return torch.ops.attn_gym_lite.varlen_attention_backward(do, q, k, v, out, lse, cu, causal, schedule, max_seqlen,
                                                             False, default_config().flat())


def check_in_interpreter():
    """dQ, dK, dV against float64 autograd through a softmax per sequence, float32 on the CPU
    (Triton's interpreter), ragged layouts with capacity past the last sequence, causal and not."""
    H, D = 2, 16
    tiles = {"dq": (16, 16, 4, 2), "dkdv": (16, 32, 4, 2)}
    torch.manual_seed(0)
    worst = 0.0
    for lengths in ([5, 40, 17, 1], [33], [16, 16, 3]):
        cu = cu_seqlens_from_lengths(torch.tensor(lengths))
        q, k, v, do = (torch.randn(sum(lengths) + 7, H, D) for _ in range(4))
        for causal in (False, True):
            out, lse = package_forward(q, k, v, cu, causal)
            runs = [ws_backward(do, q, k, v, out, lse, cu, causal, s, max(lengths), tiles)
                    for s in ("rect", "flat", "persistent")]
            for (a, b), grads in itertools.product(zip(cu[:-1].tolist(), cu[1:].tolist()), runs):
                leaves = [x[a:b].double().transpose(0, 1).requires_grad_() for x in (q, k, v)]
                scores = leaves[0] @ leaves[1].transpose(1, 2) / D ** 0.5
                if causal:
                    scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
                (scores.softmax(-1) @ leaves[2]).backward(do[a:b].double().transpose(0, 1))
                worst = max([worst] + [float((g[a:b].double() - x.grad.transpose(0, 1)).abs().max())
                                       for g, x in zip(grads, leaves)])
    print(json.dumps({"kernels": ["delta", "ws_backward_task (rect, flat, persistent)"], "max_abs_diff": worst}))
    assert worst < 1e-4, worst


def compiled_for_sm90():
    """Each kernel built for sm_90 without a GPU: specialized or not, warps, registers, spills,
    shared memory, or the compiler's failure (the tiles the docstring names among them)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    pointers = {"LSE": "*fp32", "DELTA": "*fp32", "cu_seqlens": "*i32", "chunk_offsets": "*i32", "qk_scale": "fp32",
                "sm_scale": "fp32"}
    for fn, bm, bn, extra in [(ws_backward_task_kernel, bm, bn, {"PASS": p, "SCHEDULE": s, "LOG2_SEQS": 9})
                              for p, bm, bn, schedules in (("dq", 64, 64, ("rect", "flat", "persistent")),
                                                           ("dq", 128, 64, ("rect",)), ("dkdv", 64, 128, ("rect", "flat", "persistent")),
                                                           ("dkdv", 128, 128, ("rect",)))
                              for s in schedules]:
        for causal in (False, True):
            consts = {"CAUSAL": causal, "HEAD_DIM": 128, "BLOCK_M": bm, "BLOCK_N": bn, **extra}
            signature = {a: "constexpr" if a in consts else pointers.get(a, "*bf16" if a.isupper() else "i32")
                         for a in fn.arg_names}
            source = ASTSource(fn=fn, signature=signature,
                               constexprs={(fn.arg_names.index(a),): value for a, value in consts.items()})
            row = {"kernel": fn.__name__, **extra, "causal": causal, "tile": [bm, bn, 4, 2], "triton": triton.__version__}
            try:
                c = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
                with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                    cubin.write(c.asm["cubin"])
                    cubin.flush()
                    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin.name],
                                           capture_output=True, text=True, check=True).stdout
                regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
                row.update(specialized="ttg.warp_specialize" in c.asm["ttgir"], warps=c.metadata.num_warps,
                           registers=int(regs), stack_bytes=int(stack), shared_bytes=c.metadata.shared)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(json.dumps(row), flush=True)


def main():
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    H, D = 16, 128
    rows = []
    for (name, lengths), causal in [(x, c) for x in throughput_layouts(0).items() for c in (False, True)]:
        cu = cu_seqlens_from_lengths(lengths, device="cuda")
        S = int(lengths.max())
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(int(lengths.sum()), H, D, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(4))
        out, lse = package_forward(q, k, v, cu, causal)
        reference = package_backward(do, q, k, v, out, lse, cu, causal, "flat")
        flops = 2.5 * attention_flops(lengths, H, D, causal)
        variants = {"pkg_rect": lambda: package_backward(do, q, k, v, out, lse, cu, causal, "rect", S),
                    "pkg_flat": lambda: package_backward(do, q, k, v, out, lse, cu, causal, "flat"),
                    "pkg_auto": lambda: package_backward(do, q, k, v, out, lse, cu, causal, "auto"),
                    "ws_rect": lambda: ws_backward(do, q, k, v, out, lse, cu, causal, "rect", S),
                    "ws_flat": lambda: ws_backward(do, q, k, v, out, lse, cu, causal, "flat"),
                    "ws_persistent": lambda: ws_backward(do, q, k, v, out, lse, cu, causal, "persistent")}
        for variant, fn in variants.items():
            if time.monotonic() - START > BUDGET_S:
                print(json.dumps({"stopped": "budget", "s": BUDGET_S}), flush=True)
                return rows
            row = {"layout": name, "causal": causal, "variant": variant}
            try:
                grads = fn()
                row["max_abs_diff"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(grads, reference))
                us = event_us(fn)
                row.update(us=round(us, 1), tflops=round(flops / us / 1e6, 1))
            except Exception as exc:  # an exploration: record why a variant did not run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["--compile"]:
    compiled_for_sm90()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check"]:
    check_in_interpreter()
elif __name__ == "__main__":
    rows = main()
    print("\nlayout              causal variant    backward us  TFLOP/s  maxdiff")
    for r in rows:
        print(f"{r['layout']:<19} {r['causal']!s:<6} {r['variant']:<10} {r.get('us', '-')!s:>11} "
              f"{r.get('tflops', '-')!s:>8}  {r.get('max_abs_diff', r.get('error', ''))!s:.60}")
    print(f"total {time.monotonic() - START:.0f} s")
