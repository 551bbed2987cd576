r"""Benchmark suite ``linear-attention``: KDA on ragged batches under CUDA graphs, against fla.

Five parts, each in a fresh process, within one time budget: ``exactness`` (the package's Triton
KDA, "ours", against float64 ``kda_chunked`` on hard ragged layouts, eager and replayed at
capacity, inactive rows NaN), ``exact_shape`` (ours and fla's ``chunk_kda`` timed at ``T = L``),
``overcapture`` (a graph captured at capacity over one captured for the exact shape, ``L`` from
``T/16`` to ``T``), ``amdahl`` (the :class:`~attn_gym_lite.models.kda.KDAAttention` layer against its
KDA core alone) and ``trace`` (one labelled replay of the layer, written under
``<out>/linear_attention_traces/``, with the device time of each region).

Inputs as in fla's tests (``q, k`` L2-normalised, ``g = logsigmoid(N(0, 1))``, ``beta =
sigmoid(N(0, 1))``), bfloat16, ``H = 16``, ``K = V = 128``. The baseline, ``fla-core`` 0.6.0, is on
the GPU host only; if it cannot be imported its rows hold the error. Timing: median of CUDA events.

Source: the seed article's KDA case study; Kimi Linear (arXiv:2510.26692); flash-linear-attention.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..graph.capture import capture_graph
from ..models.kda import KDAAttention
from ..ops.kda import kda_chunked, kda_recurrent
from ..profiling import annotate_trace, device_events, profile, record_annotations, save_trace, trace_summary
from ..ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths
from ..testing.exactness import error_stats
from .harness import device_us, error_text, isolated, recorded, run_parts

Tensor = torch.Tensor

IMPLEMENTATIONS = ("ours", "fla_graph", "fla")  # fla: chunk_kda's default mode, eager only
CAPTURABLE = ("ours", "fla_graph")
GRADIENTS = ("q", "k", "v", "g", "beta")
#: Relative error (largest |difference| over the reference's largest |value|) under which an
#: exactness entry is ``ok``, per dtype.
TOLERANCE = {"float32": 2e-3, "bfloat16": 5e-2}
FLA_PACKAGE = "fla-core 0.6.0 (from fla.ops.kda import chunk_kda)"
SHAPE = {"T": 8192, "N": 128, "M": 32, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"}
SWEEP_L = (512, 1024, 2048, 4096, 8192)
LAYER = {"hidden_size": 2304, "num_heads": 32, "head_dim": 128, "N": 32}
AMDAHL_T = (4096, 2048, 1024, 512)
TRACE_FOLDER = "linear_attention_traces"
TRACE_FILE = "kda_layer_replay.json.gz"
UNLABELLED = "(unlabelled)"
#: Seconds the whole suite may take: the recording script kills the run after a fixed time, which
#: would lose every part, so the parts share this budget and the suite returns before. A first run
#: on a fresh host spends much of it compiling (Triton, fla's autotuning).
SUITE_BUDGET_S = 540.0
#: When set, replaces SUITE_BUDGET_S (the recording script sets it when it has less time left).
BUDGET_ENV = "ATTN_GYM_LITE_LA_BUDGET_S"
MIN_PART_S = 15.0  # a fresh process, torch and CUDA initialisation alone take several seconds
PART_TIMEOUT_S = 450.0


def _describe(error: BaseException) -> str:
    return error_text(error, 2000, summary=True)


def exactness_layouts(token_capacity: int, sequence_capacity: int, count: int = 4, seed: int = 0,
                      chunk_size: int = 64) -> list[list[int]]:
    """``count`` layouts of ``N`` lengths (``T >= 8``, ``N >= 4``) that stress a ragged KDA: an empty
    sequence before active ones, a length-1 sequence, a length not a multiple of ``chunk_size``,
    empty tail slots; the first fills ``T``, the others about 3/4, 1/2 and 1/8 of it (Zipf(1.2))."""
    fractions = (1.0, 0.75, 0.5, 0.125)
    layouts = []
    for i in range(count):
        generator = torch.Generator().manual_seed(seed + i)
        active = max(4, int(token_capacity * fractions[i % len(fractions)]))
        body_tokens = active - 1  # one token for the length-1 sequence
        body_count = int(torch.randint(1, min(sequence_capacity - 2, body_tokens) + 1, (1,), generator=generator))
        body = zipf_lengths(body_tokens, body_count, generator=generator).tolist()
        if all(length % chunk_size == 0 for length in body):  # a partial last chunk somewhere
            body[0] -= 1
            body.append(1)
        lengths = body[: sequence_capacity - 2]
        lengths[-1] += sum(body[sequence_capacity - 2:])  # at most N - 2 body slots
        # An empty sequence before the last body sequence (a kernel must step over it), and a
        # length-1 sequence anywhere.
        lengths.insert(int(torch.randint(0, len(lengths), (1,), generator=generator)), 0)
        lengths.insert(int(torch.randint(0, len(lengths) + 1, (1,), generator=generator)), 1)
        layouts.append(lengths + [0] * (sequence_capacity - len(lengths)))
    return layouts


def kda_inputs(token_capacity: int, heads: int, key_dim: int, value_dim: int, *, dtype: torch.dtype,
               device: torch.device | str, seed: int, active_tokens: int | None = None,
               fill: float = float("nan"), min_log_decay: float | None = None) -> dict[str, Tensor]:
    """Random KDA inputs ``q, k, g`` ``[T, H, K]``, ``v`` ``[T, H, V]``, ``beta`` ``[T, H]`` and an output
    gradient ``grad_o`` ``[T, H, V]``, in that order, drawn on the CPU in float64 (the same seed gives
    the same values on any device) and rounded to ``dtype`` (``g`` at least float32).

    ``g = logsigmoid(N(0, 1))``, or uniform in ``[min_log_decay, 0]`` when given. Rows from
    ``active_tokens`` on hold ``fill`` (NaN: no implementation may read them).
    """
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def log_decay(*shape: int) -> Tensor:
        if min_log_decay is None:
            return F.logsigmoid(normal(*shape))
        return min_log_decay * torch.rand(*shape, generator=generator, dtype=torch.float64)

    values = {
        "q": F.normalize(normal(token_capacity, heads, key_dim), dim=-1).to(dtype),
        "k": F.normalize(normal(token_capacity, heads, key_dim), dim=-1).to(dtype),
        "v": normal(token_capacity, heads, value_dim).to(dtype),
        "g": log_decay(token_capacity, heads, key_dim).to(torch.promote_types(dtype, torch.float32)),
        "beta": torch.sigmoid(normal(token_capacity, heads)).to(dtype),
        "grad_o": normal(token_capacity, heads, value_dim).to(dtype),
    }
    if active_tokens is not None:
        for x in values.values():
            x[active_tokens:] = fill
    return {name: x.to(device) for name, x in values.items()}


def kda_function(implementation: str, num_sequences: int) -> Callable[..., Tensor]:
    """``(q, k, v, g, beta, cu_seqlens) -> o`` on the package's layout (``[T, H, ...]``, int32
    ``cu_seqlens``): ``"ours"`` (kda_triton), ``"chunked"``, ``"recurrent"`` (the references), or fla's
    ``chunk_kda`` on ``[1, T, H, ...]``, ``"fla_graph"`` (``use_graph=True, max_num_seqs=N``) or ``"fla"``."""
    if implementation in ("fla", "fla_graph"):
        from fla.ops.kda import chunk_kda

        options = {"use_graph": True, "max_num_seqs": num_sequences} if implementation == "fla_graph" else {}

        def fla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu: Tensor) -> Tensor:
            o, _ = chunk_kda(q[None], k[None], v[None], g[None], beta[None], cu_seqlens=cu.long(), **options)
            return o[0]

        return fla
    if implementation == "ours":
        from ..ops.kda import kda_triton as kernel
    else:
        kernel = {"chunked": kda_chunked, "recurrent": kda_recurrent}[implementation]
    return lambda q, k, v, g, beta, cu: kernel(q, k, v, g, beta, cu)[0]


def reference_outputs(inputs: dict[str, Tensor], cu_seqlens: Tensor) -> dict[str, Tensor]:
    """The float64 ground truth: ``kda_chunked`` on the inputs upcast, ``o`` and the gradients of
    ``q, k, v, g, beta`` for ``grad_o`` on the active rows."""
    leaves = {name: inputs[name].double().requires_grad_(True) for name in GRADIENTS}
    o, _ = kda_chunked(*leaves.values(), cu_seqlens)
    L = int(cu_seqlens[-1])
    grad_o = torch.zeros_like(o)
    grad_o[:L] = inputs["grad_o"][:L].double()
    grads = torch.autograd.grad(o, tuple(leaves.values()), grad_o)
    return {"o": o.detach(), **dict(zip(GRADIENTS, grads))}


def compare_outputs(ours: dict[str, Tensor], reference: dict[str, Tensor], active_tokens: int, dtype: str) -> dict:
    """One exactness entry: ``error_stats`` of ``o`` and every gradient on the first ``L`` rows (the
    rows past ``L`` are undefined, as the layer's masks expect), and ``ok``."""
    L = active_tokens
    stats = {name: error_stats(ours[name][:L], reference[name][:L]) for name in ("o", *GRADIENTS)}
    bound = TOLERANCE[dtype]
    return {"errors": stats, "ok": all(s["rel_err"] is not None and s["rel_err"] <= bound for s in stats.values())}


class KDAStep:
    """One KDA call (with ``backward``, also the gradients of ``q, k, v, g, beta``) on static buffers
    of ``T`` rows and ``N`` sequences, run eagerly or captured once and replayed; :meth:`load`
    copies a new batch into the same buffers."""

    def __init__(self, implementation: str, inputs: dict[str, Tensor], sequence_capacity: int, *,
                 backward: bool = True) -> None:
        self.function = kda_function(implementation, sequence_capacity)
        self.backward = backward
        self.buffers = {name: x.detach().clone().requires_grad_(backward and name in GRADIENTS)
                        for name, x in inputs.items()}
        full = cu_seqlens_from_lengths([inputs["q"].shape[0]], device=inputs["q"].device)
        self.cu_seqlens = pad_cu_seqlens(full, sequence_capacity)
        self.graph = None
        self.outputs: tuple[Tensor, ...] | None = None

    def __call__(self) -> tuple[Tensor, ...]:
        leaves = [self.buffers[name] for name in GRADIENTS]
        o = self.function(*leaves, self.cu_seqlens)
        if not self.backward:
            return (o,)
        return (o, *torch.autograd.grad(o, leaves, self.buffers["grad_o"]))

    def load(self, inputs: dict[str, Tensor] | None, cu_seqlens: Tensor) -> None:
        with torch.no_grad():
            for name, x in (inputs or {}).items():
                self.buffers[name].copy_(x)
            self.cu_seqlens.copy_(cu_seqlens)

    def capture(self) -> None:
        self.graph, self.outputs = capture_graph(self)

    def run(self) -> dict[str, Tensor]:
        """Replay the graph if captured, else call eagerly; ``{"o", "q", ...}``."""
        if self.graph is not None:
            self.graph.replay()
            outputs = self.outputs
        else:
            outputs = self()
        return dict(zip(("o", *GRADIENTS) if self.backward else ("o",), outputs))

    def time_us(self, iters: int) -> float:
        return device_us(self.graph.replay if self.graph is not None else self, iters)


def overcapture_point(L: int, M: int, captured_us: float, exact_us: float, output_diff: dict | None = None) -> dict:
    return {"L": L, "M": M, "captured_us": captured_us, "exact_us": exact_us, "ratio": captured_us / exact_us,
            "output_diff": output_diff}


def amdahl_point(T: int, M: int, core_us: float, module_us: float) -> dict:
    return {"T": T, "M": M, "core_us": core_us, "module_us": module_us, "core_share": core_us / module_us,
            "rest_us": module_us - core_us}


def amdahl_summary(points: Sequence[dict], overcaptured: dict | None = None) -> dict:
    """The seed's comparison of the largest ``T`` with half of it: ``{"T_full", "T_half", "core_drop",
    "module_drop"}`` (0.38 = 38% less time), or ``{}`` without a row at half; with ``overcaptured``
    (the graphs of ``T_full`` replayed with half the tokens) also ``"overcaptured_core_drop"`` and
    ``"overcaptured_module_drop"``, the seed's own measurement."""
    by_T = {p["T"]: p for p in points}
    full = max(by_T, default=None)
    half = by_T.get(full // 2) if full else None
    if half is None:
        return {}
    summary = {"T_full": full, "T_half": full // 2, "core_drop": 1 - half["core_us"] / by_T[full]["core_us"],
               "module_drop": 1 - half["module_us"] / by_T[full]["module_us"]}
    if overcaptured and overcaptured["T"] == full:
        summary["overcaptured_core_drop"] = 1 - overcaptured["core_us"] / by_T[full]["core_us"]
        summary["overcaptured_module_drop"] = 1 - overcaptured["module_us"] / by_T[full]["module_us"]
    return summary


def region_stage(label: str) -> str:
    """``"kda.core backward"`` -> ``"kda.core"``; ``"backward"`` and UNLABELLED are their own stage."""
    return label.removesuffix(" backward") or label


def region_table(trace: dict) -> dict:
    """Device µs, share and kernels per region of a labelled trace of one replay (``regions``), and
    per stage, forward + backward (``stages``), both by decreasing µs; ``device_us`` is the sum of
    the events' durations, ``busy_us`` their union, ``window_us`` first start to last end."""
    summary = trace_summary(trace, steps=1)
    labels = [(e.get("args", {}).get("region", UNLABELLED), e["cat"] == "kernel") for e in device_events(trace)]
    total = sum(summary["region_us"].values())

    def table(key: Callable[[str], str]) -> dict:
        us, kernels, counts = Counter(), Counter(), Counter()
        for label, time_us in summary["region_us"].items():
            us[key(label)] += time_us
        for label, is_kernel in labels:
            counts[key(label)] += 1
            kernels[key(label)] += is_kernel
        return {name: {"us": value, "share": value / total if total > 0 else 0.0, "kernels": kernels[name],
                       "device_events": counts[name]}
                for name, value in sorted(us.items(), key=lambda item: (-item[1], item[0]))}

    return {"regions": table(lambda label: label), "stages": table(region_stage), "device_us": total,
            "kernels": summary["kernels"], "device_events": summary["device_events"],
            "window_us": summary["window_us"], "busy_us": summary["busy_us"]}


# --------------------------------------------------------------------------------------------
# The parts: functions of JSON-ready arguments returning JSON-ready dicts (they run isolated).


def exactness(token_capacity: int = 1024, sequence_capacity: int = 16, heads: int = 4, key_dim: int = 128,
              value_dim: int = 128, dtypes: Sequence[str] = ("float32", "bfloat16"), layouts: int = 4,
              modes: Sequence[str] = ("eager", "graph"), device: str = "cuda", seed: int = 0) -> dict:
    """Ours against the float64 reference per dtype, mode and layout: ``"eager"`` on each layout's
    own buffers, ``"graph"`` one capture at capacity replayed after copying each layout in.
    Runs on a CPU with ``device="cpu"`` and ``modes=("eager",)`` (Triton's interpreter)."""
    all_layouts = exactness_layouts(token_capacity, sequence_capacity, layouts, seed)
    entries, errors = [], {}
    for dtype_name in dtypes:
        cases = []
        for i, lengths in enumerate(all_layouts):
            cu = cu_seqlens_from_lengths(lengths, device=device)
            L = int(sum(lengths))
            inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=getattr(torch, dtype_name),
                                device=device, seed=seed + 100 + i, active_tokens=L)
            cases.append((i, lengths, cu, L, inputs, reference_outputs(inputs, cu)))
        for mode in modes:
            with recorded(errors, f"{dtype_name}/{mode}", _describe):
                step = None
                for i, lengths, cu, L, inputs, reference in cases:
                    if step is None or mode == "eager":
                        step = KDAStep("ours", inputs, sequence_capacity)
                        if mode == "graph":
                            step.capture()
                    step.load(inputs, cu)
                    ours = {name: x.detach().clone() for name, x in step.run().items()}
                    entries.append({"dtype": dtype_name, "mode": mode, "layout": i, "L": L,
                                    "M": sum(1 for n in lengths if n), **compare_outputs(ours, reference, L, dtype_name)})
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "H": heads, "K": key_dim, "V": value_dim,
                   "layouts": all_layouts, "reference": "kda_chunked, float64, same device",
                   "inactive_fill": "nan", "tolerance": {d: TOLERANCE[d] for d in dtypes},
                   "implementation": "ours", "device": device, "seed": seed},
        "entries": entries,
        "errors": errors,
    }


