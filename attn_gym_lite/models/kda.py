r"""A Kimi Delta Attention (KDA) layer on packed batches, masked for padded capacity.

::

    x ─► [input: value mask] ─┬─► qkv projection ─► [projection_grad: gradient barrier]
                              │     ─► short conv (ragged) ─► SiLU ─► q, k, v ─► L2 norm (q, k)
                              ├─► f_proj (low rank) ─► g = -exp(A_log) · softplus(· + dt_bias)
                              ├─► b_proj ─► beta = sigmoid(·)
                              │     [gate_grad: gradient barrier on g and beta]
                              │   KDA core (q, k, v, g, beta, cu_seqlens)  ─► o
                              └─► g_proj (low rank) ─► gated RMSNorm(o, sigmoid gate) ─► output projection

The layer of the Kimi Linear report and of flash-linear-attention's ``KimiDeltaAttention``, on a
packed ``[T, hidden]`` batch described by ``cu_seqlens`` (DESIGN.md's ``T``, ``L``, ``N``), and with
no residual (the caller's block adds it). The q, k, v projections are one matrix and their three
short convolutions one depthwise convolution over the concatenated channels: a depthwise
convolution acts on each channel alone, so this is the same function as three of each, with fewer
launches.

Masks, by the "Masking" chapter's rule (*mask where inactive rows can mix, reduce, or become
undefined, and nowhere else*):

============================  =================  ================================================
site (``MASK_SITES`` name)    kind               why exactly here
============================  =================  ================================================
``input``                     value mask         rows past ``L`` of the input may hold anything
                                                 (NaN, stale data); every projection's weight
                                                 gradient sums over every row, ``NaN * 0 = NaN``
``projection_grad``           gradient barrier   the short convolution's backward leaves the
                                                 inactive rows of its input gradient undefined;
                                                 the qkv weight gradient would sum them
``gate_grad``                 gradient barrier   the core's contract fixes its *output* rows past
                                                 ``L`` (zero) but not its ``g``/``beta`` input
                                                 gradients there; ``A_log``, ``dt_bias`` and the
                                                 ``f_proj``/``b_proj`` weight gradients sum them
============================  =================  ================================================

Nowhere else: the short convolution and the KDA core are ragged (their active rows read only
active rows); q, k, v rows past ``L`` come out of the convolution undefined, but every op between
it and the core is token-parallel and the core never reads them, and their gradients stop in the
convolution's backward, which reads active rows only. The core writes zeros in rows past ``L``
(all three implementations), so the gated norm and the output projection turn them into exact
zeros: the layer's output rows past ``L`` are 0, and with a loss that selects active rows every
gradient equals the one computed on the ``L`` real rows alone (``tests/test_kda_module.py``).

Sources:

* Kimi Team, *Kimi Linear: An Expressive, Efficient Hybrid Linear Attention Architecture*
  (arXiv:2510.26692, 2025), section on Kimi Delta Attention: the layer (projections, short
  convolution, L2-normalised q and k, the low-rank per-channel forget gate
  ``-exp(A) · softplus(·)``, sigmoid ``beta``, the sigmoid-gated output RMSNorm).
* flash-linear-attention (fla-org/flash-linear-attention), ``fla/layers/kda.py``
  (``KimiDeltaAttention``): the same layer; read for the parameter shapes and initialisations
  (``A_log`` per head from ``log U(1, 16)``, ``dt_bias`` per channel at zero, both float32;
  low-rank ``f_proj``/``g_proj`` through ``head_v_dim``). The code here is written anew.
* Seed article (``seed/so-you-wanna-cuda-graph.txt``), "A real KDA module": the module-level
  Amdahl study this layer is measured in (``attn_gym_lite.bench.linear_attention``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .. import checks
from ..ops.kda import kda_chunked, kda_recurrent
from ..ops.masking import active_token_mask, mask_inactive_token_gradients, mask_inactive_tokens
from ..ops.short_conv import ShortConv
from ..regions import mark_kernels

Tensor = torch.Tensor

__all__ = ["KDA_IMPLEMENTATIONS", "KDAAttention", "KDA_MASK_SITES", "KDA_REGIONS", "gated_rms_norm", "kda_gate",
           "l2_normalize"]

#: Where :class:`KDAAttention` masks, in forward order.
KDA_MASK_SITES = ("input", "projection_grad", "gate_grad")

#: The KDA cores :class:`KDAAttention` can run: the Triton kernel (default, capturable) and the
#: two eager references of :mod:`attn_gym_lite.ops.kda` (they read ``cu_seqlens`` on the host).
KDA_IMPLEMENTATIONS = ("triton", "chunked", "recurrent")

#: The regions :class:`KDAAttention` marks its stages with (:func:`attn_gym_lite.regions.mark_kernels`),
#: in forward order: the input mask (active-row mask and input value mask), the q, k, v projection
#: (with its gradient barrier), the short convolution and SiLU, the L2 norm of q and k, the gates
#: (``g`` from ``f_proj``, ``beta`` from ``b_proj``, their gradient barrier), the KDA core, the output
#: gate (``g_proj``) with the gated RMSNorm, and the output projection. In a labelled trace the
#: backward kernels of a stage carry ``"<region> backward"``.
KDA_REGIONS = ("kda.input_mask", "kda.qkv_proj", "kda.short_conv", "kda.qk_norm", "kda.gates", "kda.core",
               "kda.norm_gate", "kda.out_proj")


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim, computed in at least float32.

    Args:
        x: ``[..., K]`` floating tensor (``[T, H, K]`` per head here), at least 1-D.
        eps: added under the square root, a finite real ``> 0`` (fla's ``l2norm`` uses 1e-6), so
            a zero row stays zero.

    Returns:
        A tensor like ``x`` (same dtype), each last-dim vector of norm ~1.

    Raises:
        TypeError: ``x`` is not a floating tensor; ``eps`` is not a real number.
        ValueError: ``x`` is 0-D; ``eps`` is not finite and ``> 0`` (0 would turn a zero row into
            NaN).

    Token-parallel: row ``t`` of the result depends on row ``t`` of ``x`` only.
    Source: Kimi Linear report (q and k L2-normalised per head); fla ``fla/modules/l2norm.py``.
    """
    checks.check_tensor("x", x, shape="[..., K]", dtypes=checks.FLOATING_DTYPES)
    if x.dim() == 0:
        raise ValueError("x must have shape [..., K] (at least 1-D), got a 0-D tensor")
    return _l2_normalize(x, checks.check_real("eps", eps, above=0.0))


