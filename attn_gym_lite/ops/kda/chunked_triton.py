r"""``kda_triton``: chunked KDA on packed batches in Triton, graph-safe, forward and backward.

The same function as :func:`attn_gym_lite.ops.kda.reference.kda_chunked` (read that module for the
math and the conventions: decay first, delta rule, read after update; ``g`` natural-log per-channel
decay; ``scale = K ** -0.5`` by default), computed by kernels whose launch grids depend only on
``T``, ``N``, ``H`` and ``C``: no value of ``cu_seqlens`` is ever read on the host, so a CUDA graph
captured once replays correctly for every layout of the same capacity.

Work is cut the way a ragged kernel cuts it (DESIGN.md's vocabulary): every sequence is split into
chunks of ``C`` tokens starting at its first row, a chunk never spans two sequences, and
``chunk_offsets`` (built on the device by
:func:`attn_gym_lite.ops.kernels.offsets.chunk_offsets_kernel`) numbers the ``G_active`` chunks
of the batch. Per-chunk kernels run on a flat grid of ``G_cap = min(T, N) + (T - min(T, N)) // C``
programs per head (:func:`attn_gym_lite.schedule.chunk_capacity`); a program past ``G_active``
exits. The recurrence across chunks runs on a grid of one program per (sequence slot, head,
value block), each looping over its own sequence's chunks.

Forward, four kernels (one head of one chunk of ``c <= C`` rows; ``G`` is the within-chunk
cumulative log-decay, ``E_rj = exp(G_r - G_j)`` for ``j <= r``)::

    1. cumsum   G = cumsum(g)                                           per chunk, parallel
    2. intra    Γ_rj = Σ_d k_rd k_jd E_rjd  (j < r)                     per chunk, parallel
                P_rj = scale Σ_d q_rd k_jd E_rjd  (j <= r)
    3. wy       M = (I + Diag(beta) Γ)^{-1}                             per chunk, parallel
                W = M Diag(beta) (K ⊙ exp(G)),   U_0 = M Diag(beta) V
    4. state    for each chunk of the sequence, in order, from S = 0:   per (sequence, head, V block)
                    H_chunk = S                  (saved for the backward)
                    U = U_0 - W S
                    O = (scale Q ⊙ exp(G)) S + P U
                    S = Diag(exp(G_last)) S + (K ⊙ exp(G_last - G))^T U

Every exponent is ``<= 0`` when ``g <= 0``. Kernel 2 computes ``Γ`` and ``P`` in ``16 x 16``
sub-blocks: an off-diagonal block (rows in sub-block ``i``, columns in an earlier sub-block) is one
``tl.dot`` of ``X_i ⊙ exp(G_i - G_ref)`` with ``K_j ⊙ exp(G_ref - G_j)``, ``G_ref`` the cumulative
decay at the first row of sub-block ``i`` (both factors ``<= 1``); a diagonal block is built column
by column with the exponent masked to ``j <= r`` before ``exp``.

Backward, two kernels: a reverse sequential loop per (sequence, head, V block) carrying ``dS``
(the gradient of the state leaving a chunk) and producing ``dU``; then one parallel kernel per
chunk that rebuilds ``U`` from the saved entering state and turns ``dO``, ``dU`` and ``dS`` into
``dq, dk, dv, dg, dbeta``. See :func:`_kda_backward` for the equations.

Sources: Kimi Team, *Kimi Linear* (arXiv:2510.26692), chunkwise KDA with the WY representation and
the UT transform; flash-linear-attention ``fla/ops/kda/`` (``chunk_kda``: the same factorisation
across several kernels, the sub-block reference point for a stable ``Γ``), read for the math only;
the seed article, "Scheduling without max_seqlen", for the flat grid and ``chunk_offsets``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import checks
from ...schedule import chunk_capacity
from ..kernels.offsets import chunk_offsets_kernel
from ..kernels.tasks import first_task, next_task, task_at

Tensor = torch.Tensor

__all__ = ["kda_triton"]

# Triton's interpreter replaces every @triton.jit function when TRITON_INTERPRET=1 is set before
# the kernels are defined; it runs on CPU tensors only.
INTERPRETED = type(chunk_offsets_kernel).__name__ == "InterpretedFunction"

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_WIDTHS = (16, 32, 64, 128)  # K and V: tl.dot needs >= 16, registers cap the state at 128 x 128
_CHUNKS = (16, 32, 64)
_SUB = 16  # sub-block of the intra-chunk kernel
_INT32_MAX = 2**31 - 1


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
    float32 ``[*, H, K, V]`` (64-bit offsets: ``G_cap * H * K * V`` may pass 2**31)."""
    base = (slot.to(tl.int64) * H + head) * (K * V)
    return ptr + base + tl.arange(0, K)[:, None] * V + v_block * BV + tl.arange(0, BV)[None, :]


