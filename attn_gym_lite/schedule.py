"""Grid arithmetic for ragged kernels: how many CTAs a schedule launches, and which chunk each runs.

A ragged kernel tiles every sequence into chunks of ``C`` tokens and gives each CTA one chunk (per
head). Three ways to lay that work onto a launch grid:

* **rectangular** (FlashAttention-2): ``ceil(S_max / C)`` chunk slots for each of the ``N``
  sequences, ``G_rect = N * ceil(S_max / C)``. Slots past a sequence's end exit at once. Needs
  ``S_max`` (``max_seqlen``) on the host: under a CUDA graph that is the worst case, ``T``.
* **flat**: one flat list of the ``G_active`` real chunks, indexed through ``chunk_offsets`` (a
  prefix sum of per-sequence chunk counts, built on the device). The grid is the static bound
  ``chunk_capacity(T, N, C)``; CTAs past ``chunk_offsets[-1]`` exit at once.
* **persistent**: a fixed number of workers, at most as many as the GPU keeps resident, that stride
  over the active task list whose length they read from ``chunk_offsets[-1]``.

The functions here are the host-side half: grid sizes from static quantities (``T``, ``N``, ``C``,
heads, SM count) and a CPU oracle of the kernels' decoding. ``chunk_offsets`` is the one device
function, made of tensor ops only, so a captured graph recomputes it from whatever ``cu_seqlens``
holds at each replay.

Source: the seed article, sections "The anatomy of a ragged kernel", "Scheduling without
max_seqlen" and "Graph overcapture: bound capacity-sized launches"; FlashAttention-2 (Dao, 2023)
for the rectangular grid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checks import (
    INT32_MAX,
    check_choice,
    check_cu_seqlens,
    check_device,
    check_host_cu_seqlens_values,
    check_int,
    check_int_sequence,
)

Tensor = torch.Tensor

__all__ = [
    "SCHEDULES",
    "G_active",
    "G_rect",
    "choose_schedule",
    "chunk_capacity",
    "chunk_offsets",
    "decode_chunk",
    "launch_grid",
    "num_sms",
    "persistent_workers",
]

#: The schedules a ragged kernel of this package can launch with.
SCHEDULES = ("rect", "flat", "persistent", "dynamic", "auto")

# Without a GPU the Triton interpreter runs kernels on the CPU; a small nominal "SM" count there
# keeps the persistent grid smaller than its task list, so tests exercise the striding loop.
_INTERPRETER_SMS = 4


def _lengths(lengths: Tensor | Sequence[int]) -> list[int]:
    # No lengths at all is M = 0 sequences (G_active = 0), in any container the check takes (an
    # empty array or iterator was refused while [] gave 0).
    return check_int_sequence("lengths", lengths, minimum=0, allow_set=False, allow_empty=True)


# -----------------------------------------------------------------------------
# Grid sizes. Each counts chunks for ONE head; a kernel multiplies by the head count.


def G_rect(N: int, S_max: int, C: int) -> int:
    """Chunks launched by the rectangular (FlashAttention-2) grid: ``N * ceil(S_max / C)``.

    Args:
        N: sequence slots (``cu_seqlens`` has ``N + 1`` entries), ``>= 1``.
        S_max: the ``max_seqlen`` the grid is sized for, in tokens, ``>= 0``.
        C: chunk size in tokens, ``>= 1``.

    Raises:
        TypeError / ValueError: an argument is not an int in range.

    Source: seed article, "The anatomy of a ragged kernel".
    """
    N, S_max, C = check_int("N", N, minimum=1), check_int("S_max", S_max, minimum=0), check_int("C", C, minimum=1)
    return N * -(-S_max // C)


def G_active(lengths: Tensor | Sequence[int], C: int) -> int:
    """The minimal covering: ``sum_i ceil(s_i / C)`` chunks, one per ``C`` tokens of each sequence.

    Args:
        lengths: sequence lengths ``s_i`` in tokens (ints ``>= 0``, or a 1-D integer tensor, read
            on the host: eager only). Empty slots count 0; an empty list gives 0.
        C: chunk size in tokens, ``>= 1``.

    Raises:
        TypeError: ``lengths`` is not a sequence of ints or an integer tensor (a float tensor is
            refused, not truncated), or ``C`` is not an int.
        ValueError: a length is negative, ``C < 1``, or ``lengths`` is a meta tensor.

    Source: seed article, "The anatomy of a ragged kernel".
    """
    C = check_int("C", C, minimum=1)
    return sum(-(-s // C) for s in _lengths(lengths))


def chunk_capacity(T: int, N: int, C: int) -> int:
    """``G_cap``: the most chunks any layout of ``T`` tokens in ``N`` slots can need.

    ``G_cap = M_max + (T - M_max) // C`` with ``M_max = min(T, N)``. Each non-empty sequence
    needs ``ceil(s/C) = 1 + (s - 1) // C`` chunks; summing over ``M`` of them and using
    ``sum (s_i - 1) <= T - M`` gives ``G_active <= M + (T - M) // C``, which grows with ``M`` and
    so peaks at the largest possible ``M``. This is the flat grid's size: static, and needing no
    ``max_seqlen``.

    Args:
        T: token capacity, ``>= 0``.
        N: sequence capacity, ``>= 1``.
        C: chunk size in tokens, ``>= 1``.

    Raises:
        TypeError / ValueError: an argument is not an int in range.

    Source: seed article, "Scheduling without max_seqlen".
    """
    T, N, C = check_int("T", T, minimum=0), check_int("N", N, minimum=1), check_int("C", C, minimum=1)
    m_max = min(T, N)
    return m_max + (T - m_max) // C


def persistent_workers(capacity_tasks: int, num_sms: int, ctas_per_sm: int) -> int:
    """Workers of a persistent grid: ``min(capacity_tasks, num_sms * ctas_per_sm)``, at least 1.

    Never more workers than tasks could ever exist, never more than the GPU keeps resident at
    once: each worker then loops over tasks ``worker, worker + workers, ...``.

    Args:
        capacity_tasks: the static task bound, e.g. ``chunk_capacity(T, N, C) * heads``, ``>= 0``.
        num_sms: streaming multiprocessors, ``>= 1`` (see :func:`num_sms`).
        ctas_per_sm: CTAs of this kernel resident on one SM, ``>= 1``.

    Raises:
        TypeError / ValueError: an argument is not an int in range.

    Source: seed article, "Graph overcapture: bound capacity-sized launches".
    """
    capacity_tasks = check_int("capacity_tasks", capacity_tasks, minimum=0)
    resident = check_int("num_sms", num_sms, minimum=1) * check_int("ctas_per_sm", ctas_per_sm, minimum=1)
    return max(1, min(capacity_tasks, resident))


def num_sms(device: torch.device | str | int) -> int:
    """SM count of a CUDA device; on any other device (CPU: the Triton interpreter) a nominal 4.

    Args:
        device: a ``torch.device``, a device string (``"cuda"``, ``"cuda:1"``, ``"cpu"``) or a
            device index, as :func:`~attn_gym_lite.checks.check_device` takes them.

    Returns:
        The number of streaming multiprocessors (``multi_processor_count``).

    Raises:
        TypeError: ``device`` is not a ``torch.device``, ``str`` or ``int`` (``None``, a ``bool``).
        ValueError: a string torch does not parse as a device (``"x"``), a CUDA device when CUDA
            is not available, or a CUDA index at or past the number of CUDA devices
            (:func:`~attn_gym_lite.checks.check_device`).

    Source: ``torch.cuda.get_device_properties``.
    """
    device = check_device("device", device)
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

    Raises:
        TypeError / ValueError: an argument is not an int in range.
    """
    tasks = chunk_capacity(T, N, C) * check_int("heads", heads, minimum=1)
    resident = check_int("num_sms", num_sms, minimum=1) * check_int("ctas_per_sm", ctas_per_sm, minimum=1)
    return "flat" if tasks <= resident else "dynamic"


