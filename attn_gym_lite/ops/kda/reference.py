r"""Reference KDA (Kimi Delta Attention) on packed batches: the recurrence and the chunked form.

KDA is a gated delta rule whose forgetting gate is a vector: each key channel of the ``K x V`` state
decays at its own rate. For ``q, k, g [T, H, K]``, ``v [T, H, V]``, ``beta [T, H]``, the state is
zero at every sequence start and token ``t`` decays it, applies the delta rule, then reads it (one
head; ``g`` a natural-log decay, ``scale = K ** -0.5`` by default, ``q, k`` L2-normalised by the caller)::

    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,     o_t = S_t^T (scale q_t)

Chunked form: in a chunk entering with state ``S_0``, with ``G_r = g_1 + ... + g_r`` and
``Δ_rj = Diag(exp(G_r - G_j))``, the WY factors ``W, U_0`` do not depend on ``S_0``, so every chunk
computes them in parallel; only the last three lines run from chunk to chunk::

    A_rj = beta_r k_r^T Δ_rj k_j  (j < r),          P_rj = scale q_r^T Δ_rj k_j  (j <= r)
    [U_0, W] = (I + A)^{-1} Diag(beta) [V, K ⊙ exp(G)]                   (the UT transform)
    U = U_0 - W S_0
    O = (scale Q ⊙ exp(G)) S_0 + P U
    S_c = Diag(exp(G_c)) S_0 + (K ⊙ exp(G_c - G))^T U

Every exponent is ``<= 0`` when ``g <= 0``. Both functions are eager (they read ``cu_seqlens`` on
the host), compute in float32 or float64, and return zeros in rows past ``L``, which they never read.
Sources: Kimi Linear (arXiv:2510.26692); fla ``fla/ops/kda/naive.py``, read for the conventions.
"""

from __future__ import annotations

import torch

from ... import checks

Tensor = torch.Tensor

__all__ = ["LOG_DECAY_FLOOR", "kda_chunked", "kda_recurrent"]

# The chunked paths (kda_chunked, kda_triton) floor g here on entry. exp(-40) ~ 4e-18 is below
# float64's and float32's resolution relative to any O(1) state, so the floor changes no result (a
# decay below it is exactly zero to the precision computed) and clamp_min's zero gradient below it
# is the exact derivative to float precision. What it removes is cancellation: the chunked form
# takes differences G_r - G_j of cumulative log-decays, where one g = -1e7 makes float32 lose the
# small decays of the other tokens and g = -inf gives -inf - (-inf) = NaN.
LOG_DECAY_FLOOR = -40.0


def check_kda_metadata(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor) -> tuple[int, int, int]:
    """The shapes of KDA's arguments and the layout of ``cu_seqlens`` (metadata only: capture-safe);
    returns ``(T, H, K)``."""
    T, H, K = q.shape
    if k.shape != q.shape or g.shape != q.shape or v.shape[:2] != (T, H) or beta.shape != (T, H):
        raise ValueError(f"KDA takes q, k, g [T, H, K], v [T, H, V] and beta [T, H], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    checks.check_cu_seqlens(cu_seqlens, device=q.device)
    return T, H, K


def _prepare(q, k, v, g, beta, cu_seqlens, scale):  # (host bounds, read once and checked; scale; compute dtype)
    T, _, K = check_kda_metadata(q, k, v, g, beta, cu_seqlens)
    bounds = checks.check_cu_seqlens_values(cu_seqlens, token_capacity=T).tolist()
    compute = torch.promote_types(torch.promote_types(q.dtype, g.dtype), torch.promote_types(beta.dtype, torch.float32))
    return bounds, K**-0.5 if scale is None else scale, compute


def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                  scale: float | None = None, output_final_state: bool = False) -> tuple[Tensor, Tensor | None]:
    """KDA by its definition, one token at a time; returns ``(o [T, H, V], final state [N, H, K, V] or None)``."""
    bounds, scale, compute = _prepare(q, k, v, g, beta, cu_seqlens, scale)
    (T, H, K), V, L, out_dtype = q.shape, v.shape[2], bounds[-1], q.dtype
    q, k, v, g, beta = (x.to(compute) for x in (q, k, v, g, beta))
    rows, states = [], []
    for start, end in zip(bounds[:-1], bounds[1:]):
        S = q.new_zeros(H, K, V)
        for t in range(start, end):
            S = g[t].exp().unsqueeze(-1) * S
            recalled = torch.einsum("hk,hkv->hv", k[t], S)  # what the state returns for key k_t
            correction = beta[t].unsqueeze(-1) * (v[t] - recalled)
            S = S + torch.einsum("hk,hv->hkv", k[t], correction)
            rows.append(torch.einsum("hk,hkv->hv", q[t] * scale, S))
        states.append(S)
    active = torch.stack(rows) if rows else q.new_zeros(0, H, V)
    o = torch.cat([active, q.new_zeros(T - L, H, V)]).to(out_dtype)
    final_state = torch.stack(states) if output_final_state else None
    return o, final_state


