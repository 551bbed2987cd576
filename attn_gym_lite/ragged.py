"""Packed ("ragged") tensors and their ``cu_seqlens`` metadata.

A batch of variable-length sequences is stored as one packed tensor of shape
``[T, ...]`` plus an int32 prefix sum ``cu_seqlens`` of shape ``[N + 1]``::

    sequences   a a a | b b | c c c c          (M = 3 active sequences)
    packed      a a a b b c c c c . . .        (L = 9 active tokens, T = 12 rows)
    cu_seqlens  [0, 3, 5, 9, 9, 9]             (N = 5 sequence slots)

Sequence ``i`` occupies ``packed[cu_seqlens[i]:cu_seqlens[i + 1]]``. The rows past
``L = cu_seqlens[-1]`` are capacity, not data, and the unused tail of ``cu_seqlens``
repeats ``L`` so those slots are empty sequences. Keeping ``T`` and ``N`` fixed while
``L`` and ``M`` vary is what lets one captured CUDA graph serve every batch (seed
article, section "Terminology time"); the int32 prefix-sum layout is the
FlashAttention varlen convention, also used by ``torch.nn.attention.varlen``.

Two kinds of function live here. Eager helpers (packing, validation, ``max_seqlen``)
read values on the host and must run outside graph capture. ``active_token_mask``,
``lengths_from_cu_seqlens`` and ``pad_cu_seqlens`` only launch device ops on a CUDA
``cu_seqlens``, so they may run inside a captured region and are recomputed on every replay
(a CPU ``cu_seqlens`` has its values checked on the host first: no device sync).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from .checks import INT32_MAX as _INT32_MAX
from .checks import (
    check_cu_seqlens,
    check_cu_seqlens_values,
    check_device,
    check_fill,
    check_host_cu_seqlens_values,
    check_int,
    check_real,
    host_values,
)

Tensor = torch.Tensor

__all__ = [
    "active_token_mask",
    "cu_seqlens_from_lengths",
    "lengths_from_cu_seqlens",
    "max_seqlen",
    "pack_sequences",
    "packed_to_padded",
    "pad_cu_seqlens",
    "positions_in_sequence",
    "padded_to_packed",
    "unpack_sequences",
    "validate_cu_seqlens",
    "zipf_lengths",
]



def _require_token_tensor(name: str, value: object) -> None:
    """Raise unless ``value`` is a tensor with a leading token dimension."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape [T, ...], got {type(value).__name__}"
        )
    if value.ndim == 0:
        raise ValueError(f"{name} must have a token dimension (shape [T, ...]), got a 0-d tensor")


# -----------------------------------------------------------------------------
# cu_seqlens: building, padding and checking the metadata


