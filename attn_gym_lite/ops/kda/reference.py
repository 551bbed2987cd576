r"""Reference KDA (Kimi Delta Attention) on packed batches: the recurrence and the chunked form.

KDA is a gated delta rule whose forgetting gate is a *vector*: every key channel of the state decays
at its own rate (fine-grained, per-channel decay), where Gated DeltaNet decays the whole state by
one scalar per head. This module holds two references for it, written independently of each other
so that each can check the other, and both meant as the ground truth for a ragged Triton kernel:

* :func:`kda_recurrent` walks the tokens one by one: the definition, nothing derived.
* :func:`kda_chunked` cuts every sequence into chunks of ``C`` tokens and does the work of a chunk
  with matrix products (the WY representation, built by a unit-lower-triangular solve: the "UT
  transform"), carrying the state from one chunk of a sequence to the next.

Shapes and layout (DESIGN.md's vocabulary)
------------------------------------------
A packed batch holds ``N`` sequences back to back in ``T`` rows; sequence ``n`` owns rows
``cu_seqlens[n] .. cu_seqlens[n + 1] - 1``, and ``L = cu_seqlens[-1] <= T`` rows are active.

=================  ==================  =====================================================
argument           shape               meaning
=================  ==================  =====================================================
``q``, ``k``       ``[T, H, K]``       queries and keys (``H`` heads, key width ``K``)
``v``              ``[T, H, V]``       values (value width ``V``)
``g``              ``[T, H, K]``       per-channel log-decay, ``g <= 0`` (natural log, so the
                                       decay factor of channel ``d`` is ``exp(g[t, h, d])``)
``beta``           ``[T, H]``          delta-rule step size (learning rate), in ``(0, 1)``
``cu_seqlens``     ``[N + 1]``         int32 prefix sums, unused tail slots repeat ``L``
output ``o``       ``[T, H, V]``       rows ``L .. T - 1`` are zeros
final state        ``[N, H, K, V]``    each sequence's state after its last token
=================  ==================  =====================================================

The math (one head; vectors are columns)
----------------------------------------
The state ``S`` is a ``K x V`` matrix, zero at the start of every sequence. Token ``t`` first
decays it channel by channel, then applies the delta rule with step ``beta_t``, then reads it::

    S'_t = Diag(exp(g_t)) S_{t-1}                          # decay first ...
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T          # ... then the delta-rule update
         = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t  = S_t^T (scale * q_t)                             # read *after* the update

so ``o_t`` sees token ``t``'s own key and value. ``scale`` defaults to ``K ** -0.5``. The references
do **not** normalise ``q`` and ``k``: the Kimi Linear layer L2-normalises them per head before
this core (fla exposes that as ``use_qk_l2norm_in_kernel``, off by default), and that is the
caller's job here. With an L2-normalised ``k`` and ``beta`` in ``(0, 1)`` the transition
``I - beta k k^T`` is a contraction; nothing here checks the values of ``g`` or ``beta``.

Chunked form. Take one chunk of ``c <= C`` tokens (rows ``1..c`` below) entering with state ``S_0``;
let ``G_r = g_1 + ... + g_r`` (cumulative log-decay inside the chunk, per channel, ``G_0 = 0``) and
``Δ_rj = Diag(exp(G_r - G_j))`` (the decay from token ``j`` to token ``r``, entries ``<= 1`` for
``j <= r``). Writing ``S_r = Diag(exp(g_r)) S_{r-1} + k_r u_r^T`` with the "pseudo-value"
``u_r = beta_r (v_r - S'_r^T k_r)`` and unrolling::

    S_r = Diag(exp(G_r)) S_0 + Σ_{j<=r} Δ_rj k_j u_j^T

Putting this into ``u_r`` gives a unit-lower-triangular system for all ``u`` of the chunk at once::

    (I + A) U = Diag(beta) (V - (K ⊙ exp(G)) S_0),     A_rj = beta_r k_r^T Δ_rj k_j   (j < r)

hence, with the WY factors ``W = (I + A)^{-1} Diag(beta) (K ⊙ exp(G))`` and
``U_0 = (I + A)^{-1} Diag(beta) V`` that do not depend on ``S_0`` (so every chunk of the batch
computes them in parallel)::

    U     = U_0 - W S_0
    O     = (scale Q ⊙ exp(G)) S_0 + P U,              P_rj = scale q_r^T Δ_rj k_j     (j <= r)
    S_c   = Diag(exp(G_c)) S_0 + (K ⊙ exp(G_c - G))^T U

Only the last three lines are sequential, from one chunk of a sequence to the next. Chunking
restarts at every sequence start (a chunk never spans two sequences); a sequence's last chunk may
be shorter than ``C``; an empty sequence has no chunk and a zero final state. The padded tail of
a short chunk is filled with ``k = v = q = 0``, ``g = 0``, ``beta = 0``, which adds nothing.

Every exponent above is ``G_r - G_j`` with ``j <= r`` (or ``G_c - G_j``, ``G_r``), never
positive when ``g <= 0``, so nothing overflows however long a chunk decays; the price is the
``[C, C, K]`` decay tensor per chunk and head (memory ``O(G_active · H · C² · K)``): this is a
reference for tests and small shapes, not a fast path.

Both functions are eager and read ``cu_seqlens`` on the host (they loop over sequences, chunks
and tokens in Python), so they refuse to run during CUDA graph capture. They compute in float32
for float16/bfloat16 inputs and in float64 for float64 inputs, are differentiable by autograd in
every floating argument, and never read rows ``L .. T - 1`` (NaN there is harmless; those rows get
zero gradients).

Sources
-------
* Kimi Team, *Kimi Linear: An Expressive, Efficient Hybrid Linear Attention Architecture*
  (arXiv:2510.26692, 2025), section on Kimi Delta Attention: the recurrence
  ``S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T q_t``,
  with ``alpha_t = exp(g_t)`` here, and its chunkwise WY/UT form.
* flash-linear-attention (fla-org/flash-linear-attention), ``fla/ops/kda/naive.py``
  (``naive_recurrent_kda``: decay, then update, then read; ``scale = K ** -0.5`` on ``q``;
  ``g`` in natural-log space) and ``fla/ops/kda/chunk.py`` (``use_qk_l2norm_in_kernel``).
  Read for the convention only; the code here is written from the equations above.
* Yang, Kautz & Hatamizadeh, *Gated Delta Networks* (ICLR 2025): the scalar-gated ancestor.
* Seed article (``seed/so-you-wanna-cuda-graph.txt``), the KDA case study: why a ragged
  ``chunk_kda`` needs no ``max_seqlen`` and how the KDA core sits in a full module.
"""