# -----------------------------------------------------------------------------
# Forward kernels.


@triton.jit(do_not_specialize=["num_seqs"])
def kda_cumsum_kernel(g, g_cum, cu_seqlens, chunk_offsets, num_seqs, H,
                      K: tl.constexpr, C: tl.constexpr, SCHEDULE: tl.constexpr):
    """``g_cum[r] = g[first row of r's chunk] + ... + g[r]`` (float32), per head and channel.
    Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, C, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, SCHEDULE)
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        x = _load_rows(g, rows, ok, head, H, K)
        _store_rows(g_cum, tl.cumsum(x, 0), rows, ok, head, H, K)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, SCHEDULE)


@triton.jit(do_not_specialize=["num_seqs"])
def kda_intra_kernel(q, k, g_cum, gram, qk, cu_seqlens, chunk_offsets, num_seqs, H, scale,
                     K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, SCHEDULE: tl.constexpr,
                     PRECISION: tl.constexpr):
    """The decayed Gram matrices of one chunk, stored row by row into ``[T, H, C]`` buffers::

        gram[r, j] = Σ_d k_rd k_jd exp(G_rd - G_jd)           j <  r   (other entries unspecified)
        qk[r, j]   = scale Σ_d q_rd k_jd exp(G_rd - G_jd)     j <= r   (other entries unspecified)

    ``r, j`` are positions in the chunk. Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, C, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, SCHEDULE)
        chunk_start = seq_start + chunk * C  # packed row of position 0
        valid = tl.minimum(seq_len - chunk * C, C)  # rows of this chunk inside the sequence
        sub = tl.arange(0, BC)
        for i in tl.static_range(C // BC):
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
            for j in tl.static_range(i):
                c = j * BC + sub
                ok_j = c < tl.where(block_ok, valid, 0)  # nothing if sub-block i is all padding
                k_j = _load_rows(k, chunk_start + c, ok_j, head, H, K)
                G_j = _load_rows(g_cum, chunk_start + c, ok_j, head, H, K)
                k_from_ref = k_j * tl.exp(tl.where(ok_j[:, None], ref[None, :] - G_j, 0.0))  # <= 1: before ref
                a = tl.dot(k_ref, tl.trans(k_from_ref), input_precision=PRECISION)
                p = tl.dot(q_ref, tl.trans(k_from_ref), input_precision=PRECISION) * scale
                tl.store(gram + out + c[None, :], a, mask=ok_i[:, None])
                tl.store(qk + out + c[None, :], p, mask=ok_i[:, None])
            # The diagonal sub-block, one column at a time: mask the exponent to j <= r before exp.
            a = tl.zeros([BC, BC], tl.float32)
            p = tl.zeros([BC, BC], tl.float32)
            for jj in range(BC):
                j = i * BC + jj
                ok_j = j < valid
                k_j = _load_row(k, chunk_start + j, ok_j, head, H, K)
                G_j = _load_row(g_cum, chunk_start + j, ok_j, head, H, K)
                seen = ok_i & (r >= j)
                decayed = k_j[None, :] * tl.exp(tl.where(seen[:, None], G_i - G_j[None, :], 0.0))
                column = sub[None, :] == jj
                a = tl.where(column & (r > j)[:, None], tl.sum(k_i * decayed, 1)[:, None], a)
                p = tl.where(column & seen[:, None], tl.sum(q_i * decayed, 1)[:, None], p)
            c = i * BC + sub
            tl.store(gram + out + c[None, :], a, mask=ok_i[:, None])
            tl.store(qk + out + c[None, :], p * scale, mask=ok_i[:, None])
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, SCHEDULE)


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


