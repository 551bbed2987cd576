"""Ways a CUDA graph goes wrong, each run for real on a GPU and reported as data: the error
PyTorch raised, or numbers that show a silently wrong result. A failed capture can leave the CUDA
context unusable, so :func:`run_pitfall` runs each in a fresh process. The first line of each
pitfall's docstring is what chapter 2 prints as the mistake."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..graph.capture import StaticInputs, capture_graph
from ..isolation import run_isolated
from ..models import VarLenAttention
from ..ragged import cu_seqlens_from_lengths

PITFALLS: dict[str, Callable[[], dict]] = {}


def _pitfall(fn: Callable[[], dict]) -> Callable[[], dict]:
    PITFALLS[fn.__name__] = fn
    return fn


def _error(exc: BaseException) -> dict:
    return {"outcome": "error", "error_type": type(exc).__name__, "message": str(exc).strip().splitlines()[0]}


def _outcome(mistake: Callable[[], object], expected: type[Exception]) -> dict:
    try:
        mistake()
    except expected as exc:
        return _error(exc)
    return {"outcome": "no error"}


@_pitfall
def host_sync_item() -> dict:
    """``.item()`` inside the captured function: the host waits for a value that does not exist yet."""
    x = torch.randn(4096, device="cuda")

    def normalise():
        return x / x.abs().max().item()  # host read of a device value

    return _outcome(lambda: capture_graph(normalise, warmup=1), RuntimeError)


@_pitfall
def host_sync_tolist() -> dict:
    """``cu_seqlens.tolist()`` inside capture, as a per-sequence Python loop would do."""
    cu_seqlens = cu_seqlens_from_lengths([3, 5, 8], device="cuda")
    x = torch.randn(16, 4, device="cuda")

    def per_sequence_mean():
        bounds = cu_seqlens.tolist()
        return torch.stack([x[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:])])

    return _outcome(lambda: capture_graph(per_sequence_mean, warmup=1), RuntimeError)


@_pitfall
def new_shape() -> dict:
    """A batch longer than the captured capacity: the graph has no kernel for that shape."""
    static = StaticInputs({"x": torch.randn(1024, 64)}, "cuda")
    weight = torch.randn(64, 64, device="cuda")
    capture_graph(lambda: static.x @ weight, warmup=1)
    return _outcome(lambda: static.copy_({"x": torch.randn(1040, 64)}), ValueError)


@_pitfall
def rebinding_input() -> dict:
    """``x = next_batch`` rebinds a Python name; the graph still reads the captured buffer."""
    x = torch.randn(1024, 64, device="cuda")
    weight = torch.randn(64, 64, device="cuda")
    graph, out = capture_graph(lambda: x @ weight, warmup=1)
    first = (x @ weight).clone()
    x = torch.randn(1024, 64, device="cuda")  # the mistake: should be x_static.copy_(...)
    graph.replay()
    expected = x @ weight
    return {
        "outcome": "wrong result",
        "max_abs_diff_to_expected": (out - expected).abs().max().item(),
        "max_abs_diff_to_old_batch": (out - first).abs().max().item(),
    }


@_pitfall
def baked_max_seqlen() -> dict:
    """``max_seqlen`` captured from the first batch; a later batch has a longer sequence."""
    # FlashAttention-2's grid has ceil(max_seqlen / BLOCK_M) query blocks per sequence, fixed at
    # capture: the query rows past the captured bound are never computed. No error, wrong rows.
    torch.manual_seed(0)
    dim, heads, capacity = 512, 8, 4096
    model = VarLenAttention(dim, heads, impl="varlen_attn", device="cuda", dtype=torch.bfloat16)
    batch = {
        "x": torch.randn(capacity, dim, dtype=torch.bfloat16),
        "cu_seqlens": cu_seqlens_from_lengths([256] * 16),
    }
    static = StaticInputs(batch, "cuda")
    captured_max_seqlen = 256  # exact for the first batch
    graph, out = capture_graph(lambda: model(static.x, static.cu_seqlens, captured_max_seqlen))

    lengths = [2048] + [128] * 15  # one long document: 8x the captured max_seqlen
    static.copy_({
        "x": torch.randn(capacity, dim, dtype=torch.bfloat16),
        "cu_seqlens": cu_seqlens_from_lengths(lengths),
    })
    graph.replay()
    with torch.no_grad():
        expected = model(static.x, static.cu_seqlens, max(lengths))
    active = sum(lengths)
    wrong = (out[:active].float() - expected[:active].float()).abs().amax(dim=1) > 1e-2
    return {
        "outcome": "wrong result",
        "captured_max_seqlen": captured_max_seqlen,
        "replayed_max_seqlen": max(lengths),
        "active_tokens": active,
        "wrong_rows": int(wrong.sum()),
        "first_wrong_row": int(wrong.nonzero()[0]) if wrong.any() else None,
        "max_abs_diff": (out[:active].float() - expected[:active].float()).abs().max().item(),
    }


@_pitfall
def stale_output() -> dict:
    """Keeping a graph output across replays: the next replay overwrites it in place."""
    x = torch.randn(1024, 64, device="cuda")
    weight = torch.randn(64, 64, device="cuda")
    graph, out = capture_graph(lambda: x @ weight, warmup=1)
    graph.replay()
    kept = out  # the mistake: should be out.clone()
    kept_value = out.clone()
    x.copy_(torch.randn(1024, 64))
    graph.replay()
    return {
        "outcome": "wrong result",
        "kept_is_new_output": bool(torch.equal(kept, out)),
        "kept_changed_by": (kept - kept_value).abs().max().item(),
    }


def run_pitfall(name: str) -> dict:
    """Pitfall ``name`` (a key of :data:`PITFALLS`) run in a fresh Python process: its report."""
    return run_isolated(pitfall_report, name)


def pitfall_report(name: str) -> dict:
    """Pitfall ``name`` run in this process: ``{"name", "what", **its result}``."""
    fn = PITFALLS[name]
    return {"name": fn.__name__, "what": fn.__doc__.strip().splitlines()[0], **fn()}
