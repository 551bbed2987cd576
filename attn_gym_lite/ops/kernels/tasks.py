"""Which chunk a program works on: the schedules, as three small device functions.

Every ragged kernel in this package is written as

    task = first_task(...)
    while task >= 0:
        seq_start, seq_len, chunk, head = task_at(task, ...)
        <process chunk ``chunk`` of the sequence at ``seq_start`` for head ``head``>
        task = next_task(task, ...)

and the schedule (a compile-time constant) decides only what those functions return:

* ``"rect"``, grid ``(ceil(max_seqlen / C), N, H)``: program ``(chunk, seq, head)`` owns exactly
  that slot, and has one task if the slot lies inside the sequence, none if it lies past its end
  (FlashAttention-2's early exit).
* ``"flat"``, grid ``(chunk_capacity(T, N, C), H)``: program ``(flat, head)`` has one task if
  ``flat < chunk_offsets[N]`` (the active chunk count, read on the device), else none; its
  sequence is found by binary search over ``chunk_offsets``.
* ``"persistent"``, grid ``(workers,)``: worker ``w`` runs tasks ``w, w + workers, ...`` below
  ``chunk_offsets[N] * H``; task ``t`` is chunk ``t % active`` of head ``t // active``, so
  workers running side by side share a head and neighbouring chunks (and their keys in L2).
* ``"dynamic"``, grid ``(workers,)``: the same task list; worker ``w`` starts with task ``w``, then
  takes its next task from a counter in device memory (``workers + atomic_add(counter, 1)``) when
  it finishes the last one, so a worker dealt heavy tasks simply takes fewer of them: the balance
  of the flat grid (where the hardware hands the next CTA to the first free SM) without launching
  one CTA per task. The first task costs no atomic, so a batch with fewer tasks than workers runs
  exactly like the persistent grid. The counter is an int32 zeroed before every launch.

No schedule reads anything on the host: the active work comes from ``cu_seqlens`` and
``chunk_offsets`` in device memory, so a captured graph adapts to each replay's batch.

Nor is anything read from ``cu_seqlens`` trusted to address memory: :func:`sequence_bounds` clamps
every sequence into the ``T`` rows of the tensors (``start = clamp(cu_seqlens[i], 0, T)``, ``end =
clamp(cu_seqlens[i + 1], start, T)``), and ``chunk_offsets`` is built from the same clamped
lengths (:func:`attn_gym_lite.ops.kernels.offsets.launch_chunk_offsets` with ``token_capacity``),
so a task's chunk always lies inside its sequence and its sequence inside the tensors. On a valid
``cu_seqlens`` the clamps change nothing; on a malformed one (values never checked on the device)
the results are wrong but no access leaves the tensors.

Source: the seed article, sections "The anatomy of a ragged kernel" (rect), "Scheduling without
max_seqlen" (flat, the decoding) and "Graph overcapture" (persistent); FlashAttention-3's
dynamic tile scheduler (an atomic counter) for dynamic.
"""

import triton
import triton.language as tl


@triton.jit
def find_sequence(chunk_offsets, flat_chunk, num_seqs):
    """The sequence owning ``flat_chunk``: the last ``i`` with ``chunk_offsets[i] <= flat_chunk``.

    Keeps ``chunk_offsets[lo] <= flat_chunk < chunk_offsets[hi]`` while halving ``[lo, hi)``;
    it starts from ``[0, N)``, valid because ``chunk_offsets[0] = 0`` and ``chunk_offsets[N] =
    G_active > flat_chunk``. Empty slots share their offset with the next slot, so they can be
    ``lo`` only transiently: the last slot with that offset is the one that owns chunks.
    """
    lo = 0
    hi = num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        owns_mid_or_later = tl.load(chunk_offsets + mid) <= flat_chunk
        lo = tl.where(owns_mid_or_later, mid, lo)
        hi = tl.where(owns_mid_or_later, hi, mid)
    return lo


@triton.jit
def sequence_bounds(cu_seqlens, seq, token_capacity):
    """Sequence slot ``seq``'s first packed row and length, clamped into ``[0, token_capacity]``:
    ``start = clamp(cu_seqlens[seq], 0, T)``, ``end = clamp(cu_seqlens[seq + 1], start, T)``,
    returns ``(start, end - start)``. Two min/max pairs: the identity on a valid ``cu_seqlens``."""
    start = tl.minimum(tl.maximum(tl.load(cu_seqlens + seq), 0), token_capacity)
    end = tl.minimum(tl.maximum(tl.load(cu_seqlens + seq + 1), start), token_capacity)
    return start, end - start


@triton.jit
def _active_tasks(chunk_offsets, num_seqs, num_heads):
    return tl.load(chunk_offsets + num_seqs) * num_heads


@triton.jit
def first_task(counter, cu_seqlens, chunk_offsets, num_seqs, num_heads, token_capacity, CHUNK: tl.constexpr,
               SCHEDULE: tl.constexpr):
    """This program's first task, ``-1`` if it has none (rect and flat use task 0 for "my slot")."""
    if SCHEDULE == "rect":
        seq = tl.program_id(1)
        _, seq_len = sequence_bounds(cu_seqlens, seq, token_capacity)
        task = tl.where(tl.program_id(0) * CHUNK < seq_len, 0, -1)
    elif SCHEDULE == "flat":
        task = tl.where(tl.program_id(0) < tl.load(chunk_offsets + num_seqs), 0, -1)
    else:
        task = tl.program_id(0)
        task = tl.where(task < _active_tasks(chunk_offsets, num_seqs, num_heads), task, -1)
    return task


@triton.jit
def next_task(task, counter, chunk_offsets, num_seqs, num_heads, SCHEDULE: tl.constexpr):
    """The task after ``task``, ``-1`` when there is none: rect and flat have one task only,
    persistent strides by the grid, dynamic takes the counter's next value."""
    if SCHEDULE == "persistent":
        task = task + tl.num_programs(0)
        task = tl.where(task < _active_tasks(chunk_offsets, num_seqs, num_heads), task, -1)
    elif SCHEDULE == "dynamic":
        task = tl.num_programs(0) + tl.atomic_add(counter, 1)
        task = tl.where(task < _active_tasks(chunk_offsets, num_seqs, num_heads), task, -1)
    else:
        task = -1
    return task


@triton.jit
def task_at(task, cu_seqlens, chunk_offsets, num_seqs, token_capacity, SCHEDULE: tl.constexpr):
    """Task ``task`` of this program: ``(seq_start, seq_len, chunk, head)``, where ``seq_start`` is
    the sequence's first packed row, ``seq_len`` its length and ``chunk`` the chunk's index
    within the sequence (it covers rows ``chunk * C ..`` of the sequence). The sequence comes from
    :func:`sequence_bounds`, so ``0 <= seq_start <= seq_start + seq_len <= token_capacity`` and
    ``chunk * C < seq_len`` whatever ``cu_seqlens`` holds (``chunk_offsets`` built with the same
    ``token_capacity``)."""
    if SCHEDULE == "rect":
        chunk = tl.program_id(0)
        seq = tl.program_id(1)
        head = tl.program_id(2)
    else:
        if SCHEDULE == "flat":
            flat_chunk = tl.program_id(0)
            head = tl.program_id(1)
        else:
            active = tl.load(chunk_offsets + num_seqs)
            head = task // active
            flat_chunk = task % active
        seq = find_sequence(chunk_offsets, flat_chunk, num_seqs)
        chunk = flat_chunk - tl.load(chunk_offsets + seq)
    seq_start, seq_len = sequence_bounds(cu_seqlens, seq, token_capacity)
    return seq_start, seq_len, chunk, head