def cu_seqlens_from_lengths(
    lengths: Tensor | Sequence[int], *, device: torch.device | str | None = None
) -> Tensor:
    """Prefix-sum sequence lengths into ``cu_seqlens``.

    Args:
        lengths: ``M >= 1`` sequence lengths in tokens, each ``>= 0``: a 1-D tensor of
            any integer dtype, or a sequence of Python ints.
        device: device of the result. Defaults to ``lengths``'s device for a tensor and
            to the CPU for a sequence of ints.

    Returns:
        int32 tensor of shape ``[M + 1]``: ``[0, s_0, s_0 + s_1, ..., L]``.

    Raises:
        TypeError: ``lengths`` is neither a 1-D integer tensor nor a sequence of ints;
            ``device`` is not a str, int or ``torch.device``.
        ValueError: ``lengths`` is empty or not 1-D, a meta tensor (no values to read), an
            entry is negative or past the int32 range, or the total exceeds the int32 range;
            ``device`` is one torch does not parse or this host does not have (``"cuda"``
            without a GPU; :func:`~attn_gym_lite.checks.check_device`).

    Eager: reads ``lengths`` on the host to check them, and builds the result there before
    moving it to ``device`` (so ``device="meta"`` gives a meta tensor). Source: FlashAttention varlen
    convention; seed article, section "What are ragged kernels?".
    """
    if device is not None:
        device = check_device("device", device)
    if isinstance(lengths, Tensor):
        dtype = lengths.dtype
        if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
        if lengths.ndim != 1:
            raise ValueError(
                f"lengths must be 1-D with shape [M], got shape {tuple(lengths.shape)}"
            )
        # Checked on the host (one read, as before: the checks below read every length), in int64
        # so that the running sum cannot wrap before it is checked against int32.
        target = lengths.device if device is None else device
        lengths64 = host_values("lengths", lengths)
    elif isinstance(lengths, Sequence) and not isinstance(lengths, (str, bytes)):
        for i, value in enumerate(lengths):
            value = check_int(f"lengths[{i}]", value)
            if not -(2**63) <= value < 2**63:  # no int64 holds it: refused here, naming the entry
                check_int(f"lengths[{i}]", value, minimum=0, maximum=_INT32_MAX)
        target = "cpu" if device is None else device
        lengths64 = torch.tensor([int(value) for value in lengths], dtype=torch.int64)
    else:
        raise TypeError(
            f"lengths must be a 1-D integer tensor or a sequence of ints, "
            f"got {type(lengths).__name__}"
        )

    if lengths64.numel() == 0:
        raise ValueError(
            "lengths must hold at least one sequence length (cu_seqlens needs N >= 1), got 0"
        )
    # One scan for both bounds. Each length within int32 before the sum: a running sum of int64
    # lengths near 2**62 wraps (to 0, or negative) and would pass the total's check below
    # ([2**62, 2**62] gave [0, 0, 0]).
    bad = torch.nonzero((lengths64 < 0) | (lengths64 > _INT32_MAX)).flatten()
    if bad.numel() > 0:
        i = int(bad[0])
        value = int(lengths64[i])
        if value < 0:
            raise ValueError(f"lengths must be >= 0, got lengths[{i}] = {value}")
        raise ValueError(f"lengths[{i}] must be an int in [0, {_INT32_MAX}] (cu_seqlens is int32), got {value}")
    ends = lengths64.cumsum(0)  # now at most M * (2**31 - 1): no wrap for any M that fits in memory
    if int(ends[-1]) > _INT32_MAX:
        raise ValueError(
            f"sum of lengths must fit in int32 (<= {_INT32_MAX}), the cu_seqlens dtype, "
            f"got {int(ends[-1])}"
        )
    return torch.cat((ends.new_zeros(1), ends)).to(device=target, dtype=torch.int32)


def lengths_from_cu_seqlens(cu_seqlens: Tensor) -> Tensor:
    """Sequence lengths from ``cu_seqlens``: ``cu_seqlens[1:] - cu_seqlens[:-1]``.

    Args:
        cu_seqlens: int32 tensor of shape ``[N + 1]``, any device.

    Returns:
        int32 tensor of shape ``[N]`` on ``cu_seqlens``'s device, in tokens. Tail slots
        (which repeat ``L``) give length 0.

    Raises:
        TypeError: ``cu_seqlens`` is not a tensor or not int32.
        ValueError: ``cu_seqlens`` is not 1-D or has fewer than 2 entries.

    Capture-safe: checks only metadata and launches one device op. Source:
    FlashAttention varlen convention.
    """
    check_cu_seqlens(cu_seqlens)
    return cu_seqlens.diff()


