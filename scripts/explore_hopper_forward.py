"""Exploration (not a recording): can Hopper's tensor-memory accelerator (TMA) and Triton's warp
specialization speed up the ragged attention forward on the H200? Run on the GPU host:

    python3 scripts/explore_hopper_forward.py [seconds]
    python3 scripts/explore_hopper_forward.py --compile   # on any machine: what Triton builds for sm_90
    TRITON_INTERPRET=1 python3 scripts/explore_hopper_forward.py --check   # the TMA kernels' values, on a CPU

``--check`` needs the interpreter of Triton 3.8 or newer (3.6's raises a TypeError in these kernels,
seen here); the GPU host's 3.6 compiles them for sm_90 (``--compile`` shows it).

It prints one JSON line per variant and layout, and a table last. Nothing here is used by the
package; a variant that wins is a lead for the kernels in ``attn_gym_lite/ops/kernels``.

The variant kernel keeps the package's forward algorithm (online softmax in base 2, full key blocks
without masks, then the masked ones: the sequence's ragged last block and, under causal masking, the
diagonal) and changes only how tiles reach shared memory. Each program builds *device-side tensor
descriptors* for its sequence and head: a 2-D view ``[seq_len, D]`` starting at the sequence's first
row, row stride ``H * D``. The copy engine then zero-fills rows past the sequence's end by itself,
so no load needs a mask; only the scores of those rows still need ``-inf``. The output goes back
through a descriptor too, which clips rows past the end. Grid: FlashAttention-2's rectangle
``(ceil(max_seqlen / BLOCK_M), N * H)`` (chapter 4's ``rect``), so the comparison with the package's
``rect`` schedule isolates the load path. Device descriptors need a little global scratch per
program, which Triton asks ``triton.set_allocator`` for at launch.

The ``ws4_*`` variants are the ones Triton actually warp-specializes on sm_90. Compiled for the
target on a CPU (Triton 3.6, as on the GPU host, and 3.9), ``warp_specialize=True`` is ignored at 8
warps (no ``ttg.warp_specialize`` in the IR) and at 4 warps the pass fails on ``tma_forward_kernel``:
its early ``return`` for chunks past the sequence breaks it, and a loop body with an ``if`` (masks
only where a block can hold a hidden key) is left unspecialized; a ``while`` loop anywhere before the
key loop stops it too. So ``_ws_forward_chunk`` has one loop over key blocks, masks every block, and
for a chunk past its sequence runs that loop zero times instead of returning (its stores are clipped
or masked), and ``tma_ws_task_kernel`` runs it under the package's rect, flat and persistent
schedules (against ``pkg_rect``, ``pkg_flat`` and ``pkg_persistent``) with the tasks as a ``for``
loop and the binary search over ``chunk_offsets`` at a fixed trip count. The dynamic schedule needs
a ``while`` loop (its next task comes from an atomic counter), so it is left out. At 4 warps each
compiles to 12: a TMA producer and consumer warpgroups, with ``setmaxnreg`` moving registers to the
consumers (168 registers per thread, no spills, at [128, 64], 2 stages).
"""

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

from attn_gym_lite.bench.schedulers import attention_flops, throughput_layouts
from attn_gym_lite.ops.kernels import AttentionConfig, KernelConfig, default_config, varlen_attention_triton
from attn_gym_lite.ops.kernels.offsets import launch_chunk_offsets
from attn_gym_lite.ops.kernels.tasks import sequence_bounds
from attn_gym_lite.ragged import cu_seqlens_from_lengths
from attn_gym_lite.schedule import launch_grid, num_sms