def _timed_step(implementation: str, inputs: dict[str, Tensor], cu: Tensor, N: int, backward: bool, graph: bool,
                iters: int) -> float:
    step = KDAStep(implementation, inputs, N, backward=backward)
    step.load(None, cu)
    if graph:
        step.capture()
    return step.time_us(iters)


def exact_shape(token_capacity: int = SHAPE["T"], active_sequences: int = SHAPE["M"], heads: int = SHAPE["H"],
                key_dim: int = SHAPE["K"], value_dim: int = SHAPE["V"], iters: int = 30, seed: int = 0) -> dict:
    """Forward and forward + backward µs per implementation at ``T = L``, ``N = M``: from an
    exact-shape graph (ours, ``fla_graph``) and eagerly (all three)."""
    lengths = zipf_lengths(token_capacity, active_sequences, generator=torch.Generator().manual_seed(seed))
    cu = cu_seqlens_from_lengths(lengths, device="cuda")
    inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=torch.bfloat16, device="cuda", seed=seed)
    rows, errors = {}, {}
    for implementation in IMPLEMENTATIONS:
        with recorded(errors, implementation, _describe):
            rows[implementation] = {
                f"{'graph' if graph else 'eager'}_{name}_us":
                    _timed_step(implementation, inputs, cu, active_sequences, backward, graph, iters)
                for graph in ((True, False) if implementation in CAPTURABLE else (False,))
                for name, backward in (("fwd", False), ("fwd_bwd", True))
            }
        torch.cuda.empty_cache()
    ratios = {}
    if "ours" in rows and "fla_graph" in rows:
        ratios = {f"{name}_vs_fla_graph": rows["ours"][f"graph_{name}_us"] / rows["fla_graph"][f"graph_{name}_us"]
                  for name in ("fwd", "fwd_bwd")}
    return {
        "config": {"T": token_capacity, "L": token_capacity, "N": active_sequences, "M": active_sequences,
                   "H": heads, "K": key_dim, "V": value_dim, "dtype": "bfloat16", "g_dtype": "float32",
                   "lengths": "Zipf(1.2)", "iters": iters, "seed": seed, "baseline": FLA_PACKAGE},
        "rows": rows,
        "ratios": ratios,
        "errors": errors,
    }


