"""Forward pass of ragged (varlen) attention: one task = one chunk of queries of one head.

For a chunk of ``BLOCK_M`` queries of one sequence the kernel streams that sequence's keys and
values in blocks of ``BLOCK_N`` and keeps the softmax *online* (FlashAttention): a running row
maximum ``m``, a running denominator ``l`` and an unnormalised output ``acc``, rescaled by
``2**(m_old - m_new)`` whenever the maximum grows. Exponentials are base 2 (``exp2`` is one
instruction), so scores are pre-multiplied by ``log2(e) / sqrt(D)``.

Key blocks come in two kinds, and the loop over each kind is compiled separately:

* *full* blocks, every key visible to every query of the chunk: no masks at all;
* *masked* blocks: the sequence's ragged last block, and under causal masking the blocks on the
  diagonal. Blocks entirely above the diagonal are never visited (``masked_end``), which halves
  causal work.

Besides the output the kernel saves the log-sum-exp of every active row (base 2), which is all
the backward pass needs to rebuild the probabilities without storing them.

Which chunk and head a program processes, and how many of them, is the schedule's business:
see :mod:`attn_gym_lite.ops.kernels.tasks`.

Source: FlashAttention-2 (Dao, 2023), Algorithm 1; Triton's fused-attention tutorial.
"""

import triton
import triton.language as tl

from .mma import dot
from .tasks import first_task, next_task, task_at


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, q, k_base, v_base, rows, seq_len, lo, hi, stride_kt, stride_vt, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Fold key blocks ``[lo, hi)`` of the sequence into the online softmax of one query chunk."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        # Keys are loaded transposed, [HEAD_DIM, BLOCK_N], ready for q @ k^T.
        k_ptrs = k_base + cols[None, :] * stride_kt + offs_d[:, None]
        v_ptrs = v_base + cols[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            col_ok = cols < seq_len
            k = tl.load(k_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
        scores = dot(q, k, None, None) * qk_scale
        if MASKED:
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.math.exp2(scores - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = dot(p.to(v.dtype), v, acc * alpha[:, None], None)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def query_chunk_key_ranges(chunk, seq_len, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys a query chunk visits, as two ranges: ``[0, full_end)`` needs no mask and
    ``[full_end, masked_end)`` does. Shared by the forward and the dQ kernel.

    Causal: keys before the chunk's first query are visible to all of its rows; keys past its last
    query to none of them (never visited); the ``BLOCK_M`` keys in between form the diagonal. Not
    causal: every full ``BLOCK_N`` block, then the sequence's ragged last block.
    """
    if CAUSAL:
        full_end = chunk * BLOCK_M
        masked_end = tl.minimum(seq_len, full_end + BLOCK_M)
    else:
        full_end = seq_len // BLOCK_N * BLOCK_N
        masked_end = seq_len
    return full_end, masked_end


@triton.jit
def _forward_chunk(
    Q, K, V, O, LSE, seq_start, seq_len, chunk, head,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    token_capacity, qk_scale,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Attention output and log-sum-exp for query rows ``chunk * BLOCK_M ..`` of one sequence."""
    rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)  # positions inside the sequence
    row_ok = rows < seq_len
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + seq_start * stride_qt + head * stride_qh
    k_base = K + seq_start * stride_kt + head * stride_kh
    v_base = V + seq_start * stride_vt + head * stride_vh
    q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full_end, masked_end = query_chunk_key_ranges(chunk, seq_len, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, rows, seq_len, 0, full_end, stride_kt, stride_vt, qk_scale,
        False, CAUSAL, HEAD_DIM, BLOCK_N,
    )
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, rows, seq_len, full_end, masked_end, stride_kt, stride_vt,
        qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_N,
    )

    # Every active row sees at least its own key, so l_i > 0 where we store.
    out = acc / l_i[:, None]
    o_ptrs = O + (seq_start + rows[:, None]) * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + head * token_capacity + seq_start + rows, m_i + tl.math.log2(l_i), mask=row_ok)


@triton.jit(do_not_specialize=["num_seqs", "token_capacity"])
def attention_forward_kernel(
    Q, K, V, O, LSE, cu_seqlens, chunk_offsets, counter,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_seqs, num_heads, token_capacity, qk_scale,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCHEDULE: tl.constexpr,
):
    """Ragged attention forward.

    Q, K, V: ``[T, H, HEAD_DIM]`` (unit stride on the last dim); O: same shape, written for the
    active rows; LSE: float32 ``[H, T]``, base-2 log-sum-exp of the scaled scores, written for the
    active rows. ``chunk_offsets`` must be built with ``C = BLOCK_M``.
    """
    task = first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity, BLOCK_M, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, token_capacity, SCHEDULE)
        _forward_chunk(
            Q, K, V, O, LSE, seq_start, seq_len, chunk, head,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
            token_capacity, qk_scale, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N,
        )
        task = next_task(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE)