@triton.jit(do_not_specialize=["num_seqs"])
def kda_wy_kernel(k, v, g_cum, beta, gram, inverse, w, u, cu_seqlens, chunk_offsets, num_seqs, H,
                  K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, SCHEDULE: tl.constexpr,
                  PRECISION: tl.constexpr):
    """The UT transform of one chunk: ``M = (I + Diag(beta) Γ)^{-1}`` by forward substitution, then
    the WY factors ``W = M Diag(beta) (K ⊙ exp(G))`` and ``U_0 = M Diag(beta) V``. Stores ``M``
    (``[T, H, C]``, rows of the chunk), ``W`` (``[T, H, K]``) and ``U_0`` (``[T, H, V]``).
    Grid ``(G_cap, H)``, flat schedule."""
    task = first_task(cu_seqlens, cu_seqlens, chunk_offsets, num_seqs, H, C, SCHEDULE)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, cu_seqlens, chunk_offsets, num_seqs, SCHEDULE)
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        b = tl.load(beta + rows * H + head, mask=ok, other=0.0).to(tl.float32)
        A = _load_square(gram, rows, ok, head, H, C, True) * b[:, None]  # strictly lower
        pos = tl.arange(0, C)
        # Row r of M = e_r - Σ_{j<r} A_rj M_j: rows above r are final when row r is formed, and
        # A_rj = 0 for j >= r, so one masked product with all of M gives the sum.
        M = tl.where(pos[:, None] == pos[None, :], 1.0, 0.0)
        for r in range(1, C):
            a_r = tl.sum(tl.where(pos[:, None] == r, A, 0.0), 0)  # row r of A, indexed by j
            row = tl.where(pos == r, 1.0, 0.0) - tl.sum(a_r[:, None] * M, 0)
            M = tl.where(pos[:, None] == r, row[None, :], M)
        k_c = _load_rows(k, rows, ok, head, H, K)
        G = _load_rows(g_cum, rows, ok, head, H, K)
        v_c = _load_rows(v, rows, ok, head, H, V)
        W = tl.dot(M, b[:, None] * k_c * tl.exp(G), input_precision=PRECISION)  # G <= 0 (0 past the end)
        U0 = tl.dot(M, b[:, None] * v_c, input_precision=PRECISION)
        _store_rows(inverse, M, rows, ok, head, H, C)
        _store_rows(w, W, rows, ok, head, H, K)
        _store_rows(u, U0, rows, ok, head, H, V)
        task = next_task(task, cu_seqlens, chunk_offsets, num_seqs, H, SCHEDULE)


@triton.jit
def _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K: tl.constexpr, C: tl.constexpr):
    """``G_last``: the cumulative decay at the chunk's last row inside the sequence, ``[K]``."""
    last = seq_start + tl.minimum(chunk * C + C, seq_len) - 1
    return _load_row(g_cum, last, True, head, H, K)