def overcapture(token_capacity: int = SHAPE["T"], sequence_capacity: int = SHAPE["N"],
                active_sequences: int = SHAPE["M"], active_tokens: Sequence[int] = SWEEP_L, heads: int = SHAPE["H"],
                key_dim: int = SHAPE["K"], value_dim: int = SHAPE["V"], iters: int = 30, seed: int = 0) -> dict:
    """Forward + backward replay µs of a graph captured at capacity and of one captured for the exact
    shape, at each ``L``; both get the same active rows, so ``output_diff`` (largest |difference| of
    ``o`` and each gradient on the first ``L`` rows) should be ~0."""
    inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=torch.bfloat16, device="cuda", seed=seed)
    layouts = [zipf_lengths(L, min(active_sequences, L), generator=torch.Generator().manual_seed(seed))
               for L in active_tokens]
    series, errors = {}, {}
    for implementation in CAPTURABLE:
        with recorded(errors, implementation, _describe):
            captured = KDAStep(implementation, inputs, sequence_capacity)
            captured.capture()
            rows = []
            for lengths in layouts:
                L, M = int(lengths.sum()), lengths.numel()
                cu = cu_seqlens_from_lengths(lengths, device="cuda")
                captured.load(None, pad_cu_seqlens(cu, sequence_capacity))
                captured_us = captured.time_us(iters)
                at_capacity = {name: x[:L].clone() for name, x in captured.run().items()}
                exact = KDAStep(implementation, {name: x[:L] for name, x in inputs.items()}, M)
                exact.load(None, cu)
                exact.capture()
                exact_us = exact.time_us(iters)
                at_exact = exact.run()
                diff = {name: error_stats(at_capacity[name], at_exact[name])["max_abs_diff"] for name in at_capacity}
                del exact
                rows.append(overcapture_point(L, M, captured_us, exact_us, diff))
            series[implementation] = rows
            del captured
        torch.cuda.empty_cache()
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "M": active_sequences, "H": heads, "K": key_dim,
                   "V": value_dim, "dtype": "bfloat16", "lengths": "Zipf(1.2)", "iters": iters, "seed": seed,
                   "exact": "graph captured at T = L, N = M", "baseline": FLA_PACKAGE},
        "series": series,
        "errors": errors,
    }


