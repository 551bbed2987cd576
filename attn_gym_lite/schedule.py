"""Grid arithmetic for ragged kernels: how many CTAs a schedule launches, and which chunk each runs.

A ragged kernel tiles every sequence into chunks of ``C`` tokens and gives each CTA one chunk (per
head). Four ways to lay that work onto a launch grid:

* **rect** (FlashAttention-2): ``ceil(S_max / C)`` chunk slots for each of the ``N`` sequences.
  Slots past a sequence's end exit at once. Needs ``max_seqlen`` on the host: under a CUDA graph
  that is the worst case, ``T``.
* **flat**: one flat list of the ``G_active`` real chunks, indexed through ``chunk_offsets`` (a
  prefix sum of per-sequence chunk counts, built on the device). The grid is the static bound
  ``chunk_capacity(T, N, C)``; CTAs past ``chunk_offsets[-1]`` exit at once.
* **persistent**: a fixed number of workers, at most as many as the GPU keeps resident, striding
  over the active task list whose length they read from ``chunk_offsets[-1]``.
* **dynamic**: the persistent grid, but each worker takes its next task from an atomic counter,
  so workers that drew short tasks take more of them.

``"auto"`` picks flat or dynamic from static quantities (:func:`choose_schedule`). Everything here
is host arithmetic on static quantities, except :func:`chunk_offsets`, made of tensor ops only so
a captured graph recomputes it from whatever ``cu_seqlens`` holds at each replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checks import check_host_cu_seqlens_values

Tensor = torch.Tensor

#: The schedules a ragged kernel of this package can launch with.
SCHEDULES = ("rect", "flat", "persistent", "dynamic", "auto")

# Without a GPU the Triton interpreter runs kernels on the CPU; a small nominal "SM" count there
# keeps the persistent grid smaller than its task list, so tests exercise the striding loop.
_INTERPRETER_SMS = 4


# Grid sizes. Each counts chunks for ONE head; a kernel multiplies by the head count.


def G_rect(N: int, S_max: int, C: int) -> int:
    """Chunks the rectangular grid launches: ``N * ceil(S_max / C)``."""
    return N * -(-S_max // C)


def G_active(lengths: Sequence[int] | Tensor, C: int) -> int:
    """The minimal covering, ``sum_i ceil(s_i / C)``: one chunk per ``C`` tokens of each sequence."""
    return sum(-(-int(s) // C) for s in lengths)


def chunk_capacity(T: int, N: int, C: int) -> int:
    """``G_cap``: the most chunks any layout of ``T`` tokens in ``N`` slots can need.

    ``G_cap = M_max + (T - M_max) // C`` with ``M_max = min(T, N)``. Each non-empty sequence needs
    ``ceil(s/C) = 1 + (s - 1) // C`` chunks; summing over ``M`` of them with ``sum (s_i - 1) <=
    T - M`` gives ``G_active <= M + (T - M) // C``, which grows with ``M`` and so peaks at the
    largest possible ``M``. This is the flat grid's size: static, and needing no ``max_seqlen``.
    """
    m_max = min(T, N)
    return m_max + (T - m_max) // C


def persistent_workers(capacity_tasks: int, num_sms: int, ctas_per_sm: int) -> int:
    """Workers of a persistent grid: never more than tasks could exist, nor than the GPU keeps
    resident (``num_sms * ctas_per_sm``); at least 1."""
    return max(1, min(capacity_tasks, num_sms * ctas_per_sm))


def num_sms(device: torch.device | str | int) -> int:
    """SM count of a CUDA device; on any other device (the Triton interpreter) a nominal 4."""
    device = torch.device(device)
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_schedule(T: int, N: int, C: int, heads: int, num_sms: int, ctas_per_sm: int) -> str:
    """``"auto"``'s choice, from static quantities only (so it is fixed at capture).

    ``"flat"`` when its whole static grid, ``chunk_capacity(T, N, C) * heads`` CTAs, fits in one
    wave of resident CTAs (``num_sms * ctas_per_sm``): then the exiting CTAs cost one cheap wave
    and the hardware's block scheduler balances the real ones. Otherwise ``"dynamic"``, whose
    launch never exceeds that wave however large the capacity and whose workers balance their
    load through a task counter (the "Schedulers" chapter measures the choice on an H200).
    """
    tasks = chunk_capacity(T, N, C) * heads
    return "flat" if tasks <= num_sms * ctas_per_sm else "dynamic"


def launch_grid(schedule: str, *, T: int, N: int, C: int, heads: int, max_seqlen: int | None = None,
                num_sms: int, ctas_per_sm: int) -> tuple[int, ...]:
    """The launch grid of one ragged kernel, from static quantities (resolve ``"auto"`` first):

    * ``"rect"``: ``(ceil(max_seqlen / C), N, heads)``, FlashAttention-2's layout;
    * ``"flat"``: ``(chunk_capacity(T, N, C), heads)``;
    * ``"persistent"``, ``"dynamic"``: ``(persistent_workers(chunk_capacity(T, N, C) * heads, ...),)``.

    ``max_seqlen`` sizes the rect grid (any bound on the longest sequence); the others ignore it.
    """
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

    ``chunk_offsets[i + 1] = chunk_offsets[i] + ceil(s_i / C)``. The ceiling must be taken per
    sequence, because chunking restarts at every sequence boundary: for ``cu_seqlens = [0, 65,
    128]`` and ``C = 64`` the lengths are ``[65, 63]``, the chunks ``[2, 1]`` and the offsets
    ``[0, 2, 3]``, whereas ``ceil(cu_seqlens / 64) = [0, 2, 2]`` would lose a chunk.

    Capture-safe: tensor ops only (no ``.item()``, no data-dependent shape), so a CUDA graph that
    captured this call recomputes the offsets from the static ``cu_seqlens`` on every replay.
    """
    check_host_cu_seqlens_values(cu_seqlens)
    # Prepending cu_seqlens[0] makes the first "length" 0, so the cumsum starts at 0. In int64:
    # `lengths + C - 1` would wrap in int32 for a C near 2**31.
    lengths = torch.diff(cu_seqlens, prepend=cu_seqlens[:1]).to(torch.int64)
    return torch.div(lengths + (C - 1), C, rounding_mode="floor").cumsum(0, dtype=torch.int32)


def decode_chunk(chunk_offsets: Sequence[int] | Tensor, cu_seqlens: Sequence[int] | Tensor,
                 flat_chunk: int, C: int) -> tuple[int, int, int]:
    """CPU oracle of the kernels' decoding: flat chunk index -> (sequence, local chunk, token start).

    ``sequence`` is the last slot whose offset is ``<= flat_chunk``, found by the binary search
    the kernels run (``chunk_offsets[lo] <= flat_chunk < chunk_offsets[hi]``), so empty slots,
    whose offset equals the next slot's, are skipped.
    """
    offsets, bounds = [int(x) for x in chunk_offsets], [int(x) for x in cu_seqlens]
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
    """CTAs each schedule launches for one layout, and how many of them have work (``"active"``);
    rect is sized with ``max_seqlen = T``, as a graph captured for the worst case must be."""
    flat = chunk_capacity(T, N, C) * heads
    return {
        "active": G_active(lengths, C) * heads,
        "rect": G_rect(N, T, C) * heads,
        "flat": flat,
        "persistent": persistent_workers(flat, num_sms, ctas_per_sm),
    }