def pad_cu_seqlens(cu_seqlens: Tensor, sequence_capacity: int) -> Tensor:
    """Extend ``cu_seqlens`` to ``N + 1`` entries by repeating ``L`` in the unused tail.

    A graph captured for ``N`` sequence slots needs ``cu_seqlens`` of shape ``[N + 1]``
    on every replay; a batch with ``M < N`` sequences fills the extra slots with empty
    sequences ``[0, ..., L, L, L]``.

    Args:
        cu_seqlens: int32 tensor of shape ``[M + 1]``, any device.
        sequence_capacity: ``N``, the number of sequence slots, ``>= M``.

    Returns:
        A new int32 tensor of shape ``[N + 1]`` on ``cu_seqlens``'s device.

    Raises:
        TypeError: ``cu_seqlens`` is not an int32 tensor, or ``sequence_capacity`` not an int.
        ValueError: ``cu_seqlens`` is not 1-D with at least 2 entries, or it already has
            more than ``N + 1`` entries; a CPU ``cu_seqlens`` (its values read without a device sync) not
            starting at 0 or decreasing.

    Capture-safe: the tail is copied from the device value ``cu_seqlens[-1]``. Source:
    seed article, sections "Terminology time" and "A More Realistic Training Loop".
    """
    check_cu_seqlens(cu_seqlens)
    capacity = check_int("sequence_capacity", sequence_capacity, minimum=1)
    # A CPU cu_seqlens has its value rules checked, with no device sync (as active_token_mask does); before,
    # [3, 1] was padded to [3, 1, 1, 1].
    check_host_cu_seqlens_values(cu_seqlens)
    if cu_seqlens.numel() > capacity + 1:
        raise ValueError(
            f"cu_seqlens must have at most sequence_capacity + 1 = {capacity + 1} entries, "
            f"got {cu_seqlens.numel()}"
        )
    tail = cu_seqlens[-1:].expand(capacity + 1 - cu_seqlens.numel())
    return torch.cat((cu_seqlens, tail))


def validate_cu_seqlens(
    cu_seqlens: Tensor,
    token_capacity: int | None = None,
    *,
    max_seqlen: int | None = None,
    device: torch.device | str | None = None,
) -> None:
    """Check that ``cu_seqlens`` is well-formed metadata for a packed batch.

    Eager only: this reads ``cu_seqlens`` on the host, which synchronizes with the
    device, so never call it inside a captured region. Validate a batch before copying
    it into a graph's static buffers.

    Args:
        cu_seqlens: int32 tensor of shape ``[N + 1]``.
        token_capacity: ``T``, if given: ``L = cu_seqlens[-1]`` must be ``<= T``.
        max_seqlen: if given, must be ``>=`` the longest sequence ``S_max`` in tokens.
        device: if given, the device ``cu_seqlens`` must be on (``"cuda"`` matches any GPU).

    Raises:
        TypeError: ``cu_seqlens`` is not a tensor or not int32; ``token_capacity`` or
            ``max_seqlen`` is not an int; ``device`` is not a str, int or ``torch.device``.
        ValueError: ``cu_seqlens`` is on the wrong device, not 1-D, has fewer than 2
            entries, does not start at 0, decreases, ends past ``token_capacity``, or
            has a sequence longer than ``max_seqlen``; ``device`` is one torch does not
            parse, one this host does not have (``"cuda"`` without a GPU) or ``"meta"``
            (no values to check; :func:`~attn_gym_lite.checks.check_device`).
        RuntimeError: called while the current CUDA stream is capturing.

    Source: FlashAttention varlen convention; seed article, section "Terminology time".
    """
    if device is not None:
        device = check_device("device", device, allow_meta=False)
    check_cu_seqlens(cu_seqlens, device=device)
    check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen)


def _validate_against(cu_seqlens: Tensor, packed: Tensor, *, max_seqlen: int | None = None) -> None:
    """:func:`validate_cu_seqlens` for a ``cu_seqlens`` that must sit on ``packed``'s device (a
    tensor's device, so not itself an argument to check: a meta ``packed`` is named through
    ``cu_seqlens``'s device message, not refused as a ``device=`` argument the caller never gave)."""
    check_cu_seqlens(cu_seqlens, device=packed.device)
    check_cu_seqlens_values(cu_seqlens, token_capacity=packed.shape[0], max_seqlen=max_seqlen)


def max_seqlen(cu_seqlens: Tensor) -> int:
    """``S_max``: the longest sequence in ``cu_seqlens``, in tokens (0 if all are empty).

    Eager only: validates ``cu_seqlens`` and reads it on the host. Kernels that take
    ``max_seqlen`` need it as a Python int at launch, so under CUDA graphs pass the
    capacity bound (for example ``T``) rather than recomputing it per replay.

    Args:
        cu_seqlens: int32 tensor of shape ``[N + 1]``, any device.

    Raises:
        The errors of :func:`validate_cu_seqlens`.

    Source: FlashAttention varlen convention (``max_seqlen_q``/``max_seqlen_k``).
    """
    validate_cu_seqlens(cu_seqlens)
    return int(lengths_from_cu_seqlens(cu_seqlens).max())