def _l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """:func:`l2_normalize` without its checks (the layer's inputs are its own, checked once)."""
    compute = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (compute * torch.rsqrt(compute.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def kda_gate(f: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """KDA's per-channel log-decay ``g = -exp(A_log[h]) · softplus(f + dt_bias)``, ``g <= 0``.

    Args:
        f: ``[T, H, K]`` floating, the low-rank gate projection of the input.
        A_log: ``[H]`` floating, per-head log rate (``exp(A_log) > 0`` scales the decay), on
            ``f``'s device.
        dt_bias: ``[H * K]`` floating, per-channel bias inside the softplus, on ``f``'s device.

    Returns:
        ``[T, H, K]`` in the promoted dtype of ``A_log`` and float32 (float32, or float64 for a
        float64 layer): the natural-log decay, so channel ``d`` keeps ``exp(g[t, h, d])`` of its
        state at token ``t``.

    Raises:
        TypeError: an argument that is not a floating tensor.
        ValueError: ``f`` not 3-D, ``A_log`` not ``[H]`` or ``dt_bias`` not ``[H * K]`` for ``f``'s
            ``H`` and ``K``, or ``A_log`` or ``dt_bias`` on another device than ``f``.

    Source: Kimi Linear report, KDA gate; fla ``fla/ops/kda/gate.py`` (``-exp(A_log) *
    softplus(g + dt_bias)``, the formula ``chunk_kda(use_gate_in_kernel=True)`` fuses).
    """
    checks.check_tensor("f", f, ndim=3, shape="[T, H, K]", dtypes=checks.FLOATING_DTYPES)
    _, heads, width = f.shape
    checks.check_tensor("A_log", A_log, ndim=1, shape=f"[H] = [{heads}]", dtypes=checks.FLOATING_DTYPES, device=f.device)
    checks.check_tensor("dt_bias", dt_bias, ndim=1, shape=f"[H * K] = [{heads * width}]", dtypes=checks.FLOATING_DTYPES,
                        device=f.device)
    if A_log.shape[0] != heads:
        raise ValueError(f"A_log must have shape [H] = [{heads}] (f's H), got {tuple(A_log.shape)}")
    if dt_bias.shape[0] != heads * width:
        raise ValueError(f"dt_bias must have shape [H * K] = [{heads * width}] (f's H and K), got {tuple(dt_bias.shape)}")
    return _kda_gate(f, A_log, dt_bias)


def _kda_gate(f: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """:func:`kda_gate` without its checks (the layer's parameters have their shapes by construction)."""
    tokens, heads, width = f.shape
    compute = torch.promote_types(A_log.dtype, torch.float32)
    pre = f.to(compute) + dt_bias.to(compute).view(heads, width)
    return -A_log.to(compute).exp().view(heads, 1) * F.softplus(pre)


def gated_rms_norm(o: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``RMSNorm(o) · weight · sigmoid(gate)`` over the last dim, computed in at least float32.

    Args:
        o: ``[T, H, V]`` floating, the core's output.
        gate: ``[T, H, V]`` floating, the output gate's pre-activation, on ``o``'s device.
        weight: ``[V]`` floating, the norm's gain, shared by the heads, on ``o``'s device.
        eps: added to the mean square, a finite real ``> 0``.

    Returns:
        ``[T, H, V]`` in ``o``'s dtype. A zero row of ``o`` gives a zero row (whatever the gate).

    Raises:
        TypeError: an argument that is not a floating tensor; ``eps`` not a real number.
        ValueError: ``o`` not 3-D, ``gate`` not of ``o``'s shape, ``weight`` not ``[V]``, a tensor
            on another device than ``o``, or ``eps`` not finite and ``> 0`` (0 would turn a zero
            row into NaN).

    Source: fla ``FusedRMSNormGated(head_v_dim, activation="sigmoid")``; Kimi Linear report
    (output gate).
    """
    checks.check_tensor("o", o, ndim=3, shape="[T, H, V]", dtypes=checks.FLOATING_DTYPES)
    checks.check_tensor("gate", gate, ndim=3, shape=f"[T, H, V] = {list(o.shape)}", dtypes=checks.FLOATING_DTYPES, device=o.device)
    checks.check_tensor("weight", weight, ndim=1, shape=f"[V] = [{o.shape[-1]}]", dtypes=checks.FLOATING_DTYPES, device=o.device)
    if gate.shape != o.shape:
        raise ValueError(f"gate must have o's shape {tuple(o.shape)}, got {tuple(gate.shape)}")
    if weight.shape[0] != o.shape[-1]:
        raise ValueError(f"weight must have shape [V] = [{o.shape[-1]}] (o's last dim), got {tuple(weight.shape)}")
    return _gated_rms_norm(o, gate, weight, checks.check_real("eps", eps, above=0.0))


def _gated_rms_norm(o: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """:func:`gated_rms_norm` without its checks (the layer's tensors have their shapes by construction)."""
    compute = torch.promote_types(o.dtype, torch.float32)
    normed = F.rms_norm(o.to(compute), (o.shape[-1],), weight.to(compute), eps)
    return (normed * torch.sigmoid(gate.to(compute))).to(o.dtype)


class KDAAttention(nn.Module):
    """Kimi Delta Attention on a packed batch: projections, ragged short convolution, KDA core,
    gated output norm and output projection.

    Args:
        hidden_size: model width (int >= 1).
        num_heads: ``H`` (int >= 1).
        head_dim: ``K``, the key width per head (int >= 1; the Triton core takes 16, 32, 64 or
            128 only, see :func:`attn_gym_lite.ops.kda.kda_triton`).
        head_v_dim: ``V``, the value width per head; default ``head_dim`` (fla's ``expand_v=1``).
        conv_size: width of the short convolution (int >= 1, 4 in Kimi Linear and fla).
        gate_rank: inner width of the low-rank ``f_proj`` and ``g_proj``; default ``head_v_dim``
            (fla's choice).
        norm_eps: the output RMSNorm's epsilon, a finite real ``> 0`` (0 would make the zero rows
            past ``L`` NaN).
        impl: the KDA core: ``"triton"`` (default; :func:`attn_gym_lite.ops.kda.kda_triton`, no
            host read, capturable), ``"chunked"`` or ``"recurrent"`` (the eager references; they
            read ``cu_seqlens`` on the host, so a captured graph cannot hold them).
        chunk_size: ``C`` of the chunked cores (64, fla's and the kernel's default), an int >= 1
            (checked here); the core checks the sizes it supports (the recurrent core ignores it).
        masks: which of :data:`KDA_MASK_SITES` to apply. All of them (default) is what training
            at padded capacity needs; leave sites out only to see what each one prevents.
        device, dtype: of the parameters. ``A_log`` and ``dt_bias`` are kept in at least float32
            (as fla keeps them), whatever ``dtype``.

    Shapes: ``forward(x [T, hidden_size], cu_seqlens int32 [N + 1], max_seqlen=None) ->
    [T, hidden_size]`` in ``x``'s dtype (``max_seqlen`` is ignored: no KDA core needs a bound on the
    longest sequence, the seed's point about ``chunk_kda``; it is accepted so that the layer is
    called like the package's attention modules); rows ``L .. T - 1`` of the result are 0 and never depend on rows
    ``L .. T - 1`` of ``x`` (which may hold anything, NaN included).

    Raises:
        TypeError / ValueError: a size that is not an int >= 1, an ``impl`` outside
            :data:`KDA_IMPLEMENTATIONS`, ``masks`` not an iterable of sites from
            :data:`KDA_MASK_SITES` (a string or a dict is refused), a ``dtype`` that is not floating, a ``device`` refused by
            :func:`~attn_gym_lite.checks.check_device` (``"cuda"`` without a GPU); in ``forward``, ``x`` not
            ``[T, hidden_size]`` in the parameters' dtype and device, or a ``cu_seqlens`` of the
            wrong layout (1-D int32 ``[N + 1 >= 2]`` on ``x``'s device). The values of
            ``cu_seqlens`` (starts at 0, never decreases, ``L <= T``) are checked by the core,
            once, read on the host once, before it indexes memory with them (the projections and
            the short convolution before it are tensor ops that never do), with the core's
            messages naming ``cu_seqlens``: always by the eager references (they read them on
            the host anyway), by ``impl="triton"`` when ``cu_seqlens`` is a CPU tensor. A CUDA
            ``cu_seqlens`` with ``impl="triton"`` is trusted, so that ``forward`` stays
            capturable: validate those batches where they are built
            (:func:`attn_gym_lite.ragged.validate_cu_seqlens`), since the kernels index memory
            with unchecked values. Also, in the core's words (its rules live there only),
            whatever the core refuses at the first ``forward``: with ``impl="triton"``, a width
            outside 16, 32, 64, 128 (named as ``q``'s ``K`` for ``head_dim``, ``v``'s ``V`` for
            ``head_v_dim``), a ``chunk_size`` outside 16, 32, 64, float64 (named as ``q``; such
            a layer wants ``impl="chunked"``).

    Capturable on CUDA with ``impl="triton"``: nothing in ``forward`` reads the device. Its stages are
    marked as the regions of :data:`KDA_REGIONS` (``record_function`` ranges; no host read, so the
    labels are capture-safe), which a profiled replay reports kernel by kernel.
    Source: Kimi Linear report (arXiv:2510.26692); fla ``fla/layers/kda.py``. See
    :mod:`attn_gym_lite.models.kda`.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int = 128,
        *,
        head_v_dim: int | None = None,
        conv_size: int = 4,
        gate_rank: int | None = None,
        norm_eps: float = 1e-5,
        impl: str = "triton",
        chunk_size: int = 64,
        masks: Iterable[str] = KDA_MASK_SITES,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        hidden_size = checks.check_int("hidden_size", hidden_size, minimum=1)
        H = checks.check_int("num_heads", num_heads, minimum=1)
        K = checks.check_int("head_dim", head_dim, minimum=1)
        V = K if head_v_dim is None else checks.check_int("head_v_dim", head_v_dim, minimum=1)
        rank = V if gate_rank is None else checks.check_int("gate_rank", gate_rank, minimum=1)
        conv_size = checks.check_int("conv_size", conv_size, minimum=1)
        self.norm_eps = checks.check_real("norm_eps", norm_eps, above=0.0)
        self.impl = checks.check_choice("impl", impl, KDA_IMPLEMENTATIONS)
        # Its type and sign here, for every core (the recurrent one ignores it, so chunk_size="x"
        # was never refused there); which sizes a core supports, the core says at the first forward.
        self.chunk_size = checks.check_int("chunk_size", chunk_size, minimum=1)
        self.masks = checks.check_subset("masks", masks, KDA_MASK_SITES)
        factory = checks.check_factory(device, dtype)
        device = factory["device"]
        self.hidden_size, self.num_heads, self.head_dim, self.head_v_dim = hidden_size, H, K, V

        self.qkv_proj = nn.Linear(hidden_size, 2 * H * K + H * V, bias=False, **factory)
        self.conv = ShortConv(2 * H * K + H * V, conv_size, activation="silu", **factory)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False, **factory),
                                    nn.Linear(rank, H * K, bias=False, **factory))
        self.b_proj = nn.Linear(hidden_size, H, bias=False, **factory)
        # The decay's parameters stay in float32 at least: exp(A_log) and softplus are sensitive
        # to rounding, and fla keeps them float32 in bf16 models too.
        gate_dtype = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.A_log = nn.Parameter(torch.empty(H, device=device, dtype=gate_dtype).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(torch.zeros(H * K, device=device, dtype=gate_dtype))
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False, **factory),
                                    nn.Linear(rank, H * V, bias=True, **factory))
        self.o_norm_weight = nn.Parameter(torch.ones(V, **factory))
        self.o_proj = nn.Linear(H * V, hidden_size, bias=False, **factory)

    def _core(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor) -> Tensor:
        if self.impl == "triton":
            # Imported here: the kernel module loads Triton, which the references do not need.
            from ..ops.kda import kda_triton

            # validate=None: the kernel checks the values of a CPU cu_seqlens (free to read) and
            # trusts a CUDA one (no sync, capturable); the layer itself does not read them.
            o, _ = kda_triton(q, k, v, g, beta, cu_seqlens, chunk_size=self.chunk_size)
        elif self.impl == "chunked":
            o, _ = kda_chunked(q, k, v, g, beta, cu_seqlens, chunk_size=self.chunk_size)
        else:
            o, _ = kda_recurrent(q, k, v, g, beta, cu_seqlens)
        return o

    def core_inputs(self, x: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Everything before the core: ``(q, k, v, g, beta)`` for the input ``x``.

        ``q, k`` ``[T, H, K]`` (L2-normalised), ``v`` ``[T, H, V]`` in ``x``'s dtype; ``g``
        ``[T, H, K]`` in at least float32; ``beta`` ``[T, H]``. Rows past ``L`` of ``q, k, v`` are
        undefined (the short convolution's); those of ``g`` and ``beta`` are finite. Exposed so
        that the core can be timed on the layer's own inputs (the Amdahl study).
        """
        x, active = self._masked_input(x, cu_seqlens)
        return self._core_inputs(x, active, cu_seqlens)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        # max_seqlen is accepted and ignored: the call then matches the package's attention
        # modules (module(x, cu_seqlens, max_seqlen)); the KDA core sizes nothing by it.
        del max_seqlen
        x, active = self._masked_input(x, cu_seqlens)
        T = x.shape[0]
        q, k, v, g, beta = self._core_inputs(x, active, cu_seqlens)
        with mark_kernels("kda.core"):
            o = self._core(q, k, v, g, beta, cu_seqlens)
        with mark_kernels("kda.norm_gate"):
            gate = self.g_proj(x).view(T, self.num_heads, self.head_v_dim)
            o = _gated_rms_norm(o, gate, self.o_norm_weight, self.norm_eps)
        with mark_kernels("kda.out_proj"):
            return self.o_proj(o.reshape(T, self.num_heads * self.head_v_dim))

    def _masked_input(self, x: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor]:
        """Metadata checks, the active-row mask (on the device, from ``cu_seqlens[-1]``) and the
        input mask."""
        self._check_input(x, cu_seqlens)
        with mark_kernels("kda.input_mask"):
            active = active_token_mask(x, cu_seqlens)
            return (mask_inactive_tokens(x, active) if "input" in self.masks else x), active

    def _core_inputs(self, x: Tensor, active: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, ...]:
        T, H, K, V = x.shape[0], self.num_heads, self.head_dim, self.head_v_dim
        with mark_kernels("kda.qkv_proj"):
            qkv = self.qkv_proj(x)
            if "projection_grad" in self.masks:
                qkv = mask_inactive_token_gradients(qkv, active)
        with mark_kernels("kda.short_conv"):
            qkv = self.conv(qkv, cu_seqlens)  # SiLU fused into the convolution
            q, k, v = qkv.split([H * K, H * K, H * V], dim=-1)
        with mark_kernels("kda.qk_norm"):
            q, k = _l2_normalize(q.reshape(T, H, K)), _l2_normalize(k.reshape(T, H, K))
        with mark_kernels("kda.gates"):
            g = _kda_gate(self.f_proj(x).view(T, H, K), self.A_log, self.dt_bias)
            beta = torch.sigmoid(self.b_proj(x))
            if "gate_grad" in self.masks:
                g, beta = mask_inactive_token_gradients(g, active), mask_inactive_token_gradients(beta, active)
        return q, k, v.reshape(T, H, V), g, beta

    def _check_input(self, x: object, cu_seqlens: object) -> None:
        checks.check_features("x", x, self.hidden_size, like=self.qkv_proj.weight, name="hidden_size")
        checks.check_cu_seqlens(cu_seqlens, device=x.device)
        # Not the values: the core checks them (see the class docstring), and a second check here
        # would read cu_seqlens on the host a second time. Nothing before the core indexes memory
        # with them: the short convolution and the masks are tensor ops (searchsorted, where).

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"head_v_dim={self.head_v_dim}, impl={self.impl!r}, masks={sorted(self.masks)}")
