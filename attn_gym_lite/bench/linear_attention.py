r"""Benchmark suite ``linear-attention``: KDA on ragged batches under CUDA graphs, against fla.

Five parts, each run in a fresh process (a CUDA fault in one is recorded, the others still run):

* ``exactness``: the package's Triton KDA (:func:`attn_gym_lite.ops.kda.kda_triton`, "ours")
  against :func:`~attn_gym_lite.ops.kda.kda_chunked` in float64 on the GPU, on random ragged
  layouts with empty and length-1 sequences and lengths that are not multiples of ``C``: the
  output and the gradients of ``q, k, v, g, beta`` on the active rows, eagerly and replayed from
  one CUDA graph captured at capacity while the layout changes under it. The inactive rows of
  every input and of the output gradient hold NaN, so a kernel that reads them shows it.
* ``exact_shape``: forward and forward + backward time of ours and of fla's ``chunk_kda`` at
  the exact shape (``T = L``, ``N = M``): ours and ``chunk_kda(use_graph=True)`` replayed from
  CUDA graphs, and ``chunk_kda`` in its default mode eagerly (it reads ``cu_seqlens`` on the host,
  so it cannot be captured).
* ``overcapture``: ``T = 8192``, ``N = 128`` fixed, ``L`` from ``T/16`` to ``T`` (``M = 32``): the
  replay time of a graph captured once at capacity over the time of a graph captured for the
  exact shape, for ours and ``chunk_kda(use_graph=True)``; and the largest difference between
  the two graphs' outputs and gradients on the active rows (same inputs), which should be ~0.
* ``amdahl``: :class:`~attn_gym_lite.models.kda.KDAAttention` forward + backward against its
  KDA core alone on the layer's own inputs, both replayed from exact-shape graphs, at
  ``T = 4096`` and half of it (and two smaller ``T`` for the scaling figure).
* ``trace``: one replay of the Amdahl study's layer graph (forward + backward, exact shape, its
  largest ``T``), profiled with the layer's region labels
  (:data:`~attn_gym_lite.models.kda.KDA_REGIONS`) and written as gzipped Chrome JSON,
  ``<out>/linear_attention_traces/kda_layer_replay.json.gz`` (ui.perfetto.dev opens it), with the
  device time and kernel count of each region (:func:`region_table`).

Shapes: ``H = 16`` heads, ``K = V = 128``, bfloat16 (``g`` float32, as the layer makes it);
``q, k`` L2-normalised, ``g = logsigmoid(N(0, 1))`` per channel, ``beta = sigmoid(N(0, 1))``
(flash-linear-attention's test inputs). The layer of ``amdahl`` has the seed's hidden size (2304)
and head count (32); the seed does not state its head width, so it is 128 here, a width the
kernel's tiles take. Unlike the seed, which halves the tokens inside one graph captured at
``T_max``, each ``T`` here is replayed from a graph captured for it.

The baseline is ``fla-core`` 0.6.0 (``from fla.ops.kda import chunk_kda``; shapes ``[1, T, H, K]``,
``cu_seqlens`` int64), installed on the GPU host only; the package never imports it on its own
path. If it cannot be imported, its rows hold the error string and ours are still measured.
Timing: median of CUDA-event timings (:func:`attn_gym_lite.bench.timing.cuda_event_us`).

Source: the seed article's KDA case study (overcapture sweeps, "A real KDA module"); Kimi Linear
report (arXiv:2510.26692); flash-linear-attention (fla-org/flash-linear-attention) ``chunk_kda``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..isolation import describe_error, run_isolated, run_within_budget
from ..ops.kda import kda_chunked, kda_recurrent
from ..ragged import cu_seqlens_from_lengths, pad_cu_seqlens, zipf_lengths
from ..testing.exactness import error_stats
from .timing import cuda_event_us, median

Tensor = torch.Tensor

#: Implementations a part can time: ours (the Triton kernel), fla's ``chunk_kda`` in its graph-safe
#: mode, and fla's default (eager only) mode.
IMPLEMENTATIONS = ("ours", "fla_graph", "fla")
CAPTURABLE = ("ours", "fla_graph")
#: The gradients every exactness entry compares, besides the output ``o``.
GRADIENTS = ("q", "k", "v", "g", "beta")
#: The suite's parts, in the order they run.
PARTS = ("exactness", "exact_shape", "overcapture", "amdahl", "trace")
#: The parts that write files beside the suite's JSON: each takes the output folder (a string, or
#: ``None`` to write nothing) as its first argument.
WRITES_FILES = ("trace",)
#: Relative error bound (largest |difference| over the float64 reference's largest |value|) under
#: which an exactness entry is ``ok``, per dtype of ours.
TOLERANCE = {"float32": 2e-3, "bfloat16": 5e-2}
FLA_PACKAGE = "fla-core 0.6.0 (from fla.ops.kda import chunk_kda)"

#: The benchmark shape: capacity, sequence capacity, active sequences, heads, key and value widths.
SHAPE = {"T": 8192, "N": 128, "M": 32, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"}
#: ``L`` of the overcapture sweep: ``T / 16 .. T``.
SWEEP_L = (512, 1024, 2048, 4096, 8192)
#: The Amdahl study's layer and token counts (the seed's T = 4096 and half of it first).
LAYER = {"hidden_size": 2304, "num_heads": 32, "head_dim": 128, "N": 32}
AMDAHL_T = (4096, 2048, 1024, 512)
#: Where the ``trace`` part writes its trace, under the suite's output folder (beside the
#: ``profiling`` suite's ``profiling_traces/``).
TRACE_FOLDER = "linear_attention_traces"
TRACE_FILE = "kda_layer_replay.json.gz"
#: What :func:`~attn_gym_lite.profiling.trace_summary` calls device work that carries no region.
UNLABELLED = "(unlabelled)"
#: Seconds the whole suite may take by default. The recording script (``scripts/gpu_record.sh``,
#: pass L, a device call of its own) gives the ``linear-attention`` run a fixed time in all and kills
#: it after, which would lose every part, finished or not; so the parts share this budget and the
#: suite returns (and the CLI writes its JSON) before that. A first run on a fresh host spends much of
#: it compiling (Triton, fla's autotuning, cached on disk for the later parts): on an H200 the
#: exactness part took about 76 s and the exact-shape part did not finish in the 194 s a 270 s
#: budget left it (2026-12-01, d24bb81), hence 540 s.
SUITE_BUDGET_S = 540.0
#: An environment variable that, when set, replaces :data:`SUITE_BUDGET_S` as the default budget
#: (seconds > 0): the recording script sets it when its device call has less time left than usual.
#: The budget a run had is recorded in its ``config``.
BUDGET_ENV = "ATTN_GYM_LITE_LA_BUDGET_S"
#: A part is not started with less than this left of the budget (a fresh process, torch and CUDA
#: initialisation alone take several seconds).
MIN_PART_S = 15.0
_ERROR_CHARS = 2000  # of an error message in the record (an isolated part's carries its stderr's end)


# --------------------------------------------------------------------------------------------
# CPU-testable pieces: layouts, inputs, the implementations behind one signature, comparisons.


def exactness_layouts(token_capacity: int, sequence_capacity: int, count: int = 4, seed: int = 0,
                      chunk_size: int = 64) -> list[list[int]]:
    """``count`` ragged layouts (``N`` lengths each, summing to ``L <= T``) that stress a ragged KDA.

    Every layout holds an empty sequence followed by active ones, a length-1 sequence, at
    least one length that is not a multiple of ``chunk_size``, and empty tail slots whenever its
    ``M < N``; the first layout fills the capacity (``L = T``), the others leave ``T - L`` rows
    inactive (``L`` about 3/4, 1/2 and 1/8 of ``T``, cycling). The other lengths are Zipf(1.2).

    Args:
        token_capacity: ``T >= 8``.
        sequence_capacity: ``N >= 4``.
        count: how many layouts (>= 1).
        seed: the CPU generator's seed (layout ``i`` uses ``seed + i``).
        chunk_size: ``C``, for the non-multiple guarantee.

    Returns:
        ``count`` lists of ``N`` non-negative ints.

    Raises:
        ValueError: ``T < 8``, ``N < 4`` or ``count < 1``.
    """
    if token_capacity < 8 or sequence_capacity < 4 or count < 1:
        raise ValueError(f"exactness_layouts needs T >= 8, N >= 4, count >= 1, got T={token_capacity}, "
                         f"N={sequence_capacity}, count={count}")
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
        # An empty sequence before the last body sequence (so active ones follow it: a kernel must
        # step over it), and a length-1 sequence anywhere.
        lengths.insert(int(torch.randint(0, len(lengths), (1,), generator=generator)), 0)
        lengths.insert(int(torch.randint(0, len(lengths) + 1, (1,), generator=generator)), 1)
        layouts.append(lengths + [0] * (sequence_capacity - len(lengths)))
    return layouts


def kda_inputs(token_capacity: int, heads: int, key_dim: int, value_dim: int, *, dtype: torch.dtype,
               device: torch.device | str, seed: int, active_tokens: int | None = None,
               fill: float = float("nan"), min_log_decay: float | None = None) -> dict[str, Tensor]:
    """Random KDA inputs ``q, k, g`` ``[T, H, K]``, ``v`` ``[T, H, V]``, ``beta`` ``[T, H]`` and an
    output gradient ``grad_o`` ``[T, H, V]``, drawn on the CPU in float64 (the same seed gives the
    same values on any device, rounded to ``dtype``), in that order:
    ``q, k, v, g, beta, grad_o = kda_inputs(...).values()``.

    ``q, k`` are L2-normalised per head (as Kimi Linear feeds the core), ``beta = sigmoid(N(0,
    1))``, ``v`` and ``grad_o`` standard normal; ``g = logsigmoid(N(0, 1))`` (fla's test inputs), or
    uniform in ``[min_log_decay, 0]`` when ``min_log_decay`` is given (a chosen decay strength:
    mild for float32 kernels, extreme to test that nothing overflows). All but ``g`` in ``dtype``;
    ``g`` in float32, or float64 when ``dtype`` is. With ``active_tokens = L``, rows ``L .. T - 1``
    of every tensor hold ``fill`` (NaN by default: no implementation may read them).
    """
    generator = torch.Generator().manual_seed(seed)
    gate_dtype = torch.promote_types(dtype, torch.float32)

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
        "g": log_decay(token_capacity, heads, key_dim).to(gate_dtype),
        "beta": torch.sigmoid(normal(token_capacity, heads)).to(dtype),
        "grad_o": normal(token_capacity, heads, value_dim).to(dtype),
    }
    if active_tokens is not None:
        for x in values.values():
            x[active_tokens:] = fill
    return {name: x.to(device) for name, x in values.items()}


def kda_function(implementation: str, num_sequences: int | None = None) -> Callable[..., Tensor]:
    """``(q, k, v, g, beta, cu_seqlens) -> o`` for one implementation, all on the package's layout
    (``[T, H, ...]``, int32 ``cu_seqlens``).

    * ``"ours"``: :func:`attn_gym_lite.ops.kda.kda_triton` (capturable).
    * ``"chunked"`` / ``"recurrent"``: the eager references (not capturable).
    * ``"fla_graph"``: fla's ``chunk_kda(use_graph=True, max_num_seqs=N)`` on ``[1, T, H, ...]``
      with ``cu_seqlens`` as int64 (capturable; ``num_sequences`` is that ``N``; the int64 copy
      of ``cu_seqlens`` is made inside the call, so a graph recaptures it at every replay).
    * ``"fla"``: fla's ``chunk_kda`` in its default mode (reads ``cu_seqlens`` on the host).

    Raises:
        ValueError: an unknown ``implementation``; ``"fla_graph"`` without ``num_sequences``.
        ImportError: fla cannot be imported (for the fla implementations only).
    """
    if implementation == "ours":
        from ..ops.kda import kda_triton

        return lambda q, k, v, g, beta, cu: kda_triton(q, k, v, g, beta, cu)[0]
    if implementation == "chunked":
        return lambda q, k, v, g, beta, cu: kda_chunked(q, k, v, g, beta, cu)[0]
    if implementation == "recurrent":
        return lambda q, k, v, g, beta, cu: kda_recurrent(q, k, v, g, beta, cu)[0]
    if implementation in ("fla", "fla_graph"):
        from fla.ops.kda import chunk_kda

        graph = implementation == "fla_graph"
        if graph and num_sequences is None:
            raise ValueError("kda_function: 'fla_graph' needs num_sequences (fla's max_num_seqs)")
        options = {"use_graph": True, "max_num_seqs": num_sequences} if graph else {}

        def fla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu: Tensor) -> Tensor:
            o, _ = chunk_kda(q[None], k[None], v[None], g[None], beta[None], cu_seqlens=cu.long(), **options)
            return o[0]

        return fla
    raise ValueError(f"implementation must be one of {('chunked', 'recurrent', *IMPLEMENTATIONS)}, got {implementation!r}")


def reference_outputs(inputs: dict[str, Tensor], cu_seqlens: Tensor) -> dict[str, Tensor]:
    """The float64 ground truth: :func:`kda_chunked` on ``inputs`` upcast (the rounded values ours
    sees, so only the computation is compared), ``o`` and the gradients of ``q, k, v, g, beta``
    for the output gradient ``grad_o``; NaN rows past ``L`` are never read by it."""
    leaves = {name: inputs[name].double().requires_grad_(True) for name in GRADIENTS}
    o, _ = kda_chunked(*(leaves[name] for name in GRADIENTS), cu_seqlens)
    L = int(cu_seqlens[-1])
    grad_o = torch.zeros_like(o)
    grad_o[:L] = inputs["grad_o"][:L].double()
    grads = torch.autograd.grad(o, tuple(leaves.values()), grad_o)
    return {"o": o.detach(), **dict(zip(GRADIENTS, grads))}


def compare_outputs(ours: dict[str, Tensor], reference: dict[str, Tensor], active_tokens: int, dtype: str) -> dict:
    """One exactness entry: :func:`~attn_gym_lite.testing.exactness.error_stats` of ``o`` and every
    gradient on rows ``0 .. L-1``, the largest |value| of ``o`` in rows ``L..T-1`` (``None`` if not
    finite; should be 0), and ``ok``: every entry finite and within :data:`TOLERANCE` for
    ``dtype``."""
    L = active_tokens
    stats = {name: error_stats(ours[name][:L], reference[name][:L]) for name in ("o", *GRADIENTS)}
    tail = ours["o"][L:]
    inactive = error_stats(tail, torch.zeros_like(tail))["max_abs_diff"]  # the largest |value|, None if not finite
    bound = TOLERANCE[dtype]
    ok = inactive == 0.0 and all(s["rel_err"] is not None and s["rel_err"] <= bound for s in stats.values())
    return {"errors": stats, "inactive_output_max_abs": inactive, "ok": ok}


class KDAStep:
    """One KDA call (``backward=True``: forward and the gradients of ``q, k, v, g, beta``) on static
    buffers of capacity ``T`` rows and ``N`` sequences, to run eagerly or capture once and replay.

    ``inputs`` (from :func:`kda_inputs`) are copied into leaf buffers that this object owns; the
    int32 ``cu_seqlens`` buffer starts as one full sequence. ``load(inputs, cu_seqlens)`` copies a new
    batch into the same buffers (what a training loop does before a replay).
    """

    def __init__(self, implementation: str, inputs: dict[str, Tensor], sequence_capacity: int, *,
                 backward: bool = True) -> None:
        self.function = kda_function(implementation, sequence_capacity)
        self.backward = backward
        self.buffers = {name: x.detach().clone().requires_grad_(backward and name in GRADIENTS)
                        for name, x in inputs.items()}
        token_capacity = inputs["q"].shape[0]
        device = inputs["q"].device
        self.cu_seqlens = pad_cu_seqlens(cu_seqlens_from_lengths([token_capacity], device=device),
                                         sequence_capacity)
        self.graph = None
        self.outputs: tuple[Tensor, ...] | None = None

    def __call__(self) -> tuple[Tensor, ...]:
        b = self.buffers
        o = self.function(*(b[name] for name in GRADIENTS), self.cu_seqlens)
        if not self.backward:
            return (o,)
        return (o, *torch.autograd.grad(o, tuple(b[name] for name in GRADIENTS), b["grad_o"]))

    def load(self, inputs: dict[str, Tensor] | None, cu_seqlens: Tensor) -> None:
        """Copy ``inputs`` (optional) and ``cu_seqlens`` (int32 ``[N + 1]``) into the buffers."""
        with torch.no_grad():
            for name, x in (inputs or {}).items():
                self.buffers[name].copy_(x)
            self.cu_seqlens.copy_(cu_seqlens)

    def capture(self) -> None:
        """Capture one call as a CUDA graph (:func:`attn_gym_lite.graph.capture_graph`)."""
        from ..graph.capture import capture_graph

        self.graph, self.outputs = capture_graph(self)

    def run(self) -> dict[str, Tensor]:
        """Replay the graph if captured, else call eagerly; ``{"o", "q", ...}`` (gradients by input)."""
        if self.graph is not None:
            self.graph.replay()
            outputs = self.outputs
        else:
            outputs = self()
        return dict(zip(("o", *GRADIENTS) if self.backward else ("o",), outputs))

    def time_us(self, iters: int) -> float:
        """Median µs (CUDA events) of a replay, or of an eager call before :meth:`capture`."""
        return median(cuda_event_us(self.graph.replay if self.graph is not None else self, iters))


def overcapture_point(L: int, M: int, captured_us: float, exact_us: float, output_diff: dict | None = None) -> dict:
    """One row of an overcapture series: ``{"L", "M", "captured_us", "exact_us", "ratio",
    "output_diff"}`` with ``ratio = captured_us / exact_us``."""
    return {"L": L, "M": M, "captured_us": captured_us, "exact_us": exact_us, "ratio": captured_us / exact_us,
            "output_diff": output_diff}


def amdahl_point(T: int, M: int, core_us: float, module_us: float) -> dict:
    """One row of the Amdahl study: ``{"T", "M", "core_us", "module_us", "core_share", "rest_us"}``
    (``core_share = core_us / module_us``, ``rest_us`` what the module spends outside the core)."""
    return {"T": T, "M": M, "core_us": core_us, "module_us": module_us, "core_share": core_us / module_us,
            "rest_us": module_us - core_us}


def amdahl_summary(points: Sequence[dict]) -> dict:
    """From the Amdahl rows, the seed's comparison between the largest ``T`` and the row at half of
    it: ``{"T_full", "T_half", "core_drop", "module_drop"}`` (fractions: 0.38 = 38% less time), or
    ``{}`` when no row sits at half of the largest ``T``."""
    by_T = {p["T"]: p for p in points}
    if not by_T:
        return {}
    full = max(by_T)
    half = by_T.get(full // 2)
    if half is None:
        return {}
    return {"T_full": full, "T_half": full // 2, "core_drop": 1 - half["core_us"] / by_T[full]["core_us"],
            "module_drop": 1 - half["module_us"] / by_T[full]["module_us"]}


def region_stage(label: str) -> str:
    """The stage a region label belongs to: ``"kda.core backward"`` -> ``"kda.core"``; a label of no
    region's backward (``"backward"``, :data:`UNLABELLED`) is its own stage."""
    return label.removesuffix(" backward") or label


def region_table(trace: dict) -> dict:
    """Device time and kernels per region of a labelled trace of one graph replay (what
    :func:`~attn_gym_lite.profiling.annotate_trace` returns).

    The µs per region are :func:`~attn_gym_lite.profiling.trace_summary`'s ``region_us`` (the sum of
    the durations of the kernel, memcpy and memset events carrying that ``args["region"]``, events
    with none under :data:`UNLABELLED`); the counts come from
    :func:`~attn_gym_lite.profiling.device_events` with the same rule. A region's ``share`` is its
    µs over ``device_us``, the sum over all regions: the replay's device time as the sum of its
    events' durations (events that overlap each count in full; ``busy_us`` is their union).

    Args:
        trace: a Chrome trace dict of one replay, labelled.

    Returns:
        ``{"regions": {label: row}, "stages": {stage: row}, "device_us", "kernels", "device_events",
        "window_us", "busy_us"}`` with ``row = {"us", "share", "kernels", "device_events"}``, both
        tables in decreasing µs; ``stages`` adds each ``"<region> backward"`` to its region
        (:func:`region_stage`), so a stage's row is its forward + backward. ``window_us`` is the span
        from the first device event's start to the last one's end, ``busy_us`` the union of the events
        (both from :func:`~attn_gym_lite.profiling.trace_summary`).

    Raises:
        TypeError / ValueError: what :func:`~attn_gym_lite.profiling.trace_summary` raises (a
            malformed trace, or one without device events).
    """
    from ..profiling import device_events, trace_summary

    summary = trace_summary(trace, steps=1)
    events = device_events(trace)
    labels = [(e.get("args", {}).get("region", UNLABELLED), e["cat"] == "kernel") for e in events]
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
# The parts. Each is a module-level function of JSON-ready arguments returning a JSON-ready dict,
# so the suite can run it in a fresh process (attn_gym_lite.isolation.run_isolated).


def exactness(token_capacity: int = 1024, sequence_capacity: int = 16, heads: int = 4, key_dim: int = 128,
              value_dim: int = 128, dtypes: Sequence[str] = ("float32", "bfloat16"), layouts: int = 4,
              modes: Sequence[str] = ("eager", "graph"), device: str = "cuda", seed: int = 0,
              implementation: str = "ours") -> dict:
    """Ours against the float64 chunked reference, per dtype, mode and layout.

    ``"eager"`` calls the implementation on each layout's own buffers; ``"graph"`` captures one
    call at capacity (``T``, ``N``) and replays it after copying each layout into the same buffers.
    Inputs and the output gradient are NaN in rows ``L .. T - 1``.

    Returns:
        ``{"config", "entries": [{"dtype", "mode", "layout", "L", "M", **compare_outputs}], "errors"}``.
        An exception in one (dtype, mode) is recorded in ``errors`` under ``"<dtype>/<mode>"``.

    Runs on a CPU with ``device="cpu"`` and ``modes=("eager",)`` (the Triton kernel through the
    interpreter), at small shapes.
    """
    all_layouts = exactness_layouts(token_capacity, sequence_capacity, layouts, seed)
    entries, errors = [], {}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        cases = []
        for i, lengths in enumerate(all_layouts):
            cu = cu_seqlens_from_lengths(lengths, device=device)
            L = int(sum(lengths))
            inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=dtype, device=device,
                                seed=seed + 100 + i, active_tokens=L)
            cases.append((i, lengths, cu, L, inputs, reference_outputs(inputs, cu)))
        for mode in modes:
            try:
                step = None
                for i, lengths, cu, L, inputs, reference in cases:
                    if step is None or mode == "eager":
                        step = KDAStep(implementation, inputs, sequence_capacity)
                        if mode == "graph":
                            step.capture()
                    step.load(inputs, cu)
                    ours = {name: x.detach().clone() for name, x in step.run().items()}
                    entries.append({"dtype": dtype_name, "mode": mode, "layout": i, "L": L,
                                    "M": sum(1 for n in lengths if n), **compare_outputs(ours, reference, L, dtype_name)})
            except Exception as exc:  # recorded; the other modes still run
                errors[f"{dtype_name}/{mode}"] = describe_error(exc, max_chars=_ERROR_CHARS)
    return {
        "config": {"T": token_capacity, "N": sequence_capacity, "H": heads, "K": key_dim, "V": value_dim,
                   "layouts": all_layouts, "reference": "kda_chunked, float64, same device",
                   "inactive_fill": "nan", "tolerance": {d: TOLERANCE[d] for d in dtypes},
                   "implementation": implementation, "device": device, "seed": seed},
        "entries": entries,
        "errors": errors,
    }