@dataclasses.dataclass
class LayerStep:
    """The Amdahl layer on one exact-shape bfloat16 batch (``T`` rows, ``M = min(N, T)`` Zipf
    sequences); calling it returns the gradients of ``x`` and every parameter for ``grad_y``."""

    layer: torch.nn.Module
    x: Tensor
    grad_y: Tensor
    cu_seqlens: Tensor
    M: int
    generator: torch.Generator  # left where it is, for the caller's further draws
    parameters: list[Tensor]

    @classmethod
    def build(cls, token_count: int, hidden_size: int, num_heads: int, head_dim: int, active_sequences: int,
              seed: int) -> LayerStep:
        torch.manual_seed(seed)
        layer = KDAAttention(hidden_size, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
        generator = torch.Generator().manual_seed(seed)
        M = min(active_sequences, token_count)
        cu = cu_seqlens_from_lengths(zipf_lengths(token_count, M, generator=generator), device="cuda")
        x = torch.randn(token_count, hidden_size, generator=generator).to("cuda", torch.bfloat16).requires_grad_(True)
        grad_y = torch.randn(token_count, hidden_size, generator=generator).to("cuda", torch.bfloat16)
        parameters = [p for p in layer.parameters() if p.requires_grad]
        return cls(layer, x, grad_y, cu, M, generator, parameters)

    def __call__(self) -> tuple[Tensor, ...]:
        return torch.autograd.grad(self.layer(self.x, self.cu_seqlens), [self.x, *self.parameters], self.grad_y)


def _layer_and_core(T: int, replay_tokens: int | None, hidden_size: int, num_heads: int, head_dim: int,
                    active_sequences: int, iters: int, seed: int) -> dict:
    """:func:`amdahl_point` of the layer and of its core alone (on the layer's own core inputs), each
    captured at ``T`` rows, replayed with all of them or with ``replay_tokens`` in the same ``M``
    sequences."""
    module_step = LayerStep.build(T, hidden_size, num_heads, head_dim, active_sequences, seed)
    with torch.no_grad():
        core = dict(zip(GRADIENTS, module_step.layer.core_inputs(module_step.x, module_step.cu_seqlens)))
    core["grad_o"] = torch.randn(T, num_heads, head_dim, generator=module_step.generator).to("cuda", torch.bfloat16)
    module_graph, _ = capture_graph(module_step)
    core_step = KDAStep("ours", core, module_step.M)
    core_step.load(None, module_step.cu_seqlens)
    core_step.capture()
    if replay_tokens is not None:  # the same graphs, fewer tokens: the rows past L are padding
        lengths = zipf_lengths(replay_tokens, module_step.M, generator=module_step.generator)
        cu = cu_seqlens_from_lengths(lengths, device="cuda")
        module_step.cu_seqlens.copy_(cu)
        core_step.load(None, cu)
    return amdahl_point(T, module_step.M, core_step.time_us(iters), device_us(module_graph.replay, iters))


def amdahl(hidden_size: int = LAYER["hidden_size"], num_heads: int = LAYER["num_heads"],
           head_dim: int = LAYER["head_dim"], active_sequences: int = LAYER["N"],
           token_counts: Sequence[int] = AMDAHL_T, iters: int = 30, seed: int = 0) -> dict:
    """Forward + backward µs of the whole layer and of its KDA core alone, each replayed from an
    exact-shape graph, at each ``T``; then the seed's experiment: both captured at the largest ``T``
    and replayed with half its tokens (``overcaptured``)."""
    shape = (hidden_size, num_heads, head_dim, active_sequences, iters, seed)
    points, errors, overcaptured = [], {}, None
    for T in token_counts:
        with recorded(errors, f"T={T}", _describe):
            points.append(_layer_and_core(T, None, *shape))
        torch.cuda.empty_cache()
    T = max(token_counts)
    with recorded(errors, f"T={T}, L={T // 2}", _describe):
        overcaptured = {**_layer_and_core(T, T // 2, *shape), "L": T // 2}
    return {
        "config": {"hidden_size": hidden_size, "num_heads": num_heads, "head_dim": head_dim, "head_v_dim": head_dim,
                   "N": active_sequences, "dtype": "bfloat16", "lengths": "Zipf(1.2)", "iters": iters, "seed": seed,
                   "shape_note": "seed: hidden 2304, 32 KDA heads, head width not stated (B200); here the same "
                                 "hidden size and heads, head width 128",
                   "exact": "graphs captured at T = L",
                   "overcaptured": "the largest T's graphs replayed with half its tokens in the same M sequences"},
        "points": points,
        "overcaptured": overcaptured,
        "summary": amdahl_summary(points, overcaptured),
        "errors": errors,
    }


def trace(out: str | None = None, hidden_size: int = LAYER["hidden_size"], num_heads: int = LAYER["num_heads"],
          head_dim: int = LAYER["head_dim"], active_sequences: int = LAYER["N"], token_count: int = max(AMDAHL_T),
          warmup: int = 3, seed: int = 0) -> dict:
    """One replay of the Amdahl layer graph (``T = token_count``), captured inside
    ``record_annotations``, replayed ``warmup`` times, profiled (one discarded replay, then the
    recorded one), labelled with the layer's regions and summarised by :func:`region_table`.
    The trace goes to ``out/linear_attention_traces/kda_layer_replay.json.gz`` (``out=None``: not written).
    """
    step = LayerStep.build(token_count, hidden_size, num_heads, head_dim, active_sequences, seed)
    with record_annotations(["kda layer"]) as annotations:
        graph, _ = capture_graph(step)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    with profile(None, warmup=1) as recording:
        for _ in range(2):  # the profiler's warm-up replay (discarded), then the recorded one
            graph.replay()
            torch.cuda.synchronize()
            recording.step()
    labelled = annotate_trace(recording.trace, annotations)
    report = labelled["attn_gym_lite"]
    errors = {}
    if report["replays"] != 1:
        errors["replays"] = f"the trace holds {report['replays']} graph replays, not 1"
    if report["unmatched_replays"]:
        errors["labels"] = "replays left unlabelled: " + "; ".join(r["reason"] for r in report["unmatched_replays"])
    trace_file = None
    if out is not None:
        save_trace(labelled, Path(out) / TRACE_FOLDER / TRACE_FILE)
        trace_file = f"{TRACE_FOLDER}/{TRACE_FILE}"
    return {
        "config": {"hidden_size": hidden_size, "num_heads": num_heads, "head_dim": head_dim, "head_v_dim": head_dim,
                   "T": token_count, "L": token_count, "N": active_sequences, "M": step.M, "dtype": "bfloat16",
                   "lengths": "Zipf(1.2)", "seed": seed, "warmup_replays": warmup, "profiled_replays": 1,
                   "graph": "KDAAttention forward + backward (gradients of x and every parameter), "
                            "captured at T = L, as in the amdahl part"},
        "route": annotations.route,
        "trace_file": trace_file,
        "annotation": report,
        **region_table(labelled),
        "errors": errors,
    }


PART_FUNCTIONS: dict[str, Callable[..., dict]] = {
    "exactness": exactness, "exact_shape": exact_shape, "overcapture": overcapture, "amdahl": amdahl,
    "trace": trace,  # last: the profiler slows later launches in a process, and it writes files
}
PARTS = tuple(PART_FUNCTIONS)


def _fla_version() -> str:
    try:
        import fla

        return str(getattr(fla, "__version__", "unknown"))
    except Exception as exc:
        return _describe(exc)


def default_budget_s() -> float:
    """:data:`BUDGET_ENV` if set, else :data:`SUITE_BUDGET_S`."""
    return float(os.environ.get(BUDGET_ENV, SUITE_BUDGET_S))


def linear_attention_suite(*, out: Path | str | None = None) -> dict:
    """Every part in a fresh process, within :func:`default_budget_s` seconds (each part at most
    :data:`PART_TIMEOUT_S`); a part that fails, times out or finds less than :data:`MIN_PART_S`
    left is an entry of ``errors``. The ``trace`` part writes under ``out`` (the CLI's folder)."""
    budget_s = default_budget_s()
    # The folder travels as a string: an isolated part gets its arguments as JSON.
    parts = {name: isolated(function, *((None if out is None else str(out),) if name == "trace" else ()))
             for name, function in PART_FUNCTIONS.items()}
    done, errors = run_parts(parts, timeout_s=PART_TIMEOUT_S, budget_s=budget_s, min_part_s=MIN_PART_S,
                             describe=_describe)
    return {"config": {"fla": _fla_version(), "parts": list(PARTS), "budget_s": budget_s}, **done, "errors": errors}