# -----------------------------------------------------------------------------
# Synthetic batches: document lengths in real corpora are heavy-tailed, a few long
# documents and many short ones. A Zipf law over a random ranking reproduces that.


def zipf_lengths(
    total_tokens: int,
    num_sequences: int,
    *,
    exponent: float = 1.2,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Split ``total_tokens`` into ``num_sequences`` Zipf-distributed lengths.

    Each sequence draws a distinct rank ``r`` from a random permutation of
    ``1..num_sequences`` and weight ``r ** -exponent``. Every sequence gets 1 token plus
    the floor of its weighted share of the remaining ``total_tokens - num_sequences``
    tokens; the tokens lost to flooring go, one each, to the sequences with the largest
    fractional parts (ties to the lower index).

    Args:
        total_tokens: ``L``, the tokens to distribute, ``<= 2**31 - 1``.
        num_sequences: ``M >= 1``, the number of sequences, ``<= total_tokens``.
        exponent: Zipf exponent, a finite real ``>= 0`` (0 gives near-equal lengths).
        generator: CPU ``torch.Generator`` for the random ranking; the same seed gives
            the same lengths.

    Returns:
        int32 CPU tensor of shape ``[num_sequences]``, each entry ``>= 1``, summing to
        exactly ``total_tokens``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``num_sequences < 1``, ``total_tokens < num_sequences``,
            ``total_tokens`` beyond int32, ``exponent`` negative or not finite, or a
            non-CPU ``generator``.

    Source: seed article, section "Hello World" (``get_zipf_tokens``).
    """
    n = check_int("num_sequences", num_sequences, minimum=1)
    total = check_int("total_tokens", total_tokens, minimum=0)
    if total < n:
        raise ValueError(
            f"total_tokens must be >= num_sequences (each sequence gets at least 1 token), "
            f"got total_tokens = {total} < num_sequences = {n}"
        )
    if total > _INT32_MAX:
        raise ValueError(f"total_tokens must be <= {_INT32_MAX} (int32 cu_seqlens), got {total}")
    exponent = check_real("exponent", exponent, minimum=0)
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}"
            )
        if generator.device.type != "cpu":
            raise ValueError(
                f"generator must be a CPU torch.Generator, got one on {generator.device}"
            )

    ranks = torch.randperm(n, generator=generator).add(1).to(torch.float64)
    weights = ranks.pow(-float(exponent))
    spare = total - n
    shares = weights * (spare / weights.sum())
    extra = shares.floor()
    # The floors are exact integers in float64, so `remainder` is an exact count. As the
    # shares sum to `spare` (up to rounding), it is the sum of n fractional parts: < n,
    # so no sequence gets more than one extra token.
    remainder = spare - int(extra.sum())
    by_fraction = torch.argsort(shares - extra, descending=True, stable=True)
    extra[by_fraction[:remainder]] += 1
    return (extra + 1).to(torch.int32)


# -----------------------------------------------------------------------------
# Packing and unpacking. These run eagerly: they read lengths on the host to pick
# output shapes, which is exactly what a captured graph cannot do.


def pack_sequences(sequences: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Concatenate sequences along dim 0 into one packed tensor plus ``cu_seqlens``.

    Args:
        sequences: non-empty list or tuple of ``M`` tensors of shape ``[s_i, ...]`` with
            the same trailing shape, dtype and device. Empty sequences (``s_i = 0``) are
            allowed and become empty slots.

    Returns:
        ``(packed, cu_seqlens)``: a new tensor of shape ``[L, ...]`` with
        ``L = sum(s_i)``, and int32 ``cu_seqlens`` of shape ``[M + 1]``, both on the
        sequences' device.

    Raises:
        TypeError: ``sequences`` is not a list/tuple, holds a non-tensor, or the dtypes differ.
        ValueError: ``sequences`` is empty, holds a 0-d tensor, or the trailing shapes or
            devices differ.

    Source: seed article, section "What are ragged kernels?".
    """
    if not isinstance(sequences, (list, tuple)):
        raise TypeError(
            f"sequences must be a list or tuple of tensors, got {type(sequences).__name__}"
        )
    if len(sequences) == 0:
        raise ValueError("sequences must hold at least one tensor, got an empty list")
    first = sequences[0]
    for i, seq in enumerate(sequences):
        _require_token_tensor(f"sequences[{i}]", seq)
        if seq.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"sequences[{i}] must have trailing shape {tuple(first.shape[1:])} "
                f"like sequences[0], "
                f"got shape {tuple(seq.shape)}"
            )
        if seq.dtype != first.dtype:
            raise TypeError(
                f"sequences[{i}] must have dtype {first.dtype} like sequences[0], got {seq.dtype}"
            )
        if seq.device != first.device:
            raise ValueError(
                f"sequences[{i}] must be on device {first.device} like sequences[0], "
                f"got {seq.device}"
            )
    packed = torch.cat(tuple(sequences))
    cu_seqlens = cu_seqlens_from_lengths([seq.shape[0] for seq in sequences], device=first.device)
    return packed, cu_seqlens