@triton.jit
def kda_state_kernel(q, k, g_cum, qk, w, u, o, states, final, cu_seqlens, chunk_offsets, H, scale,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                     PRECISION: tl.constexpr):
    """The recurrence across chunks. Program ``(n, head, v_block)`` walks sequence slot ``n``'s
    chunks in order with its ``[K, BV]`` state block in registers: saves the entering state of
    each chunk in ``states`` (float32 ``[G_cap, H, K, V]``, indexed by ``chunk_offsets``), writes
    the chunk's output rows, and stores the state after the last chunk in ``final`` (float32
    ``[N, H, K, V]``; zero for an empty sequence). Grid ``(N, H, V // BV)``."""
    n = tl.program_id(0)
    head = tl.program_id(1)
    v_block = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + n)
    seq_len = tl.load(cu_seqlens + n + 1) - seq_start
    first = tl.load(chunk_offsets + n)
    cols = v_block * BV + tl.arange(0, BV)
    S = tl.zeros([K, BV], tl.float32)
    for chunk in range(0, tl.cdiv(seq_len, C)):
        rows, ok = _chunk_rows(seq_start, seq_len, chunk, C)
        tl.store(_state_ptrs(states, first + chunk, head, H, K, V, BV, v_block), S)
        row_offs = (rows[:, None] * H + head) * V + cols[None, :]
        U0 = tl.load(u + row_offs, mask=ok[:, None], other=0.0).to(tl.float32)
        W = _load_rows(w, rows, ok, head, H, K)
        U = U0 - tl.dot(W, S, input_precision=PRECISION)
        G = _load_rows(g_cum, rows, ok, head, H, K)
        q_c = _load_rows(q, rows, ok, head, H, K)
        P = _load_square(qk, rows, ok, head, H, C, False)
        out = tl.dot(q_c * scale * tl.exp(G), S, input_precision=PRECISION)
        out = tl.dot(P, U, out, input_precision=PRECISION)
        tl.store(o + row_offs, out.to(o.dtype.element_ty), mask=ok[:, None])
        G_last = _chunk_tail(g_cum, seq_start, seq_len, chunk, head, H, K, C)
        k_c = _load_rows(k, rows, ok, head, H, K)
        # Rows past the sequence have k = 0, but their exponent G_last - 0 may be positive: mask it.
        k_to_end = k_c * tl.exp(tl.where(ok[:, None], G_last[None, :] - G, 0.0))
        S = tl.exp(G_last)[:, None] * S
        S = tl.dot(tl.trans(k_to_end), U, S, input_precision=PRECISION)
    tl.store(_state_ptrs(final, n, head, H, K, V, BV, v_block), S)


# -----------------------------------------------------------------------------
# Host side: checks (metadata only), buffers, launches.