def _timed_step(implementation: str, inputs: dict[str, Tensor], cu: Tensor, N: int, *, backward: bool,
                graph: bool, iters: int) -> float:
    step = KDAStep(implementation, inputs, N, backward=backward)
    step.load(None, cu)
    if graph:
        step.capture()
    us = step.time_us(iters)
    del step
    return us


def exact_shape(token_capacity: int = SHAPE["T"], active_sequences: int = SHAPE["M"], heads: int = SHAPE["H"],
                key_dim: int = SHAPE["K"], value_dim: int = SHAPE["V"], iters: int = 30, seed: int = 0) -> dict:
    """Forward and forward + backward µs of each implementation at the exact shape ``T = L``,
    ``N = M`` (Zipf lengths): from an exact-shape CUDA graph for ours and ``fla_graph``, and eagerly
    (CUDA events around each call) for all three.

    Returns:
        ``{"config", "rows": {impl: {"graph_fwd_us", "graph_fwd_bwd_us", "eager_fwd_us",
        "eager_fwd_bwd_us"}}, "ratios": {"fwd_bwd_vs_fla_graph", "fwd_vs_fla_graph"}, "errors"}``;
        an implementation that fails (fla not importable, a fault) has its error in ``errors``.
    """
    lengths = zipf_lengths(token_capacity, active_sequences, generator=torch.Generator().manual_seed(seed))
    cu = cu_seqlens_from_lengths(lengths, device="cuda")
    inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=torch.bfloat16, device="cuda", seed=seed)
    rows, errors = {}, {}
    for implementation in IMPLEMENTATIONS:
        try:
            row = {}
            for graph in (True, False) if implementation in CAPTURABLE else (False,):
                for name, backward in (("fwd", False), ("fwd_bwd", True)):
                    row[f"{'graph' if graph else 'eager'}_{name}_us"] = _timed_step(
                        implementation, inputs, cu, active_sequences, backward=backward, graph=graph, iters=iters)
            rows[implementation] = row
        except Exception as exc:
            errors[implementation] = describe_error(exc, max_chars=_ERROR_CHARS)
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
    """Forward + backward replay µs of a graph captured at capacity (``T``, ``N``) and of one captured
    for the exact shape (``T = L``, ``N = M``), for ours and ``fla_graph``, at each ``L``.

    Both graphs get the same values in the active rows (the exact graph's inputs are the first
    ``L`` rows of the capacity graph's), so their active outputs should agree: ``output_diff`` holds
    the largest |difference| of ``o`` and of each gradient on rows ``0 .. L-1``.

    Returns:
        ``{"config", "series": {impl: [overcapture_point, ...]}, "errors"}``.
    """
    inputs = kda_inputs(token_capacity, heads, key_dim, value_dim, dtype=torch.bfloat16, device="cuda", seed=seed)
    layouts = [zipf_lengths(L, min(active_sequences, L), generator=torch.Generator().manual_seed(seed))
               for L in active_tokens]
    series, errors = {}, {}
    for implementation in CAPTURABLE:
        try:
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
        except Exception as exc:
            errors[implementation] = describe_error(exc, max_chars=_ERROR_CHARS)
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
    """The Amdahl study's layer on one exact-shape batch (``T = L``, ``M`` Zipf(1.2) sequences), in
    bfloat16 on the GPU: calling it runs :class:`~attn_gym_lite.models.kda.KDAAttention` forward and
    returns the gradients of ``x`` and of every parameter for the output gradient ``grad_y`` (what
    the ``amdahl`` part times and the ``trace`` part profiles, both from a captured graph).

    Attributes:
        layer: the layer (``torch.manual_seed(seed)`` before it is made).
        x, grad_y: ``[T, hidden_size]`` input (a leaf that requires grad) and output gradient.
        cu_seqlens: int32 ``[M + 1]``, ``cu_seqlens[-1] = T``.
        M: active sequences, ``min(N, T)``.
        generator: the CPU generator that drew the layout, ``x`` and ``grad_y`` (seeded with
            ``seed``), left where they left it for the caller's further draws.
        parameters: the layer's parameters that require grad, in ``layer.parameters()`` order.
    """

    layer: torch.nn.Module
    x: Tensor
    grad_y: Tensor
    cu_seqlens: Tensor
    M: int
    generator: torch.Generator
    parameters: list[Tensor]

    @classmethod
    def build(cls, token_count: int, hidden_size: int, num_heads: int, head_dim: int, active_sequences: int,
              seed: int) -> LayerStep:
        """The layer and batch at ``T = token_count`` with ``N = active_sequences`` (``M = min(N, T)``)."""
        from ..models.kda import KDAAttention

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