def unpack_sequences(packed: Tensor, cu_seqlens: Tensor) -> list[Tensor]:
    """Split a packed tensor back into one view per sequence slot.

    Args:
        packed: tensor of shape ``[T, ...]``; rows past ``L = cu_seqlens[-1]`` are
            capacity and are not returned.
        cu_seqlens: int32 tensor of shape ``[N + 1]`` on ``packed``'s device, with
            ``L <= T``.

    Returns:
        ``N`` tensors, the ``i``-th of shape ``[s_i, ...]``, one per slot of
        ``cu_seqlens``. They are views: writing to them writes to ``packed``. The unused
        tail slots (which repeat ``L``) give empty tensors of shape ``[0, ...]``.

    Raises:
        TypeError / ValueError: ``packed`` is not a tensor with a token dimension, or
            the errors of ``validate_cu_seqlens(cu_seqlens, T, device=packed.device)``.

    Eager only (reads ``cu_seqlens`` on the host). Source: seed article, section
    "What are ragged kernels?".
    """
    _require_token_tensor("packed", packed)
    _validate_against(cu_seqlens, packed)
    lengths = lengths_from_cu_seqlens(cu_seqlens).tolist()
    return list(packed[: sum(lengths)].split(lengths))


def packed_to_padded(
    packed: Tensor,
    cu_seqlens: Tensor,
    *,
    max_seqlen: int | None = None,
    padding_value: float = 0.0,
) -> Tensor:
    """Scatter a packed ``[T, ...]`` tensor into a padded ``[B, S_max, ...]`` batch.

    Row ``b`` holds sequence ``b`` followed by ``padding_value``. Because sequences are
    stored back to back, the active cells of the padded batch, read in row-major order,
    are exactly ``packed[:L]``; one masked ``index_put`` places them all.

    Args:
        packed: tensor of shape ``[T, ...]``, any dtype and device.
        cu_seqlens: int32 tensor of shape ``[B + 1]`` on ``packed``'s device, ``L <= T``.
        max_seqlen: width of the padded batch in tokens, ``>= S_max``; defaults to ``S_max``.
        padding_value: fill for positions past each sequence's end, which ``packed.dtype`` must
            hold (:func:`~attn_gym_lite.checks.check_fill`: an integral value in range for an
            integer dtype, a real number within range for a floating one; a float is rounded).

    Returns:
        A new tensor of shape ``[B, max_seqlen, ...]`` with ``packed``'s dtype and device,
        differentiable with respect to ``packed``. Tail slots of ``cu_seqlens`` give
        all-padding rows.

    Raises:
        TypeError / ValueError: ``packed`` is not a tensor with a token dimension,
            ``padding_value`` is not a number, is complex for a real ``packed``, is outside
            ``packed.dtype``'s range or (for an integer or bool dtype) not integral, ``max_seqlen``
            not an int in ``[0, 2**31 - 1]``, or the errors of
            ``validate_cu_seqlens(cu_seqlens, T, max_seqlen=max_seqlen, device=packed.device)``.

    Eager only (reads ``cu_seqlens`` on the host). Source: the padded layout that the
    seed article, section "What are ragged kernels?", contrasts with packing.
    """
    _require_token_tensor("packed", packed)
    check_fill("padding_value", padding_value, packed.dtype)
    if max_seqlen is not None:  # a width, in int32 like every length here (2**62 overflowed the allocation)
        max_seqlen = check_int("max_seqlen", max_seqlen, minimum=0, maximum=_INT32_MAX)
    _validate_against(cu_seqlens, packed, max_seqlen=max_seqlen)

    lengths = lengths_from_cu_seqlens(cu_seqlens)
    width = int(lengths.max()) if max_seqlen is None else max_seqlen
    active_tokens = int(cu_seqlens[-1])
    # valid[b, s] is True where position s of row b holds a real token.
    positions = torch.arange(width, device=packed.device)
    valid = positions[None, :] < lengths[:, None]
    padded = packed.new_full((lengths.numel(), width, *packed.shape[1:]), padding_value)
    return padded.index_put((valid,), packed[:active_tokens])