from __future__ import annotations

import torch

from ... import checks

Tensor = torch.Tensor

__all__ = ["LOG_DECAY_FLOOR", "kda_chunked", "kda_recurrent"]

# The chunked paths (kda_chunked, kda_triton) floor g here on entry. exp(-40) ~ 4e-18 is below
# float64's and float32's resolution relative to any O(1) state, so the floor changes no result:
# a decay below it is exactly zero to the precision computed (the recurrence's -inf is a full
# reset, and so is -40). What it removes is cancellation: the chunked form takes differences of
# cumulative log-decays, and with g = -1e7 in a chunk float32 loses the small decays of its other
# tokens (G_r - G_j of two cumulative sums near -1e7), while g = -inf gives -inf - (-inf) = NaN.
# Floored, a chunk's cumulative sums stay small enough for float32 to keep them. Through autograd,
# clamp_min's gradient is 0 below the floor: the exact derivative to float precision.
LOG_DECAY_FLOOR = -40.0


def check_kda_metadata(q: object, k: object, v: object, g: object, beta: object, cu_seqlens: object, *,
                       dtypes: tuple[torch.dtype, ...] = checks.FLOATING_DTYPES, widths: tuple[int, ...] | None = None,
                       width_rule: str | None = None) -> tuple[int, int, int]:
    """The rules of KDA's arguments that read only metadata (types, dims, dtypes, devices, shapes,
    the layout of ``cu_seqlens``), shared by the references and the Triton kernels; returns
    ``(T, H, K)``. ``dtypes``: the floating dtypes allowed; ``widths``: the key and value widths
    allowed (``None``: any ``>= 1``), described in messages by ``width_rule`` (default: ``">= 1"``
    or ``"in <widths>"``).

    Raises:
        TypeError: an argument is not a tensor, or has a dtype outside ``dtypes``, or ``k``/``v``
            differ from ``q``'s dtype.
        ValueError: wrong dims or shapes, a device mismatch, a width outside ``widths``, or a
            ``cu_seqlens`` that breaks a layout rule (1-D, int32, contiguous, ``N + 1 >= 2``).
    """
    checks.check_tensor("q", q, ndim=3, shape="[T, H, K]", dtypes=dtypes)
    device = q.device
    checks.check_tensor("k", k, ndim=3, shape="[T, H, K]", dtypes=dtypes, device=device)
    checks.check_tensor("v", v, ndim=3, shape="[T, H, V]", dtypes=dtypes, device=device)
    checks.check_tensor("g", g, ndim=3, shape="[T, H, K]", dtypes=dtypes, device=device)
    checks.check_tensor("beta", beta, ndim=2, shape="[T, H]", dtypes=dtypes, device=device)

    if width_rule is None:
        width_rule = ">= 1" if widths is None else f"in {tuple(widths)}"

    def allowed(width: int) -> bool:
        return width >= 1 if widths is None else width in widths

    T, H, K = q.shape
    if H == 0 or not allowed(K):
        raise ValueError(f"q must have shape [T, H, K] with H >= 1 and K {width_rule}, got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape [T, H, K] = {tuple(q.shape)}, got shape {tuple(k.shape)}")
    if v.shape[:2] != q.shape[:2] or not allowed(v.shape[2]):
        raise ValueError(
            f"v must have shape [T, H, V] = [{T}, {H}, V] with V {width_rule} (T, H from q), got shape {tuple(v.shape)}"
        )
    if g.shape != q.shape:
        raise ValueError(f"g must have q's shape [T, H, K] = {tuple(q.shape)}, got shape {tuple(g.shape)}")
    if beta.shape != q.shape[:2]:
        raise ValueError(f"beta must have shape [T, H] = [{T}, {H}] (from q), got shape {tuple(beta.shape)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
    checks.check_cu_seqlens(cu_seqlens, device=device)
    return T, H, K


def _check_kda_arguments(q: object, k: object, v: object, g: object, beta: object, cu_seqlens: object,
                         scale: object, output_final_state: object) -> tuple[list[int], float, torch.dtype]:
    """Checks shared by both references; returns ``(cu_seqlens on the host, scale, compute dtype)``.

    Metadata checks first (:func:`check_kda_metadata`), then the values of ``cu_seqlens``, read on
    the host once (one device sync for a CUDA tensor): checked there, and returned as the bounds.
    """
    T, _, K = check_kda_metadata(q, k, v, g, beta, cu_seqlens)
    host = checks.check_cu_seqlens_values(cu_seqlens, token_capacity=T)  # the one read, the checked values
    scale = K**-0.5 if scale is None else checks.check_real("scale", scale)
    checks.check_bool("output_final_state", output_final_state)
    compute = torch.promote_types(torch.promote_types(q.dtype, g.dtype), torch.promote_types(beta.dtype, torch.float32))
    return host.tolist(), scale, compute


def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                  scale: float | None = None, output_final_state: bool = False) -> tuple[Tensor, Tensor | None]:
    r"""KDA by its definition: one token at a time, the state reset to zero at every sequence start.

    For each sequence and each of its tokens ``t`` (one head shown; ``S`` is ``K x V``)::

        S = Diag(exp(g_t)) S                       # per-channel decay first
        S = S + beta_t k_t (v_t - S^T k_t)^T       # then the delta rule on the decayed state
        o_t = S^T (scale * q_t)                    # read after the update

    Args:
        q, k: ``[T, H, K]`` queries and keys, floating, one dtype and device with ``v``. Not
            normalised here (Kimi Linear L2-normalises them per head before the core).
        v: ``[T, H, V]`` values.
        g: ``[T, H, K]`` per-channel log-decay (natural log; ``<= 0`` for a decay), any floating dtype.
        beta: ``[T, H]`` step sizes in ``(0, 1)``, any floating dtype. The values of ``g`` and
            ``beta`` are not checked: any finite values are computed as the recurrence says
            (``g > 0`` grows the state instead of decaying it, and :func:`kda_chunked`'s
            exponents may then overflow), but only ``g <= 0`` and ``beta`` in ``(0, 1)`` with
            L2-normalised keys keep the state bounded.
        cu_seqlens: int32 ``[N + 1]`` prefix sums on ``q``'s device, ``L = cu_seqlens[-1] <= T``;
            read on the host.
        scale: factor on ``q``; default ``K ** -0.5`` (fla's default).
        output_final_state: also return every sequence's state after its last token.

    Returns:
        ``(o, final_state)``: ``o`` is ``[T, H, V]`` in ``q``'s dtype with rows ``L .. T - 1`` zero;
        ``final_state`` is ``[N, H, K, V]`` in the compute dtype (float32, or float64 for float64
        inputs; zero for an empty sequence) if ``output_final_state``, else ``None``.

    Raises:
        TypeError: an argument is not a tensor, or has a dtype outside float16/bfloat16/float32/
            float64 (``cu_seqlens``: not int32), or ``k``/``v`` differ from ``q``'s dtype; ``scale``
            is not a real number or ``output_final_state`` not a bool.
        ValueError: a wrong number of dims, a shape that disagrees with ``q``'s, another device,
            a malformed ``cu_seqlens`` (not starting at 0, decreasing, ``L > T``, ...), a
            non-finite ``scale``.
        RuntimeError: ``cu_seqlens`` is a CUDA tensor and the current stream is capturing.

    Cost: ``L`` sequential steps of ``O(H · K · V)`` each, in Python: for tests and small shapes.

    Source: Kimi Linear technical report (arXiv:2510.26692), KDA recurrence; fla
    ``fla/ops/kda/naive.py`` (``naive_recurrent_kda``) for the order of decay, update and read and
    the default scale. See :mod:`attn_gym_lite.ops.kda.reference`.
    """
    bounds, scale, compute = _check_kda_arguments(q, k, v, g, beta, cu_seqlens, scale, output_final_state)
    T, H, K = q.shape
    V = v.shape[2]
    L = bounds[-1]
    out_dtype = q.dtype
    q, k, v, g, beta = (x.to(compute) for x in (q, k, v, g, beta))
    rows: list[Tensor] = []
    states: list[Tensor] = []
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
    r"""KDA in chunked form: the same function as :func:`kda_recurrent`, computed chunk by chunk.

    Every sequence is cut into chunks of ``C = chunk_size`` tokens, starting afresh at its first
    row (the last chunk may be shorter; an empty sequence has none): ``G_active = chunk_offsets[-1]``
    chunks with ``chunk_offsets`` the prefix sum of ``ceil(s_n / C)``. All chunks first compute,
    in parallel, what does not depend on the state entering them (per chunk and head; ``G`` is the
    within-chunk cumulative sum of ``g``, ``Δ_rj = Diag(exp(G_r - G_j))``)::

        A_rj = beta_r k_r^T Δ_rj k_j  (j < r)          P_rj = scale q_r^T Δ_rj k_j  (j <= r)
        [U_0, W] = (I + A)^{-1} Diag(beta) [V, K ⊙ exp(G)]          # WY factors, UT transform

    then the chunks of each sequence run in order from a zero state ``S`` (step ``i`` handles the
    ``i``-th chunk of every sequence that has one)::

        U = U_0 - W S
        O = (scale Q ⊙ exp(G)) S + P U
        S = Diag(exp(G_last)) S + (K ⊙ exp(G_last - G))^T U

    The derivation is in :mod:`attn_gym_lite.ops.kda.reference`. ``(I + A)`` is unit lower
    triangular; it is solved with :func:`torch.linalg.solve_triangular` (what a kernel does by
    forward substitution or blockwise inversion).

    Args:
        q, k, v, g, beta, cu_seqlens, scale, output_final_state: as in :func:`kda_recurrent`.
        chunk_size: ``C``, tokens per chunk, an int >= 1 (default 64, fla's chunk size). The
            result does not depend on it up to rounding. A ``C`` above the longest sequence
            computes with the longest sequence's length instead (no chunk can be longer), so a
            huge ``C`` costs no more memory than one chunk per sequence.

    Returns:
        ``(o, final_state)`` as in :func:`kda_recurrent`.

    Raises:
        The errors of :func:`kda_recurrent`, and TypeError / ValueError naming ``chunk_size`` when
        it is not an int >= 1.

    Cost: memory ``O(G_active · H · C² · K)`` for the pairwise decays (every exponent stays
    ``<= 0``, so nothing overflows); ``max_n ceil(s_n / C)`` sequential steps. For tests and small
    shapes, float64-capable, differentiable by autograd.

    Source: Kimi Linear technical report (arXiv:2510.26692), chunkwise KDA (WY representation,
    UT transform); fla ``fla/ops/kda/naive.py`` (``naive_chunk_kda``) for the same factorisation
    on padded batches. See :mod:`attn_gym_lite.ops.kda.reference`.
    """
    bounds, scale, compute = _check_kda_arguments(q, k, v, g, beta, cu_seqlens, scale, output_final_state)
    C = checks.check_int("chunk_size", chunk_size, minimum=1)
    # No chunk is longer than its sequence: padding every chunk to a C beyond the longest one only
    # allocates ([G_active, H, C, C, K] decays); chunk_size=10**5 asked for 640 GB at T = 8.
    C = min(C, max([b - a for a, b in zip(bounds[:-1], bounds[1:])] + [1]))
    T, H, K = q.shape
    V = v.shape[2]
    N = len(bounds) - 1
    L = bounds[-1]
    out_dtype = q.dtype
    device = q.device
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

    def per_chunk(x: Tensor) -> Tensor:
        """[T, H, ...] -> [G_active, H, C, ...], zero in the padded tail of a short chunk."""
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