def amdahl(hidden_size: int = LAYER["hidden_size"], num_heads: int = LAYER["num_heads"],
           head_dim: int = LAYER["head_dim"], active_sequences: int = LAYER["N"],
           token_counts: Sequence[int] = AMDAHL_T, iters: int = 30, seed: int = 0) -> dict:
    """Forward + backward µs of the whole :class:`KDAAttention` (gradients of ``x`` and every
    parameter) and of its KDA core alone (gradients of ``q, k, v, g, beta``, on the layer's own
    core inputs), each replayed from a graph captured for the exact shape, at each ``T``.

    Returns:
        ``{"config", "points": [amdahl_point, ...], "summary": amdahl_summary, "errors"}``.
    """
    from ..graph.capture import capture_graph

    points, errors = [], {}
    for T in token_counts:
        try:
            module_step = LayerStep.build(T, hidden_size, num_heads, head_dim, active_sequences, seed)
            layer, x, cu, M, generator = (module_step.layer, module_step.x, module_step.cu_seqlens, module_step.M,
                                          module_step.generator)
            module_graph, _ = capture_graph(module_step)
            module_us = median(cuda_event_us(module_graph.replay, iters))
            del module_graph

            with torch.no_grad():
                core = dict(zip(GRADIENTS, layer.core_inputs(x, cu)))
            core["grad_o"] = torch.randn(T, num_heads, head_dim, generator=generator).to("cuda", torch.bfloat16)
            step = KDAStep("ours", core, M)
            step.load(None, cu)
            step.capture()
            core_us = step.time_us(iters)
            del step, layer, module_step
            points.append(amdahl_point(T, M, core_us, module_us))
        except Exception as exc:
            errors[f"T={T}"] = describe_error(exc, max_chars=_ERROR_CHARS)
        torch.cuda.empty_cache()
    return {
        "config": {"hidden_size": hidden_size, "num_heads": num_heads, "head_dim": head_dim, "head_v_dim": head_dim,
                   "N": active_sequences, "dtype": "bfloat16", "lengths": "Zipf(1.2)", "iters": iters, "seed": seed,
                   "shape_note": "seed: hidden 2304, 32 KDA heads, head width not stated (B200); here the same "
                                 "hidden size and heads, head width 128",
                   "exact": "graphs captured at T = L"},
        "points": points,
        "summary": amdahl_summary(points),
        "errors": errors,
    }