BUDGET_S = float(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else 120.0
START = time.monotonic()


@triton.jit
def _tma_key_blocks(acc, l_i, m_i, q, k_desc, v_desc, rows, seq_len, lo, hi, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([start_n, 0])
        scores = tl.dot(q, k.T) * qk_scale
        if MASKED:
            cols = start_n + tl.arange(0, BLOCK_N)
            visible = (cols < seq_len)[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.math.exp2(scores - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def tma_forward_kernel(Q, K, V, O, LSE, cu_seqlens, stride_t, num_heads, token_capacity, qk_scale,
                       CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, WS: tl.constexpr):
    chunk = tl.program_id(0)
    seq = tl.program_id(1) // num_heads
    head = tl.program_id(1) % num_heads
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    if chunk * BLOCK_M >= seq_len:
        return
    # One descriptor per tensor: this sequence's rows of this head, [seq_len, HEAD_DIM].
    offset = seq_start.to(tl.int64) * stride_t + head * HEAD_DIM
    q_desc = tl.make_tensor_descriptor(Q + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_M, HEAD_DIM])
    rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    q = q_desc.load([chunk * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full_end = chunk * BLOCK_M
        masked_end = tl.minimum(seq_len, full_end + BLOCK_M)
    else:
        full_end = seq_len // BLOCK_N * BLOCK_N
        masked_end = seq_len
    acc, l_i, m_i = _tma_key_blocks(acc, l_i, m_i, q, k_desc, v_desc, rows, seq_len, 0, full_end, qk_scale,
                                    False, CAUSAL, BLOCK_N, WS)
    acc, l_i, m_i = _tma_key_blocks(acc, l_i, m_i, q, k_desc, v_desc, rows, seq_len, full_end, masked_end,
                                    qk_scale, True, CAUSAL, BLOCK_N, False)
    out = acc / l_i[:, None]
    o_desc.store([chunk * BLOCK_M, 0], out.to(O.dtype.element_ty))
    tl.store(LSE + head * token_capacity + seq_start + rows, m_i + tl.math.log2(l_i), mask=rows < seq_len)


@triton.jit
def _ws_forward_chunk(Q, K, V, O, LSE, seq_start, seq_len, chunk, head, stride_t, token_capacity, qk_scale,
                      CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One query chunk, written so that Triton warp-specializes its key loop on sm_90: one loop that
    # masks every block; a chunk past its sequence runs it zero times (a return stops the pass).
    offset = seq_start.to(tl.int64) * stride_t + head * HEAD_DIM
    q_desc = tl.make_tensor_descriptor(Q + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O + offset, [seq_len, HEAD_DIM], [stride_t, 1], [BLOCK_M, HEAD_DIM])
    rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    q = q_desc.load([chunk * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(seq_len, chunk * BLOCK_M + BLOCK_M) if CAUSAL else seq_len
    hi = tl.where(chunk * BLOCK_M < seq_len, hi, 0)
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        k = k_desc.load([start_n, 0])
        scores = tl.dot(q, k.T) * qk_scale
        cols = start_n + tl.arange(0, BLOCK_N)
        visible = (cols < seq_len)[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.math.exp2(scores - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o_desc.store([chunk * BLOCK_M, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
    tl.store(LSE + head * token_capacity + seq_start + rows, m_i + tl.math.log2(l_i), mask=rows < seq_len)


@triton.jit
def _find_sequence_unrolled(chunk_offsets, flat_chunk, num_seqs, LOG2_SEQS: tl.constexpr):
    # The package's binary search (tasks.find_sequence) with a fixed trip count: a while loop in
    # the task prologue stops the warp specialization of the key loop after it.
    lo = 0
    hi = num_seqs
    for _ in tl.static_range(LOG2_SEQS):
        halving = hi - lo > 1
        mid = (lo + hi) // 2
        owns = tl.load(chunk_offsets + mid) <= flat_chunk
        lo = tl.where(halving & owns, mid, lo)
        hi = tl.where(halving & ~owns, mid, hi)
    return lo


@triton.jit
def tma_ws_task_kernel(Q, K, V, O, LSE, cu_seqlens, chunk_offsets, stride_t, num_seqs, num_heads, token_capacity,
                       qk_scale, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, SCHEDULE: tl.constexpr, LOG2_SEQS: tl.constexpr):
    # _ws_forward_chunk under the package's rect, flat and persistent schedules
    # (attn_gym_lite.ops.kernels.tasks), written so that Triton still warp-specializes the key loop:
    # the tasks as a for loop (a while loop stops it; so dynamic, which needs one, is left out).
    active = tl.load(chunk_offsets + num_seqs)  # active chunks per head
    if SCHEDULE == "rect":
        seq_start, seq_len = sequence_bounds(cu_seqlens, tl.program_id(1), token_capacity)
        first = tl.where(tl.program_id(0) * BLOCK_M < seq_len, 0, 1)
        end, step = 1, 1
    elif SCHEDULE == "flat":
        first = tl.where(tl.program_id(0) < active, 0, 1)
        end, step = 1, 1
    else:
        first, end, step = tl.program_id(0), active * num_heads, tl.num_programs(0)
    for task in range(first, end, step):
        if SCHEDULE == "rect":
            chunk, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        else:
            flat = tl.program_id(0) if SCHEDULE == "flat" else task % active
            head = tl.program_id(1) if SCHEDULE == "flat" else task // active
            seq = _find_sequence_unrolled(chunk_offsets, flat, num_seqs, LOG2_SEQS)
            chunk = flat - tl.load(chunk_offsets + seq)
        seq_start, seq_len = sequence_bounds(cu_seqlens, seq, token_capacity)
        _ws_forward_chunk(Q, K, V, O, LSE, seq_start, seq_len, chunk, head, stride_t, token_capacity, qk_scale,
                          CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N)


def tma_ws_scheduled(q, k, v, cu, max_seqlen, causal, block_m, block_n, warps, stages, schedule):
    """``tma_ws_task_kernel`` on the package's grid and ``chunk_offsets`` for ``schedule``."""
    T, H, D = q.shape
    N = cu.numel() - 1
    out = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    offsets = launch_chunk_offsets(cu, block_m, token_capacity=T)
    sms = num_sms(q.device) if q.is_cuda else 4
    grid = launch_grid(schedule, T=T, N=N, C=block_m, heads=H, max_seqlen=max_seqlen, num_sms=sms, ctas_per_sm=1)
    tma_ws_task_kernel[grid](q, k, v, out, lse, cu, offsets, q.stride(0), N, H, T, 1.4426950408889634 / math.sqrt(D),
                             CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, SCHEDULE=schedule,
                             LOG2_SEQS=max(N, 1).bit_length(), num_warps=warps, num_stages=stages)
    return out


def tma_forward(q, k, v, cu, max_seqlen, causal, block_m, block_n, warps, stages):
    T, H, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(max_seqlen, block_m), (cu.numel() - 1) * H)
    tma_forward_kernel[grid](q, k, v, out, lse, cu, q.stride(0), H, T, 1.4426950408889634 / math.sqrt(D),
                             CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, WS=False,
                             num_warps=warps, num_stages=stages)
    return out


def scratch(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def event_us(fn, iters=30, repeats=5):
    """Device time per call: ``iters`` calls back to back between two CUDA events, the median of
    ``repeats`` such runs. Back to back, the host enqueues the next launch while the device runs the
    current one, so the host's launch time stays out of the figure as long as a call's device work
    is longer than its launch (it is here: hundreds of µs against tens). Timing each call alone,
    with a synchronisation after it, would add the host's launch time to every call (the first run
    of this script on the H200 did that: every variant, cuDNN too, looked 1.3-1.6x slower than the
    recorded graph replays)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / iters)
    return sorted(times)[len(times) // 2]


def main():
    triton.set_allocator(scratch)
    H, D = 16, 128
    rows = []
    base = default_config()
    variants = [("pkg_rect", 128, 64, 8, 3, False), ("pkg_rect", 128, 128, 8, 2, False),
                ("ws4_rect", 128, 64, 4, 2, "rect"), ("ws4_rect", 128, 64, 4, 3, "rect"),
                ("ws4_rect", 128, 128, 4, 2, "rect"), ("ws4_flat", 128, 64, 4, 2, "flat"), ("ws4_persistent", 128, 64, 4, 2, "persistent"),
                ("pkg_flat", 128, 64, 8, 3, "flat"), ("pkg_persistent", 128, 64, 8, 3, "persistent"),
                ("tma", 128, 64, 8, 3, False), ("tma", 128, 128, 8, 2, False), ("tma", 128, 64, 4, 3, False)]
    for (name, lengths), causal in [(x, c) for x in throughput_layouts(0).items() for c in (False, True)]:
        cu = cu_seqlens_from_lengths(lengths, device="cuda")
        L, S = int(lengths.sum()), int(lengths.max())
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = attention_flops(lengths, H, D, causal)
        reference = varlen_attention_triton(q, k, v, cu, causal=causal)
        for kind, bm, bn, w, st, ws in variants:
            if time.monotonic() - START > BUDGET_S:
                print(json.dumps({"stopped": "budget", "s": BUDGET_S}), flush=True)
                return rows
            row = {"layout": name, "causal": causal, "variant": kind, "tile": [bm, bn, w, st]}
            try:
                if kind in ("pkg_flat", "pkg_persistent"):
                    def fn():
                        return varlen_attention_triton(q, k, v, cu, causal=causal, schedule=ws, config=base)
                elif kind.startswith("ws4_"):
                    def fn():
                        return tma_ws_scheduled(q, k, v, cu, S, causal, bm, bn, w, st, ws)
                elif kind == "pkg_rect":
                    cfg = AttentionConfig(KernelConfig(bm, bn, num_warps=w, num_stages=st), base.dq, base.dkdv)
                    def fn():
                        return varlen_attention_triton(q, k, v, cu, causal=causal, schedule="rect", max_seqlen=S,
                                                       config=cfg)
                else:
                    def fn():
                        return tma_forward(q, k, v, cu, S, causal, bm, bn, w, st)
                out = fn()
                row["max_abs_diff"] = float((out.float() - reference.float()).abs().max())
                us = event_us(fn)
                row.update(us=round(us, 1), tflops=round(flops / us / 1e6, 1))
            except Exception as exc:  # an exploration: record why a variant did not run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    # Dense SDPA on 16 x 1024 (cuDNN), the hardware reference of the kernel-speed issue.
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for causal in (False, True):
        q, k, v = (torch.randn(16, H, 1024, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        def dense():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        us = event_us(dense)
        flops = attention_flops(torch.full((16,), 1024), H, D, causal)
        row = {"layout": "uniform_16x1024", "causal": causal, "variant": "sdpa_cudnn_dense",
               "us": round(us, 1), "tflops": round(flops / us / 1e6, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def compiled_for_sm90():
    """Each TMA kernel built for sm_90 without a GPU (Triton's own ptxas and cuobjdump): whether the
    warp specialization happened (a ``ttg.warp_specialize`` op, ``setmaxnreg``), warps, registers,
    spills and shared memory, or the compiler's failure."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "LSE": "*fp32", "cu_seqlens": "*i32",
                "chunk_offsets": "*i32", "qk_scale": "fp32"}
    for fn, extra, bn, warps, stages in [
            (tma_forward_kernel, {"WS": True}, 64, 8, 3), (tma_forward_kernel, {"WS": True}, 64, 4, 3),
            (tma_ws_task_kernel, {"SCHEDULE": "rect", "LOG2_SEQS": 9}, 128, 4, 2),
            *((tma_ws_task_kernel, {"SCHEDULE": s, "LOG2_SEQS": 9}, 64, 4, 2) for s in ("rect", "flat", "persistent"))]:
        consts = {"CAUSAL": False, "HEAD_DIM": 128, "BLOCK_M": 128, "BLOCK_N": bn, **extra}
        source = ASTSource(fn=fn, signature={a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names},
                           constexprs={(fn.arg_names.index(a),): v for a, v in consts.items()})
        row = {"kernel": fn.__name__, **extra, "tile": [128, bn, warps, stages], "triton": triton.__version__}
        try:
            c = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                cubin.write(c.asm["cubin"])
                cubin.flush()
                usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin.name],
                                       capture_output=True, text=True, check=True).stdout
            regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
            row.update(specialized=c.asm["ttgir"].count("ttg.warp_specialize") > 0, warps=c.metadata.num_warps,
                       setmaxnreg=sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", c.asm["ptx"]))),
                       registers=int(regs), stack_bytes=int(stack), shared_bytes=c.metadata.shared)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps(row), flush=True)


def check_in_interpreter():
    """Each TMA variant against a float64 softmax per sequence, float32 on the CPU (Triton's
    interpreter), ragged layouts with capacity past the last sequence, causal and not."""
    H, D = 2, 16
    torch.manual_seed(0)
    worst = 0.0
    for lengths in ([5, 40, 17, 1], [33], [16, 16, 3]):
        cu = cu_seqlens_from_lengths(torch.tensor(lengths))
        q, k, v = (torch.randn(sum(lengths) + 7, H, D) for _ in range(3))
        for causal in (False, True):
            outs = [tma_forward(q, k, v, cu, max(lengths), causal, 16, 16, 4, 2)]
            outs += [tma_ws_scheduled(q, k, v, cu, max(lengths), causal, 16, 16, 4, 2, s) for s in ("rect", "flat", "persistent")]
            for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
                qq, kk, vv = (x[a:b].double().transpose(0, 1) for x in (q, k, v))
                scores = qq @ kk.transpose(1, 2) / D ** 0.5
                if causal:
                    scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
                ref = (scores.softmax(-1) @ vv).transpose(0, 1)
                worst = max([worst] + [float((out[a:b].double() - ref).abs().max()) for out in outs])
    print(json.dumps({"variants": ["tma", "ws4_rect", "ws4_flat", "ws4_persistent"], "max_abs_diff": worst}))
    assert worst < 1e-5, worst


if __name__ == "__main__" and sys.argv[1:2] == ["--compile"]:
    compiled_for_sm90()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check"]:
    check_in_interpreter()
elif __name__ == "__main__":
    rows = main()
    print("\nlayout              causal variant          tile              us      TFLOP/s  maxdiff")
    for r in rows:
        print(f"{r['layout']:<19} {r['causal']!s:<6} {r['variant']:<16} {str(r.get('tile', '')):<17} "
              f"{r.get('us', '-')!s:>7} {r.get('tflops', '-')!s:>8}  {r.get('max_abs_diff', r.get('error', ''))!s:.60}")
    print(f"total {time.monotonic() - START:.0f} s")
