"""The per-call metadata of the flat, persistent and dynamic schedules, in one launch.

Before its kernels run, every call needs ``chunk_offsets`` (the prefix sum of ``ceil(s_i / C)``
over the sequences, :func:`attn_gym_lite.schedule.chunk_offsets`) and, for the dynamic schedule,
task counters set to zero. Written with torch ops that is five small kernels (a diff, a
concatenation, an add, a division, a cumsum) plus a fill: each costs a few microseconds of host
time to launch, which in eager mode is more than the tiny kernels themselves. This one kernel does
all of it: one CTA walks ``cu_seqlens`` in blocks, with a running total carried between blocks.

Capture-safe like the torch version: it reads ``cu_seqlens`` on the device only, so a graph that
captured it recomputes the offsets (and re-zeroes the counters) on every replay.

:func:`launch_chunk_offsets` is the one host-side launch of it: every op that needs
``chunk_offsets`` on the device (the attention kernels of :mod:`.varlen`, the KDA kernels of
:mod:`attn_gym_lite.ops.kda.chunked_triton`) calls it.

Source: the seed article, "Scheduling without max_seqlen" (``chunk_offsets``); the counters are
FlashAttention-3's dynamic tile scheduler's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import checks


@triton.jit(do_not_specialize=["token_capacity", "max_total"])
def chunk_offsets_kernel(cu_seqlens, offsets, counters, num_seqs, token_capacity, max_total,
                         NUM_COUNTERS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """``offsets[i] = min(max_total, sum_{j < i} ceil(s_j / CHUNK))`` for ``i = 0 .. num_seqs``,
    then ``counters[:NUM_COUNTERS] = 0``. Launch with grid ``(1,)``.

    ``s_j`` is sequence ``j``'s length clamped into the tensors, as the kernels' task decoding
    (:func:`attn_gym_lite.ops.kernels.tasks.sequence_bounds`) clamps it: ``start = clamp(cu[j], 0,
    T)``, ``end = clamp(cu[j + 1], start, T)``, ``s_j = end - start``. Totals are summed in 64 bits
    and capped at ``max_total`` (``G_cap``), so the offsets never decrease and never overflow, and
    no chunk they number lies past its sequence's end, whatever ``cu_seqlens`` holds. On a valid
    ``cu_seqlens`` neither the clamps nor the cap change anything."""
    carry = tl.full((), 0, tl.int64)
    for start in range(0, num_seqs + 1, BLOCK):
        i = start + tl.arange(0, BLOCK)
        # Slot i's entry counts the chunks of sequences 0 .. i-1, so element i adds sequence i-1.
        has_sequence = (i >= 1) & (i <= num_seqs)
        begin = tl.load(cu_seqlens + i - 1, mask=has_sequence, other=0)
        begin = tl.minimum(tl.maximum(begin, 0), token_capacity)
        end = tl.load(cu_seqlens + i, mask=has_sequence, other=0)
        end = tl.minimum(tl.maximum(end, begin), token_capacity)
        chunks = tl.where(has_sequence, ((end - begin).to(tl.int64) + CHUNK - 1) // CHUNK, 0)
        totals = tl.minimum(carry + tl.cumsum(chunks, 0), max_total)
        tl.store(offsets + i, totals.to(tl.int32), mask=i <= num_seqs)
        carry = tl.minimum(carry + tl.sum(chunks, 0), max_total)
    if NUM_COUNTERS > 0:
        slots = tl.arange(0, 4)
        tl.store(counters + slots, tl.zeros([4], tl.int32), mask=slots < NUM_COUNTERS)


_INT32_MAX = 2**31 - 1
_MAX_COUNTERS = 4  # the kernel zeroes at most this many counters (its tl.arange(0, 4))


def _is_int32_buffer(x: object, device: torch.device) -> bool:
    """A contiguous 1-D int32 tensor on exactly ``device``."""
    return (isinstance(x, torch.Tensor) and x.dtype == torch.int32 and x.dim() == 1 and x.is_contiguous()
            and x.device == device)


def launch_chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int, *, out: torch.Tensor | None = None,
                         counters: torch.Tensor | None = None, token_capacity: int | None = None) -> torch.Tensor:
    """``chunk_offsets`` of ``cu_seqlens`` for chunk size ``chunk_size``, on the device, in one launch.

    The same values as :func:`attn_gym_lite.schedule.chunk_offsets` (the definition, five torch
    kernels), computed by :func:`chunk_offsets_kernel` with no host read of ``cu_seqlens``:
    capturable, and a replay recomputes them from the captured buffer.

    Args:
        cu_seqlens: int32 ``[N + 1]`` contiguous prefix sums, on the device the kernels run on (a
            CPU tensor under ``TRITON_INTERPRET=1``). Its values are not read on the host.
        chunk_size: ``C``, tokens per chunk, an int ``>= 1`` (each value compiles once).
        out: int32 ``[N + 1]`` contiguous buffer on ``cu_seqlens``'s device to write into;
            default: a new one.
        counters: int32 1-D contiguous buffer of at most 4 task counters on that device, set to
            zero by the same launch (the dynamic schedule's); default: none.
        token_capacity: ``T``, the rows of the tensors the chunks will index (an int ``>= 0``), or
            ``None``.
            Given, every sequence is clamped into ``[0, T]`` (start ``clamp(cu_seqlens[i], 0,
            T)``, end ``clamp(cu_seqlens[i + 1], start, T)``) and the totals are capped at
            ``G_cap = chunk_capacity(T, N, C)``, exactly as the kernels decode their tasks, so a
            malformed ``cu_seqlens`` (not starting at 0, decreasing, ``L > T``: values are not
            read on the host) cannot make a kernel address rows outside the tensors. ``None``:
            lengths are only kept ``>= 0`` and totals capped at ``2**31 - 1``. On a valid
            ``cu_seqlens`` (``L <= T``) both give the definition's values.

    Returns:
        ``out`` (or the new buffer): int32 ``[N + 1]``, ``[0, ..., G_active]``.

    Raises:
        TypeError / ValueError: ``cu_seqlens`` breaks a layout rule
            (:func:`attn_gym_lite.checks.check_cu_seqlens`), ``chunk_size`` is not an int ``>= 1``,
            ``out`` is not such an ``[N + 1]`` buffer, ``counters`` not such a buffer of at most 4,
            ``token_capacity`` neither ``None`` nor an int in ``[0, 2**31 - 1]``. Values are
            never checked, not even a CPU ``cu_seqlens``'s: the ops that launch this check them
            first where they are asked to (``validate``), and the clamps keep the rest in bounds. Metadata only: a few host
            microseconds per call.
    """
    # The ops call this on every call: each rule is one cheap test, and the package's checks
    # (which build the messages) run only when it fails.
    checks.check_cu_seqlens(cu_seqlens)
    if type(chunk_size) is not int or chunk_size < 1:
        chunk_size = checks.check_int("chunk_size", chunk_size, minimum=1)
    N = cu_seqlens.numel() - 1
    device = cu_seqlens.device
    if out is None:
        out = torch.empty(N + 1, dtype=torch.int32, device=device)
    elif not _is_int32_buffer(out, device) or out.numel() != N + 1:
        checks.check_cu_seqlens(out, device=device, sequence_capacity=N, argument="out")
        raise ValueError(f"out must be on device {device}, got {out.device}")  # e.g. cuda:1 for cuda:0
    count = 0
    if counters is not None:
        if not _is_int32_buffer(counters, device) or counters.numel() > _MAX_COUNTERS:
            checks.check_tensor("counters", counters, ndim=1, shape=f"[<= {_MAX_COUNTERS}]", dtypes=(torch.int32,),
                                device=device)
            raise ValueError(f"counters must be a contiguous buffer of at most {_MAX_COUNTERS} entries on device "
                             f"{device}, got shape {tuple(counters.shape)}, stride {counters.stride()}, device "
                             f"{counters.device}")
        count = counters.numel()
    if token_capacity is None:
        token_capacity, max_total = _INT32_MAX, _INT32_MAX
    else:
        if type(token_capacity) is not int or not 0 <= token_capacity <= _INT32_MAX:
            token_capacity = checks.check_int("token_capacity", token_capacity, minimum=0, maximum=_INT32_MAX)
        largest = min(token_capacity, N)  # G_cap, inline: schedule.chunk_capacity's checks cost µs
        max_total = largest + (token_capacity - largest) // chunk_size
    # One CTA walks cu_seqlens in blocks of up to 1024 rows, the carry between blocks in a register.
    block = max(16, min(1024, 1 << N.bit_length()))  # next power of two >= N + 1 (triton's helper costs ~1 µs)
    chunk_offsets_kernel[(1,)](cu_seqlens, out, out if counters is None else counters, N, token_capacity,
                               max_total, NUM_COUNTERS=count, CHUNK=chunk_size, BLOCK=block)
    return out
