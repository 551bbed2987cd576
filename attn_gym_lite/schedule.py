"""Grid arithmetic for ragged kernels, which tile each sequence into chunks of ``C`` tokens: how many
CTAs each schedule launches, and which chunk each runs. Host arithmetic on static quantities, except
:func:`chunk_offsets`: tensor ops that a captured graph recomputes at each replay."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checks import check_host_cu_seqlens_values

Tensor = torch.Tensor

# rect (FlashAttention-2): ceil(max_seqlen / C) chunk slots per sequence, needs max_seqlen on the host.
# flat: one CTA per slot of the static bound chunk_capacity(T, N, C); those past G_active exit.
# persistent: at most one wave of resident workers, striding over the active tasks.
# dynamic: the persistent grid, each worker taking its next task from an atomic counter.
# auto: flat or dynamic, from static quantities (choose_schedule).
SCHEDULES = ("rect", "flat", "persistent", "dynamic", "auto")

# Without a GPU the Triton interpreter runs kernels on the CPU; a small nominal "SM" count there
# keeps the persistent grid smaller than its task list, so tests exercise the striding loop.
_INTERPRETER_SMS = 4


# Grid sizes count chunks for ONE head; a kernel multiplies by the head count.


def G_rect(N: int, S_max: int, C: int) -> int:
    """Chunks the rectangular grid launches: ``N * ceil(S_max / C)``."""
    return N * -(-S_max // C)


def G_active(lengths: Sequence[int] | Tensor, C: int) -> int:
    """The minimal covering, ``sum_i ceil(s_i / C)``: one chunk per ``C`` tokens of each sequence."""
    return sum(-(-int(s) // C) for s in lengths)


def chunk_capacity(T: int, N: int, C: int) -> int:
    """``G_cap``, the most chunks any layout of ``T`` tokens in ``N`` slots can need: the flat grid."""
    # M non-empty sequences need sum(1 + (s_i - 1) // C) <= M + (T - M) // C chunks, which grows
    # with M: the bound peaks at the largest possible M.
    m_max = min(T, N)
    return m_max + (T - m_max) // C


def persistent_workers(capacity_tasks: int, num_sms: int, ctas_per_sm: int) -> int:
    """Workers of a persistent grid: at most the tasks that could exist, and one wave of resident CTAs."""
    return max(1, min(capacity_tasks, num_sms * ctas_per_sm))


def num_sms(device: torch.device | str | int) -> int:
    """SM count of a CUDA device; on any other device (the Triton interpreter) a nominal 4."""
    device = torch.device(device)
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_schedule(T: int, N: int, C: int, heads: int, num_sms: int, ctas_per_sm: int) -> str:
    """``"auto"``'s choice, from static quantities only, so it is fixed at capture."""
    # flat: the hardware hands each chunk to the first free SM, so uneven (causal) tasks balance,
    # and a CTA past the active chunks exits at once. It was the fastest schedule at nearly every
    # point the schedulers suite records (chapter 4). Its idle CTAs still cost a launch slot each,
    # so past 64 waves of resident CTAs, where a nearly empty replay would mostly launch CTAs that
    # exit, dynamic's single wave of workers takes over.
    tasks = chunk_capacity(T, N, C) * heads
    return "flat" if tasks <= 64 * num_sms * ctas_per_sm else "dynamic"


def launch_grid(schedule: str, *, T: int, N: int, C: int, heads: int, max_seqlen: int | None = None,
                num_sms: int, ctas_per_sm: int) -> tuple[int, ...]:
    """The launch grid of one ragged kernel (resolve ``"auto"`` first); only rect reads ``max_seqlen``."""
    if schedule == "rect":
        return (-(-max_seqlen // C), N, heads)
    if schedule == "flat":
        return (chunk_capacity(T, N, C), heads)
    if schedule in ("persistent", "dynamic"):
        return (persistent_workers(chunk_capacity(T, N, C) * heads, num_sms, ctas_per_sm),)
    raise ValueError(f"schedule must be one of {SCHEDULES[:-1]}, got {schedule!r}")


# The flat chunk list: built on the device, decoded on the CPU for testing.


def chunk_offsets(cu_seqlens: Tensor, C: int) -> Tensor:
    """Where each sequence's chunks start in the flat chunk list: int32 ``[0, ..., G_active]``.
    Capture-safe: tensor ops only, no value read on the host."""
    check_host_cu_seqlens_values(cu_seqlens)
    # The ceiling is taken per sequence, as chunking restarts at every boundary: cu_seqlens [0, 65,
    # 128] at C = 64 gives offsets [0, 2, 3], where ceil(cu_seqlens / 64) = [0, 2, 2] loses a chunk.
    # Prepending cu_seqlens[0] makes the first "length" 0, so the cumsum starts at 0. In int64:
    # `lengths + C - 1` would wrap in int32 for a C near 2**31.
    lengths = torch.diff(cu_seqlens, prepend=cu_seqlens[:1]).to(torch.int64)
    return torch.div(lengths + (C - 1), C, rounding_mode="floor").cumsum(0, dtype=torch.int32)


def decode_chunk(chunk_offsets: Sequence[int] | Tensor, cu_seqlens: Sequence[int] | Tensor,
                 flat_chunk: int, C: int) -> tuple[int, int, int]:
    """CPU oracle of the kernels' decoding: flat chunk index -> (sequence, local chunk, token start)."""
    offsets, bounds = [int(x) for x in chunk_offsets], [int(x) for x in cu_seqlens]
    # The kernels' binary search for the last slot whose offset is <= flat_chunk: it steps over
    # empty slots, whose offset equals the next slot's.
    lo, hi = 0, len(offsets) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= flat_chunk:
            lo = mid
        else:
            hi = mid
    local = flat_chunk - offsets[lo]
    return lo, local, bounds[lo] + local * C


def grid_sizes(T: int, N: int, lengths: Sequence[int], C: int, heads: int, num_sms: int,
               ctas_per_sm: int = 1) -> dict:
    """CTAs each schedule launches for one layout, and how many have work; rect sized for ``max_seqlen = T``."""
    flat = chunk_capacity(T, N, C) * heads
    return {
        "active": G_active(lengths, C) * heads,
        "rect": G_rect(N, T, C) * heads,
        "flat": flat,
        "persistent": persistent_workers(flat, num_sms, ctas_per_sm),
    }