def trace(out: str | None = None, hidden_size: int = LAYER["hidden_size"], num_heads: int = LAYER["num_heads"],
          head_dim: int = LAYER["head_dim"], active_sequences: int = LAYER["N"], token_count: int = max(AMDAHL_T),
          warmup: int = 3, seed: int = 0) -> dict:
    """A labelled trace of one replay of the Amdahl study's layer graph: :class:`LayerStep` (forward
    + backward at the exact shape ``T = token_count``, the study's largest ``T`` by default) captured
    inside :func:`~attn_gym_lite.profiling.record_annotations`, replayed ``warmup`` times, then
    profiled (:func:`~attn_gym_lite.profiling.profile`, one discarded replay for the profiler's
    start-up, then the recorded one), labelled by :func:`~attn_gym_lite.profiling.annotate_trace`
    with the layer's regions (:data:`~attn_gym_lite.models.kda.KDA_REGIONS`, backward kernels as
    ``"<region> backward"``) and summarised by :func:`region_table`.

    Args:
        out: the suite's output folder: the trace goes to ``out/linear_attention_traces/
            kda_layer_replay.json.gz`` (gzipped Chrome JSON, for ui.perfetto.dev). ``None`` writes
            nothing (a notebook's live run).
        hidden_size, num_heads, head_dim, active_sequences, seed: the layer and batch, as in
            :func:`amdahl`.
        token_count: ``T``.
        warmup: replays before the profiled ones.

    Returns:
        ``{"config", "route", "trace_file", "annotation", **region_table, "errors"}``:
        ``trace_file`` is the trace's path relative to ``out`` (``None`` when ``out`` is),
        ``route`` the labelling route (graph node id or capture order), ``annotation`` what
        :func:`~attn_gym_lite.profiling.annotate_trace` reported. ``errors`` says so when the trace
        does not hold exactly one labelled replay (its numbers are then not one replay's).
    """
    from ..graph.capture import capture_graph
    from ..profiling import annotate_trace, profile, record_annotations, save_trace

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
    "trace": trace,
}


