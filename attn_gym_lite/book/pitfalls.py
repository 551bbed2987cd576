"""Ways a CUDA graph goes wrong, run for real on a GPU and reported as data: the error raised, or
numbers that show a silently wrong result. A failed capture can leave the CUDA context unusable, so
:func:`run_pitfall` runs each in a fresh process. Chapter 2 prints each docstring's first line."""

import torch

from ..graph.capture import StaticInputs, capture_graph
from ..isolation import run_isolated
from ..models import VarLenAttention
from ..ragged import cu_seqlens_from_lengths


def _outcome(mistake, expected: type[Exception]) -> dict:
    try:
        mistake()
    except expected as exc:
        return {"outcome": "error", "error_type": type(exc).__name__, "message": str(exc).strip().splitlines()[0]}
    return {"outcome": "no error"}


def _matmul_graph():
    x, weight = torch.randn(1024, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    return (x, weight, *capture_graph(lambda: x @ weight, warmup=1))


def host_sync_item() -> dict:
    """``.item()`` inside the captured function: the host waits for a value that does not exist yet."""
    x = torch.randn(4096, device="cuda")
    return _outcome(lambda: capture_graph(lambda: x / x.abs().max().item(), warmup=1), RuntimeError)


def host_sync_tolist() -> dict:
    """``cu_seqlens.tolist()`` inside capture, as a per-sequence Python loop would do."""
    cu_seqlens, x = cu_seqlens_from_lengths([3, 5, 8], device="cuda"), torch.randn(16, 4, device="cuda")

    def per_sequence_mean():
        bounds = cu_seqlens.tolist()
        return torch.stack([x[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:])])

    return _outcome(lambda: capture_graph(per_sequence_mean, warmup=1), RuntimeError)


def new_shape() -> dict:
    """A batch longer than the captured capacity: the graph has no kernel for that shape."""
    static, weight = StaticInputs({"x": torch.randn(1024, 64)}, "cuda"), torch.randn(64, 64, device="cuda")
    capture_graph(lambda: static.x @ weight, warmup=1)
    return _outcome(lambda: static.copy_({"x": torch.randn(1040, 64)}), ValueError)


def rebinding_input() -> dict:
    """``x = next_batch`` rebinds a Python name; the graph still reads the captured buffer."""
    x, weight, graph, out = _matmul_graph()
    first = (x @ weight).clone()
    x = torch.randn(1024, 64, device="cuda")  # the mistake: should be x.copy_(next_batch)
    graph.replay()
    return {"outcome": "wrong result", "max_abs_diff_to_expected": (out - x @ weight).abs().max().item(),
            "max_abs_diff_to_old_batch": (out - first).abs().max().item()}


def baked_max_seqlen() -> dict:
    """``max_seqlen`` captured from the first batch; a later batch has a longer sequence."""
    # FlashAttention-2's grid has ceil(max_seqlen / BLOCK_M) query blocks per sequence, fixed at
    # capture: the query rows past the captured bound are never computed. No error, wrong rows.
    torch.manual_seed(0)
    dim, heads, capacity, captured_max_seqlen = 512, 8, 4096, 256  # exact for the first batch
    model = VarLenAttention(dim, heads, impl="varlen_attn", device="cuda", dtype=torch.bfloat16)
    static = StaticInputs({"x": torch.randn(capacity, dim, dtype=torch.bfloat16), "cu_seqlens": cu_seqlens_from_lengths([256] * 16)},
                          "cuda")
    graph, out = capture_graph(lambda: model(static.x, static.cu_seqlens, captured_max_seqlen))
    lengths = [2048] + [128] * 15  # one long document: 8x the captured max_seqlen
    static.copy_({"x": torch.randn(capacity, dim, dtype=torch.bfloat16), "cu_seqlens": cu_seqlens_from_lengths(lengths)})
    graph.replay()
    with torch.no_grad():
        expected = model(static.x, static.cu_seqlens, max(lengths))
    active = sum(lengths)
    error = (out[:active].float() - expected[:active].float()).abs()
    wrong = error.amax(dim=1) > 1e-2
    return {"outcome": "wrong result", "captured_max_seqlen": captured_max_seqlen, "replayed_max_seqlen": max(lengths),
            "active_tokens": active, "wrong_rows": int(wrong.sum()),
            "first_wrong_row": int(wrong.nonzero()[0]) if wrong.any() else None, "max_abs_diff": error.max().item()}


def stale_output() -> dict:
    """Keeping a graph output across replays: the next replay overwrites it in place."""
    x, _, graph, out = _matmul_graph()
    graph.replay()
    kept, kept_value = out, out.clone()  # the mistake: kept should be out.clone()
    x.copy_(torch.randn(1024, 64))
    graph.replay()
    return {"outcome": "wrong result", "kept_is_new_output": bool(torch.equal(kept, out)),
            "kept_changed_by": (kept - kept_value).abs().max().item()}


PITFALLS = {fn.__name__: fn for fn in (host_sync_item, host_sync_tolist, new_shape, rebinding_input, baked_max_seqlen, stale_output)}


def run_pitfall(name: str) -> dict:
    """Pitfall ``name`` (a key of :data:`PITFALLS`) run in a fresh Python process: its report."""
    return run_isolated(pitfall_report, name)


def pitfall_report(name: str) -> dict:
    """Pitfall ``name`` run in this process: ``{"name", "what", **its result}``."""
    fn = PITFALLS[name]
    return {"name": fn.__name__, "what": fn.__doc__.strip().splitlines()[0], **fn()}
