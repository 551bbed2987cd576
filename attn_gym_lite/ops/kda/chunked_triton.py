r"""``kda_triton``: chunked KDA on packed batches in Triton, graph-safe, forward and backward.

The same function as :func:`attn_gym_lite.ops.kda.reference.kda_chunked` (read that module for the
math and the conventions: decay first, delta rule, read after update; ``g`` natural-log per-channel
decay; ``scale = K ** -0.5`` by default), computed by kernels whose launch grids depend only on
``T``, ``N``, ``H`` and ``C``: no value of ``cu_seqlens`` is ever read on the host, so a CUDA graph
captured once replays correctly for every layout of the same capacity.

Work is cut the way a ragged kernel cuts it (DESIGN.md's vocabulary): every sequence is split into
chunks of ``C`` tokens starting at its first row, a chunk never spans two sequences, and
``chunk_offsets`` (built on the device by
:func:`attn_gym_lite.ops.kernels.offsets.launch_chunk_offsets`) numbers the ``G_active`` chunks
of the batch. Per-chunk kernels run on a flat grid of ``G_cap = min(T, N) + (T - min(T, N)) // C``
programs per head (:func:`attn_gym_lite.schedule.chunk_capacity`); a program past ``G_active``
exits. The recurrence across chunks runs on a grid of one program per (sequence slot, head,
value block), each looping over its own sequence's chunks.

No kernel trusts ``cu_seqlens`` to address memory: every one of them, the per-chunk kernels
through ``task_at`` and the sequential ones through ``_sequence_program``, takes its sequence's
bounds from :func:`attn_gym_lite.ops.kernels.tasks.sequence_bounds`, clamped into the ``T`` rows
(``num_rows``), and ``chunk_offsets`` is built from the same clamped lengths; the sequential
kernels also cap a sequence's chunks at the slots ``chunk_offsets`` gave it. On a valid
``cu_seqlens`` the clamps change nothing; on a malformed one the results are wrong, but no access
leaves the tensors.

The per-chunk kernels are written in the package's task-loop form
(:mod:`attn_gym_lite.ops.kernels.tasks`) but take no schedule: the flat one is fixed in them. It
is the only one under which a program's index is its chunk's place in the flat chunk list, which
is where :func:`kda_chunk_backward_kernel` finds the chunk's saved entering state (a persistent or
dynamic program runs several chunks, a rectangular one is indexed by sequence and chunk, and the
dynamic schedule would also need a task counter of its own).

Forward, five kernels (one head of one chunk of ``c <= C`` rows; ``G`` is the within-chunk
cumulative log-decay, ``E_rj = exp(G_r - G_j)`` for ``j <= r``)::

    1. cumsum   G = cumsum(g)                                           per chunk, parallel
    2. intra    Γ_rj = Σ_d k_rd k_jd E_rjd  (j < r)                     per chunk, parallel
                P_rj = scale Σ_d q_rd k_jd E_rjd  (j <= r)
    3. wy       M = (I + Diag(beta) Γ)^{-1}                             per chunk, parallel
                W = M Diag(beta) (K ⊙ exp(G)),   U_0 = M Diag(beta) V
                Q_g = scale Q ⊙ exp(G),          K_e = K ⊙ exp(G_last - G)
    4. state    for each chunk of the sequence, in order, from S = 0:   per (sequence, head, V block)
                    H_chunk = S                  (saved for the backward)
                    U = U_0 - W S                (saved, in U_0's place)
                    S = Diag(exp(G_last)) S + K_e^T U
    5. output   O = Q_g H_chunk + P U                                   per chunk, parallel

Kernel 4 is the only sequential one, so the longest sequence's chunk count times its loop body is
the forward's critical path: the body is two dependent products, and the output, which the
recurrence never reads back, is computed afterwards for all chunks at once.

Every exponent is ``<= 0`` when ``g <= 0``. Kernel 2 computes ``Γ`` and ``P`` in ``16 x 16``
sub-blocks: an off-diagonal block (rows in sub-block ``i``, columns in an earlier sub-block) is one
``tl.dot`` of ``X_i ⊙ exp(G_i - G_ref)`` with ``K_j ⊙ exp(G_ref - G_j)``, ``G_ref`` the cumulative
decay at the first row of sub-block ``i`` (both factors ``<= 1``); a diagonal block by binary
splitting: the pairs ``j < r`` whose positions first differ at bit ``h`` straddle one midpoint, so
each of the ``log2 BC`` levels is one more such product (:func:`_split_factors`).

Backward, four kernels: per chunk in parallel, ``P^T dO`` (the part of ``dU`` that does not depend
on the state gradient); a reverse sequential loop per (sequence, head, V block) carrying ``dS``
(the gradient of the state leaving a chunk) and completing ``dU`` (two dependent products per
chunk); then, per chunk in parallel, one kernel that turns ``dO``, ``dU`` and ``dS`` (with the
saved ``U`` and entering state) into ``dv``, ``dbeta`` and the gradients of ``P`` and ``Γ``, and
one that takes those through the pairwise decays (the same sub-blocks as the forward's) and
through ``G = cumsum(g)`` into ``dq, dk, dg``. See :func:`_kda_backward` for the equations.

Sources: Kimi Team, *Kimi Linear* (arXiv:2510.26692), chunkwise KDA with the WY representation and
the UT transform; flash-linear-attention ``fla/ops/kda/`` (``chunk_kda``: the same factorisation
across several kernels, the sub-block reference point for a stable ``Γ``), read for the math only;
the seed article, "Scheduling without max_seqlen", for the flat grid and ``chunk_offsets``.
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

# What kda_triton accepts (its docstring states them; its checks refuse the rest).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_WIDTHS = (16, 32, 64, 128)  # K and V: tl.dot needs >= 16, registers cap the state at 128 x 128
_CHUNKS = (16, 32, 64)
_SUB = 16  # sub-block of the intra-chunk kernel
_LOG2_SUB = _SUB.bit_length() - 1  # the binary-splitting levels of a diagonal sub-block
# Launch options of the sequential kernels and of the per-chunk backward (ignored by the
# interpreter). Triton pipelines their loops' loads through shared memory; with K = V = 128,
# C = 64 and BV = 64, three stages (the default) ask for more than the 227 KiB an H200 block
# may use (about 320 KiB for the state kernel, compiled for sm_90); these fit.
_SEQUENTIAL = dict(num_warps=4, num_stages=1)
# With bfloat16/float16 inputs the sequential kernels' tiles are stored and multiplied in that
# dtype, and the forward no longer loads Q_g and P: a stage takes about a quarter of the shared
# memory the float32 four-product loop took, so two stages (the next chunk's tiles loaded while
# this one's products run) should fit. UNMEASURED: chosen by that arithmetic, not on the H200.
# 8 warps: compiled for sm_90 at BV = 64 (scripts/kernel_resources.py), 4 warps spilled 664 B
# (state) and 744 B (state backward) of stack per thread, 8 warps 72 B and 24 B.
_SEQUENTIAL_LOW_PRECISION = dict(num_warps=8, num_stages=2)
_CHUNK_BACKWARD = dict(num_warps=8, num_stages=2)  # with value blocks of 32, to fit the H200's shared memory
# The per-chunk kernels with 16-row sub-blocks (intra, wy, pairwise backward): at Triton's default 4
# warps each thread holds 16 floats of every [16, 128] tile and ptxas spilled 1.0-2.4 KiB of stack
# per thread (sm_90, K = 128, C = 64, compiled on a CPU by scripts/kernel_resources.py); at 8 warps
# 0-0.6 KiB. UNMEASURED on the H200: the choice of that count, not of a timing.
_PER_CHUNK = dict(num_warps=8, num_stages=2)


# -----------------------------------------------------------------------------
# Device helpers.


@triton.jit
def _chunk_rows(seq_start, seq_len, chunk, C: tl.constexpr):
    """Packed rows of chunk ``chunk`` of a sequence and which of them are inside it."""
    local = chunk * C + tl.arange(0, C)
    return seq_start + local, local < seq_len


@triton.jit
def _load_rows(ptr, rows, ok, head, H, D: tl.constexpr):
    """Rows ``rows`` of head ``head`` of a contiguous ``[T, H, D]`` tensor as float32, zero where
    not ``ok`` (rows past the sequence are never read, so NaN there cannot leak)."""
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    return tl.load(ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _load_tile(ptr, rows, ok, head, H, D: tl.constexpr):
    """As :func:`_load_rows`, but in the buffer's own dtype: a saved matrix-product operand
    (bfloat16 for bfloat16 inputs) goes to ``tl.dot`` as stored."""
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    return tl.load(ptr + offs, mask=ok[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, x, rows, ok, head, H, D: tl.constexpr):
    offs = (rows[:, None] * H + head) * D + tl.arange(0, D)[None, :]
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _load_row(ptr, row, ok, head, H, D: tl.constexpr):
    """One row ``[D]`` of head ``head`` of a ``[T, H, D]`` tensor, float32, zero if not ``ok``."""
    d = tl.arange(0, D)
    # A vector mask made by a comparison: the interpreter refuses a scalar mask, and a scalar
    # bool broadcast by ``&`` reaches it as integers.
    return tl.load(ptr + (row * H + head) * D + d, mask=d < tl.where(ok, D, 0), other=0.0).to(tl.float32)


@triton.jit
def _state_ptrs(ptr, slot, head, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v_block):
    """Pointers to the ``[K, BV]`` block ``v_block`` of ``ptr[slot, head]``, ``ptr`` a contiguous
    ``[*, H, K, V]`` (64-bit offsets: ``G_cap * H * K * V`` may pass 2**31)."""
    base = (slot.to(tl.int64) * H + head) * (K * V)
    return ptr + base + tl.arange(0, K)[:, None] * V + v_block * BV + tl.arange(0, BV)[None, :]


@triton.jit
def _sequence_program(cu_seqlens, chunk_offsets, num_rows, C: tl.constexpr, BV: tl.constexpr):
    """What program ``(n, head, v_block)`` of a sequential kernel (grid ``(N, H, V // BV)``) walks:
    returns ``n, head, v_block``, sequence slot ``n``'s first packed row and length (clamped into
    the ``num_rows`` rows by :func:`~attn_gym_lite.ops.kernels.tasks.sequence_bounds`), the index
    of its first chunk in ``chunk_offsets`` (its slot in ``states``), its number of chunks and the
    ``BV`` value columns of block ``v_block``. An empty slot has no chunks, so the kernels' chunk
    loops do not run. The chunk count is ``ceil(seq_len / C)`` capped at the slots
    ``chunk_offsets`` gave the sequence (equal on a valid ``cu_seqlens``), so a malformed one
    cannot index ``states`` past its ``G_cap`` slots."""
    n = tl.program_id(0)
    head = tl.program_id(1)
    v_block = tl.program_id(2)
    seq_start, seq_len = sequence_bounds(cu_seqlens, n, num_rows)
    first = tl.load(chunk_offsets + n)
    num_chunks = tl.minimum(tl.cdiv(seq_len, C), tl.load(chunk_offsets + n + 1) - first)
    cols = v_block * BV + tl.arange(0, BV)
    return n, head, v_block, seq_start, seq_len, first, num_chunks, cols


# -----------------------------------------------------------------------------
# Forward kernels.


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_cumsum_kernel(g, g_cum, cu_seqlens, chunk_offsets, num_seqs, num_rows, H,
                      K: tl.constexpr, C: tl.constexpr):
    """``g_cum[r] = g[first row of r's chunk] + ... + g[r]`` (float32), per head and channel.
    Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        x = _load_rows(g, rows, ok, head, H, K)
        _store_rows(g_cum, tl.cumsum(x, 0), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


@triton.jit
def _split_factors(g_cum, G, block_start, block_valid, head, H, K: tl.constexpr, BC: tl.constexpr, bit):
    """One level of the binary splitting of a diagonal ``BC x BC`` sub-block's decays.

    Positions ``j < r`` of the sub-block whose binary forms first differ at bit ``bit`` (``h = 2**bit
    < BC``, a runtime value: the levels are a loop, not unrolled copies) lie on both sides of the
    midpoint ``m = (r // h) * h``: ``j < m <= r``. So
    ``E_rj = exp(G_r - G_m) exp(G_m - G_j)`` with both factors ``<= 1`` whatever the decay, and
    the level's pairs are one matrix product of ``X ⊙ row_f`` with ``(Y ⊙ col_f)^T``. The ``log2 BC``
    levels cover every pair ``j < r`` once; ``j = r`` (``E = 1``) is the caller's.

    ``G``: the sub-block's cumulative decays ``[BC, K]`` (float32, rows ``block_start ..``, zero
    past ``block_valid``). Returns ``row_f`` (``exp(G_r - G_m)`` on rows with bit ``h`` set, else
    0), ``col_f`` (``exp(G_m' - G_j)``, ``m' = (j // 2h) * 2h + h``, on columns with bit ``h``
    clear whose ``m'`` is inside the sequence, else 0), both ``[BC, K]``, and ``at_level``
    ``[BC, BC]``: the pairs ``(r, j)`` this level computes (there ``m = m'``; elsewhere the product
    mixes two midpoints and must be dropped)."""
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
    """The decayed Gram matrices of one chunk, stored row by row into ``[T, H, C]`` buffers::

        gram[r, j] = Σ_d k_rd k_jd exp(G_rd - G_jd)           j <  r   (other entries unspecified)
        qk[r, j]   = scale Σ_d q_rd k_jd exp(G_rd - G_jd)     j <= r   (other entries unspecified)

    ``r, j`` are positions in the chunk. Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C  # packed row of position 0
        valid = tl.minimum(seq_len - chunk * C, C)  # rows of this chunk inside the sequence
        sub = tl.arange(0, BC)
        for i in range(0, C // BC):  # runtime loops: unrolled, the sub-blocks' tiles stayed live together
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
    """The ``[C, C]`` lower triangle (strict if ``STRICT``) of a chunk's rows of a ``[T, H, C]``
    buffer, zero elsewhere and in rows past the sequence."""
    pos = tl.arange(0, C)
    if STRICT:
        lower = pos[None, :] < pos[:, None]
    else:
        lower = pos[None, :] <= pos[:, None]
    offs = (rows[:, None] * H + head) * C + pos[None, :]
    return tl.load(ptr + offs, mask=ok[:, None] & lower, other=0.0)


@triton.jit
def _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K: tl.constexpr, C: tl.constexpr):
    """``G_last``: the cumulative decay at the chunk's last row inside the sequence, ``[K]``."""
    last = seq_start + tl.minimum(chunk * C + C, seq_len) - 1
    return _load_row(g_cum, last, True, head, H, K)


@triton.jit
def _unit_lower_inverse(A, BC: tl.constexpr):
    """``(I + A)^{-1}`` of a strictly lower ``[BC, BC]`` float32 ``A`` by forward substitution: row
    ``r`` of the inverse is ``e_r - Σ_{j<r} A_rj M_j``; the rows above ``r`` are final when it is
    formed, and ``A_rj = 0`` for ``j >= r``, so one masked product with all of ``M`` gives the sum."""
    pos = tl.arange(0, BC)
    M = tl.where(pos[:, None] == pos[None, :], 1.0, 0.0)
    for r in range(1, BC):
        a_r = tl.sum(tl.where(pos[:, None] == r, A, 0.0), 0)  # row r of A, indexed by j
        row = tl.where(pos == r, 1.0, 0.0) - tl.sum(a_r[:, None] * M, 0)
        M = tl.where(pos[:, None] == r, row[None, :], M)
    return M


@triton.jit
def _block_ptrs(ptr, chunk_start, i, j, head, H, C: tl.constexpr, BC: tl.constexpr):
    """Pointers to the ``[BC, BC]`` block ``(i, j)`` (rows of sub-block ``i``, columns of sub-block
    ``j``) of a chunk's rows of a ``[T, H, C]`` buffer."""
    sub = tl.arange(0, BC)
    return ptr + ((chunk_start + i * BC + sub[:, None]) * H + head) * C + j * BC + sub[None, :]


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_wy_kernel(q, k, v, g_cum, beta, gram, inverse, w, u, q_decayed, k_to_end, cu_seqlens, chunk_offsets,
                  num_seqs, num_rows, H, scale, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                  BC: tl.constexpr, PRECISION: tl.constexpr):
    """The UT transform of one chunk: ``M = (I + A)^{-1}`` with ``A = Diag(beta) Γ`` (strictly
    lower), then the WY factors ``W = M Diag(beta) (K ⊙ exp(G))`` and ``U_0 = M Diag(beta) V``.
    Stores ``M`` (``[T, H, C]``, rows of the chunk; its lower triangle, diagonal included, is what
    the backward reads), ``W`` (``[T, H, K]``) and ``U_0`` (``[T, H, V]``), and, so that the
    sequential kernels do no exponentials, ``scale Q ⊙ exp(G)`` and ``K ⊙ exp(G_last - G)``
    (``[T, H, K]``). Grid ``(G_cap, H)``, flat schedule.

    ``M`` is formed by block forward substitution over ``BC x BC`` sub-blocks (as fla's
    ``solve_tril`` does): each diagonal block is inverted by forward substitution over its ``BC``
    rows, then ``M_ij = -M_ii Σ_{j <= l < i} A_il M_lj`` for ``j < i``, block row by block row.
    A chunk-wide forward substitution would take ``C - 1`` dependent steps, each a reduction over a
    ``[C, C]`` tile; here the dependent steps are ``BC - 1`` on ``[BC, BC]`` tiles, and the rest are
    small products. The blocks travel through ``inverse`` itself (a barrier after each block row
    makes them visible to the whole program), so no register tile has to be cut into blocks. The
    products use IEEE float32 whatever the inputs' dtype: the solve is kept as exact as the
    element-wise one it replaces."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
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
            tl.debug_barrier()  # block row i stored: the next rows, and the full load below, read it
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
    """The recurrence across chunks, and nothing else. Program ``(n, head, v_block)`` walks
    sequence slot ``n``'s chunks in order with its ``[K, BV]`` state block in registers and, per
    chunk, saves the entering state ``S`` in ``states`` (``[G_cap, H, K, V]`` in the storage dtype,
    indexed by ``chunk_offsets``), turns ``U_0`` into ``U = U_0 - W S`` in place in ``u`` and moves the
    state on; if ``STORE_FINAL``, it stores the state after the last chunk in ``final`` (float32
    ``[N, H, K, V]``; zero for an empty sequence; otherwise ``final`` is never touched and may be
    any pointer). Grid ``(N, H, V // BV)``.

    This loop is the critical path of the whole forward: the longest sequence's chunks run one
    after another here while every other kernel is parallel over chunks. So it holds only what
    the next chunk's state needs, two dependent products per chunk (``W S``, then ``K_e^T U``);
    the output ``Q_g S + P U``, which nothing later in the loop reads, is left to
    :func:`kda_output_kernel`, which runs on every chunk at once from the saved ``S`` and ``U``."""
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
    """The output of one chunk, ``O = Q_g S + P U`` (``Q_g = scale Q ⊙ exp(G)``, ``S`` the saved
    entering state, ``U`` the state-corrected values :func:`kda_state_kernel` left in ``u``), for
    the ``BV`` value columns of block ``program_id(2)``. Grid ``(G_cap, H, V // BV)``, flat
    schedule: program ``(i, head, v_block)`` has chunk ``i`` of the flat chunk list, whose
    entering state is slot ``i`` of ``states``."""
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
    """The part of ``dU`` that does not depend on the state gradient, ``P^T dO`` (rows of the
    storage-dtype ``[T, H, V]`` ``d_u``), for the ``BV`` value columns of block ``program_id(2)``.
    It runs on every chunk at once, before :func:`kda_state_backward_kernel`, which adds the
    rest: that keeps this product off the backward's sequential critical path.
    Grid ``(G_cap, H, V // BV)``, flat schedule."""
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
    """The recurrence backwards. Program ``(n, head, v_block)`` walks sequence slot ``n``'s chunks
    from last to first carrying ``dS``, the gradient of the state leaving the chunk (for the last
    one, ``d_final`` if ``HAS_D_FINAL``, else zero and ``d_final`` is never read), and per chunk::

        d_states[chunk] = dS                                   ([G_cap, H, K, V], storage dtype)
        dU += (K ⊙ exp(G_last - G)) dS                          ([T, H, V] rows, in place)
        dS = Diag(exp(G_last)) dS + (scale Q ⊙ exp(G))^T dO - W^T dU

    the last line being the gradient of the state entering the chunk; ``d_u`` arrives holding
    ``P^T dO`` (:func:`kda_local_du_kernel`). The critical path from one chunk's ``dS`` to the
    next is two dependent products (``K_e dS``, then ``W^T dU``); ``Q_g^T dO`` does not depend on
    ``dS`` and overlaps them (taking it out too would cost a ``[G_cap, H, K, V]`` buffer written
    and read back, more traffic than the two tiles it reads). Grid ``(N, H, V // BV)``."""
    n, head, v_block, seq_start, seq_len, first, num_chunks, cols = _sequence_program(cu_seqlens, chunk_offsets,
                                                                                      num_rows, C, BV)
    if HAS_D_FINAL:
        dS = tl.load(_state_ptrs(d_final, n, head, H, K, V, BV, v_block))
    else:
        dS = tl.zeros([K, BV], tl.float32)
    for step in range(0, num_chunks):
        chunk = num_chunks - 1 - step
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        # As in the forward: dS accumulates in float32, the products take it rounded to the
        # saved buffers' dtype, and dU rounded as stored.
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
    """Columns ``cols`` of rows ``rows`` of head ``head`` of a contiguous ``[T, H, D]`` tensor, as
    float32, zero where not ``ok``."""
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
    """The per-chunk backward up to the pairwise terms, given ``dO``, ``dU`` and the state
    gradients from :func:`kda_state_backward_kernel` (equations in :func:`_kda_backward`).
    Writes the chunk's rows of ``dv`` and ``dbeta`` (final), the coefficients of the pairwise
    terms ``d_qk_out`` (dL/dP times ``scale``) and ``d_gram_out`` (dL/dA_rj times ``beta_r``),
    both float32 ``[T, H, C]``, and float32 partial ``dq, dk`` and ``dL/dG`` for
    :func:`kda_pairwise_backward_kernel`. Grid ``(G_cap, H)``, flat schedule (fixed, not a
    parameter: under it, program ``(i, head)`` has chunk ``i`` of the flat chunk list, whose
    entering state and state gradient are slot ``i`` of ``states`` and ``d_states``).

    The work is cut so that few tiles are live at once: first the terms that do not involve the
    key dimension (``dP``, ``dU``'s share of ``dM``, ``dv``), one value block at a time; then, one
    block of ``BK`` key channels at a time, the ``[C, BK]`` products with the states (``dQ_g``,
    ``dW``, ``dK_e``, each summed over the value blocks) and everything they give column by
    column, adding that block's share to ``dM``; last ``dA`` from the complete ``dM``. Every
    channel of ``dq``, ``dk``, ``dG`` depends on its own column only, so the blocks are
    independent; the ``U``, ``dU``, ``dO`` tiles are read once per key block (``K / BK`` extra
    reads of a few KiB), and the float32 accumulators held at once shrink from three ``[C, K]``
    to three ``[C, BK]`` (see ``_key_block``)."""
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
    """A ``[len(rows), len(cols)]`` block of a ``[T, H, C]`` buffer (float32), zero where not ``ok``."""
    return tl.load(ptr + (rows[:, None] * H + head) * C + cols[None, :], mask=ok[:, None], other=0.0)


@triton.jit(do_not_specialize=["num_seqs", "num_rows"])
def kda_pairwise_backward_kernel(q, k, g_cum, d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk, dg,
                                 cu_seqlens, chunk_offsets, num_seqs, num_rows, H, K: tl.constexpr, C: tl.constexpr,
                                 BC: tl.constexpr, LOG2_BC: tl.constexpr, PRECISION: tl.constexpr):
    """The pairwise terms of the backward, then the chain through ``G = cumsum(g)``.

    With coefficients ``c^P_rj`` (``d_qk``: dL/dP_rj, times ``scale``) and ``c^Γ_rj``
    (``d_gram``: dL/dA_rj, times ``beta_r``), per sub-block of ``BC`` rows::

        row side     dq_r += Σ_{j<=r} c^P_rj k_j ⊙ E_rj      dk_r += Σ_{j<r} c^Γ_rj k_j ⊙ E_rj
        column side  dk_j += Σ_{r>=j} (c^P_rj q_r + c^Γ_rj k_r) ⊙ E_rj
        dG_r += q_r ⊙ (row side of dq_r) + k_r ⊙ (row side of dk_r) - k_r ⊙ (column side of dk_r)

    Off-diagonal sub-blocks are ``tl.dot`` products through the reference point of the *later*
    sub-block (its first row), as in :func:`kda_intra_kernel`; diagonal ones by binary splitting
    (:func:`_split_factors`), as there too.
    Sub-blocks run from the chunk's last to its first, carrying ``Σ dG`` of the later rows, so
    ``dg_r = Σ_{r' >= r} dG_r'`` comes out block by block. Adds the partial gradients of
    :func:`kda_chunk_backward_kernel` and writes ``dq, dk, dg``. Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, num_rows, C, "flat")
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, num_rows, "flat")
        chunk_start = seq_start + chunk * C
        valid = tl.minimum(seq_len - chunk * C, C)
        sub = tl.arange(0, BC)
        later = tl.zeros([K], tl.float32)  # Σ dG over the rows after this sub-block
        for i_back in range(0, C // BC):  # last sub-block first; runtime loops (unrolled, tiles stayed live)
            i = C // BC - 1 - i_back
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
            # dg_r = Σ_{r' >= r} dG_r': the later sub-blocks' total plus a reverse cumsum in this one.
            d_g = later[None, :] + tl.sum(dG, 0)[None, :] - tl.cumsum(dG, 0) + dG
            later += tl.sum(dG, 0)
            _store_rows(dq, d_q, rows_i, ok_i, head, H, K)
            _store_rows(dk, d_k, rows_i, ok_i, head, H, K)
            _store_rows(dg, d_g, rows_i, ok_i, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, "flat")


# -----------------------------------------------------------------------------
# Host side: checks (metadata only), buffers, launches.


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Every decision of one call that depends only on metadata: sizes, launch options, and
    whether this call reads ``cu_seqlens``'s values on the host."""

    T: int
    H: int
    K: int
    V: int
    N: int
    C: int
    scale: float
    G_cap: int  # programs per head of the per-chunk kernels
    precision: str  # tl.dot's input_precision (for float32 operands)
    storage: torch.dtype  # dtype of the saved matrix-product operands (states, W, U, P, Q_g, K_e, dU, dS)
    value_block: int  # BV of the sequential kernels
    backward_value_block: int  # BV of kda_chunk_backward_kernel (see _CHUNK_BACKWARD)
    validate: bool  # validate=None resolved: read cu_seqlens's values (a host tensor only)
    final_state: bool  # output_final_state: allocate and write the [N, H, K, V] final states


def _check_arguments(q: object, k: object, v: object, g: object, beta: object, cu_seqlens: object,
                     scale: object, chunk_size: object, output_final_state: object,
                     validate: object) -> _Plan:
    """The reference's argument rules that read only metadata, plus the kernels' own limits;
    returns the launch plan they allow."""
    T, H, K = check_kda_metadata(q, k, v, g, beta, cu_seqlens, dtypes=_DTYPES, widths=_WIDTHS,
                                 width_rule=f"in {_WIDTHS} (a power of two the kernels tile)")
    V = v.shape[2]
    device = q.device
    scale = K**-0.5 if scale is None else checks.check_real("scale", scale)
    C = checks.check_int("chunk_size", chunk_size)
    if C not in _CHUNKS:
        raise ValueError(f"chunk_size must be one of {_CHUNKS}, got {C}")
    checks.check_bool("output_final_state", output_final_state)
    if validate is not None:
        checks.check_bool("validate", validate)
    # The device rule of ops.kernels.varlen's _check_inputs, which is private there and bundled
    # with attention's own rules; this one also refuses meta tensors under the interpreter.
    if INTERPRETED and device.type != "cpu":
        # The interpreter runs kernels on the host through data pointers: CUDA tensors give wrong
        # results, and a meta tensor has no data at all.
        raise ValueError(
            "q must be a CPU tensor while TRITON_INTERPRET=1 (the interpreter runs the kernels on the "
            f"host), got device {device}"
        )
    if not INTERPRETED and not q.is_cuda:
        raise ValueError(
            f"q must be a CUDA tensor (or set TRITON_INTERPRET=1 before importing attn_gym_lite to run "
            f"the kernels on CPU), got device {device}"
        )
    # Row offsets are 32-bit: every [T, H, *] buffer must stay below 2**31 elements.
    if T * H * max(K, V, C) > checks.INT32_MAX:
        raise ValueError(
            f"q must have T * H * max(K, V, C) below 2**31 (the kernels' row offsets are 32-bit), got "
            f"T = {T}, H = {H}, K = {K}, V = {V}, C = {C}"
        )
    N = cu_seqlens.numel() - 1
    return _Plan(
        T=T, H=H, K=K, V=V, N=N, C=C, scale=scale, G_cap=chunk_capacity(T, N, C),
        # float32 inputs get full-precision products; lower-precision inputs are already rounded
        # more coarsely than tf32 rounds the float32 intermediates.
        precision="ieee" if q.dtype == torch.float32 else "tf32",
        # bfloat16/float16 inputs: the operands that feed only matrix products are stored and
        # multiplied in that dtype, accumulated in float32 (as fla does); float32 stays float32.
        storage=q.dtype,
        value_block=_value_block(V), backward_value_block=_value_block(V, 32),
        # A host tensor's values cost nothing to read; a device tensor's would cost a sync.
        validate=cu_seqlens.device.type == "cpu" if validate is None else validate,
        final_state=output_final_state,
    )


def _sequential(plan: _Plan) -> dict:
    """Launch options of the sequential kernels for the plan's storage dtype."""
    return _SEQUENTIAL if plan.storage == torch.float32 else _SEQUENTIAL_LOW_PRECISION


def _value_block(V: int, largest: int = 64) -> int:
    # The interpreter runs programs one after another: one block is fastest there. On the GPU a
    # [128, 64] float32 state block is 64 registers per thread at 4 warps; the per-chunk backward
    # takes 32 columns at a time to fit its shared memory (see _CHUNK_BACKWARD).
    return V if INTERPRETED else min(V, largest)


def _key_block(K: int) -> int:
    # The per-chunk backward's key channels per block. Compiled for sm_90 at K = V = 128, C = 64,
    # 8 warps, value blocks of 32 (scripts/kernel_resources.py), the spilled stack per thread was
    # 2448 B with the whole K at once, 856 B with blocks of 64 and 184 B with blocks of 32; 16 in
    # the interpreter, so that the tests (K = 32) run the split.
    return min(K, 16 if INTERPRETED else 32)


# In eager mode the host time of a call is part of every step, and everything _check_arguments
# decides depends on metadata only: decide it once per call signature (as ops.kernels.varlen's
# _PLANS does); a repeated call costs one dictionary lookup.
_PLANS = checks.SignatureCache()


def _plan(q: object, k: object, v: object, g: object, beta: object, cu_seqlens: object, scale: object,
          chunk_size: object, output_final_state: object, validate: object) -> _Plan:
    # Each flag is keyed with its type: 64.0 == 64 and 1 == True hash alike, and a cached plan
    # must not let through what the checks refuse (a float chunk_size, an int flag).
    flags = tuple((type(x), x) for x in (scale, chunk_size, output_final_state, validate))
    key = _PLANS.key((q, k, v, g, beta, cu_seqlens), *flags)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _check_arguments(q, k, v, g, beta, cu_seqlens, scale, chunk_size, output_final_state, validate)
        _PLANS.put(key, plan)
    return plan


def _kda_forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                 plan: _Plan) -> tuple[Tensor, Tensor | None, dict[str, Tensor]]:
    """Runs the five forward kernels; returns ``(o, final_state, saved)`` where ``final_state`` is
    ``None`` unless ``plan.final_state`` (then it is neither allocated nor written) and ``saved``
    holds the per-chunk quantities the backward reads (``chunk_offsets``, ``G``, ``Γ``, ``P``,
    ``M``, ``W``, ``U`` (in ``u``, where kernel 3 left ``U_0``), ``Q_g``, ``K_e`` and the entering
    states)."""
    T, H, K, V, N, C = plan.T, plan.H, plan.K, plan.V, plan.N, plan.C
    f32 = dict(dtype=torch.float32, device=q.device)
    # What only feeds matrix products is kept in plan.storage (the inputs' dtype for bfloat16 and
    # float16, float32 for float32); the decay cumsum, Γ (which builds A) and the inverse M stay
    # float32, as the triangular solve needs them exact to float32.
    low = dict(dtype=plan.storage, device=q.device)
    # On the device, one launch, no host read; clamped into the T rows as the kernels clamp.
    offsets = launch_chunk_offsets(cu_seqlens, C, token_capacity=T)
    g_cum = torch.empty(T, H, K, **f32)
    gram = torch.empty(T, H, C, **f32)
    qk = torch.empty(T, H, C, **low)
    inverse = torch.empty(T, H, C, **f32)
    w = torch.empty(T, H, K, **low)
    u = torch.empty(T, H, V, **low)
    q_decayed = torch.empty(T, H, K, **low)
    k_to_end = torch.empty(T, H, K, **low)
    states = torch.empty(max(plan.G_cap, 1), H, K, V, **low)
    final = torch.empty(N, H, K, V, **f32) if plan.final_state else None
    o = torch.zeros(T, H, V, dtype=q.dtype, device=q.device)  # rows L .. T - 1 stay zero
    precision = plan.precision
    if plan.G_cap > 0:
        grid = (plan.G_cap, H)
        common = (cu_seqlens, offsets, N, T, H)
        kda_cumsum_kernel[grid](g, g_cum, *common, K=K, C=C)
        kda_intra_kernel[grid](q, k, g_cum, gram, qk, *common, plan.scale, K=K, C=C, BC=_SUB, LOG2_BC=_LOG2_SUB,
                               PRECISION=precision, **_PER_CHUNK)
        kda_wy_kernel[grid](q, k, v, g_cum, beta, gram, inverse, w, u, q_decayed, k_to_end, *common, plan.scale,
                            K=K, V=V, C=C, BC=_SUB, PRECISION=precision, **_PER_CHUNK)
    BV = plan.value_block
    # Without a final state, `states` stands in for its pointer: STORE_FINAL=False never writes it.
    kda_state_kernel[(N, H, V // BV)](g_cum, k_to_end, w, u, states, states if final is None else final,
                                      cu_seqlens, offsets, T, H, K=K, V=V, C=C, BV=BV, PRECISION=precision,
                                      STORE_FINAL=final is not None, **_sequential(plan))
    if plan.G_cap > 0:  # u now holds U = U_0 - W S
        kda_output_kernel[(plan.G_cap, H, V // BV)](q_decayed, qk, u, states, o, cu_seqlens, offsets, N, T, H,
                                                    K=K, V=V, C=C, BV=BV, PRECISION=precision)
    saved = dict(offsets=offsets, g_cum=g_cum, gram=gram, qk=qk, inverse=inverse, w=w, u=u, q_decayed=q_decayed,
                 k_to_end=k_to_end, states=states)
    return o, final, saved


def _kda_backward(q: Tensor, k: Tensor, v: Tensor, g_dtype: torch.dtype, beta: Tensor, cu_seqlens: Tensor,
                  saved: dict[str, Tensor], d_o: Tensor | None, d_final: Tensor | None,
                  plan: _Plan) -> tuple[Tensor, ...]:
    r"""Gradients of ``(q, k, v, g, beta)`` from those of ``o`` and ``final_state``; four kernels.

    Per chunk (one head; ``S_0``, ``S_1`` the states entering and leaving it, ``Q_g = scale Q ⊙
    exp(G)``, ``K_e = K ⊙ exp(G_last - G)``, ``B_k = Diag(beta) (K ⊙ exp(G))``, ``B_v = Diag(beta)
    V``, ``M = (I + Diag(beta) Γ)^{-1}``), from ``O = Q_g S_0 + P U``, ``U = M B_v - M B_k S_0``,
    ``S_1 = Diag(exp(G_last)) S_0 + K_e^T U``::

        per chunk:             dU = P^T dO
        sequential (reverse):  dU += K_e dS_1
                               dS_0 = Q_g^T dO + Diag(exp(G_last)) dS_1 - W^T dU
        per chunk:             dP = tril(dO U^T)     dQ_g = dO S_0^T     dW = -dU S_0^T
                               dK_e = U dS_1^T       dB_v = M^T dU       dB_k = M^T dW
                               dM = dU B_v^T + dW B_k^T                  dA = -stril(M^T dM M^T)

    then the pairwise terms of ``P_rj = scale Σ_d q_rd k_jd E_rjd`` and ``Γ_rj`` (the same with
    ``k_r``), whose ``G``-gradient is ``x_r ⊙ (row-side gradient) - k_j ⊙ (column-side
    gradient)``, and the chain through ``G = cumsum(g)``: ``dg`` is the reverse cumulative sum of
    ``dG`` over the chunk.
    """
    T, H, K, V, N, C = plan.T, plan.H, plan.K, plan.V, plan.N, plan.C
    device = q.device
    f32 = dict(dtype=torch.float32, device=device)
    # A None gradient (nothing downstream used that output; the Function does not materialise
    # zeros) is zero: dO is read by three kernels, so it becomes a zero buffer; dS_final only
    # starts the reverse recurrence, which starts from zero instead (HAS_D_FINAL=False).
    d_o = torch.zeros(T, H, V, dtype=q.dtype, device=device) if d_o is None else d_o.contiguous()
    d_final = None if d_final is None else d_final.float().contiguous()
    d_u = torch.empty(T, H, V, dtype=plan.storage, device=device)
    d_states = torch.empty_like(saved["states"])  # plan.storage too
    d_qk, d_gram = torch.empty(T, H, C, **f32), torch.empty(T, H, C, **f32)
    dq_part, dk_part, dG_part = (torch.empty(T, H, K, **f32) for _ in range(3))
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))  # rows L .. T - 1 stay zero
    # g itself is not needed (its cumulative sum is saved): only its dtype, for its gradient.
    dg, dbeta = torch.zeros(T, H, K, dtype=g_dtype, device=device), torch.zeros_like(beta)
    precision = plan.precision
    BV = plan.value_block
    offsets = saved["offsets"]
    if plan.G_cap > 0:  # d_u = P^T dO, on every chunk at once
        kda_local_du_kernel[(plan.G_cap, H, V // BV)](saved["qk"], d_o, d_u, cu_seqlens, offsets, N, T, H, V=V, C=C,
                                                      BV=BV, PRECISION=precision)
    kda_state_backward_kernel[(N, H, V // BV)](saved["g_cum"], saved["q_decayed"], saved["k_to_end"], saved["w"],
                                               d_o, d_states if d_final is None else d_final, d_u, d_states,
                                               cu_seqlens, offsets, T, H, K=K, V=V, C=C, BV=BV, PRECISION=precision,
                                               HAS_D_FINAL=d_final is not None, **_sequential(plan))
    if plan.G_cap > 0:
        kda_chunk_backward_kernel[(plan.G_cap, H)](
            q, k, v, saved["g_cum"], beta, saved["gram"], saved["inverse"], saved["u"],
            saved["states"], d_o, d_u, d_states, dv, dbeta, d_qk, d_gram, dq_part, dk_part, dG_part,
            cu_seqlens, offsets, N, T, H, plan.scale,
            K=K, V=V, C=C, BK=_key_block(K), BV=plan.backward_value_block, PRECISION=precision, **_CHUNK_BACKWARD,
        )
        kda_pairwise_backward_kernel[(plan.G_cap, H)](
            q, k, saved["g_cum"], d_qk, d_gram, dq_part, dk_part, dG_part, dq, dk, dg, cu_seqlens, offsets, N, T, H,
            K=K, C=C, BC=_SUB, LOG2_BC=_LOG2_SUB, PRECISION=precision, **_PER_CHUNK,
        )
    return dq, dk, dv, dg, dbeta


class _KDATriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                plan: _Plan) -> tuple[Tensor, Tensor | None]:
        # An output nothing downstream used gets a None gradient instead of a zero tensor (the
        # backward treats None as zero): no [N, H, K, V] buffer of zeros for an unused final state.
        ctx.set_materialize_grads(False)
        o, final, saved = _kda_forward(q, k, v, g, beta, cu_seqlens, plan)
        ctx.save_for_backward(q, k, v, beta, cu_seqlens, *saved.values())
        ctx.saved_names = tuple(saved)
        ctx.g_dtype = g.dtype
        ctx.plan = plan
        return o, final

    @staticmethod
    def backward(ctx, d_o: Tensor | None, d_final: Tensor | None):
        q, k, v, beta, cu_seqlens, *rest = ctx.saved_tensors
        saved = dict(zip(ctx.saved_names, rest))
        grads = _kda_backward(q, k, v, ctx.g_dtype, beta, cu_seqlens, saved, d_o, d_final, ctx.plan)
        return (*grads, None, None)


def kda_triton(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
               scale: float | None = None, chunk_size: int = 64, output_final_state: bool = False,
               validate: bool | None = None) -> tuple[Tensor, Tensor | None]:
    r"""KDA (Kimi Delta Attention) on a packed batch by chunked Triton kernels, CUDA-graph safe.

    Computes, for every sequence of the batch independently and from a zero state (one head shown,
    ``S`` is ``K x V``)::

        S = Diag(exp(g_t)) S;   S = S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T (scale q_t)

    in the chunked (WY / UT transform) form of :func:`attn_gym_lite.ops.kda.kda_chunked`, which
    is the specification: same arguments, shapes and results up to rounding.

    Args:
        q, k: ``[T, H, K]`` queries and keys, float32 / bfloat16 / float16, one dtype with ``v``;
            ``K`` in 16, 32, 64, 128. Not normalised here (Kimi Linear L2-normalises them first).
        v: ``[T, H, V]`` values, ``V`` in 16, 32, 64, 128.
        g: ``[T, H, K]`` per-channel log-decay (natural log, ``<= 0``), float32 / bfloat16 / float16.
            Its values are not checked (that would read the device): with ``g > 0`` the kernels'
            exponents turn positive and may overflow to inf/NaN where the recurrence would not.
        beta: ``[T, H]`` delta-rule step sizes in ``(0, 1)``, float32 / bfloat16 / float16. Not
            checked either: any finite value is computed as the formula says, but only ``(0, 1)``
            (with L2-normalised keys) keeps the state bounded.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L]`` on ``q``'s device, ``L <= T``.
            Not read on the host unless validated (see ``validate``): under a CUDA graph, copy each batch's
            ``cu_seqlens`` into the captured buffer and replay.
        scale: factor on ``q``; default ``K ** -0.5``.
        chunk_size: ``C``, 16, 32 or 64 tokens per chunk (default 64, fla's). The result does
            not depend on it up to rounding.
        output_final_state: also return every sequence's state after its last token. Without
            it the ``[N, H, K, V]`` buffer is neither allocated nor written.
        validate: read ``cu_seqlens`` on the host and check its values (starts at 0, never
            decreases, ``L <= T``) before any kernel runs. ``None`` (default): only when
            ``cu_seqlens`` is a CPU tensor (the interpreter), where reading it costs no device
            sync; ``True``: also on CUDA (one sync per call; skipped while the stream is
            capturing); ``False``: never. Unchecked values are not an error: the kernels clamp
            every sequence into the ``T`` rows (and its chunks into the slots ``chunk_offsets``
            gave it), so a malformed ``cu_seqlens`` gives wrong results, never an access outside
            the tensors, and never a clean error either. Validate batches where they are built
            (:func:`attn_gym_lite.ragged.validate_cu_seqlens`) or pass ``validate=True`` while
            debugging.

    Returns:
        ``(o, final_state)``: ``o`` ``[T, H, V]`` in ``q``'s dtype, rows ``L .. T - 1`` zero;
        ``final_state`` float32 ``[N, H, K, V]`` (zero for an empty sequence) if
        ``output_final_state``, else ``None``. float32 inputs: float32 throughout. bfloat16/float16
        inputs: the operands that only feed matrix products (per-chunk states and their
        gradients, ``W``, ``U``, ``P``, ``Q_g``, ``K_e``, ``dU``) are stored and multiplied in that
        dtype with float32 accumulation, as fla does; the decay cumsum, the exponentials, ``Γ``,
        ``A`` and the triangular solve stay float32 (other products of float32 intermediates use
        tf32 tensor cores on the GPU). Differentiable with respect
        to ``q, k, v, g, beta`` (and through ``final_state``); rows ``L .. T - 1`` of the inputs
        are never read (NaN there is harmless) and get zero gradients.

    Raises:
        TypeError: an argument is not a tensor or has a dtype outside float32/bfloat16/float16
            (``cu_seqlens``: not int32), ``k``/``v`` differ from ``q``'s dtype, ``scale`` is not
            a real number, ``chunk_size`` not an int, a flag not a bool (``validate``: nor
            ``None``).
        ValueError: a wrong number of dims, a shape that disagrees with ``q``'s, ``K`` or ``V``
            not in 16, 32, 64, 128, ``chunk_size`` not in 16, 32, 64, another device, a CPU
            tensor without the interpreter (or a CUDA one with it), a malformed ``cu_seqlens``
            layout (and, when validated, malformed values), a ``[T, H, *]`` buffer of 2**31
            elements or more.

    Cost: the per-chunk kernels run on ``G_cap`` programs per head (``G_cap x V / BV`` for the
    output and ``P^T dO``; :func:`attn_gym_lite.schedule.chunk_capacity`), the recurrence on ``N x H x V / BV``
    programs, each looping over its own sequence's chunks. Memory kept for the backward: float32
    ``[T, H, K + 2C]``, ``[T, H, 3K + V + C]`` and the entering state of every chunk,
    ``[G_cap, H, K, V]``, in the storage dtype (the inputs' for bfloat16/float16, else float32);
    the backward adds float32 ``[T, H, 3K + 2C]``, storage-dtype ``[T, H, V]`` and
    ``[G_cap, H, K, V]`` of scratch (and a ``[T, H, V]`` zero ``dO`` when only ``final_state`` is
    used downstream).
    On the host, the argument checks above and the launch plan depend only on metadata (shapes,
    strides, dtypes, devices, the other arguments): they run once per such signature, and a
    repeated call costs a dictionary lookup (plus the values check when ``validate`` says so).

    Source: Kimi Linear (arXiv:2510.26692), chunkwise KDA; flash-linear-attention
    ``fla/ops/kda`` (``chunk_kda``) for the decomposition. See
    :mod:`attn_gym_lite.ops.kda.chunked_triton`.
    """
    plan = _plan(q, k, v, g, beta, cu_seqlens, scale, chunk_size, output_final_state, validate)
    # The values change from call to call: read them every call the plan says to, but never while
    # the stream captures (the read would synchronise with the device and break the capture).
    if plan.validate and not (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        checks.check_cu_seqlens_values(cu_seqlens, token_capacity=plan.T)
    g = g.clamp_min(LOG_DECAY_FLOOR)  # strong and infinite decays stay exact (see LOG_DECAY_FLOOR)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o, final = _KDATriton.apply(q, k, v, g, beta, cu_seqlens, plan)  # final: None unless output_final_state
    return o, final