def _fla_version() -> str:
    try:
        import fla

        return str(getattr(fla, "__version__", "unknown"))
    except Exception as exc:
        return describe_error(exc, max_chars=_ERROR_CHARS)


def default_budget_s() -> float:
    """The suite's default budget in seconds: the environment's :data:`BUDGET_ENV` if set, else
    :data:`SUITE_BUDGET_S`.

    Raises:
        ValueError: the variable is set to something that is not a number > 0 (named in the message).
    """
    text = os.environ.get(BUDGET_ENV)
    if text is None:
        return SUITE_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{BUDGET_ENV} must be a number of seconds > 0, got {text!r}")
    return value


def linear_attention_suite(parts: Sequence[str] = PARTS, *, out: Path | str | None = None, isolate: bool = True,
                           timeout_s: float = 450,
                           budget_s: float | None | str = "default",
                           clock: Callable[[], float] = time.monotonic) -> dict:
    """All parts, each guarded: an exception or a time-out becomes an entry of ``errors``.

    Args:
        parts: which of :data:`PARTS` to run.
        out: the folder the parts of :data:`WRITES_FILES` write into (the CLI passes its staging
            folder, as for the ``profiling`` suite): the ``trace`` part's trace goes to
            ``out/linear_attention_traces/``. ``None``: those parts still run and write nothing.
        isolate: run each part in a fresh process (:func:`attn_gym_lite.isolation.run_isolated`),
            so that a CUDA fault in one leaves the others measurable.
        timeout_s: per part, when isolated (seconds; the budget left bounds it too).
        budget_s: seconds for the whole suite, counted from this call; ``"default"`` for
            :func:`default_budget_s` (:data:`SUITE_BUDGET_S`, under the recording script's limit,
            unless :data:`BUDGET_ENV` says otherwise), or ``None`` for no bound.
            An isolated part is stopped when the budget runs out (its timeout is at most what is
            left); a part with less than :data:`MIN_PART_S` left is not started, and says so in
            ``errors``.
        clock: the budget's clock, seconds from any fixed origin, monotonic (default
            :func:`time.monotonic`; a test passes a fake one).

    Returns:
        ``{"config": {"fla", "parts", "budget_s"}, <part>: <its dict>, ..., "errors": {part:
        message}}``: a part that raised, faulted, timed out or was not started has no entry of
        its own, only its error.

    Raises:
        ValueError: a part not in :data:`PARTS`; a ``timeout_s`` or ``budget_s`` that is not > 0.
        TypeError: ``timeout_s`` or ``budget_s`` is not a real number.
    """
    if isinstance(budget_s, str):
        if budget_s != "default":
            raise ValueError(f"budget_s must be a number of seconds > 0, None or 'default', got {budget_s!r}")
        budget_s = default_budget_s()
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"parts must be names from {PARTS}, got unknown {unknown}")

    def part(name: str) -> Callable[[float], dict]:
        function = PART_FUNCTIONS[name]
        # The folder travels as a string: an isolated part gets its arguments as JSON.
        args = (None if out is None else str(out),) if name in WRITES_FILES else ()
        if isolate:
            return lambda limit: run_isolated(function, *args, timeout_s=limit)
        return lambda limit: function(*args)

    # One harness for the budget (attn_gym_lite.isolation), as the scale-out suite uses.
    done, errors = run_within_budget({name: part(name) for name in parts}, timeout_s=timeout_s,
                                     budget_s=budget_s, min_part_s=MIN_PART_S, clock=clock,
                                     describe=lambda exc: describe_error(exc, max_chars=_ERROR_CHARS))
    result: dict = {"config": {"fla": _fla_version(), "parts": list(parts), "budget_s": budget_s}, **done}
    result["errors"] = errors
    return result
