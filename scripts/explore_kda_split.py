"""Exploration (not a recording): do KDA's two slowest forward kernels get faster when their work is
cut into more, smaller CTAs? Run on the GPU host:

    python3 scripts/explore_kda_split.py [--budget SECONDS]      # time the variants (GPU)
    TRITON_INTERPRET=1 python3 scripts/explore_kda_split.py --check  # values only, tiny shapes (CPU)

``scripts/explore_kda.py`` found ``kda_intra_kernel`` and ``kda_wy_kernel`` at 5-7x the time of
flash-linear-attention's matching kernels, both with one CTA of 8 warps per (chunk, head) walking a
chunk's 16-row sub-blocks one after the other: a long dependent chain per CTA, and few CTAs.

* ``intra_split``: the same body, one CTA per (chunk, head, sub-block row ``i``): four times the
  CTAs, each a quarter of the chain (row ``i`` reads only rows ``<= i``, nothing another CTA writes).
* ``wy_split``: the block forward substitution alone in a small kernel (its 16 x 16 tiles gain
  nothing from 8 warps: each step of ``_unit_lower_inverse`` reduces across warps), then the
  ``[64, 64] x [64, 128]`` products of W and U_0 in a second kernel with 8 warps, as fla splits
  ``solve_tril`` from ``recompute_w_u``.

Each variant replaces the package kernel in ``_kda_forward`` for the run (the package is not
changed), checks its output against the package's, and times the forward graph replay with its
kernel breakdown. Nothing here is a recorded result.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch
import triton
import triton.language as tl

from attn_gym_lite.ops.kda import chunked_triton as kt
from attn_gym_lite.ops.kernels.tasks import first_task, next_task, task_at

PACKAGE = {"intra": kt.kda_intra_kernel, "wy": kt.kda_wy_kernel, "pairwise": kt.kda_pairwise_backward_kernel,
           "chunk_backward": kt.kda_chunk_backward_kernel}


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def intra_row_kernel(q, k, g_cum, gram, qk, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, scale,
                     K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, LOG2_BC: tl.constexpr,
                     PRECISION: tl.constexpr):
    # kda_intra_kernel's loop body for sub-block row i = program_id(2). Grid (G_cap, H, C // BC).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)
        sub = tl.arange(0, BC)
        i = tl.program_id(2)
        r = i * BC + sub
        ok_i = r < valid
        q_i = kt._load_rows(q, chunk_start + r, ok_i, head, H, K)
        k_i = kt._load_rows(k, chunk_start + r, ok_i, head, H, K)
        G_i = kt._load_rows(g_cum, chunk_start + r, ok_i, head, H, K)
        block_ok = i * BC < valid
        ref = kt._load_row(g_cum, chunk_start + i * BC, block_ok, head, H, K)
        to_ref = tl.exp(tl.where(ok_i[:, None], G_i - ref[None, :], 0.0))
        q_ref = q_i * to_ref
        k_ref = k_i * to_ref
        out = (chunk_start + r[:, None]) * H * C + head * C
        for jb in range(0, i):
            cols_j = jb * BC + sub
            ok_j = cols_j < tl.where(block_ok, valid, 0)
            k_j = kt._load_rows(k, chunk_start + cols_j, ok_j, head, H, K)
            G_j = kt._load_rows(g_cum, chunk_start + cols_j, ok_j, head, H, K)
            k_from_ref = k_j * tl.exp(tl.where(ok_j[:, None], ref[None, :] - G_j, 0.0))
            gram_block = tl.dot(k_ref, tl.trans(k_from_ref), input_precision=PRECISION)
            qk_block = tl.dot(q_ref, tl.trans(k_from_ref), input_precision=PRECISION) * scale
            tl.store(gram + out + cols_j[None, :], gram_block, mask=ok_i[:, None])
            tl.store(qk + out + cols_j[None, :], qk_block, mask=ok_i[:, None])
        gram_diag = tl.zeros([BC, BC], tl.float32)
        qk_diag = tl.zeros([BC, BC], tl.float32)
        for bit in range(0, LOG2_BC):
            row_f, col_f, at_level = kt._split_factors(g_cum, G_i, chunk_start + i * BC, valid - i * BC, head,
                                                       H, K, BC, bit)
            k_col = k_i * col_f
            gram_diag += tl.where(at_level, tl.dot(k_i * row_f, tl.trans(k_col), input_precision=PRECISION), 0.0)
            qk_diag += tl.where(at_level, tl.dot(q_i * row_f, tl.trans(k_col), input_precision=PRECISION), 0.0)
        qk_diag += tl.where(sub[:, None] == sub[None, :], tl.sum(q_i * k_i, 1)[:, None], 0.0)
        cols_i = i * BC + sub
        tl.store(gram + out + cols_i[None, :], gram_diag, mask=ok_i[:, None])
        tl.store(qk + out + cols_i[None, :], qk_diag * scale, mask=ok_i[:, None])
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def solve_kernel(beta, gram, inverse, cu_seqlens, chunk_offsets, num_seqs, num_rows, H,
                 C: tl.constexpr, BC: tl.constexpr):
    # M = (I + Diag(beta) Γ)^{-1} by block forward substitution: kda_wy_kernel's first half. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)
        sub = tl.arange(0, BC)
        for i in tl.static_range(C // BC):
            ok_i = i * BC + sub < valid
            b_i = tl.load(beta + (chunk_start + i * BC + sub) * H + head, mask=ok_i, other=0.0).to(tl.float32)
            strict = sub[None, :] < sub[:, None]
            A_ii = tl.load(kt._block_ptrs(gram, chunk_start, i, i, head, H, C, BC), mask=ok_i[:, None] & strict,
                           other=0.0) * b_i[:, None]
            M_ii = kt._unit_lower_inverse(A_ii, BC)
            tl.store(kt._block_ptrs(inverse, chunk_start, i, i, head, H, C, BC), M_ii, mask=ok_i[:, None])
            for j in tl.static_range(i):
                acc = tl.zeros([BC, BC], tl.float32)
                for l in tl.static_range(j, i):
                    ok_l = l * BC + sub < valid
                    A_il = tl.load(kt._block_ptrs(gram, chunk_start, i, l, head, H, C, BC), mask=ok_i[:, None],
                                   other=0.0) * b_i[:, None]
                    M_lj = tl.load(kt._block_ptrs(inverse, chunk_start, l, j, head, H, C, BC), mask=ok_l[:, None],
                                   other=0.0)
                    acc = tl.dot(A_il, M_lj, acc, input_precision="ieee")
                M_ij = -tl.dot(M_ii, acc, input_precision="ieee")
                tl.store(kt._block_ptrs(inverse, chunk_start, i, j, head, H, C, BC), M_ij, mask=ok_i[:, None])
            tl.debug_barrier()
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def wu_kernel(q, k, v, g_cum, beta, inverse, w, u, q_decayed, k_to_end, cu_seqlens, chunk_offsets,
              num_seqs, num_rows, H, scale, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
              PRECISION: tl.constexpr):
    # kda_wy_kernel's second half, M read back from `inverse`. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = kt._chunk_rows(seq_start, seq_len, chunk, C)
        M = kt._load_square(inverse, rows, ok, head, H, C, False)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        k_c = kt._load_rows(k, rows, ok, head, H, K)
        G = kt._load_rows(g_cum, rows, ok, head, H, K)
        v_c = kt._load_rows(v, rows, ok, head, H, V)
        W = tl.dot(M, b[:, None] * k_c * tl.exp(G), input_precision=PRECISION)
        U0 = tl.dot(M, b[:, None] * v_c, input_precision=PRECISION)
        kt._store_rows(w, W, rows, ok, head, H, K)
        kt._store_rows(u, U0, rows, ok, head, H, V)
        q_c = kt._load_rows(q, rows, ok, head, H, K)
        kt._store_rows(q_decayed, q_c * scale * tl.exp(G), rows, ok, head, H, K)
        G_last = kt._chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K, C)
        kt._store_rows(k_to_end, k_c * tl.exp(tl.where(ok[:, None], G_last[None, :] - G, 0.0)), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def pairwise_row_kernel(q, k, g_cum, d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk,
                        cu_seqlens, chunk_offsets, num_seqs, num_rows, H, K: tl.constexpr, C: tl.constexpr,
                        BC: tl.constexpr, LOG2_BC: tl.constexpr, PRECISION: tl.constexpr):
    # kda_pairwise_backward_kernel's loop body for sub-block i = program_id(2). Grid (G_cap, H, C // BC).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)
        sub = tl.arange(0, BC)
        i = tl.program_id(2)
        r = i * BC + sub
        ok_i = r < valid
        rows_i = chunk_start + r
        q_i = kt._load_rows(q, rows_i, ok_i, head, H, K)
        k_i = kt._load_rows(k, rows_i, ok_i, head, H, K)
        G_i = kt._load_rows(g_cum, rows_i, ok_i, head, H, K)
        block_ok = i * BC < valid
        ref = kt._load_row(g_cum, chunk_start + i * BC, block_ok, head, H, K)
        row_q = tl.zeros([BC, K], tl.float32)
        row_k = tl.zeros([BC, K], tl.float32)
        col_k = tl.zeros([BC, K], tl.float32)
        # Row side, earlier sub-blocks jb < i, through this sub-block's reference point.
        for jb in range(0, i):
            cols_j = jb * BC + sub
            ok_j = cols_j < tl.where(block_ok, valid, 0)
            k_j = kt._load_rows(k, chunk_start + cols_j, ok_j, head, H, K)
            G_j = kt._load_rows(g_cum, chunk_start + cols_j, ok_j, head, H, K)
            k_from_ref = k_j * tl.exp(tl.where(ok_j[:, None], ref[None, :] - G_j, 0.0))
            row_q = tl.dot(kt._load_block(d_qk, rows_i, ok_i, cols_j, head, H, C), k_from_ref, row_q,
                           input_precision=PRECISION)
            row_k = tl.dot(kt._load_block(d_gram, rows_i, ok_i, cols_j, head, H, C), k_from_ref, row_k,
                           input_precision=PRECISION)
        to_ref = tl.exp(tl.where(ok_i[:, None], G_i - ref[None, :], 0.0))
        row_q *= to_ref
        row_k *= to_ref
        # Column side, later sub-blocks ib > i (their rows see this sub-block's keys), through
        # the later sub-block's reference point.
        for ib in range(i + 1, C // BC):
            rr = ib * BC + sub
            ok_r = rr < valid
            ref_r = kt._load_row(g_cum, chunk_start + ib * BC, ib * BC < valid, head, H, K)
            q_r = kt._load_rows(q, chunk_start + rr, ok_r, head, H, K)
            k_r = kt._load_rows(k, chunk_start + rr, ok_r, head, H, K)
            G_r = kt._load_rows(g_cum, chunk_start + rr, ok_r, head, H, K)
            r_to_ref = tl.exp(tl.where(ok_r[:, None], G_r - ref_r[None, :], 0.0))
            c_P = kt._load_block(d_qk, chunk_start + rr, ok_r, r, head, H, C)  # [rows rr, columns of block i]
            c_G = kt._load_block(d_gram, chunk_start + rr, ok_r, r, head, H, C)
            part = tl.dot(tl.trans(c_P), q_r * r_to_ref, input_precision=PRECISION)
            part = tl.dot(tl.trans(c_G), k_r * r_to_ref, part, input_precision=PRECISION)
            seen_by_r = r < tl.where(ib * BC < valid, valid, 0)  # keys of block i, if block ib has rows
            col_k += part * tl.exp(tl.where(seen_by_r[:, None], ref_r[None, :] - G_i, 0.0))
        # The diagonal sub-block, by binary splitting (see _split_factors): per level, the row side
        # is (c ⊙ at_level) (k ⊙ col_f) scaled by row_f, the column side its transpose.
        c_P = kt._load_block(d_qk, rows_i, ok_i, r, head, H, C)
        c_G = kt._load_block(d_gram, rows_i, ok_i, r, head, H, C)
        for bit in range(0, LOG2_BC):  # h = 2**bit: 1, 2, ..., BC / 2
            row_f, col_f, at_level = kt._split_factors(g_cum, G_i, chunk_start + i * BC, valid - i * BC, head,
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
        d_q = kt._load_rows(dq_part, rows_i, ok_i, head, H, K) + row_q
        d_k = kt._load_rows(dk_part, rows_i, ok_i, head, H, K) + row_k + col_k
        dG = kt._load_rows(dG_part, rows_i, ok_i, head, H, K) + q_i * row_q + k_i * (row_k - col_k)
        dG = tl.where(ok_i[:, None], dG, 0.0)
        # dG in place of its partial (only this CTA touches these rows); dg_r = Σ_{r' >= r} dG_r'
        # over the chunk is left to reverse_cumsum_kernel, as the later sub-blocks are other CTAs.
        kt._store_rows(dq, d_q, rows_i, ok_i, head, H, K)
        kt._store_rows(dk, d_k, rows_i, ok_i, head, H, K)
        kt._store_rows(dG_part, dG, rows_i, ok_i, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def reverse_cumsum_kernel(dG, dg, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, K: tl.constexpr,
                          C: tl.constexpr):
    # dg = the reverse cumulative sum of dG within each chunk. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = kt._chunk_rows(seq_start, seq_len, chunk, C)
        x = kt._load_rows(dG, rows, ok, head, H, K)
        kt._store_rows(dg, tl.sum(x, 0)[None, :] - tl.cumsum(x, 0) + x, rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


class PairwiseSplit:
    """Stands in for ``kda_pairwise_backward_kernel[grid](...)``: the row kernel, then the reverse cumsum."""

    def __init__(self, num_warps):
        self.num_warps = num_warps

    def __getitem__(self, grid):
        def launch(q, k, g_cum, d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk, dg, cu, offsets, N, T, H, *,
                   K, C, BC, LOG2_BC, PRECISION, num_warps=8, num_stages=2):
            pairwise_row_kernel[(*grid, C // BC)](q, k, g_cum, d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk,
                                                 cu, offsets, N, T, H, K=K, C=C, BC=BC, LOG2_BC=LOG2_BC,
                                                 PRECISION=PRECISION, num_warps=self.num_warps,
                                                 num_stages=num_stages)
            reverse_cumsum_kernel[grid](dG_part, dg, cu, offsets, N, T, H, K=K, C=C)
        return launch


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def chunk_backward_keys_kernel(q, k, g_cum, beta, inverse, u, states, d_o, d_u, d_states, dq_part, dk_part,
                               dG_part, dM_part, db_part, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, scale,
                               K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr, PRECISION: tl.constexpr):
    # kda_chunk_backward_kernel's step 2 for one block of key channels. Grid (G_cap, H, K // BK).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        slot = tl.program_id(0)  # = chunk_offsets[sequence] + chunk, the flat schedule's one task
        rows, ok = kt._chunk_rows(seq_start, seq_len, chunk, C)
        valid = tl.minimum(seq_len - chunk * C, C)
        pos = tl.arange(0, C)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        M = kt._load_square(inverse, rows, ok, head, H, C, False)

        # 2. Key block k_block = program_id(2); its dM and dbeta terms to per-block buffers.
        last = seq_start + chunk * C + valid - 1  # the chunk's last row inside the sequence
        k_block = tl.program_id(2)
        dM = tl.zeros([C, C], tl.float32)
        db = tl.zeros([C], tl.float32)
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
            U = kt._load_cols(u, rows, ok, head, H, V, cols)
            dU = kt._load_cols(d_u, rows, ok, head, H, V, cols)
            dO = kt._load_cols(d_o, rows, ok, head, H, V, cols)
            dQg = tl.dot(dO, tl.trans(S0), dQg, input_precision=PRECISION)
            dW = tl.dot(-dU, tl.trans(S0), dW, input_precision=PRECISION)
            dKd = tl.dot(U, tl.trans(dS1), dKd, input_precision=PRECISION)
            dG_last += tl.sum(S0 * dS1, 1)
        # Through the UT transform: W = M B_k, U_0 = M B_v, M = (I + A)^{-1}, A = Diag(beta) Γ.
        k_c = kt._load_cols(k, rows, ok, head, H, K, kcols)
        G = kt._load_cols(g_cum, rows, ok, head, H, K, kcols)
        decay = tl.exp(G)  # exponent <= 0 (0 on padding rows, where k = 0)
        k_decayed = k_c * decay
        B_k = b[:, None] * k_decayed
        dB_k = tl.dot(tl.trans(M), dW, input_precision=PRECISION)
        dM = tl.dot(dW, tl.trans(B_k), dM, input_precision=PRECISION)
        db += tl.sum(dB_k * k_decayed, 1)
        # Everything but the pairwise terms (kda_pairwise_backward_kernel adds those).
        q_c = kt._load_cols(q, rows, ok, head, H, K, kcols)
        G_last = tl.load(g_cum + (last * H + head) * K + kcols).to(tl.float32)
        to_end = tl.exp(tl.where(ok[:, None], G_last[None, :] - G, 0.0))
        k_to_end = k_c * to_end
        d_q = scale * decay * dQg
        d_k = b[:, None] * decay * dB_k + to_end * dKd
        dG = dQg * (scale * q_c * decay) + dB_k * B_k - dKd * k_to_end  # dL/dG_r through Q_g, B_k, K_e
        dG_tail = tl.sum(dKd * k_to_end, 0) + tl.exp(G_last) * dG_last  # through G_last
        dG = tl.where(pos[:, None] == valid - 1, dG + dG_tail[None, :], dG)
        kt._store_cols(dq_part, d_q, rows, ok, head, H, K, kcols)
        kt._store_cols(dk_part, d_k, rows, ok, head, H, K, kcols)
        kt._store_cols(dG_part, dG, rows, ok, head, H, K, kcols)

        dM_offs = ((k_block * num_rows + rows[:, None]) * H + head) * C + pos[None, :]
        tl.store(dM_part + dM_offs, dM, mask=ok[:, None])
        tl.store(db_part + (k_block * num_rows + rows) * H + head, db, mask=ok)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def chunk_backward_values_kernel(v, beta, gram, inverse, u, d_o, d_u, dv, dbeta, d_qk_out, d_gram_out, dM_part,
                                 db_part, cu_seqlens, chunk_offsets, num_seqs, num_rows, H, scale,
                                 K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                                 BV: tl.constexpr, PRECISION: tl.constexpr):
    # kda_chunk_backward_kernel's steps 1 and 3, after chunk_backward_keys_kernel. Grid (G_cap, H).
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = kt._chunk_rows(seq_start, seq_len, chunk, C)
        pos = tl.arange(0, C)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        M = kt._load_square(inverse, rows, ok, head, H, C, False)

        # 1. What does not involve the keys, one value block at a time.
        dP = tl.zeros([C, C], tl.float32)
        dM = tl.zeros([C, C], tl.float32)
        db = tl.zeros([C], tl.float32)
        for v_block in range(0, V // BV):
            cols = v_block * BV + tl.arange(0, BV)
            U = kt._load_cols(u, rows, ok, head, H, V, cols)  # saved by the forward
            dU = kt._load_cols(d_u, rows, ok, head, H, V, cols)
            dO = kt._load_cols(d_o, rows, ok, head, H, V, cols)
            v_c = kt._load_cols(v, rows, ok, head, H, V, cols)
            dP = tl.dot(dO, tl.trans(U), dP, input_precision=PRECISION)
            B_v = b[:, None] * v_c
            dM = tl.dot(dU, tl.trans(B_v), dM, input_precision=PRECISION)
            dB_v = tl.dot(tl.trans(M), dU, input_precision=PRECISION)
            kt._store_cols(dv, b[:, None] * dB_v, rows, ok, head, H, V, cols)
            db += tl.sum(dB_v * v_c, 1)

        # The key blocks' dM and dbeta terms, then 3. dA from the complete dM.
        for kb in range(0, K // BK):
            dM += tl.load(dM_part + ((kb * num_rows + rows[:, None]) * H + head) * C + pos[None, :], mask=ok[:, None],
                          other=0.0)
            db += tl.load(db_part + (kb * num_rows + rows) * H + head, mask=ok, other=0.0)
        gram_c = kt._load_square(gram, rows, ok, head, H, C, True)
        dA = -tl.dot(tl.dot(tl.trans(M), dM, input_precision=PRECISION), tl.trans(M), input_precision=PRECISION)
        strict = (pos[None, :] < pos[:, None]) & ok[:, None]
        dA = tl.where(strict, dA, 0.0)
        db += tl.sum(dA * gram_c, 1)
        d_gram = dA * b[:, None]  # coefficient of Γ_rj = Σ_d k_rd k_jd E_rjd
        d_qk = tl.where((pos[None, :] <= pos[:, None]) & ok[:, None], dP, 0.0) * scale  # of Σ_d q_rd k_jd E_rjd
        kt._store_rows(d_qk_out, d_qk, rows, ok, head, H, C)
        kt._store_rows(d_gram_out, d_gram, rows, ok, head, H, C)
        tl.store(dbeta + rows * H + head, db.to(dbeta.dtype.element_ty), mask=ok)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


class ChunkBackwardSplit:
    """Stands in for ``kda_chunk_backward_kernel[grid](...)``: the key blocks in CTAs of their own."""

    def __init__(self, num_warps):
        self.num_warps = num_warps

    def __getitem__(self, grid):
        def launch(q, k, v, g_cum, beta, gram, inverse, u, states, d_o, d_u, d_states, dv, dbeta, d_qk, d_gram,
                   dq_part, dk_part, dG_part, cu, offsets, N, T, H, scale, *, K, V, C, BK, BV, PRECISION,
                   num_warps=8, num_stages=2):
            dM_part = torch.empty(K // BK, T, H, C, dtype=torch.float32, device=q.device)
            db_part = torch.empty(K // BK, T, H, dtype=torch.float32, device=q.device)
            options = dict(K=K, V=V, C=C, BK=BK, BV=BV, PRECISION=PRECISION, num_stages=num_stages)
            chunk_backward_keys_kernel[(*grid, K // BK)](q, k, g_cum, beta, inverse, u, states, d_o, d_u, d_states,
                                                        dq_part, dk_part, dG_part, dM_part, db_part, cu, offsets, N,
                                                        T, H, scale, num_warps=self.num_warps, **options)
            chunk_backward_values_kernel[grid](v, beta, gram, inverse, u, d_o, d_u, dv, dbeta, d_qk, d_gram, dM_part,
                                               db_part, cu, offsets, N, T, H, scale, num_warps=num_warps, **options)
        return launch


class IntraSplit:
    """Stands in for ``kda_intra_kernel[grid](...)``: the row kernel on a grid with a third axis."""

    def __init__(self, num_warps):
        self.num_warps = num_warps

    def __getitem__(self, grid):
        def launch(*args, C, BC, num_warps=None, num_stages=2, **kwargs):
            intra_row_kernel[(*grid, C // BC)](*args, C=C, BC=BC, num_warps=self.num_warps or num_warps,
                                               num_stages=num_stages, **kwargs)
        return launch


class WySplit:
    """Stands in for ``kda_wy_kernel[grid](...)``: the solve with ``solve_warps``, then W and U_0."""

    def __init__(self, solve_warps):
        self.solve_warps = solve_warps

    def __getitem__(self, grid):
        def launch(q, k, v, g_cum, beta, gram, inverse, w, u, q_decayed, k_to_end, cu, offsets, N, T, H, scale,
                   *, K, V, C, BC, PRECISION, num_warps=8, num_stages=2):
            solve_kernel[grid](beta, gram, inverse, cu, offsets, N, T, H, C=C, BC=BC, num_warps=self.solve_warps,
                               num_stages=1)
            wu_kernel[grid](q, k, v, g_cum, beta, inverse, w, u, q_decayed, k_to_end, cu, offsets, N, T, H, scale,
                            K=K, V=V, C=C, PRECISION=PRECISION, num_warps=num_warps, num_stages=num_stages)
        return launch


VARIANTS = {
    "package": {},
    "intra_split_w4": {"intra": IntraSplit(4)},
    "intra_split_w8": {"intra": IntraSplit(8)},
    "intra_split_w2": {"intra": IntraSplit(2)},
    "wy_split_s1": {"wy": WySplit(1)},
    "wy_split_s2": {"wy": WySplit(2)},
    "wy_split_s4": {"wy": WySplit(4)},
    "both_w4_s1": {"intra": IntraSplit(4), "wy": WySplit(1)},
    "both_w4_s2": {"intra": IntraSplit(4), "wy": WySplit(2)},
    "pairwise_split_w4": {"pairwise": PairwiseSplit(4)},
    "pairwise_split_w8": {"pairwise": PairwiseSplit(8)},
    "all_w4_s1_p4": {"intra": IntraSplit(4), "wy": WySplit(1), "pairwise": PairwiseSplit(4)},
    "pairwise_split_w2": {"pairwise": PairwiseSplit(2)},
    "cb_split_w4": {"chunk_backward": ChunkBackwardSplit(4)},
    "cb_split_w8": {"chunk_backward": ChunkBackwardSplit(8)},
    "all_w2_s1_p4_cb4": {"intra": IntraSplit(2), "wy": WySplit(1), "pairwise": PairwiseSplit(4),
                         "chunk_backward": ChunkBackwardSplit(4)},
    "all_w2_s1_p4_cb8": {"intra": IntraSplit(2), "wy": WySplit(1), "pairwise": PairwiseSplit(4),
                         "chunk_backward": ChunkBackwardSplit(8)},
    "package_again": {},  # the first backward capture of a process failed once: the baseline again, last
}


def use(variant):
    parts = VARIANTS[variant]
    kt.kda_intra_kernel = parts.get("intra", PACKAGE["intra"])
    kt.kda_wy_kernel = parts.get("wy", PACKAGE["wy"])
    kt.kda_pairwise_backward_kernel = parts.get("pairwise", PACKAGE["pairwise"])
    kt.kda_chunk_backward_kernel = parts.get("chunk_backward", PACKAGE["chunk_backward"])


def run_variants(T, M, H, K, V, dtype, device, backward, timed, deadline, emit):
    from attn_gym_lite.bench.linear_attention import kda_inputs
    from attn_gym_lite.ops.kda import kda_triton
    from attn_gym_lite.ragged import cu_seqlens_from_lengths, zipf_lengths

    lengths = zipf_lengths(T, M, generator=torch.Generator().manual_seed(0))
    cu_seqlens = cu_seqlens_from_lengths(lengths, device=device)
    inputs = kda_inputs(T, H, K, V, dtype=dtype, device=device, seed=0)
    names = ("q", "k", "v", "g", "beta")
    reference = None
    for variant in VARIANTS:
        if time.monotonic() > deadline:
            emit({"variant": variant, "skipped": "time budget spent"})
            continue
        use(variant)
        try:
            leaves = [inputs[n].detach().clone().requires_grad_(backward) for n in names]
            o = kda_triton(*leaves, cu_seqlens)[0]
            values = [o] + (list(torch.autograd.grad(o, leaves, inputs["grad_o"])) if backward else [])
            if reference is None:
                reference = [x.float() for x in values]
            diff = max((x.float() - r).abs().max().item() for x, r in zip(values, reference))
            record = {"variant": variant, "max_abs_diff_vs_package": diff}
            if timed:
                from explore_kda import capture, kernel_breakdown, ours, time_replays

                graph, _ = capture(ours, leaves, cu_seqlens, inputs["grad_o"], backward)
                median_us, min_us = time_replays(graph)
                kernels = kernel_breakdown(graph.replay)
                record.update(median_us=round(median_us, 1), min_us=round(min_us, 1),
                              kernels_us=[[n, round(us, 1)] for n, us in kernels[:12]])
                del graph
            emit(record)
        except Exception as error:  # record and go on
            emit({"variant": variant, "error": f"{type(error).__name__}: {error}"[:1500],
                  "trace": traceback.format_exc()[-1500:]})
    use("package")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=150.0)
    parser.add_argument("--check", action="store_true", help="tiny shapes, values only (the interpreter)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget

    def emit(record):
        print(json.dumps(record), flush=True)

    if args.check:
        run_variants(160, 4, 2, 32, 32, torch.float32, "cpu", True, False, deadline, emit)
        return
    for backward in (False, True):
        emit({"mode": "forward+backward" if backward else "forward", "T": 8192, "M": 32, "H": 16, "K": 128,
              "V": 128, "dtype": "bfloat16"})
        run_variants(8192, 32, 16, 128, 128, torch.bfloat16, "cuda", backward, True, deadline, emit)


if __name__ == "__main__":
    main()
