r"""A Kimi Delta Attention (KDA) layer on packed batches, masked for padded capacity.

::

    x ─► [input: value mask] ─┬─► qkv projection ─► [projection_grad: gradient barrier]
                              │     ─► short conv (ragged) ─► SiLU ─► q, k, v ─► L2 norm (q, k)
                              ├─► f_proj (low rank) ─► g = -exp(A_log) · softplus(· + dt_bias)
                              ├─► b_proj ─► beta = sigmoid(·)
                              │     [gate_grad: gradient barrier on g and beta]
                              │   KDA core (q, k, v, g, beta, cu_seqlens)  ─► o ─► [output: value mask]
                              └─► g_proj (low rank) ─► gated RMSNorm(o, sigmoid gate) ─► output projection

The layer of Kimi Linear (arXiv:2510.26692) and fla's ``KimiDeltaAttention``, without the
residual; q, k, v share one projection and one depthwise convolution. Masks, by the "Masking"
chapter's rule: ``input`` (every weight gradient sums over every row, which may hold NaN),
``projection_grad`` (the short convolution leaves its inactive input-gradient rows undefined),
``gate_grad`` and ``output`` (the core leaves rows past ``L`` of its output and gradients undefined).
The convolution and the core are ragged and the rest token-parallel, so nothing else needs one.
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

__all__ = ["KDAAttention", "KDA_MASK_SITES", "KDA_REGIONS", "gated_rms_norm", "kda_gate", "l2_normalize"]

#: Where :class:`KDAAttention` masks, in forward order.
KDA_MASK_SITES = ("input", "projection_grad", "gate_grad", "output")

#: The regions :class:`KDAAttention` marks its stages with (:func:`attn_gym_lite.regions.mark_kernels`),
#: in forward order; in a labelled trace a stage's backward kernels carry ``"<region> backward"``.
KDA_REGIONS = ("kda.input_mask", "kda.qkv_proj", "kda.short_conv", "kda.qk_norm", "kda.gates", "kda.core",
               "kda.norm_gate", "kda.out_proj")


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim, in at least float32."""
    # The same thing as an RMSNorm with eps / K and weight K ** -0.5: one fused kernel each way on a
    # GPU (float32 inside); written out, the formula takes seven kernels forward and eleven backward.
    # In bfloat16 the weight rounds (exact at K = 16 and 64, 1 - 1.1e-4 of it at 128: twenty times
    # below one output ulp).
    K = x.shape[-1]
    return F.rms_norm(x, (K,), x.new_full((K,), K**-0.5), eps / K)