#: CUDA's limit on a grid's y and z dimensions (blocks).
_GRID_YZ_MAX = 65535


def launch_grid(
    schedule: str,
    *,
    T: int,
    N: int,
    C: int,
    heads: int,
    max_seqlen: int | None = None,
    num_sms: int,
    ctas_per_sm: int,
) -> tuple[int, ...]:
    """The launch grid of one ragged kernel, from static quantities.

    * ``"rect"``: ``(ceil(max_seqlen / C), N, heads)``, FlashAttention-2's layout.
    * ``"flat"``: ``(chunk_capacity(T, N, C), heads)``.
    * ``"persistent"`` and ``"dynamic"``: ``(persistent_workers(chunk_capacity(T, N, C) * heads, ...),)``.

    Args:
        schedule: ``"rect"``, ``"flat"``, ``"persistent"`` or ``"dynamic"`` (resolve ``"auto"``
            first with :func:`choose_schedule`).
        T, N, C, heads: token capacity, sequence capacity, chunk size, attention heads.
        max_seqlen: required by ``"rect"`` (``>= 1``), refused by the others.
        num_sms, ctas_per_sm: the device's SMs and this kernel's resident CTAs per SM, which cap
            the persistent grid.

    Raises:
        ValueError: unknown ``schedule`` (``"auto"`` included), ``max_seqlen`` missing for
            ``"rect"`` or given to another schedule.
        TypeError / ValueError: a count is not an int in range: each of ``T, N, C, heads,
            num_sms, ctas_per_sm`` is checked for every schedule, also where its grid does not
            read it (``T <= 2**31 - 1``, the range of ``cu_seqlens``; where the grid puts them on
            its y or z axis, ``N`` and ``heads`` at most 65,535, CUDA's limit there: both for
            ``"rect"``, ``heads`` for ``"flat"``); ``max_seqlen`` above ``2**31 - 1``.
    """
    check_choice("schedule", schedule, ("rect", "flat", "persistent", "dynamic"))
    # Every count is checked whichever schedule uses it: a bad one is a slip in the caller's code
    # even where this schedule's grid does not read it.
    # T within int32 (cu_seqlens' type). N and heads within CUDA's grid y/z limit (65,535) only
    # where this schedule's grid puts them: N and heads on rect's y and z, heads on flat's y; the
    # persistent grids are 1-D. Before, T=2**40 or a rect N=2**20 gave grids no launch accepts.
    T = check_int("T", T, minimum=0, maximum=INT32_MAX)
    N = check_int("N", N, minimum=1, maximum=_GRID_YZ_MAX if schedule == "rect" else None)
    C = check_int("C", C, minimum=1)
    heads = check_int("heads", heads, minimum=1, maximum=_GRID_YZ_MAX if schedule in ("rect", "flat") else None)
    num_sms = check_int("num_sms", num_sms, minimum=1)
    ctas_per_sm = check_int("ctas_per_sm", ctas_per_sm, minimum=1)
    if schedule == "rect":
        if max_seqlen is None:
            raise ValueError("max_seqlen must be an int >= 1 for schedule='rect', got None")
        # Any upper bound on the longest sequence is valid, T or more (a shared captured bound);
        # within int32, as every length here.
        return (-(-check_int("max_seqlen", max_seqlen, minimum=1, maximum=INT32_MAX) // C), N, heads)
    if max_seqlen is not None:
        raise ValueError(
            f"max_seqlen is only used by schedule='rect'; schedule={schedule!r} reads the work "
            f"from chunk_offsets on the device, got max_seqlen={max_seqlen!r}"
        )
    if schedule == "flat":
        return (chunk_capacity(T, N, C), heads)
    return (persistent_workers(chunk_capacity(T, N, C) * heads, num_sms, ctas_per_sm),)


# -----------------------------------------------------------------------------
# The flat chunk list: built on the device, decoded on the CPU for testing.


def chunk_offsets(cu_seqlens: Tensor, C: int) -> Tensor:
    """Where each sequence's chunks start in the flat chunk list: ``[0, ..., G_active]``.

    ``chunk_offsets[i + 1] = chunk_offsets[i] + ceil(s_i / C)``. The ceiling must be taken per
    sequence, because chunking restarts at every sequence boundary: for ``cu_seqlens = [0, 65,
    128]`` and ``C = 64`` the lengths are ``[65, 63]``, the chunks ``[2, 1]`` and the offsets
    ``[0, 2, 3]``, whereas ``ceil(cu_seqlens / 64) = [0, 2, 2]`` would lose a chunk.

    Capture-safe: tensor ops only (no ``.item()``, no data-dependent shape), so a CUDA graph that
    captured this call recomputes the offsets from the static ``cu_seqlens`` buffer on every
    replay.

    Args:
        cu_seqlens: int32 ``[N + 1]`` prefix sums, any device.
        C: chunk size in tokens, ``>= 1`` (any size: the ceilings are taken in int64, so a ``C``
            near or past ``2**31`` gives 1 chunk per non-empty sequence, not a wrapped int32).

    Returns:
        int32 ``[N + 1]`` on ``cu_seqlens``'s device; the last entry is ``G_active``. Empty slots
        (the repeated-``L`` tail) add 0.

    Raises:
        TypeError / ValueError: ``cu_seqlens`` is not a 1-D int32 tensor of at least 2 entries,
            or ``C`` is not an int ``>= 1``; a CPU ``cu_seqlens`` (its values read without a device sync) not
            starting at 0 or decreasing.

    Source: seed article, "Scheduling without max_seqlen".
    """
    check_cu_seqlens(cu_seqlens)
    C = check_int("C", C, minimum=1)
    # A CPU cu_seqlens is checked with no device sync (a CUDA one is not read: capture-safe). Before, [0, 65, 1]
    # gave offsets [0, 2, 1] and one starting at 5 was taken.
    check_host_cu_seqlens_values(cu_seqlens)
    # Prepending cu_seqlens[0] makes the first "length" 0, so the cumsum starts at 0 and no
    # separate concatenation is needed.
    # In int64: `lengths + (C - 1)` wraps in int32 once C nears 2**31. A C past INT32_MAX covers
    # any int32 length in one chunk, as INT32_MAX does, so it is capped there (no int64 overflow).
    C = min(C, INT32_MAX)
    lengths = torch.diff(cu_seqlens, prepend=cu_seqlens[:1]).to(torch.int64)
    chunks = torch.div(lengths + (C - 1), C, rounding_mode="floor")
    return chunks.cumsum(0, dtype=torch.int32)


def decode_chunk(chunk_offsets: Sequence[int] | Tensor, cu_seqlens: Sequence[int] | Tensor,
                 flat_chunk: int, C: int) -> tuple[int, int, int]:
    """CPU oracle of the kernels' decoding: flat chunk index -> (sequence, local chunk, token start).

    ``sequence`` is the last slot whose offset is ``<= flat_chunk``, found by the same binary
    search the kernels run (``lo``/``hi`` bracketing, ``chunk_offsets[lo] <= flat_chunk <
    chunk_offsets[hi]``), so empty slots, whose offset equals the next slot's, are skipped.
    Then ``local_chunk = flat_chunk - chunk_offsets[sequence]`` and ``token_start =
    cu_seqlens[sequence] + local_chunk * C``.

    Args:
        chunk_offsets: the ``N + 1`` offsets of :func:`chunk_offsets` (ints, or a 1-D integer
            tensor read on the host).
        cu_seqlens: the matching ``N + 1`` prefix sums (ints or a 1-D integer tensor).
        flat_chunk: an int index in ``[0, G_active)``.
        C: the chunk size the offsets were built with, ``>= 1``.

    Raises:
        TypeError: ``chunk_offsets`` or ``cu_seqlens`` is not a sequence of ints or an integer
            tensor (a float tensor is refused), or ``flat_chunk`` or ``C`` is not an int
            (``True``, ``0.5``, ``"0"``).
        ValueError: either prefix sum is empty, they differ in length, ``C < 1``, ``cu_seqlens``
            does not start at 0 or decreases, ``chunk_offsets`` is not the offsets of
            ``cu_seqlens`` at ``C``, or ``flat_chunk`` is outside ``[0, G_active)``.

    Source: seed article, "Scheduling without max_seqlen" (``search_first_greater``).
    """
    offsets = check_int_sequence("chunk_offsets", chunk_offsets, allow_set=False)
    bounds = check_int_sequence("cu_seqlens", cu_seqlens, allow_set=False)
    flat_chunk = check_int("flat_chunk", flat_chunk)
    C = check_int("C", C, minimum=1)
    if len(offsets) != len(bounds):
        raise ValueError(
            f"chunk_offsets must have as many entries as cu_seqlens ({len(bounds)}), got {len(offsets)}"
        )
    # An oracle must not answer for offsets that are not the ones chunk_offsets(cu_seqlens, C)
    # gives (before: [0, 5, 6] against [0, 65, 128] returned token start 256, past L = 128). The
    # rule restated on the host ints, as the docstring states it: each slot adds ceil(s_i / C).
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {bounds}")
    expected = [0]
    for start, end in zip(bounds, bounds[1:]):
        expected.append(expected[-1] + -(-(end - start) // C))
    if offsets != expected:
        raise ValueError(f"chunk_offsets must be chunk_offsets(cu_seqlens, C={C}) = {expected}, got {offsets}")
    active = offsets[-1]
    if not 0 <= flat_chunk < active:
        raise ValueError(f"flat_chunk must be in [0, G_active = {active}), got {flat_chunk}")
    lo, hi = 0, len(offsets) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= flat_chunk:
            lo = mid
        else:
            hi = mid
    local = flat_chunk - offsets[lo]
    return lo, local, bounds[lo] + local * C


def grid_sizes(T: int, N: int, lengths, C: int, heads: int, num_sms: int, ctas_per_sm: int = 1) -> dict:
    """CTAs each schedule launches for one layout, and how many of them have work.

    Args:
        T, N: token and sequence capacity of the captured graph.
        lengths: the active sequence lengths (``M`` ints, ``sum <= T``).
        C: chunk size; heads: attention heads; num_sms, ctas_per_sm: the persistent grid's cap.

    Returns:
        ``{"active": G_active * heads, "rect": ..., "flat": ..., "persistent": ...}`` in CTAs, where
        rect is sized with ``max_seqlen = T`` as a graph captured for the worst case must be.
    """
    active = G_active(lengths, C) * heads
    return {
        "active": active,
        "rect": G_rect(N, T, C) * heads,
        "flat": chunk_capacity(T, N, C) * heads,
        "persistent": persistent_workers(chunk_capacity(T, N, C) * heads, num_sms, ctas_per_sm),
    }
