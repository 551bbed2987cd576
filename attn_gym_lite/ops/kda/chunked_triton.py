r"""``kda_triton``: chunked KDA on packed batches in Triton, graph-safe, forward and backward.

The function of :func:`attn_gym_lite.ops.kda.reference.kda_chunked` (the math is there), by kernels
whose grids depend only on ``T``, ``N``, ``H`` and ``C``, so one captured CUDA graph replays every
layout of the same capacity. Per-chunk kernels run on a flat grid of ``G_cap`` programs per head
(:func:`attn_gym_lite.schedule.chunk_capacity`), program ``i`` on flat chunk ``i`` (where the backward
finds its saved state), those built from 16-row sub-blocks with one program per sub-block; the
recurrence runs one program per (sequence, head, value block). Every
kernel clamps its sequence into the ``T`` rows: a malformed ``cu_seqlens`` cannot address outside.
Forward, per chunk and head::

    1. cumsum   G = cumsum(g)                                           parallel
    2. intra    Γ_rj = Σ_d k_rd k_jd E_rjd (j < r),  P_rj = scale Σ_d q_rd k_jd E_rjd (j <= r)
    3. solve    M = (I + Diag(beta) Γ)^{-1}                             parallel
       wy       W = M Diag(beta) (K ⊙ exp(G)),  U_0 = M Diag(beta) V
    4. state    per chunk in order, from S = 0: save S;  U = U_0 - W S;  S = Diag(exp(G_last)) S + K_e^T U
    5. output   O = Q_g S + P U                                         parallel

with ``E_rj = exp(G_r - G_j)``, ``Q_g = scale Q ⊙ exp(G)``, ``K_e = K ⊙ exp(G_last - G)``. Only
kernel 4 is sequential; the backward (:func:`_kda_backward`) mirrors it. Every exponent is ``<= 0``
when ``g <= 0``: ``Γ`` and ``P`` are built from ``16 x 16`` sub-blocks through reference points
(:func:`_split_factors`), so no factor exceeds 1.

Sources: Kimi Linear (arXiv:2510.26692); fla ``fla/ops/kda`` (``chunk_kda``), read for the math.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ... import checks
from ...schedule import chunk_capacity
from ..kernels import INTERPRETED
from ..kernels.mma import dot
from ..kernels.offsets import launch_chunk_offsets
from ..kernels.tasks import first_task, next_task, sequence_bounds, task_at
from .reference import LOG_DECAY_FLOOR, check_kda_metadata

Tensor = torch.Tensor

__all__ = ["kda_triton"]

_SUB = 16  # sub-block of the intra-chunk kernels
_LOG2_SUB = _SUB.bit_length() - 1  # the binary-splitting levels of a diagonal sub-block
# Launch options (ignored by the interpreter). The sequential kernels' were sized with
# scripts/kernel_resources.py: three stages overflow a block's 227 KiB of shared memory at K = V = 128;
# bfloat16 tiles take a quarter of it, so two fit; 8 warps where 4 spilled stack. The per-chunk
# kernels' are the fastest scripts/explore_kda_split.py timed on the H200 (forward + backward, T = 8192,
# K = V = 128): the sub-block kernels with few warps and no pipelining (their loops are short), the
# per-chunk backward with 4 warps (8 took 1.37x as long).
_SEQUENTIAL = dict(num_warps=4, num_stages=1)
_SEQUENTIAL_LOW_PRECISION = dict(num_warps=8, num_stages=2)
_CHUNK_BACKWARD = dict(num_warps=4, num_stages=2)  # with value blocks of 32, to fit shared memory
_WY = dict(num_warps=8, num_stages=2)
_INTRA = dict(num_warps=2, num_stages=1)
_PAIRWISE = dict(num_warps=4, num_stages=1)
_SOLVE = dict(num_warps=1, num_stages=1)


@triton.jit
def _chunk_rows(seq_start, seq_len, chunk, C: tl.constexpr):
    """Packed rows of chunk ``chunk`` of a sequence, and which of them are inside it."""
    local = chunk * C + tl.arange(0, C)
    return seq_start + local, local < seq_len


@triton.jit
def _load_rows(ptr, rows, ok, head, H, D: tl.constexpr):
    # Rows of a contiguous [T, H, D] tensor as float32, zero where not ok: NaN past the sequence cannot leak.
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    return tl.load(ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _load_tile(ptr, rows, ok, head, H, D: tl.constexpr):
    # As _load_rows, in the buffer's own dtype: a saved bfloat16 operand goes to tl.dot as stored.
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    return tl.load(ptr + offs, mask=ok[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, x, rows, ok, head, H, D: tl.constexpr):
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _load_row(ptr, row, ok, head, H, D: tl.constexpr):
    d = tl.arange(0, D)
    # A vector mask made by a comparison: the interpreter refuses a scalar mask, and a scalar
    # bool broadcast by ``&`` reaches it as integers.
    return tl.load(ptr + (row * H + head) * D + d, mask=d < tl.where(ok, D, 0), other=0.0).to(tl.float32)


@triton.jit
def _state_ptrs(ptr, slot, head, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v_block):
    # The [K, BV] block v_block of ptr[slot, head] ([*, H, K, V]); 64-bit: G_cap * H * K * V may pass 2**31.
    base = (slot.to(tl.int64) * H + head) * (K * V)
    return ptr + base + tl.arange(0, K)[:, None] * V + v_block * BV + tl.arange(0, BV)[None, :]


@triton.jit
def _sequence_program(cu_seqlens, chunk_offsets, num_rows, C: tl.constexpr, BV: tl.constexpr):
    # What program (n, head, v_block) of a sequential kernel walks: sequence n clamped into the rows,
    # its chunks capped at the slots chunk_offsets gave it (a malformed cu_seqlens cannot pass G_cap).
    n, head, v_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_start, seq_len = sequence_bounds(cu_seqlens, n, num_rows)
    first = tl.load(chunk_offsets + n)
    num_chunks = tl.minimum(tl.cdiv(seq_len, C), tl.load(chunk_offsets + n + 1) - first)
    cols = v_block * BV + tl.arange(0, BV)
    return n, head, v_block, seq_start, seq_len, first, num_chunks, cols


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_cumsum_kernel(g, g_cum, cu_seqlens, chunk_offsets, num_seqs, num_rows, H,
                      K: tl.constexpr, C: tl.constexpr, FLOOR: tl.constexpr):
    # G = cumsum(max(g, FLOOR)) within each chunk, float32: strong and infinite decays stay exact (see
    # LOG_DECAY_FLOOR), and a clamp here costs no pass over g. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        x = tl.maximum(_load_rows(g, rows, ok, head, H, K), FLOOR)
        _store_rows(g_cum, tl.cumsum(x, 0), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def _split_factors(g_cum, G, block_start, block_valid, head, H, K: tl.constexpr, BC: tl.constexpr, bit):
    # One level of the binary splitting of a diagonal sub-block's decays: positions j < r whose binary
    # forms first differ at bit h = 2**bit straddle the midpoint m = (r // h) * h, so
    # E_rj = exp(G_r - G_m) exp(G_m - G_j), both factors <= 1, and the level is one product of
    # X ⊙ row_f with (Y ⊙ col_f)^T. The log2 BC levels cover every j < r once; at_level marks the pairs
    # this level computes (elsewhere the product mixes two midpoints).
    sub = tl.arange(0, BC)
    upper = (((sub >> bit) & 1) == 1) & (sub < block_valid)
    mid_r = (sub >> bit) << bit
    mid_c = ((sub >> (bit + 1)) << (bit + 1)) + (1 << bit)
    lower = (((sub >> bit) & 1) == 0) & (mid_c < block_valid)
    G_mr = _load_rows(g_cum, block_start + mid_r, upper, head, H, K)
    G_mc = _load_rows(g_cum, block_start + mid_c, lower, head, H, K)
    row_f = tl.where(upper[:, None], tl.exp(tl.where(upper[:, None], G - G_mr, 0.0)), 0.0)
    col_f = tl.where(lower[:, None], tl.exp(tl.where(lower[:, None], G_mc - G, 0.0)), 0.0)
    at_level = ((sub[:, None] >> bit) == (sub[None, :] >> bit) + 1) & ((sub[:, None] >> (bit + 1)) == (sub[None, :] >> (bit + 1)))
    return row_f, col_f, at_level


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_intra_kernel(q, k, g_cum, gram, qk, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, scale,
                     K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, LOG2_BC: tl.constexpr,
                     PRECISION: tl.constexpr):
    # gram[r, j] = Σ_d k_rd k_jd E_rjd (j < r) and qk[r, j] = scale Σ_d q_rd k_jd E_rjd (j <= r), stored
    # row by row into [T, H, C] buffers (other entries unspecified). Grid (G_cap, H, C // BC): one CTA
    # per 16-row sub-block of a chunk: a CTA per chunk, walking the four in turn, took twice as long on
    # the H200 (scripts/explore_kda_split.py): each is a chain of small dependent products.
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C  # packed row of position 0
        valid = tl.minimum(seq_len - chunk * C, C)  # rows of this chunk inside the sequence
        sub = tl.arange(0, BC)
        i = tl.program_id(2)  # the sub-block row: it reads rows <= its own, which no other CTA writes
        r = i * BC + sub  # chunk positions of sub-block i
        ok_i = r < valid
        q_i = _load_rows(q, chunk_start + r, ok_i, head, H, K)
        k_i = _load_rows(k, chunk_start + r, ok_i, head, H, K)
        G_i = _load_rows(g_cum, chunk_start + r, ok_i, head, H, K)
        block_ok = i * BC < valid
        ref = _load_row(g_cum, chunk_start + i * BC, block_ok, head, H, K)
        to_ref = tl.exp(tl.where(ok_i[:, None], G_i - ref[None, :], 0.0))  # <= 1: rows at/after ref
        q_ref = q_i * to_ref
        k_ref = k_i * to_ref
        out = (chunk_start + r[:, None]) * H * C + head * C
        # Earlier sub-blocks: one product each, through the reference point.
        for jb in range(0, i):
            cols_j = jb * BC + sub
            ok_j = cols_j < tl.where(block_ok, valid, 0)  # nothing if sub-block i is all padding
            k_j = _load_rows(k, chunk_start + cols_j, ok_j, head, H, K)
            G_j = _load_rows(g_cum, chunk_start + cols_j, ok_j, head, H, K)
            k_from_ref = k_j * tl.exp(tl.where(ok_j[:, None], ref[None, :] - G_j, 0.0))  # <= 1: before ref
            gram_block = tl.dot(k_ref, tl.trans(k_from_ref), input_precision=PRECISION)
            qk_block = tl.dot(q_ref, tl.trans(k_from_ref), input_precision=PRECISION) * scale
            tl.store(gram + out + cols_j[None, :], gram_block, mask=ok_i[:, None])
            tl.store(qk + out + cols_j[None, :], qk_block, mask=ok_i[:, None])
        # The diagonal sub-block, by binary splitting (see _split_factors): one product per level.
        gram_diag = tl.zeros([BC, BC], tl.float32)
        qk_diag = tl.zeros([BC, BC], tl.float32)
        for bit in range(0, LOG2_BC):  # h = 2**bit: 1, 2, ..., BC / 2
            row_f, col_f, at_level = _split_factors(g_cum, G_i, chunk_start + i * BC, valid - i * BC, head,
                                                    H, K, BC, bit)
            k_col = k_i * col_f
            gram_diag += tl.where(at_level, tl.dot(k_i * row_f, tl.trans(k_col), input_precision=PRECISION),
                                  0.0)
            qk_diag += tl.where(at_level, tl.dot(q_i * row_f, tl.trans(k_col), input_precision=PRECISION),
                                0.0)
        # j = r: E = 1 (P includes its diagonal, Γ does not).
        qk_diag += tl.where(sub[:, None] == sub[None, :], tl.sum(q_i * k_i, 1)[:, None], 0.0)
        cols_i = i * BC + sub
        tl.store(gram + out + cols_i[None, :], gram_diag, mask=ok_i[:, None])
        tl.store(qk + out + cols_i[None, :], qk_diag * scale, mask=ok_i[:, None])
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def _load_square(ptr, rows, ok, head, H, C: tl.constexpr, STRICT: tl.constexpr):
    # The [C, C] lower triangle (strict if STRICT) of a chunk's rows of a [T, H, C] buffer.
    pos = tl.arange(0, C)
    if STRICT:
        lower = pos[None, :] < pos[:, None]
    else:
        lower = pos[None, :] <= pos[:, None]
    offs = (rows[:, None] * H + head) * C + pos[None, :]
    return tl.load(ptr + offs, mask=ok[:, None] & lower, other=0.0)


@triton.jit
def _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K: tl.constexpr, C: tl.constexpr):
    # G_last: the cumulative decay at the chunk's last row inside the sequence.
    last = seq_start + tl.minimum(chunk * C + C, seq_len) - 1
    return _load_row(g_cum, last, True, head, H, K)


@triton.jit
def _unit_lower_inverse(A, BC: tl.constexpr):
    # (I + A)^{-1} of a strictly lower [BC, BC] A by forward substitution: row r of the inverse is
    # e_r - Σ_{j<r} A_rj M_j, the rows above r are final when it is formed, and A_rj = 0 for j >= r, so
    # one masked product with all of M gives the sum.
    pos = tl.arange(0, BC)
    M = tl.where(pos[:, None] == pos[None, :], 1.0, 0.0)
    for r in range(1, BC):
        a_r = tl.sum(tl.where(pos[:, None] == r, A, 0.0), 0)  # row r of A, indexed by j
        row = tl.where(pos == r, 1.0, 0.0) - tl.sum(a_r[:, None] * M, 0)
        M = tl.where(pos[:, None] == r, row[None, :], M)
    return M


@triton.jit
def _block_ptrs(ptr, chunk_start, i, j, head, H, C: tl.constexpr, BC: tl.constexpr):
    sub = tl.arange(0, BC)
    return ptr + ((chunk_start + i * BC + sub[:, None]) * H + head) * C + j * BC + sub[None, :]


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_solve_kernel(beta, gram, inverse, cu_seqlens, chunk_offsets, num_seqs, num_rows, H,
                     C: tl.constexpr, BC: tl.constexpr):
    # M = (I + Diag(beta) Γ)^{-1} of one chunk by block forward substitution over BC x BC sub-blocks, as
    # fla's solve_tril: BC - 1 dependent steps on [BC, BC] tiles instead of C - 1 on [C, C], then
    # M_ij = -M_ii Σ_{j <= l < i} A_il M_lj, the blocks passed through `inverse` itself. IEEE float32
    # products whatever the inputs: the solve stays exact. A kernel of its own, launched with one warp:
    # every step of _unit_lower_inverse reduces a 16 x 16 tile, within a warp by shuffles, across warps
    # through shared memory. Fused with kda_wy_kernel's products (8 warps), the two took twice as long
    # on the H200 (scripts/explore_kda_split.py). Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)  # rows of this chunk inside the sequence
        sub = tl.arange(0, BC)
        for i in tl.static_range(C // BC):
            ok_i = i * BC + sub < valid
            b_i = tl.load(beta + (chunk_start + i * BC + sub) * H + head, mask=ok_i, other=0.0).to(tl.float32)
            strict = sub[None, :] < sub[:, None]
            A_ii = tl.load(_block_ptrs(gram, chunk_start, i, i, head, H, C, BC), mask=ok_i[:, None] & strict,
                           other=0.0) * b_i[:, None]
            M_ii = _unit_lower_inverse(A_ii, BC)
            tl.store(_block_ptrs(inverse, chunk_start, i, i, head, H, C, BC), M_ii, mask=ok_i[:, None])
            for j in tl.static_range(i):
                acc = tl.zeros([BC, BC], tl.float32)
                for l in tl.static_range(j, i):  # l: the block index of the formula
                    # Rows of an earlier block row: stored before the last barrier. Rows past the
                    # sequence were not stored; masked to 0, as their A columns are.
                    ok_l = l * BC + sub < valid
                    A_il = tl.load(_block_ptrs(gram, chunk_start, i, l, head, H, C, BC), mask=ok_i[:, None],
                                   other=0.0) * b_i[:, None]
                    M_lj = tl.load(_block_ptrs(inverse, chunk_start, l, j, head, H, C, BC), mask=ok_l[:, None],
                                   other=0.0)
                    acc = tl.dot(A_il, M_lj, acc, input_precision="ieee")
                M_ij = -tl.dot(M_ii, acc, input_precision="ieee")
                tl.store(_block_ptrs(inverse, chunk_start, i, j, head, H, C, BC), M_ij, mask=ok_i[:, None])
            tl.debug_barrier()  # block row i stored: the next rows read it
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_wy_kernel(q, k, v, g_cum, beta, inverse, w, u, q_decayed, k_to_end, cu_seqlens, chunk_offsets,
                  num_seqs, num_rows, H, scale, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                  PRECISION: tl.constexpr):
    # The UT transform's products, M from kda_solve_kernel: W = M Diag(beta) (K ⊙ exp(G)) and
    # U_0 = M Diag(beta) V; also Q_g and K_e, so that the sequential kernels do no exponentials.
    # Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        M = _load_square(inverse, rows, ok, head, H, C, False)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        k_c = _load_rows(k, rows, ok, head, H, K)
        G = _load_rows(g_cum, rows, ok, head, H, K)
        v_c = _load_rows(v, rows, ok, head, H, V)
        W = tl.dot(M, b[:, None] * k_c * tl.exp(G), input_precision=PRECISION)  # G <= 0 (0 past the end)
        U0 = tl.dot(M, b[:, None] * v_c, input_precision=PRECISION)
        _store_rows(w, W, rows, ok, head, H, K)
        _store_rows(u, U0, rows, ok, head, H, V)
        q_c = _load_rows(q, rows, ok, head, H, K)
        _store_rows(q_decayed, q_c * scale * tl.exp(G), rows, ok, head, H, K)
        G_last = _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K, C)
        # Rows past the sequence have k = 0, but their exponent G_last - 0 may be positive: mask it.
        _store_rows(k_to_end, k_c * tl.exp(tl.where(ok[:, None], G_last[None, :] - G, 0.0)), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def kda_state_kernel(g_cum, k_to_end, w, u, states, final, cu_seqlens, chunk_offsets, num_rows, H,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                     PRECISION: tl.constexpr, STORE_FINAL: tl.constexpr):
    # The recurrence across chunks, the forward's critical path: it holds only the two dependent
    # products the next state needs (U = U_0 - W S in place, then S); the output is left to
    # kda_output_kernel, on every chunk at once. Grid (N, H, V // BV).
    n, head, v_block, seq_start, seq_len, first, num_chunks, cols = _sequence_program(cu_seqlens, chunk_offsets,
                                                                                      num_rows, C, BV)
    # S accumulates in float32; its products take it, and U, rounded to the saved buffers' dtype
    # (the inputs' for bfloat16/float16), the same rounded values the later kernels read back.
    S = tl.zeros([K, BV], tl.float32)
    for chunk in range(0, num_chunks):
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        S_in = S.to(states.dtype.element_ty)
        tl.store(_state_ptrs(states, first + chunk, head, H, K, V, BV, v_block), S_in)
        row_offs = (rows[:, None] * H + head) * V + cols[None, :]
        U0 = tl.load(u + row_offs, mask=ok[:, None], other=0.0).to(tl.float32)
        W = _load_tile(w, rows, ok, head, H, K)
        U = (U0 - dot(W, S_in, None, PRECISION)).to(u.dtype.element_ty)
        # In place: this program is the only one that reads or writes these rows and columns.
        tl.store(u + row_offs, U, mask=ok[:, None])
        G_last = _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K, C)
        K_e = _load_tile(k_to_end, rows, ok, head, H, K)
        S = tl.exp(G_last)[:, None] * S
        S = dot(tl.trans(K_e), U, S, PRECISION)
    if STORE_FINAL:
        tl.store(_state_ptrs(final, n, head, H, K, V, BV, v_block), S)


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_output_kernel(q_decayed, qk, u, states, o, cu_seqlens, chunk_offsets, num_seqs, num_rows, H,
                      K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                      PRECISION: tl.constexpr):
    # O = Q_g S + P U of one chunk, S its saved entering state. Grid (G_cap, H, V // BV).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        slot = tl.program_id(0)
        v_block = tl.program_id(2)
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        row_offs = (rows[:, None] * H + head) * V + v_block * BV + tl.arange(0, BV)[None, :]
        # Every operand as saved (the inputs' dtype for bfloat16/float16), float32 accumulation.
        S = tl.load(_state_ptrs(states, slot, head, H, K, V, BV, v_block))
        Q_g = _load_tile(q_decayed, rows, ok, head, H, K)
        P = _load_square(qk, rows, ok, head, H, C, False)
        U = tl.load(u + row_offs, mask=ok[:, None], other=0.0)
        out = dot(Q_g, S, None, PRECISION)
        out = dot(P, U, out, PRECISION)
        tl.store(o + row_offs, out.to(o.dtype.element_ty), mask=ok[:, None])
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


# -----------------------------------------------------------------------------
# Backward kernels.


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_local_du_kernel(qk, d_o, d_u, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, V: tl.constexpr,
                        C: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    # dU = P^T dO, the part that does not depend on the state gradient: off the backward's
    # sequential critical path. Grid (G_cap, H, V // BV).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        row_offs = (rows[:, None] * H + head) * V + tl.program_id(2) * BV + tl.arange(0, BV)[None, :]
        P = _load_square(qk, rows, ok, head, H, C, False)
        dO = tl.load(d_o + row_offs, mask=ok[:, None], other=0.0).to(P.dtype)
        tl.store(d_u + row_offs, dot(tl.trans(P), dO, None, PRECISION).to(d_u.dtype.element_ty), mask=ok[:, None])
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def kda_state_backward_kernel(g_cum, q_decayed, k_to_end, w, d_o, d_final, d_u, d_states, cu_seqlens,
                              chunk_offsets, num_rows, H, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                              BV: tl.constexpr, PRECISION: tl.constexpr, HAS_D_FINAL: tl.constexpr):
    # The recurrence backwards, from the last chunk, carrying dS (the gradient of the state leaving
    # the chunk; d_final or zero for the last one):
    #     d_states[chunk] = dS;   dU += K_e dS;   dS = Diag(exp(G_last)) dS + Q_g^T dO - W^T dU
    # Two dependent products per chunk (K_e dS, then W^T dU); Q_g^T dO overlaps them. Grid (N, H, V // BV).
    n, head, v_block, seq_start, seq_len, first, num_chunks, cols = _sequence_program(cu_seqlens, chunk_offsets,
                                                                                      num_rows, C, BV)
    if HAS_D_FINAL:
        dS = tl.load(_state_ptrs(d_final, n, head, H, K, V, BV, v_block))
    else:
        dS = tl.zeros([K, BV], tl.float32)
    for step in range(0, num_chunks):
        chunk = num_chunks - 1 - step
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        # As in the forward: dS accumulates in float32, the products take it rounded as saved.
        dS_in = dS.to(d_states.dtype.element_ty)
        tl.store(_state_ptrs(d_states, first + chunk, head, H, K, V, BV, v_block), dS_in)
        row_offs = (rows[:, None] * H + head) * V + cols[None, :]
        K_e = _load_tile(k_to_end, rows, ok, head, H, K)
        dO = tl.load(d_o + row_offs, mask=ok[:, None], other=0.0).to(K_e.dtype)
        dU = tl.load(d_u + row_offs, mask=ok[:, None], other=0.0).to(tl.float32)
        dU = dot(K_e, dS_in, dU, PRECISION)
        tl.store(d_u + row_offs, dU.to(d_u.dtype.element_ty), mask=ok[:, None])
        Q_g = _load_tile(q_decayed, rows, ok, head, H, K)
        W = _load_tile(w, rows, ok, head, H, K)
        G_last = _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K, C)
        dS = tl.exp(G_last)[:, None] * dS
        dS = dot(tl.trans(Q_g), dO, dS, PRECISION)
        # -dU negated before the cast (the stored dU's exact negative: rounding is symmetric),
        # never a bfloat16 tile: the interpreter negates those as integers.
        dS = dot(tl.trans(W), (-dU).to(d_u.dtype.element_ty), dS, PRECISION)


@triton.jit
def _load_cols(ptr, rows, ok, head, H, D: tl.constexpr, cols):
    offs = (rows[:, None] * H + head) * D + cols[None, :]
    return tl.load(ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_cols(ptr, x, rows, ok, head, H, D: tl.constexpr, cols):
    offs = (rows[:, None] * H + head) * D + cols[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_chunk_backward_kernel(q, k, v, g_cum, beta, gram, inverse, u, states, d_o, d_u, d_states,
                              dv, dbeta, d_qk_out, d_gram_out, dq_part, dk_part, dG_part,
                              cu_seqlens, chunk_offsets, num_seqs, num_rows, H, scale,
                              K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                              BV: tl.constexpr, PRECISION: tl.constexpr):
    # The per-chunk backward up to the pairwise terms (equations in _kda_backward): dv, dbeta, the
    # coefficients d_qk_out (dL/dP · scale), d_gram_out (dL/dA · beta_r), partial dq, dk, dG. Cut so
    # that few tiles are live at once: the terms without the key dimension per value block, then per
    # block of BK key channels (each channel depends on its own column only), last dA. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        slot = tl.program_id(0)  # = chunk_offsets[sequence] + chunk, the flat schedule's one task
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        valid = tl.minimum(seq_len - chunk * C, C)
        pos = tl.arange(0, C)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        M = _load_square(inverse, rows, ok, head, H, C, False)

        # 1. What does not involve the keys, one value block at a time.
        dP = tl.zeros([C, C], tl.float32)
        dM = tl.zeros([C, C], tl.float32)
        db = tl.zeros([C], tl.float32)
        for v_block in range(0, V // BV):
            cols = v_block * BV + tl.arange(0, BV)
            U = _load_cols(u, rows, ok, head, H, V, cols)  # saved by the forward
            dU = _load_cols(d_u, rows, ok, head, H, V, cols)
            dO = _load_cols(d_o, rows, ok, head, H, V, cols)
            v_c = _load_cols(v, rows, ok, head, H, V, cols)
            dP = tl.dot(dO, tl.trans(U), dP, input_precision=PRECISION)
            B_v = b[:, None] * v_c
            dM = tl.dot(dU, tl.trans(B_v), dM, input_precision=PRECISION)
            dB_v = tl.dot(tl.trans(M), dU, input_precision=PRECISION)
            _store_cols(dv, b[:, None] * dB_v, rows, ok, head, H, V, cols)
            db += tl.sum(dB_v * v_c, 1)

        # 2. One block of key channels at a time.
        last = seq_start + chunk * C + valid - 1  # the chunk's last row inside the sequence
        for k_block in range(0, K // BK):
            kcols = k_block * BK + tl.arange(0, BK)
            dQg = tl.zeros([C, BK], tl.float32)
            dW = tl.zeros([C, BK], tl.float32)
            dKd = tl.zeros([C, BK], tl.float32)
            dG_last = tl.zeros([BK], tl.float32)
            for v_block in range(0, V // BV):
                cols = v_block * BV + tl.arange(0, BV)
                state_offs = (slot.to(tl.int64) * H + head) * (K * V) + kcols[:, None] * V + cols[None, :]
                S0 = tl.load(states + state_offs).to(tl.float32)  # [BK, BV] of the entering state
                dS1 = tl.load(d_states + state_offs).to(tl.float32)
                U = _load_cols(u, rows, ok, head, H, V, cols)
                dU = _load_cols(d_u, rows, ok, head, H, V, cols)
                dO = _load_cols(d_o, rows, ok, head, H, V, cols)
                dQg = tl.dot(dO, tl.trans(S0), dQg, input_precision=PRECISION)
                dW = tl.dot(-dU, tl.trans(S0), dW, input_precision=PRECISION)
                dKd = tl.dot(U, tl.trans(dS1), dKd, input_precision=PRECISION)
                dG_last += tl.sum(S0 * dS1, 1)
            # Through the UT transform: W = M B_k, U_0 = M B_v, M = (I + A)^{-1}, A = Diag(beta) Γ.
            k_c = _load_cols(k, rows, ok, head, H, K, kcols)
            G = _load_cols(g_cum, rows, ok, head, H, K, kcols)
            decay = tl.exp(G)  # exponent <= 0 (0 on padding rows, where k = 0)
            k_decayed = k_c * decay
            B_k = b[:, None] * k_decayed
            dB_k = tl.dot(tl.trans(M), dW, input_precision=PRECISION)
            dM = tl.dot(dW, tl.trans(B_k), dM, input_precision=PRECISION)
            db += tl.sum(dB_k * k_decayed, 1)
            # Everything but the pairwise terms (kda_pairwise_backward_kernel adds those).
            q_c = _load_cols(q, rows, ok, head, H, K, kcols)
            G_last = tl.load(g_cum + (last * H + head) * K + kcols).to(tl.float32)
            to_end = tl.exp(tl.where(ok[:, None], G_last[None, :] - G, 0.0))
            k_to_end = k_c * to_end
            d_q = scale * decay * dQg
            d_k = b[:, None] * decay * dB_k + to_end * dKd
            dG = dQg * (scale * q_c * decay) + dB_k * B_k - dKd * k_to_end  # dL/dG_r through Q_g, B_k, K_e
            dG_tail = tl.sum(dKd * k_to_end, 0) + tl.exp(G_last) * dG_last  # through G_last
            dG = tl.where(pos[:, None] == valid - 1, dG + dG_tail[None, :], dG)
            _store_cols(dq_part, d_q, rows, ok, head, H, K, kcols)
            _store_cols(dk_part, d_k, rows, ok, head, H, K, kcols)
            _store_cols(dG_part, dG, rows, ok, head, H, K, kcols)

        # 3. dA from the complete dM.
        gram_c = _load_square(gram, rows, ok, head, H, C, True)
        dA = -tl.dot(tl.dot(tl.trans(M), dM, input_precision=PRECISION), tl.trans(M), input_precision=PRECISION)
        strict = (pos[None, :] < pos[:, None]) & ok[:, None]
        dA = tl.where(strict, dA, 0.0)
        db += tl.sum(dA * gram_c, 1)
        d_gram = dA * b[:, None]  # coefficient of Γ_rj = Σ_d k_rd k_jd E_rjd
        d_qk = tl.where((pos[None, :] <= pos[:, None]) & ok[:, None], dP, 0.0) * scale  # of Σ_d q_rd k_jd E_rjd
        _store_rows(d_qk_out, d_qk, rows, ok, head, H, C)
        _store_rows(d_gram_out, d_gram, rows, ok, head, H, C)
        tl.store(dbeta + rows * H + head, db.to(dbeta.dtype.element_ty), mask=ok)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def _load_block(ptr, rows, ok, cols, head, H, C: tl.constexpr):
    return tl.load(ptr + (rows[:, None] * H + head) * C + cols[None, :], mask=ok[:, None], other=0.0)


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_pairwise_backward_kernel(q, k, g_cum, d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk,
                                 cu_seqlens, chunk_offsets, num_seqs, num_rows, H, K: tl.constexpr, C: tl.constexpr,
                                 BC: tl.constexpr, LOG2_BC: tl.constexpr, PRECISION: tl.constexpr):
    # The pairwise terms, then the chain through G = cumsum(g). With c^P = d_qk, c^Γ = d_gram:
    #     dq_r += Σ_{j<=r} c^P_rj k_j ⊙ E_rj,   dk_r += Σ_{j<r} c^Γ_rj k_j ⊙ E_rj          (row side)
    #     dk_j += Σ_{r>=j} (c^P_rj q_r + c^Γ_rj k_r) ⊙ E_rj                            (column side)
    #     dG_r += q_r ⊙ row(dq_r) + k_r ⊙ row(dk_r) - k_r ⊙ column(dk_r)
    # One CTA per sub-block, as kda_intra_kernel (a CTA per chunk, walking them from the last, took 1.5x
    # as long on the H200); dG is left in dG_part for kda_reverse_cumsum_kernel. Grid (G_cap, H, C // BC).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)
        sub = tl.arange(0, BC)
        i = tl.program_id(2)  # the sub-block
        r = i * BC + sub
        ok_i = r < valid
        rows_i = chunk_start + r
        q_i = _load_rows(q, rows_i, ok_i, head, H, K)
        k_i = _load_rows(k, rows_i, ok_i, head, H, K)
        G_i = _load_rows(g_cum, rows_i, ok_i, head, H, K)
        block_ok = i * BC < valid
        ref = _load_row(g_cum, chunk_start + i * BC, block_ok, head, H, K)
        row_q = tl.zeros([BC, K], tl.float32)
        row_k = tl.zeros([BC, K], tl.float32)
        col_k = tl.zeros([BC, K], tl.float32)
        # Row side, earlier sub-blocks jb < i, through this sub-block's reference point.
        for jb in range(0, i):
            cols_j = jb * BC + sub
            ok_j = cols_j < tl.where(block_ok, valid, 0)
            k_j = _load_rows(k, chunk_start + cols_j, ok_j, head, H, K)
            G_j = _load_rows(g_cum, chunk_start + cols_j, ok_j, head, H, K)
            k_from_ref = k_j * tl.exp(tl.where(ok_j[:, None], ref[None, :] - G_j, 0.0))
            row_q = tl.dot(_load_block(d_qk, rows_i, ok_i, cols_j, head, H, C), k_from_ref, row_q,
                           input_precision=PRECISION)
            row_k = tl.dot(_load_block(d_gram, rows_i, ok_i, cols_j, head, H, C), k_from_ref, row_k,
                           input_precision=PRECISION)
        to_ref = tl.exp(tl.where(ok_i[:, None], G_i - ref[None, :], 0.0))
        row_q *= to_ref
        row_k *= to_ref
        # Column side, later sub-blocks ib > i (their rows see this sub-block's keys), through
        # the later sub-block's reference point.
        for ib in range(i + 1, C // BC):
            rr = ib * BC + sub
            ok_r = rr < valid
            ref_r = _load_row(g_cum, chunk_start + ib * BC, ib * BC < valid, head, H, K)
            q_r = _load_rows(q, chunk_start + rr, ok_r, head, H, K)
            k_r = _load_rows(k, chunk_start + rr, ok_r, head, H, K)
            G_r = _load_rows(g_cum, chunk_start + rr, ok_r, head, H, K)
            r_to_ref = tl.exp(tl.where(ok_r[:, None], G_r - ref_r[None, :], 0.0))
            c_P = _load_block(d_qk, chunk_start + rr, ok_r, r, head, H, C)  # [rows rr, columns of block i]
            c_G = _load_block(d_gram, chunk_start + rr, ok_r, r, head, H, C)
            part = tl.dot(tl.trans(c_P), q_r * r_to_ref, input_precision=PRECISION)
            part = tl.dot(tl.trans(c_G), k_r * r_to_ref, part, input_precision=PRECISION)
            seen_by_r = r < tl.where(ib * BC < valid, valid, 0)  # keys of block i, if block ib has rows
            col_k += part * tl.exp(tl.where(seen_by_r[:, None], ref_r[None, :] - G_i, 0.0))
        # The diagonal sub-block, by binary splitting (see _split_factors): per level, the row side
        # is (c ⊙ at_level) (k ⊙ col_f) scaled by row_f, the column side its transpose.
        c_P = _load_block(d_qk, rows_i, ok_i, r, head, H, C)
        c_G = _load_block(d_gram, rows_i, ok_i, r, head, H, C)
        for bit in range(0, LOG2_BC):  # h = 2**bit: 1, 2, ..., BC / 2
            row_f, col_f, at_level = _split_factors(g_cum, G_i, chunk_start + i * BC, valid - i * BC, head,
                                                    H, K, BC, bit)
            cp_level = tl.where(at_level, c_P, 0.0)
            cg_level = tl.where(at_level, c_G, 0.0)
            k_col = k_i * col_f
            row_q += tl.dot(cp_level, k_col, input_precision=PRECISION) * row_f
            row_k += tl.dot(cg_level, k_col, input_precision=PRECISION) * row_f
            to_col = tl.dot(tl.trans(cp_level), q_i * row_f, input_precision=PRECISION)
            to_col = tl.dot(tl.trans(cg_level), k_i * row_f, to_col, input_precision=PRECISION)
            col_k += to_col * col_f
        # j = r: E = 1.
        on_diagonal = sub[:, None] == sub[None, :]
        cp_diag = tl.sum(tl.where(on_diagonal, c_P, 0.0), 1)[:, None]
        cg_diag = tl.sum(tl.where(on_diagonal, c_G, 0.0), 1)[:, None]
        row_q += cp_diag * k_i
        row_k += cg_diag * k_i
        col_k += cp_diag * q_i + cg_diag * k_i
        d_q = _load_rows(dq_part, rows_i, ok_i, head, H, K) + row_q
        d_k = _load_rows(dk_part, rows_i, ok_i, head, H, K) + row_k + col_k
        dG = _load_rows(dG_part, rows_i, ok_i, head, H, K) + q_i * row_q + k_i * (row_k - col_k)
        dG = tl.where(ok_i[:, None], dG, 0.0)
        # dG in place of its partial (no other CTA reads these rows); dg_r = Σ_{r' >= r} dG_r' needs the
        # later sub-blocks, other CTAs: kda_reverse_cumsum_kernel sums it.
        _store_rows(dq, d_q, rows_i, ok_i, head, H, K)
        _store_rows(dk, d_k, rows_i, ok_i, head, H, K)
        _store_rows(dG_part, dG, rows_i, ok_i, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_reverse_cumsum_kernel(dG, g, dg, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, K: tl.constexpr,
                              C: tl.constexpr, FLOOR: tl.constexpr):
    # dg_r = Σ_{r' >= r} dG_r' within each chunk, the chain through G = cumsum(max(g, FLOOR)); zero where
    # g < FLOOR, as torch's clamp_min passes no gradient there. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        x = _load_rows(dG, rows, ok, head, H, K)
        through_floor = _load_rows(g, rows, ok, head, H, K) >= FLOOR
        _store_rows(dg, tl.where(through_floor, tl.sum(x, 0)[None, :] - tl.cumsum(x, 0) + x, 0.0), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


# -----------------------------------------------------------------------------
# Host side: buffers and launches.


@dataclasses.dataclass(frozen=True)
class _Plan:
    T: int
    H: int
    K: int
    V: int
    N: int
    C: int
    scale: float
    G_cap: int  # programs per head of the per-chunk kernels
    precision: str  # tl.dot's input_precision for float32 operands
    storage: torch.dtype  # dtype of the saved matrix-product operands (states, W, U, P, Q_g, K_e, dU, dS)
    value_block: int  # BV of the sequential kernels
    backward_value_block: int  # BV of kda_chunk_backward_kernel (see _CHUNK_BACKWARD)
    final_state: bool  # allocate and write the [N, H, K, V] final states

    @property
    def sequential(self) -> dict:  # launch options of the sequential kernels
        return _SEQUENTIAL if self.storage == torch.float32 else _SEQUENTIAL_LOW_PRECISION


def _value_block(V: int, largest: int = 64) -> int:
    # One block in the interpreter (it runs programs in turn); 64 registers per thread for a [128, 64] state.
    return V if INTERPRETED else min(V, largest)


def _key_block(K: int) -> int:
    # The per-chunk backward's key block: 32 (the whole K spilled 2.4 KiB of stack per thread), 16 in
    # the interpreter so that the tests run the split.
    return min(K, 16 if INTERPRETED else 32)


def _forward_buffers(q: Tensor, plan: _Plan) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """``(o, final state, what the backward reads)``, allocated (the fake implementation's shapes too)."""
    T, H, K, V, N, C = plan.T, plan.H, plan.K, plan.V, plan.N, plan.C
    f32 = dict(dtype=torch.float32, device=q.device)
    # What only feeds matrix products is kept in plan.storage (bfloat16 for bfloat16 inputs); the
    # decay cumsum, Γ (which builds A) and the inverse M stay float32, as the solve needs them exact.
    low = dict(dtype=plan.storage, device=q.device)
    saved = dict(offsets=torch.empty(N + 1, dtype=torch.int32, device=q.device), g_cum=torch.empty(T, H, K, **f32),
                 gram=torch.empty(T, H, C, **f32), qk=torch.empty(T, H, C, **low), inverse=torch.empty(T, H, C, **f32),
                 w=torch.empty(T, H, K, **low), u=torch.empty(T, H, V, **low), q_decayed=torch.empty(T, H, K, **low),
                 k_to_end=torch.empty(T, H, K, **low), states=torch.empty(max(plan.G_cap, 1), H, K, V, **low))
    final = torch.empty(N if plan.final_state else 0, H, K, V, **f32)
    # Rows L .. T - 1 are left as they are: zeroing them would cost a pass over the whole capacity per
    # call, under a graph captured at T at every replay. The model's masks stop them (chapter 5).
    o = torch.empty(T, H, V, dtype=q.dtype, device=q.device)
    return o, final, saved


def _kda_forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                 plan: _Plan) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
    # Returns (o, final_state or None, what the backward reads).
    T, H, K, V, N, C = plan.T, plan.H, plan.K, plan.V, plan.N, plan.C
    o, final, saved = _forward_buffers(q, plan)
    offsets = launch_chunk_offsets(cu_seqlens, C, out=saved["offsets"], token_capacity=T)  # clamped into T rows
    g_cum, gram, qk, inverse, w, u, q_decayed, k_to_end, states = list(saved.values())[1:]
    final = final if plan.final_state else None
    precision = plan.precision
    if plan.G_cap > 0:
        grid = (plan.G_cap, H)
        common = (cu_seqlens, offsets, N, T, H)
        kda_cumsum_kernel[grid](g, g_cum, *common, K=K, C=C, FLOOR=LOG_DECAY_FLOOR)
        kda_intra_kernel[(*grid, C // _SUB)](q, k, g_cum, gram, qk, *common, plan.scale, K=K, C=C, BC=_SUB,
                                             LOG2_BC=_LOG2_SUB, PRECISION=precision, **_INTRA)
        kda_solve_kernel[grid](beta, gram, inverse, *common, C=C, BC=_SUB, **_SOLVE)
        kda_wy_kernel[grid](q, k, v, g_cum, beta, inverse, w, u, q_decayed, k_to_end, *common, plan.scale,
                            K=K, V=V, C=C, PRECISION=precision, **_WY)
    BV = plan.value_block
    # Without a final state, `states` stands in for its pointer: STORE_FINAL=False never writes it.
    kda_state_kernel[(N, H, V // BV)](g_cum, k_to_end, w, u, states, states if final is None else final,
                                      cu_seqlens, offsets, T, H, K=K, V=V, C=C, BV=BV, PRECISION=precision,
                                      STORE_FINAL=final is not None, **plan.sequential)
    if plan.G_cap > 0:  # u now holds U = U_0 - W S
        kda_output_kernel[(plan.G_cap, H, V // BV)](q_decayed, qk, u, states, o, cu_seqlens, offsets, N, T, H,
                                                    K=K, V=V, C=C, BV=BV, PRECISION=precision)
    return o, final, saved


def _kda_backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                  saved: dict[str, Tensor], d_o: Tensor | None, d_final: Tensor | None,
                  plan: _Plan) -> tuple[Tensor, ...]:
    r"""Gradients of ``(q, k, v, g, beta)``; five kernels. Per chunk (``S_0``, ``S_1`` the states
    entering and leaving it, ``B_k = Diag(beta) (K ⊙ exp(G))``, ``B_v = Diag(beta) V``), from
    ``O = Q_g S_0 + P U``, ``U = M B_v - M B_k S_0``, ``S_1 = Diag(exp(G_last)) S_0 + K_e^T U``::

        per chunk:             dU = P^T dO
        sequential (reverse):  dU += K_e dS_1;   dS_0 = Q_g^T dO + Diag(exp(G_last)) dS_1 - W^T dU
        per chunk:             dP = tril(dO U^T)   dQ_g = dO S_0^T   dW = -dU S_0^T   dK_e = U dS_1^T
                               dB_v = M^T dU   dB_k = M^T dW   dM = dU B_v^T + dW B_k^T
                               dA = -stril(M^T dM M^T)

    then the pairwise terms of ``P`` and ``Γ`` and the chain through ``G = cumsum(g)`` (``dg`` is
    the reverse cumulative sum of ``dG`` over the chunk).
    """
    T, H, K, V, N, C = plan.T, plan.H, plan.K, plan.V, plan.N, plan.C
    device = q.device
    f32 = dict(dtype=torch.float32, device=device)
    # A None gradient (an unused output) is zero: a zero dO buffer, or a reverse recurrence from zero.
    d_o = torch.zeros(T, H, V, dtype=q.dtype, device=device) if d_o is None else d_o.contiguous()
    d_final = None if d_final is None else d_final.float().contiguous()
    d_u = torch.empty(T, H, V, dtype=plan.storage, device=device)
    d_states = torch.empty_like(saved["states"])
    d_qk, d_gram = torch.empty(T, H, C, **f32), torch.empty(T, H, C, **f32)
    dq_part, dk_part, dG_part = (torch.empty(T, H, K, **f32) for _ in range(3))
    dq, dk, dv, dg, dbeta = (torch.empty_like(x) for x in (q, k, v, g, beta))  # rows L .. T - 1 undefined
    precision = plan.precision
    BV = plan.value_block
    offsets = saved["offsets"]
    if plan.G_cap > 0:  # d_u = P^T dO, on every chunk at once
        kda_local_du_kernel[(plan.G_cap, H, V // BV)](saved["qk"], d_o, d_u, cu_seqlens, offsets, N, T, H, V=V, C=C,
                                                      BV=BV, PRECISION=precision)
    kda_state_backward_kernel[(N, H, V // BV)](saved["g_cum"], saved["q_decayed"], saved["k_to_end"], saved["w"],
                                               d_o, d_states if d_final is None else d_final, d_u, d_states,
                                               cu_seqlens, offsets, T, H, K=K, V=V, C=C, BV=BV, PRECISION=precision,
                                               HAS_D_FINAL=d_final is not None, **plan.sequential)
    if plan.G_cap > 0:
        kda_chunk_backward_kernel[(plan.G_cap, H)](
            q, k, v, saved["g_cum"], beta, saved["gram"], saved["inverse"], saved["u"],
            saved["states"], d_o, d_u, d_states, dv, dbeta, d_qk, d_gram, dq_part, dk_part, dG_part,
            cu_seqlens, offsets, N, T, H, plan.scale,
            K=K, V=V, C=C, BK=_key_block(K), BV=plan.backward_value_block, PRECISION=precision, **_CHUNK_BACKWARD,
        )
        kda_pairwise_backward_kernel[(plan.G_cap, H, C // _SUB)](
            q, k, saved["g_cum"], d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk, cu_seqlens, offsets, N, T, H,
            K=K, C=C, BC=_SUB, LOG2_BC=_LOG2_SUB, PRECISION=precision, **_PAIRWISE,
        )
        kda_reverse_cumsum_kernel[(plan.G_cap, H)](dG_part, g, dg, cu_seqlens, offsets, N, T, H, K=K, C=C,
                                                   FLOOR=LOG_DECAY_FLOOR)
    return dq, dk, dv, dg, dbeta


def _plan(q: Tensor, v: Tensor, cu_seqlens: Tensor, chunk_size: int, scale: float, final_state: bool) -> _Plan:
    T, H, K = q.shape
    N, C, V = cu_seqlens.shape[0] - 1, chunk_size, v.shape[2]
    return _Plan(T=T, H=H, K=K, V=V, N=N, C=C, scale=scale, G_cap=chunk_capacity(T, N, C),
                 # Full-precision products for float32 inputs; bfloat16 ones are rounded more coarsely than tf32.
                 precision="ieee" if q.dtype == torch.float32 else "tf32", storage=q.dtype,
                 value_block=_value_block(V), backward_value_block=_value_block(V, 32), final_state=final_state)


# Forward and backward as torch ops (``torch.library.custom_op``, fake implementations from the same
# allocation): torch.compile traces each call as one node, with no graph break and no host read of
# cu_seqlens. The forward returns what its backward reads, so autograd saves it.
_ARGS = "Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor cu_seqlens"
_OPTIONS = "int chunk_size, float scale, bool output_final_state"


@torch.library.custom_op("attn_gym_lite::kda_forward", mutates_args=(),
                         schema=f"({_ARGS}, {_OPTIONS}) -> ({', '.join(['Tensor'] * 12)})")
def _forward_op(q, k, v, g, beta, cu_seqlens, chunk_size, scale, output_final_state):
    plan = _plan(q, v, cu_seqlens, chunk_size, scale, output_final_state)
    o, final, saved = _kda_forward(q, k, v, g, beta, cu_seqlens, plan)
    return o, (final if final is not None else q.new_empty(0, plan.H, plan.K, plan.V, dtype=torch.float32)), \
        *saved.values()


@_forward_op.register_fake
def _(q, k, v, g, beta, cu_seqlens, chunk_size, scale, output_final_state):
    o, final, saved = _forward_buffers(q, _plan(q, v, cu_seqlens, chunk_size, scale, output_final_state))
    return o, final, *saved.values()


@torch.library.custom_op("attn_gym_lite::kda_backward", mutates_args=(),
                         schema=f"({_ARGS}, Tensor[] saved, Tensor? d_o, Tensor? d_final, {_OPTIONS}) "
                                "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _backward_op(q, k, v, g, beta, cu_seqlens, saved, d_o, d_final, chunk_size, scale, output_final_state):
    plan = _plan(q, v, cu_seqlens, chunk_size, scale, output_final_state)
    names = ("offsets", "g_cum", "gram", "qk", "inverse", "w", "u", "q_decayed", "k_to_end", "states")
    return _kda_backward(q, k, v, g, beta, cu_seqlens, dict(zip(names, saved)), d_o,
                         d_final if output_final_state else None, plan)


@_backward_op.register_fake
def _(q, k, v, g, beta, cu_seqlens, saved, d_o, d_final, chunk_size, scale, output_final_state):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape), \
        beta.new_empty(beta.shape)


def _setup_context(ctx, inputs, output):
    *tensors, ctx.chunk_size, ctx.scale, ctx.final_state = inputs
    ctx.save_for_backward(*tensors, *output[2:])


def _grad(ctx, d_o, d_final, *_unused):
    q, k, v, g, beta, cu_seqlens, *saved = ctx.saved_tensors
    grads = _backward_op(q, k, v, g, beta, cu_seqlens, saved, d_o, d_final, ctx.chunk_size, ctx.scale, ctx.final_state)
    return (*grads, None, None, None, None)


_forward_op.register_autograd(_grad, setup_context=_setup_context)


def kda_triton(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
               scale: float | None = None, chunk_size: int = 64, output_final_state: bool = False,
               validate: bool | None = None) -> tuple[Tensor, Tensor | None]:
    r"""KDA (Kimi Delta Attention) on a packed batch by chunked Triton kernels, CUDA-graph safe.

    For every sequence, from a zero state (one head; ``S`` is ``K x V``)::

        S = Diag(exp(g_t)) S;   S = S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T (scale q_t)

    in the chunked form of :func:`attn_gym_lite.ops.kda.kda_chunked`, the specification.

    Args:
        q, k, v: ``[T, H, K]``, ``[T, H, K]``, ``[T, H, V]``, float32 / bfloat16 / float16,
            ``K, V`` in 16, 32, 64, 128; ``q, k`` L2-normalised by the caller.
        g: ``[T, H, K]`` log-decay (natural log, ``<= 0``; ``-inf`` resets the state), floored at
            :data:`~attn_gym_lite.ops.kda.reference.LOG_DECAY_FLOOR`.
        beta: ``[T, H]`` delta-rule step sizes in ``(0, 1)``.
        cu_seqlens: int32 ``[N + 1]`` prefix sums on ``q``'s device. Its values are checked on the
            host for a CPU tensor (``validate=None``), always with ``validate=True`` (one sync,
            skipped during capture), never with ``False``; unchecked ones are clamped into the rows.
        scale: factor on ``q``; default ``K ** -0.5``.
        chunk_size: 16, 32 or 64. The result does not depend on it.
        output_final_state: also return each sequence's final state (else never allocated).

    Returns:
        ``(o [T, H, V] in q's dtype; final_state float32 [N, H, K, V] or None)``, differentiable.
        Rows past ``L`` of ``o`` and of the input gradients are undefined, as attention's: mask them.
        bfloat16/float16 inputs: operands that only feed matrix products are stored and multiplied
        in that dtype (float32 accumulation, as fla); decays and the solve stay float32.
    """
    T, H, K = check_kda_metadata(q, k, v, g, beta, cu_seqlens)
    V, C = v.shape[2], chunk_size
    if C not in (16, 32, 64):  # the kernels tile chunks by 16-row sub-blocks
        raise ValueError(f"chunk_size must be one of (16, 32, 64), got {C}")
    if q.device.type != ("cpu" if INTERPRETED else "cuda"):  # the interpreter reads CPU memory only
        raise ValueError(f"q must be a {'CPU' if INTERPRETED else 'CUDA'} tensor "
                         f"({'with' if INTERPRETED else 'without'} TRITON_INTERPRET=1), got device {q.device}")
    if T * H * max(K, V, C) > checks.INT32_MAX:  # the kernels' row offsets are 32-bit
        raise ValueError(f"q must have T * H * max(K, V, C) below 2**31, got T = {T}, H = {H}, K = {K}, V = {V}")
    capturing = torch.compiler.is_compiling() or (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing())
    if (cu_seqlens.device.type == "cpu" if validate is None else validate) and not capturing:
        checks.check_cu_seqlens_values(cu_seqlens, token_capacity=T)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o, final, *_ = _forward_op(q, k, v, g, beta, cu_seqlens, C, K**-0.5 if scale is None else float(scale),
                               output_final_state)
    return o, (final if output_final_state else None)