def _check_arguments(q: object, k: object, v: object, g: object, beta: object, cu_seqlens: object,
                     scale: object, chunk_size: object, output_final_state: object,
                     validate: object) -> tuple[float, int]:
    """The reference's argument rules that read only metadata, plus the kernels' own limits.
    Returns ``(scale, C)``."""
    checks.check_tensor("q", q, ndim=3, shape="[T, H, K]", dtypes=_DTYPES)
    device = q.device
    checks.check_tensor("k", k, ndim=3, shape="[T, H, K]", dtypes=_DTYPES, device=device)
    checks.check_tensor("v", v, ndim=3, shape="[T, H, V]", dtypes=_DTYPES, device=device)
    checks.check_tensor("g", g, ndim=3, shape="[T, H, K]", dtypes=_DTYPES, device=device)
    checks.check_tensor("beta", beta, ndim=2, shape="[T, H]", dtypes=_DTYPES, device=device)
    T, H, K = q.shape
    if H == 0 or K not in _WIDTHS:
        raise ValueError(
            f"q must have shape [T, H, K] with H >= 1 and K in {_WIDTHS} (a power of two the kernels tile), "
            f"got shape {tuple(q.shape)}"
        )
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape [T, H, K] = {tuple(q.shape)}, got shape {tuple(k.shape)}")
    if v.shape[:2] != q.shape[:2] or v.shape[2] not in _WIDTHS:
        raise ValueError(
            f"v must have shape [T, H, V] = [{T}, {H}, V] with V in {_WIDTHS} (T, H from q), got shape {tuple(v.shape)}"
        )
    if g.shape != q.shape:
        raise ValueError(f"g must have q's shape [T, H, K] = {tuple(q.shape)}, got shape {tuple(g.shape)}")
    if beta.shape != q.shape[:2]:
        raise ValueError(f"beta must have shape [T, H] = [{T}, {H}] (from q), got shape {tuple(beta.shape)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
    checks.check_cu_seqlens(cu_seqlens, device=device)
    scale = K**-0.5 if scale is None else checks.check_real("scale", scale)
    C = checks.check_int("chunk_size", chunk_size)
    if C not in _CHUNKS:
        raise ValueError(f"chunk_size must be one of {_CHUNKS}, got {C}")
    checks.check_bool("output_final_state", output_final_state)
    checks.check_bool("validate", validate)
    if INTERPRETED and q.is_cuda:
        raise ValueError(
            "q must be a CPU tensor while TRITON_INTERPRET=1 (the interpreter gives wrong results on "
            f"CUDA tensors), got device {device}"
        )
    if not INTERPRETED and not q.is_cuda:
        raise ValueError(
            f"q must be a CUDA tensor (or set TRITON_INTERPRET=1 before importing attn_gym_lite to run "
            f"the kernels on CPU), got device {device}"
        )
    # Row offsets are 32-bit: every [T, H, *] buffer must stay below 2**31 elements.
    if T * H * max(K, v.shape[2], C) > _INT32_MAX:
        raise ValueError(
            f"q must have T * H * max(K, V, C) below 2**31 (the kernels' row offsets are 32-bit), got "
            f"T = {T}, H = {H}, K = {K}, V = {v.shape[2]}, C = {C}"
        )
    return scale, C


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs get full-precision products; lower-precision inputs are already rounded
    # more coarsely than tf32 rounds the float32 intermediates.
    return "ieee" if dtype == torch.float32 else "tf32"


def _value_block(V: int) -> int:
    # The interpreter runs programs one after another: one block is fastest there. On the GPU a
    # [128, 64] float32 state block is 64 registers per thread at 4 warps.
    return V if INTERPRETED else min(V, 64)


def _chunk_offsets(cu_seqlens: Tensor, C: int) -> Tensor:
    """``chunk_offsets`` for chunk size ``C`` on the device, one launch, no host read."""
    slots = cu_seqlens.numel()
    offsets = torch.empty(slots, dtype=torch.int32, device=cu_seqlens.device)
    block = max(16, min(1024, triton.next_power_of_2(slots)))
    chunk_offsets_kernel[(1,)](cu_seqlens, offsets, offsets, slots - 1, NUM_COUNTERS=0, CHUNK=C, BLOCK=block)
    return offsets


def _kda_forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                 scale: float, C: int) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Runs the four forward kernels; returns ``(o, final_state, saved)`` where ``saved`` holds the
    per-chunk quantities the backward reads (``chunk_offsets``, ``G``, ``Γ``, ``M``, ``W``, ``U_0``
    and the entering states)."""
    T, H, K = q.shape
    V = v.shape[2]
    N = cu_seqlens.numel() - 1
    device = q.device
    f32 = dict(dtype=torch.float32, device=device)
    G_cap = chunk_capacity(T, N, C)
    offsets = _chunk_offsets(cu_seqlens, C)
    g_cum = torch.empty(T, H, K, **f32)
    gram = torch.empty(T, H, C, **f32)
    qk = torch.empty(T, H, C, **f32)
    inverse = torch.empty(T, H, C, **f32)
    w = torch.empty(T, H, K, **f32)
    u = torch.empty(T, H, V, **f32)
    states = torch.empty(max(G_cap, 1), H, K, V, **f32)
    final = torch.empty(N, H, K, V, **f32)
    o = torch.zeros(T, H, V, dtype=q.dtype, device=device)  # rows L .. T - 1 stay zero
    precision = _precision(q.dtype)
    if G_cap > 0:
        grid = (G_cap, H)
        common = (cu_seqlens, offsets, N, H)
        kda_cumsum_kernel[grid](g, g_cum, *common, K=K, C=C, SCHEDULE="flat")
        kda_intra_kernel[grid](q, k, g_cum, gram, qk, *common, scale, K=K, C=C, BC=_SUB, SCHEDULE="flat",
                               PRECISION=precision)
        kda_wy_kernel[grid](k, v, g_cum, beta, gram, inverse, w, u, *common, K=K, V=V, C=C, SCHEDULE="flat",
                            PRECISION=precision)
    BV = _value_block(V)
    kda_state_kernel[(N, H, V // BV)](q, k, g_cum, qk, w, u, o, states, final, cu_seqlens, offsets, H, scale,
                                      K=K, V=V, C=C, BV=BV, PRECISION=precision)
    saved = dict(offsets=offsets, g_cum=g_cum, gram=gram, inverse=inverse, w=w, u=u, states=states)
    return o, final, saved


class _KDATriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                scale: float, C: int) -> tuple[Tensor, Tensor]:
        o, final, saved = _kda_forward(q, k, v, g, beta, cu_seqlens, scale, C)
        ctx.save_for_backward(q, k, v, g, beta, cu_seqlens, *saved.values())
        ctx.saved_names = tuple(saved)
        ctx.scale = scale
        ctx.chunk = C
        return o, final

    @staticmethod
    def backward(ctx, d_o: Tensor | None, d_final: Tensor | None):
        raise NotImplementedError("kda_triton: the backward is not written yet")


def kda_triton(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
               scale: float | None = None, chunk_size: int = 64, output_final_state: bool = False,
               validate: bool = False) -> tuple[Tensor, Tensor | None]:
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
        beta: ``[T, H]`` delta-rule step sizes in ``(0, 1)``, float32 / bfloat16 / float16.
        cu_seqlens: int32 ``[N + 1]`` prefix sums ``[0, ..., L, L]`` on ``q``'s device, ``L <= T``.
            Never read on the host (unless ``validate``): under a CUDA graph, copy each batch's
            ``cu_seqlens`` into the captured buffer and replay.
        scale: factor on ``q``; default ``K ** -0.5``.
        chunk_size: ``C``, 16, 32 or 64 tokens per chunk (default 64, fla's). The result does
            not depend on it up to rounding.
        output_final_state: also return every sequence's state after its last token.
        validate: read ``cu_seqlens`` on the host once and check its values (starts at 0, never
            decreases, ``L <= T``). Skipped while a CUDA stream is capturing. Off by default: a
            malformed ``cu_seqlens`` otherwise gives unspecified results.

    Returns:
        ``(o, final_state)``: ``o`` ``[T, H, V]`` in ``q``'s dtype, rows ``L .. T - 1`` zero;
        ``final_state`` float32 ``[N, H, K, V]`` (zero for an empty sequence) if
        ``output_final_state``, else ``None``. Arithmetic is float32 throughout (on the GPU,
        products of bfloat16/float16 inputs use tf32 tensor cores). Differentiable with respect
        to ``q, k, v, g, beta`` (and through ``final_state``); rows ``L .. T - 1`` of the inputs
        are never read (NaN there is harmless) and get zero gradients.

    Raises:
        TypeError: an argument is not a tensor or has a dtype outside float32/bfloat16/float16
            (``cu_seqlens``: not int32), ``k``/``v`` differ from ``q``'s dtype, ``scale`` is not
            a real number, ``chunk_size`` not an int, a flag not a bool.
        ValueError: a wrong number of dims, a shape that disagrees with ``q``'s, ``K`` or ``V``
            not in 16, 32, 64, 128, ``chunk_size`` not in 16, 32, 64, another device, a CPU
            tensor without the interpreter (or a CUDA one with it), a malformed ``cu_seqlens``
            layout (and, with ``validate``, malformed values), a ``[T, H, *]`` buffer of 2**31
            elements or more.

    Cost: the per-chunk kernels run on ``G_cap`` programs per head
    (:func:`attn_gym_lite.schedule.chunk_capacity`), the recurrence on ``N x H x V / BV``
    programs, each looping over its own sequence's chunks; extra memory: float32 buffers of
    ``[T, H, 2K + V + 3C]`` and the entering state of every chunk, ``[G_cap, H, K, V]``.

    Source: Kimi Linear (arXiv:2510.26692), chunkwise KDA; flash-linear-attention
    ``fla/ops/kda`` (``chunk_kda``) for the decomposition. See
    :mod:`attn_gym_lite.ops.kda.chunked_triton`.
    """
    scale, C = _check_arguments(q, k, v, g, beta, cu_seqlens, scale, chunk_size, output_final_state, validate)
    if validate and not (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        checks.check_cu_seqlens_values(cu_seqlens, token_capacity=q.shape[0])
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o, final = _KDATriton.apply(q, k, v, g, beta, cu_seqlens, scale, C)
    return o, (final if output_final_state else None)