def padded_to_packed(padded: Tensor, lengths: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
    """Gather the real tokens of a padded ``[B, S, ...]`` batch into a packed tensor.

    The inverse of :func:`packed_to_padded`: row ``b`` contributes its first
    ``lengths[b]`` positions, in order.

    Args:
        padded: tensor of shape ``[B, S, ...]``, any dtype and device.
        lengths: ``B`` lengths in tokens, each in ``[0, S]``: a 1-D integer tensor (any
            device) or a sequence of ints.

    Returns:
        ``(packed, cu_seqlens)``: a new tensor of shape ``[L, ...]`` with
        ``L = sum(lengths)``, and int32 ``cu_seqlens`` of shape ``[B + 1]``, both on
        ``padded``'s device.

    Raises:
        TypeError: ``padded`` is not a tensor, or ``lengths`` is not integer.
        ValueError: ``padded`` has fewer than 2 dims, ``lengths`` does not have ``B``
            entries, or an entry is negative or greater than ``S``.

    Eager only. Source: the padded layout that the seed article, section "What are
    ragged kernels?", contrasts with packing.
    """
    if not isinstance(padded, Tensor):
        raise TypeError(
            f"padded must be a torch.Tensor of shape [B, S, ...], got {type(padded).__name__}"
        )
    if padded.ndim < 2:
        raise ValueError(f"padded must have shape [B, S, ...], got shape {tuple(padded.shape)}")
    cu_seqlens = cu_seqlens_from_lengths(lengths, device=padded.device)
    row_lengths = cu_seqlens.diff()
    batch, width = padded.shape[0], padded.shape[1]
    if row_lengths.numel() != batch:
        raise ValueError(
            f"lengths must have one entry per row of padded (B = {batch}), "
            f"got {row_lengths.numel()}"
        )
    too_long = torch.nonzero(row_lengths > width).flatten()
    if too_long.numel() > 0:
        i = int(too_long[0])
        raise ValueError(
            f"lengths must be <= padded.shape[1] = {width}, "
            f"got lengths[{i}] = {int(row_lengths[i])}"
        )
    positions = torch.arange(width, device=padded.device)
    valid = positions[None, :] < row_lengths[:, None]
    return padded[valid], cu_seqlens


# -----------------------------------------------------------------------------
# Masking the capacity tail. Rows past L hold stale or undefined values; they must
# be masked wherever rows mix or reduce (seed article, section "Correctness tangent").


def active_token_mask(x_or_token_capacity: Tensor | int, cu_seqlens: Tensor) -> Tensor:
    """Boolean mask of the active rows: ``arange(T) < cu_seqlens[-1]``.

    Capture-safe: ``L`` is compared on the device as the 0-d tensor ``cu_seqlens[-1]``,
    never read on the host, so a captured graph re-evaluates the mask from whatever
    ``L`` the static ``cu_seqlens`` buffer holds at each replay. A CPU ``cu_seqlens`` (read
    without a device sync) has its value rules checked (:func:`attn_gym_lite.checks.check_host_cu_seqlens_values`).

    Args:
        x_or_token_capacity: a tensor of shape ``[T, ...]`` (on ``cu_seqlens``'s
            device), or the token capacity ``T`` as an int ``>= 0``.
        cu_seqlens: int32 tensor of shape ``[N + 1]``.

    Returns:
        bool tensor of shape ``[T]`` on ``cu_seqlens``'s device; True for the first
        ``L`` rows.

    Raises:
        TypeError: ``x_or_token_capacity`` is neither a tensor nor an int, or
            ``cu_seqlens`` is not an int32 tensor.
        ValueError: ``x_or_token_capacity`` is a 0-d tensor, an int outside ``[0, 2**31 - 1]``, or on a
            different device than ``cu_seqlens``; ``cu_seqlens`` is not 1-D with at
            least 2 entries; a CPU ``cu_seqlens`` not starting at 0, decreasing, or with
            ``L > T``.

    Source: seed article, section "Correctness tangent" (``active_token_mask``).
    """
    if isinstance(x_or_token_capacity, Tensor):
        _require_token_tensor("x_or_token_capacity", x_or_token_capacity)
        token_capacity = x_or_token_capacity.shape[0]
        check_cu_seqlens(cu_seqlens, device=x_or_token_capacity.device)
    elif isinstance(x_or_token_capacity, numbers.Integral):
        # At most int32's largest: the rows are numbered in cu_seqlens' int32, and past it they
        # would wrap negative (and be marked active).
        token_capacity = check_int("x_or_token_capacity", x_or_token_capacity, minimum=0, maximum=_INT32_MAX)
        check_cu_seqlens(cu_seqlens)
    else:
        raise TypeError(
            f"x_or_token_capacity must be a tensor of shape [T, ...] or an int T >= 0, "
            f"got {x_or_token_capacity!r}"
        )
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity)
    positions = torch.arange(token_capacity, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return positions < cu_seqlens[-1]


def positions_in_sequence(cu_seqlens: Tensor, token_capacity: int) -> Tensor:
    """Each row's position inside its own sequence: ``t - cu_seqlens[i]`` for row ``t`` of
    sequence ``i``, so positions restart at 0 at every boundary (RoPE, convolution taps).

    Rows ``t >= L`` fall past every boundary and count from ``L``, as if the inactive rows were one
    more sequence: nothing computed from positions ever links an active row to an inactive one.

    Args:
        cu_seqlens: int32 ``[N + 1]``.
        token_capacity: ``T``, the rows to number (``>= 0``).

    Returns:
        int32 ``[T]`` on ``cu_seqlens``'s device.

    Raises:
        TypeError / ValueError: the layout errors of ``cu_seqlens``; ``token_capacity`` not an int
            ``>= 0``; a CPU ``cu_seqlens`` (its values read without a device sync) not starting at 0,
            decreasing, or with ``L > T``.

    Capture-safe: a ``searchsorted`` on the device (``right=True`` steps over empty sequences to
    the last boundary ``<= t``). Source: the packed-RoPE convention of FlashAttention's varlen
    training scripts (positions reset per document).
    """
    check_cu_seqlens(cu_seqlens)
    # int32 rows: past 2**31 - 1 they would wrap negative.
    token_capacity = check_int("token_capacity", token_capacity, minimum=0, maximum=_INT32_MAX)
    check_host_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity)
    rows = torch.arange(token_capacity, device=cu_seqlens.device, dtype=torch.int32)
    sequence = torch.searchsorted(cu_seqlens, rows, right=True) - 1
    return rows - cu_seqlens[sequence]