def kda_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                chunk_size: int = 64, scale: float | None = None,
                output_final_state: bool = False) -> tuple[Tensor, Tensor | None]:
    """KDA in chunked form, chunks of ``chunk_size`` tokens restarting at every sequence; the same
    function as :func:`kda_recurrent` up to rounding. Memory ``O(chunks · H · C² · K)``: for tests."""
    bounds, scale, compute = _prepare(q, k, v, g, beta, cu_seqlens, scale)
    # No chunk is longer than its sequence: a C beyond the longest one would only allocate.
    C = min(chunk_size, max([b - a for a, b in zip(bounds[:-1], bounds[1:])] + [1]))
    (T, H, K), V, N, L = q.shape, v.shape[2], len(bounds) - 1, bounds[-1]
    out_dtype, device = q.dtype, q.device
    g = g.clamp_min(LOG_DECAY_FLOOR)
    q, k, v, g, beta = (x.to(compute) for x in (q, k, v, g, beta))
    S = q.new_zeros(N, H, K, V)

    # The chunk table: sequence n owns chunks chunk_offsets[n] .. chunk_offsets[n + 1] - 1, in order,
    # so the chunks tile rows 0 .. L - 1 in order.
    chunk_offsets = [0]
    chunk_starts: list[int] = []
    chunk_ends: list[int] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        for chunk_start in range(start, end, C):
            chunk_starts.append(chunk_start)
            chunk_ends.append(min(chunk_start + C, end))
        chunk_offsets.append(len(chunk_starts))
    if not chunk_starts:  # L = 0: nothing is active
        return q.new_zeros(T, H, V).to(out_dtype), (S if output_final_state else None)

    rows = torch.tensor(chunk_starts, device=device)[:, None] + torch.arange(C, device=device)  # [G_active, C]
    valid = rows < torch.tensor(chunk_ends, device=device)[:, None]
    rows = torch.where(valid, rows, 0)  # padding reads row 0 (active, since L > 0), then is zeroed

    def per_chunk(x: Tensor) -> Tensor:  # [T, H, ...] -> [G_active, H, C, ...], zero past a short chunk's end
        mask = valid.view(*valid.shape, *([1] * (x.dim() - 1)))
        return torch.where(mask, x[rows], 0).transpose(1, 2)

    qc, kc, vc, gc, bc = (per_chunk(x) for x in (q, k, v, g, beta))
    cum = gc.cumsum(2)  # G_r, [G_active, H, C, K]; constant over the padded tail (g = 0 there)

    # Pairwise decays Δ_rj = exp(G_r - G_j) for j <= r, zero above the diagonal; the exponent is
    # masked before exp so the (positive) entries above the diagonal never overflow.
    causal = torch.ones(C, C, dtype=torch.bool, device=device).tril()
    strict = causal.tril(-1)
    keep = causal[:, :, None]
    exponent = cum.unsqueeze(3) - cum.unsqueeze(2)  # [G_active, H, C (r), C (j), K]
    decayed_keys = torch.where(keep, torch.where(keep, exponent, 0).exp(), 0) * kc.unsqueeze(2)  # Δ_rj k_j

    A = torch.where(strict, torch.einsum("ghrd,ghrjd->ghrj", kc, decayed_keys) * bc.unsqueeze(-1), 0)
    P = scale * torch.einsum("ghrd,ghrjd->ghrj", qc, decayed_keys)  # zero above the diagonal already

    # UT transform: one unit-lower-triangular solve for both WY factors.
    eye = torch.eye(C, dtype=compute, device=device)
    rhs = bc.unsqueeze(-1) * torch.cat([vc, kc * cum.exp()], dim=-1)
    U0, W = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True).split([V, K], dim=-1)

    decayed_queries = scale * qc * cum.exp()  # [G_active, H, C, K]
    last = cum[:, :, -1:, :]  # G at the chunk's last token (padding keeps it), [G_active, H, 1, K]
    state_decay = last.exp().transpose(-1, -2)  # [G_active, H, K, 1]
    keys_to_end = (kc * (last - cum).exp()).transpose(-1, -2)  # (K ⊙ exp(G_last - G))^T, [G_active, H, K, C]

    # The sequential part: step i runs the i-th chunk of every sequence that has one.
    counts = [b - a for a, b in zip(chunk_offsets[:-1], chunk_offsets[1:])]
    o_chunks = q.new_zeros(len(chunk_starts), H, C, V)
    for i in range(max(counts)):
        sequences = [n for n in range(N) if counts[n] > i]
        seq_index = torch.tensor(sequences, device=device)
        ids = torch.tensor([chunk_offsets[n] + i for n in sequences], device=device)
        S0 = S[seq_index]  # [n_i, H, K, V]
        U = U0[ids] - W[ids] @ S0
        o_chunks = o_chunks.index_copy(0, ids, decayed_queries[ids] @ S0 + P[ids] @ U)
        S = S.index_copy(0, seq_index, state_decay[ids] * S0 + keys_to_end[ids] @ U)

    active = o_chunks.transpose(1, 2)[valid]  # [L, H, V]: the chunks tile rows 0 .. L - 1 in order
    o = torch.cat([active, q.new_zeros(T - L, H, V)]).to(out_dtype)
    return o, (S if output_final_state else None)
