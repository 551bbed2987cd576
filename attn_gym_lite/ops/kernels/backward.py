"""Backward pass of ragged (varlen) attention: a dQ pass over query chunks, then a dK/dV pass over
key chunks.

With ``P = softmax(S)``, ``S = scale * Q K^T`` and the output gradient ``dO``:

    dV = P^T dO        dP = dO V^T        dS = P * (dP - delta)        delta = rowsum(dO * O)
    dQ = scale * dS K  dK = scale * dS^T Q

``P`` is rebuilt block by block from the forward's log-sum-exp: ``P = exp2(S * log2(e) - lse)``.

FlashAttention-2 splits the work so that every output element has exactly one writer:

* ``attention_backward_kernel`` with ``PASS="dq"``: one task per *query* chunk walks that sequence's key blocks and
  accumulates ``dQ`` in registers. It runs first because it also computes ``delta`` for its own
  rows, which is all of a row's ``delta`` the second pass will need.
* the same kernel with ``PASS="dkdv"``: one task per *key* chunk walks the query blocks that can see it and
  accumulates ``dK`` and ``dV``.

No atomics, so the gradients are deterministic. Both kernels reuse the forward's split into
*full* and *masked* blocks and skip the blocks a causal mask hides entirely; both are scheduled by
:mod:`attn_gym_lite.ops.kernels.tasks`, over query chunks and key chunks respectively.

Source: FlashAttention-2 (Dao, 2023), Algorithm 2 and section 3.1.2; Triton's fused-attention
tutorial.
"""

import triton
import triton.language as tl

from .forward import query_chunk_key_ranges
from .mma import dot
from .tasks import first_task, next_task, task_at


@triton.jit
def _rows_of_head(base, seq_start, idx, ok, head, stride_t, stride_h, HEAD_DIM: tl.constexpr):
    """Rows ``seq_start + idx`` of one head of a ``[T, H, D]`` tensor, ``[len(idx), HEAD_DIM]``,
    zeros where ``ok`` is false (rows past the sequence's end)."""
    offs_d = tl.arange(0, HEAD_DIM)
    return tl.load(base + (seq_start + idx[:, None]) * stride_t + head * stride_h + offs_d[None, :],
                   mask=ok[:, None], other=0.0)

# -----------------------------------------------------------------------------
# dQ (and delta): one query chunk, looping over key blocks.