def kda_gate(f: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """KDA's log-decay ``g = -exp(A_log[h]) · softplus(f + dt_bias) <= 0``, ``f [T, H, K]``, in the
    parameters' dtype (float32 or wider in the layer): the add promotes ``f`` in the same kernel."""
    _, heads, width = f.shape
    return -A_log.exp().view(heads, 1) * F.softplus(f + dt_bias.view(heads, width))


def gated_rms_norm(o: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``RMSNorm(o) · weight · sigmoid(gate)`` over the last dim: the norm in float32 inside torch's
    fused kernel, the gate in ``o``'s dtype: in bfloat16 three roundings, a median relative error of
    2.0e-3 (1.4e-3 with a float32 product, at four more passes over the tensors each way)."""
    return F.rms_norm(o, (o.shape[-1],), weight, eps) * torch.sigmoid(gate)


class KDAAttention(nn.Module):
    """Kimi Delta Attention on a packed batch: ``forward(x [T, hidden_size], cu_seqlens, max_seqlen=None)
    -> [T, hidden_size]``, rows past ``L`` zero whatever ``x`` holds there.

    ``head_dim``/``head_v_dim`` are ``K``/``V`` per head (16 to 128 for the Triton core);
    ``gate_rank`` the inner width of ``f_proj``/``g_proj`` (default ``V``); ``impl`` the core:
    ``"triton"`` (capturable), ``"chunked"`` or ``"recurrent"`` (eager references). ``masks``: the
    sites of :data:`KDA_MASK_SITES` to apply, fewer only to see what each prevents. ``max_seqlen`` is
    ignored (no KDA core needs it) so that the layer is called like the attention modules.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int = 128, *, head_v_dim: int | None = None,
                 conv_size: int = 4, gate_rank: int | None = None, norm_eps: float = 1e-5, impl: str = "triton",
                 chunk_size: int = 64, masks: Iterable[str] = KDA_MASK_SITES,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        H, K = num_heads, head_dim
        V = K if head_v_dim is None else head_v_dim
        rank = V if gate_rank is None else gate_rank
        self.masks = frozenset(masks)
        if not self.masks <= set(KDA_MASK_SITES):  # a misspelt site would silently switch its mask off
            raise ValueError(f"masks must be sites from {KDA_MASK_SITES}, got unknown {sorted(self.masks - set(KDA_MASK_SITES))}")
        self.norm_eps, self.impl, self.chunk_size = norm_eps, impl, chunk_size
        self.hidden_size, self.num_heads, self.head_dim, self.head_v_dim = hidden_size, H, K, V
        factory = dict(device=device, dtype=dtype)

        self.qkv_proj = nn.Linear(hidden_size, 2 * H * K + H * V, bias=False, **factory)
        self.conv = ShortConv(2 * H * K + H * V, conv_size, activation="silu", **factory)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False, **factory),
                                    nn.Linear(rank, H * K, bias=False, **factory))
        self.b_proj = nn.Linear(hidden_size, H, bias=False, **factory)
        # The decay's parameters stay in float32 at least: exp(A_log) and softplus are sensitive to
        # rounding, and fla keeps them float32 in bfloat16 models too.
        gate_dtype = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.A_log = nn.Parameter(torch.empty(H, device=device, dtype=gate_dtype).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(torch.zeros(H * K, device=device, dtype=gate_dtype))
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False, **factory),
                                    nn.Linear(rank, H * V, bias=True, **factory))
        self.o_norm_weight = nn.Parameter(torch.ones(V, **factory))
        self.o_proj = nn.Linear(H * V, hidden_size, bias=False, **factory)

    def _core(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor) -> Tensor:
        if self.impl == "recurrent":
            return kda_recurrent(q, k, v, g, beta, cu_seqlens)[0]
        if self.impl == "chunked":
            return kda_chunked(q, k, v, g, beta, cu_seqlens, chunk_size=self.chunk_size)[0]
        from ..ops.kda import kda_triton  # loads Triton, which the references do without

        return kda_triton(q, k, v, g, beta, cu_seqlens, chunk_size=self.chunk_size)[0]

    def core_inputs(self, x: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(q, k, v, g, beta)``: everything before the core, to time it on the layer's own inputs."""
        x, active = self._masked_input(x, cu_seqlens)
        return self._core_inputs(x, active, cu_seqlens)

    def forward(self, x: Tensor, cu_seqlens: Tensor, max_seqlen: int | None = None) -> Tensor:
        x, active = self._masked_input(x, cu_seqlens)
        T = x.shape[0]
        q, k, v, g, beta = self._core_inputs(x, active, cu_seqlens)
        with mark_kernels("kda.core"):
            o = self._core(q, k, v, g, beta, cu_seqlens)
        with mark_kernels("kda.norm_gate"):  # the output mask here: "kda.core" is the core alone, as timed
            if "output" in self.masks:
                o = mask_inactive_tokens(o, active)
            gate = self.g_proj(x).view(T, self.num_heads, self.head_v_dim)
            o = gated_rms_norm(o, gate, self.o_norm_weight, self.norm_eps)
        with mark_kernels("kda.out_proj"):
            return self.o_proj(o.reshape(T, self.num_heads * self.head_v_dim))

    def _masked_input(self, x: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor]:
        checks.check_cu_seqlens(cu_seqlens, device=x.device)  # metadata only: capturable
        with mark_kernels("kda.input_mask"):
            active = active_token_mask(x, cu_seqlens)  # on the device, from cu_seqlens[-1]
            return (mask_inactive_tokens(x, active) if "input" in self.masks else x), active

    def _core_inputs(self, x: Tensor, active: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, ...]:
        T, H, K, V = x.shape[0], self.num_heads, self.head_dim, self.head_v_dim
        with mark_kernels("kda.qkv_proj"):
            qkv = self.qkv_proj(x)
            if "projection_grad" in self.masks:
                qkv = mask_inactive_token_gradients(qkv, active)
        with mark_kernels("kda.short_conv"):
            q, k, v = self.conv(qkv, cu_seqlens).split([H * K, H * K, H * V], dim=-1)  # SiLU fused
        with mark_kernels("kda.qk_norm"):
            q, k = l2_normalize(q.reshape(T, H, K)), l2_normalize(k.reshape(T, H, K))
        with mark_kernels("kda.gates"):
            g = kda_gate(self.f_proj(x).view(T, H, K), self.A_log, self.dt_bias)
            beta = torch.sigmoid(self.b_proj(x))
            if "gate_grad" in self.masks:
                g, beta = mask_inactive_token_gradients(g, active), mask_inactive_token_gradients(beta, active)
        return q, k, v.reshape(T, H, V), g, beta