@triton.jit
def _dq_key_blocks(
    dq, q, do, lse, delta, k_base, v_base, rows, seq_len, lo, hi, stride_kt, stride_vt, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Add key blocks ``[lo, hi)``'s share of ``dS K`` (unscaled) to ``dq``."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + cols[None, :] * stride_kt + offs_d[:, None]  # [HEAD_DIM, BLOCK_N]
        v_ptrs = v_base + cols[None, :] * stride_vt + offs_d[:, None]
        if MASKED:
            col_ok = cols < seq_len
            kT = tl.load(k_ptrs, mask=col_ok[None, :], other=0.0)
            vT = tl.load(v_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            kT = tl.load(k_ptrs)
            vT = tl.load(v_ptrs)
        p = tl.math.exp2(dot(q, kT, None, None) * qk_scale - lse[:, None])
        if MASKED:
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)
        dp = dot(do, vT, None, None)
        ds = p * (dp - delta[:, None])
        dq = dot(ds.to(kT.dtype), tl.trans(kT), dq, None)
    return dq


# -----------------------------------------------------------------------------
# dK and dV: one key chunk, looping over query blocks. Everything is computed transposed
# (keys along rows), so the accumulators dK, dV are [BLOCK_N, HEAD_DIM] like the chunk itself.


@triton.jit
def _dkdv_query_blocks(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, seq_len, lo, hi, stride_qt, stride_ot,
    qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Add query blocks ``[lo, hi)``'s share of ``P^T dO`` to ``dv`` and of ``dS^T Q`` to ``dk``."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = q_base + rows[None, :] * stride_qt + offs_d[:, None]  # [HEAD_DIM, BLOCK_M]
        do_ptrs = do_base + rows[:, None] * stride_ot + offs_d[None, :]  # [BLOCK_M, HEAD_DIM]
        if MASKED:
            row_ok = rows < seq_len
            qT = tl.load(q_ptrs, mask=row_ok[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        else:
            qT = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        pT = tl.math.exp2(dot(k, qT, None, None) * qk_scale - lse[None, :])  # [BLOCK_N, BLOCK_M]
        if MASKED:
            visible = row_ok[None, :]
            if CAUSAL:
                visible = visible & (rows[None, :] >= cols[:, None])
            pT = tl.where(visible, pT, 0.0)
        dv = dot(pT.to(do.dtype), do, dv, None)
        dpT = dot(v, tl.trans(do), None, None)
        dsT = pT * (dpT - delta[None, :])
        dk = dot(dsT.to(qT.dtype), tl.trans(qT), dk, None)
    return dk, dv


# -----------------------------------------------------------------------------
# One kernel, two passes: the task loop is the same, only the chunk's work differs.


@triton.jit(do_not_specialize=["num_seqs", "token_capacity"])
def attention_backward_kernel(
    Q, K, V, O, DO, DQ, DK, DV, LSE, DELTA, cu_seqlens, chunk_offsets, counter,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_seqs, num_heads, token_capacity, qk_scale, sm_scale,
    PASS: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, SCHEDULE: tl.constexpr,
):
    """``PASS = "dq"``: dQ over query chunks (``chunk_offsets`` built with ``C = BLOCK_M``), also
    writing ``DELTA[h, t] = rowsum(dO * O)`` (float32 ``[H, T]``) for the active rows. ``PASS =
    "dkdv"``: dK, dV over key chunks (``C = BLOCK_N``), reading that ``DELTA``; launch it after."""
    if PASS == "dq":  # a compile-time choice, like every branch on PASS
        task = first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity, BLOCK_M, SCHEDULE)
    else:
        task = first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity, BLOCK_N, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, token_capacity, SCHEDULE)
        if PASS == "dq":
            # ``dQ`` and ``delta`` for query rows ``chunk * BLOCK_M ..`` of one sequence.
            rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < seq_len
            q = _rows_of_head(Q, seq_start, rows, row_ok, head, stride_qt, stride_qh, HEAD_DIM)
            # O, dO and dQ share one contiguous [T, H, D] layout.
            do = _rows_of_head(DO, seq_start, rows, row_ok, head, stride_ot, stride_oh, HEAD_DIM)
            o = _rows_of_head(O, seq_start, rows, row_ok, head, stride_ot, stride_oh, HEAD_DIM)
            delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
            row_stats = head * token_capacity + seq_start + rows
            tl.store(DELTA + row_stats, delta, mask=row_ok)
            lse = tl.load(LSE + row_stats, mask=row_ok, other=0.0)

            k_base = K + seq_start * stride_kt + head * stride_kh
            v_base = V + seq_start * stride_vt + head * stride_vh
            dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            full_end, masked_end = query_chunk_key_ranges(chunk, seq_len, CAUSAL, BLOCK_M, BLOCK_N)
            dq = _dq_key_blocks(dq, q, do, lse, delta, k_base, v_base, rows, seq_len, 0, full_end,
                                stride_kt, stride_vt, qk_scale, False, CAUSAL, HEAD_DIM, BLOCK_N)
            dq = _dq_key_blocks(dq, q, do, lse, delta, k_base, v_base, rows, seq_len, full_end, masked_end,
                                stride_kt, stride_vt, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_N)
            offs_d = tl.arange(0, HEAD_DIM)
            out_offsets = (seq_start + rows[:, None]) * stride_ot + head * stride_oh + offs_d[None, :]
            tl.store(DQ + out_offsets, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
        else:
            # ``dK`` and ``dV`` for key rows ``chunk * BLOCK_N ..`` of one sequence.
            cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < seq_len
            k = _rows_of_head(K, seq_start, cols, col_ok, head, stride_kt, stride_kh, HEAD_DIM)
            v = _rows_of_head(V, seq_start, cols, col_ok, head, stride_vt, stride_vh, HEAD_DIM)
            q_base = Q + seq_start * stride_qt + head * stride_qh
            do_base = DO + seq_start * stride_ot + head * stride_oh
            lse_base = LSE + head * token_capacity + seq_start
            delta_base = DELTA + head * token_capacity + seq_start

            dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
            dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
            full_end = seq_len // BLOCK_M * BLOCK_M
            if CAUSAL:
                # Queries before the chunk's first key see none of it (skipped); the BLOCK_N queries
                # from its first key on form the diagonal; later full query blocks see all of it.
                diag_start = chunk * BLOCK_N
                full_start = diag_start + BLOCK_N
                full_end = tl.maximum(full_start, full_end)
                dk, dv = _dkdv_query_blocks(
                    dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, seq_len, diag_start,
                    tl.minimum(seq_len, full_start), stride_qt, stride_ot, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_M,
                )
            else:
                full_start = 0
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, seq_len, full_start, full_end,
                stride_qt, stride_ot, qk_scale, False, CAUSAL, HEAD_DIM, BLOCK_M,
            )
            # The sequence's ragged last query block.
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, seq_len, full_end, seq_len,
                stride_qt, stride_ot, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_M,
            )
            # dK, dV share O's contiguous [T, H, D] layout.
            offs_d = tl.arange(0, HEAD_DIM)
            out_offsets = (seq_start + cols[:, None]) * stride_ot + head * stride_oh + offs_d[None, :]
            tl.store(DK + out_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
            tl.store(DV + out_offsets, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
        task = next_task(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE)
