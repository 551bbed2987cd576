"""Argument checks shared by the package; the bottom layer (it imports nothing from the package).

What is checked is what would otherwise give a silently wrong result: the layout and value rules
of ``cu_seqlens`` (kernels read it through its data pointer and index memory with its values), and
no read of a tensor's values on the host while a CUDA graph is being captured.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch

Tensor = torch.Tensor

#: cu_seqlens is int32, so no batch may hold more tokens than this.
INT32_MAX = torch.iinfo(torch.int32).max
FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def host_values(argument: str, value: Tensor) -> Tensor:
    """An int64 CPU copy of ``value``: the one place the package reads tensor values on the host,
    refused while the current CUDA stream is capturing (the read would synchronise)."""
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{argument}'s values are read on the host, which cannot happen during CUDA graph "
                           "capture; validate the batch before capturing or replaying")
    return value.detach().cpu().to(torch.int64)


def _same_device(expected: torch.device | str, actual: torch.device) -> bool:
    expected = torch.device(expected)  # "cuda" carries no index and matches any GPU
    return actual.type == expected.type and expected.index in (None, actual.index)


def check_cu_seqlens(cu_seqlens: Tensor, *, device: torch.device | str | None = None,
                     sequence_capacity: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The layout rules (metadata only, capture-safe): a contiguous 1-D int32 tensor of
    ``N + 1 >= 2`` entries (exactly ``sequence_capacity + 1`` if given), on ``device`` if given.
    Kernels read it through its data pointer: a strided view would be read as if it were dense."""
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{argument} must have dtype torch.int32 (FlashAttention varlen convention), "
                        f"got {cu_seqlens.dtype}")
    if device is not None and not _same_device(device, cu_seqlens.device):
        raise ValueError(f"{argument} must be on device {torch.device(device)}, got {cu_seqlens.device}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2 or sequence_capacity not in (None, cu_seqlens.numel() - 1):
        entries = "at least 2" if sequence_capacity is None else f"N + 1 = {sequence_capacity + 1}"
        raise ValueError(f"{argument} must have {entries} entries in shape [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if not cu_seqlens.is_contiguous():
        raise ValueError(f"{argument} must be contiguous (kernels read it through its data pointer), "
                         f"got stride {cu_seqlens.stride()}")
    return cu_seqlens


def check_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                            max_seqlen: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The layout rules, then the value rules: starts at 0, never decreases, ``L <= token_capacity``,
    no sequence longer than ``max_seqlen``. Returns the int64 host copy it checked.

    Eager only: reads the values on the host (:func:`host_values`).
    """
    check_cu_seqlens(cu_seqlens, argument=argument)
    host = host_values(argument, cu_seqlens)
    steps = host.diff()
    if host[0] != 0:
        raise ValueError(f"{argument}[0] must be 0, got {int(host[0])}")
    if (steps < 0).any():
        i = int(torch.nonzero(steps < 0)[0]) + 1
        raise ValueError(f"{argument} must be non-decreasing, but {argument}[{i}] = {int(host[i])} "
                         f"< {argument}[{i - 1}] = {int(host[i - 1])}")
    if token_capacity is not None and host[-1] > token_capacity:
        raise ValueError(f"{argument}[-1] (active tokens L) must be <= token_capacity T = {token_capacity}, "
                         f"got L = {int(host[-1])}")
    if max_seqlen is not None and steps.max() > max_seqlen:
        raise ValueError(f"max_seqlen must be >= the longest sequence, got max_seqlen = {max_seqlen} "
                         f"but sequence {int(steps.argmax())} has length {int(steps.max())}")
    return host


def check_host_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                                 max_seqlen: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The layout rules, and the value rules where reading the values costs no device sync: a CPU
    tensor outside ``torch.compile``. A CUDA one is not read (capture-safe): the kernels clamp."""
    check_cu_seqlens(cu_seqlens, argument=argument)
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen, argument=argument)
    return cu_seqlens


# -----------------------------------------------------------------------------
# Helpers kept while their callers are slimmed.


def _int_expectation(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an int >= {minimum}"
    if maximum is not None:
        return f"an int <= {maximum}"
    return "an int"


def check_int(argument: str, value: object, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (either bound optional).

    ``bool`` is refused although Python counts it as an integer: ``k=True`` is always a slip.

    Raises:
        TypeError: ``value`` is not an integer (``1.0``, ``"3"``, ``True``, ...).
        ValueError: it is outside the bounds.
    """
    expected = _int_expectation(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be {expected}, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{argument} must be {expected}, got {value}")
    return value


def tensor_metadata(*tensors: object) -> tuple | None:
    """A hashable key of everything static checks look at: type, shape, strides, dtype and device
    of each tensor; ``None`` if one argument is not a tensor (then check it in full).

    Checks that depend on nothing else (shapes agree, dtype allowed, contiguous, on one device,
    offsets below 2**31, ...) can be cached under this key and skipped on a repeated call: the
    host time of an eager call is part of every step.

    Raises:
        Nothing: any argument is accepted (a non-tensor one gives ``None``).
    """
    if not all(isinstance(t, Tensor) for t in tensors):
        return None
    return tuple((type(t), t.shape, t.stride(), t.dtype, t.device) for t in tensors)


class SignatureCache:
    """What static checks concluded, per call signature (:func:`tensor_metadata` plus flags), so a
    repeated eager call costs one dictionary lookup instead of the checks.

    Bounded: past ``capacity`` distinct signatures it starts again (a bound, not an LRU). While
    ``torch.compile`` traces, :meth:`key` returns ``None`` and nothing is looked up or stored: a
    lookup keyed on exact shapes would make dynamo guard on them and recompile for every new shape
    instead of tracing one dynamic graph (the checks themselves trace to nothing).
    """

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: dict = {}

    def key(self, tensors: tuple, *flags: object) -> tuple | None:
        """The key of ``tensors`` and ``flags``; ``None`` (do not cache) while compiling, when an
        argument is not a tensor, or when a flag is unhashable."""
        if torch.compiler.is_compiling():
            return None
        metadata = tensor_metadata(*tensors)
        if metadata is None:
            return None
        key = (metadata, *flags)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def get(self, key: tuple | None):
        return None if key is None else self._entries.get(key)

    def put(self, key: tuple | None, value) -> None:
        if key is None:
            return
        if len(self._entries) >= self.capacity:
            self._entries.clear()
        self._entries[key] = value

    def clear(self) -> None:
        self._entries.clear()


def check_int_sequence(argument: str, values: object, *, minimum: int | None = None,
                       maximum: int | None = None, allow_set: bool = True, allow_empty: bool = False) -> list[int]:
    """``values`` as a list of ints, each checked like :func:`check_int` (the message names the
    entry, e.g. ``capacities[1]``). A 1-D integer tensor or array is accepted. Empty only with
    ``allow_empty`` (any empty container then gives ``[]``; an empty tensor or array must still
    have an integer dtype).

    Raises:
        TypeError: ``values`` is not a sequence (a string is not, nor a dict: its keys are not
            taken; nor, with ``allow_set=False``, for values whose order or repeats count, a set:
            it has no order and merges equal entries), or an entry is not an int.
        ValueError: it is empty (without ``allow_empty``), a tensor or array that is not 1-D, or
            an entry is out of range.
    """
    if getattr(values, "ndim", 1) != 1 and (isinstance(values, Tensor) or hasattr(values, "tolist")):
        # A (0, 3) tensor was reported as holding no int, a (2, 3) one as holding lists.
        raise ValueError(f"{argument} must be a 1-D sequence of ints, got shape {tuple(values.shape)}")
    if isinstance(values, Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{argument} must be a sequence of ints, got a {values.dtype} tensor")
        values = host_values(argument, values).tolist()
    elif hasattr(values, "tolist") and not isinstance(values, (str, bytes)):
        # An empty array has no entry to refuse: its dtype must say ints (numpy's kind).
        if getattr(values, "size", None) == 0 and getattr(getattr(values, "dtype", None), "kind", "i") not in "iu":
            raise TypeError(f"{argument} must be a sequence of ints, got an empty {values.dtype} {type(values).__name__}")
        values = values.tolist()
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{argument} must be a sequence of ints, got the string {values!r}")
    if isinstance(values, Mapping):  # iterating it would silently take its keys
        raise TypeError(f"{argument} must be a sequence of ints, got a {type(values).__name__}: {values!r:.60} "
                        "(pass list(...) of the keys or values meant)")
    # allow_set=False where order or repeats count (lengths, samples): a set has no order and
    # merges equal entries ({4, 4} is {4}). Sizes a caller sorts and de-duplicates take one.
    if not allow_set and isinstance(values, AbstractSet):
        raise TypeError(f"{argument} must be a sequence of ints, got a {type(values).__name__}: {values!r:.60} "
                        "(a set has no order and merges equal entries)")
    if not isinstance(values, (list, tuple, range)):
        try:
            values = list(values)  # any other iterable, e.g. a generator of samples
        except TypeError:
            raise TypeError(f"{argument} must be a sequence of ints, got {type(values).__name__}") from None
    if len(values) == 0:
        if allow_empty:
            return []
        raise ValueError(f"{argument} must hold at least one int, got none")
    return [check_int(f"{argument}[{i}]", v, minimum=minimum, maximum=maximum) for i, v in enumerate(values)]


def check_real(argument: str, value: object, *, minimum: float | None = None,
               maximum: float | None = None, above: float | None = None) -> float:
    """``value`` as a finite ``float`` in ``[minimum, maximum]`` and ``> above`` (each bound optional;
    ``above`` is the exclusive lower bound, for an epsilon or a base that must exceed a value).

    Raises:
        TypeError: ``value`` is not a real number (``bool`` included).
        ValueError: it is NaN, infinite or outside the bounds.
    """
    bounds = "".join(
        [f" >= {minimum}" if minimum is not None else "", f" > {above}" if above is not None else "",
         f" <= {maximum}" if maximum is not None else ""]
    )
    expected = f"a finite real number{bounds}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{argument} must be {expected}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum
    ) or (above is not None and value <= above):
        raise ValueError(f"{argument} must be {expected}, got {value!r}")
    return value


def check_bool(argument: str, value: object) -> bool:
    """``value`` if it is a ``bool``.

    Raises:
        TypeError: anything else (``0``, ``"yes"``, ``None``).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool, got {value!r}")
    return value


def check_choice(argument: str, value: object, choices: Collection[object]) -> object:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: it is not.
    """
    if isinstance(value, (list, dict, set)) or value not in choices:
        raise ValueError(f"{argument} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_choices(argument: str, values: object, choices: Collection[object]) -> tuple:
    """``values`` as a tuple: a non-empty sequence (not a string) whose every entry is one of
    ``choices`` (the message names the entry, e.g. ``stacks[1]``).

    Raises:
        TypeError: ``values`` is a string or not a sequence.
        ValueError: it is empty, or an entry is not one of ``choices``.
    """
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{argument} must be a sequence of names from {tuple(choices)}, got the string {values!r}")
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{argument} must be a sequence of names from {tuple(choices)}, got {type(values).__name__}")
    if not values:
        raise ValueError(f"{argument} must name at least one of {tuple(choices)}, got none")
    return tuple(check_choice(f"{argument}[{i}]", value, choices) for i, value in enumerate(values))


def check_subset(argument: str, values: object, choices: Collection[str]) -> frozenset:
    """``values`` as a frozenset: any iterable of names from ``choices`` (empty allowed; a list, a
    set, a generator, ``dict.keys()``), for switches such as a block's ``masks``.

    A string is refused (it would be read letter by letter), and so is a dict: it would be read
    as its keys, so ``{"input": False}`` would switch on what it meant to switch off.

    Raises:
        TypeError: ``values`` is a string, a dict or not iterable; an entry is not a string.
        ValueError: an entry is not one of ``choices`` (the message lists the unknown ones).
    """
    expectation = f"an iterable of names from {tuple(choices)} (a list, a tuple, a set; not a dict)"
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{argument} must be {expectation}, got the string {values!r}")
    if isinstance(values, Mapping) or not isinstance(values, Iterable):
        raise TypeError(f"{argument} must be {expectation}, got {type(values).__name__}: {values!r:.60}")
    values = list(values)  # once: a generator is read here only
    for value in values:
        if not isinstance(value, str):
            raise TypeError(f"{argument} must be {expectation}, got an entry {type(value).__name__}: {value!r:.40}")
    unknown = sorted(set(values) - set(choices))
    if unknown:
        raise ValueError(f"{argument} must be {expectation}, got unknown {unknown}")
    return frozenset(values)


def check_keys(argument: str, value: object, required: Collection[str]) -> dict:
    """``value`` if it is a dict holding every key of ``required`` (more keys are allowed).

    Raises:
        TypeError: ``value`` is not a dict.
        ValueError: keys of ``required`` are missing (the message lists them).
    """
    if not isinstance(value, dict):
        raise TypeError(f"{argument} must be a dict with the keys {sorted(required)}, got {type(value).__name__}")
    missing = sorted(set(required) - set(value))
    if missing:
        raise ValueError(f"{argument} must be a dict with the keys {sorted(required)}, missing {missing}")
    return value


def check_capacities(token_capacity: object, sequence_capacity: object) -> tuple[int, int]:
    """``(T, N)`` with ``T >= 1`` and ``1 <= N <= T`` (every sequence holds a token).

    Raises:
        TypeError / ValueError: from :func:`check_int`, naming ``token_capacity`` or
            ``sequence_capacity``.
    """
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    sequence_capacity = check_int("sequence_capacity", sequence_capacity, minimum=1, maximum=token_capacity)
    return token_capacity, sequence_capacity


def check_path(argument: str, path: object) -> Path:
    """``path`` as a :class:`~pathlib.Path`.

    Raises:
        TypeError: it is not a ``str`` or ``os.PathLike``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def check_file(argument: str, path: object) -> Path:
    """``path`` as a :class:`~pathlib.Path` to an existing file.

    Raises:
        TypeError: see :func:`check_path`.
        FileNotFoundError: no file is there (``"path='x': no such file"``), or a directory is
            (``"path='x' is a directory, expected a file"``).
    """
    path = check_path(argument, path)
    if path.is_dir():
        raise FileNotFoundError(f"{argument}={str(path)!r} is a directory, expected a file")
    if not path.is_file():
        raise FileNotFoundError(f"{argument}={str(path)!r}: no such file")
    return path


def check_folder(argument: str, path: object, *, must_exist: bool = True) -> Path:
    """``path`` as a :class:`~pathlib.Path` to an existing directory (folder), or with
    ``must_exist=False`` to a folder that may not exist yet (an output folder the caller creates):
    then only something other than a folder there is refused.

    Raises:
        TypeError: see :func:`check_path`.
        FileNotFoundError: nothing is there (``"folder='x': no such folder"``; not with
            ``must_exist=False``), or a file is (``"folder='x' is a file, expected a folder"``).
    """
    path = check_path(argument, path)
    if path.exists() and not path.is_dir():
        raise FileNotFoundError(f"{argument}={str(path)!r} is a file, expected a folder")
    if must_exist and not path.is_dir():
        raise FileNotFoundError(f"{argument}={str(path)!r}: no such folder")
    return path


_DEVICE_EXPECTATION = "a torch.device, a device string ('cpu', 'cuda', 'cuda:<index>', 'meta') or a device index (int >= 0)"


def check_device(argument: str, value: object, *, allow_meta: bool = True) -> torch.device:
    """``value`` as a :class:`torch.device` that this host has: a ``torch.device``, a string torch
    parses (``"cpu"``, ``"cuda:1"``, ``"meta"``) or an accelerator index (``int >= 0``, as
    ``torch.device(0)`` reads it: the current accelerator type).

    A backend is accepted only where it is available (``torch.cuda.is_available()`` for CUDA, and
    an index below ``torch.cuda.device_count()``), so ``device="cuda"`` on a machine without a GPU
    is refused here, naming the argument, instead of by torch's allocator deep inside a
    constructor. Capture-safe: reads no tensor.

    Args:
        allow_meta: whether ``"meta"`` (shapes only, no values) is meaningful for the caller
            (building a model on meta is; buffers whose values are copied or read are not).

    Raises:
        TypeError: ``value`` is not a ``str``, ``int`` or ``torch.device`` (``bool``, ``float``,
            ``None`` included).
        ValueError: a string torch does not parse (``"foo"``), a negative index, a backend this
            host does not have (CUDA without a GPU), a CUDA index past the last GPU, or
            ``"meta"`` where ``allow_meta`` is False.
    """
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral, torch.device)):
        raise TypeError(f"{argument} must be {_DEVICE_EXPECTATION}, got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Integral):
        value = check_int(argument, value, minimum=0)
    try:
        device = value if isinstance(value, torch.device) else torch.device(value)
    except RuntimeError:
        if isinstance(value, int):
            raise ValueError(f"{argument} must be {_DEVICE_EXPECTATION} of an available accelerator, "
                             f"got {value} and this host has none") from None
        raise ValueError(f"{argument} must be {_DEVICE_EXPECTATION}, got {value!r}") from None
    if device.type == "meta":
        if not allow_meta:
            raise ValueError(f"{argument} must be a device that holds values (not 'meta'), got {device}")
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{argument} must be an available device; CUDA is not available here, got {device}")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{argument} must be a CUDA device index in [0, {count - 1}] (this host has {count} "
                             f"GPU{'s' if count != 1 else ''}), got {device}")
        return device
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if callable(is_available) and not is_available():
        raise ValueError(f"{argument} must be an available device; {device.type} is not available here, got {device}")
    return device


def check_factory(device: object = None, dtype: object = None, *, allow_meta: bool = True) -> dict:
    """``{"device": device, "dtype": dtype}`` for a module's parameters (torch's factory keywords),
    checked: ``device`` ``None`` or as :func:`check_device`, ``dtype`` ``None`` or a floating
    ``torch.dtype`` (parameters are trained, so an integer or bool dtype is a slip).

    Raises:
        TypeError: ``device`` of the wrong type (see :func:`check_device`); ``dtype`` not a
            floating ``torch.dtype`` (``torch.int64``, ``"float32"``, ``float``).
        ValueError: a ``device`` refused by :func:`check_device`.
    """
    if device is not None:
        device = check_device("device", device, allow_meta=allow_meta)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    return {"device": device, "dtype": dtype}


def check_tensor(argument: str, value: object, *, ndim: int | None = None, shape: str = "",
                 dtypes: Collection[torch.dtype] | None = None,
                 device: torch.device | str | None = None) -> Tensor:
    """``value`` if it is a tensor of ``ndim`` dims, one of ``dtypes``, on ``device``.

    Args:
        shape: the expected shape in words (``"[T, H, D]"``) for the messages.

    Raises:
        TypeError: not a tensor, or a dtype outside ``dtypes``.
        ValueError: another number of dims, or another device.
    """
    described = f" of shape {shape}" if shape else ""
    if not isinstance(value, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor{described}, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{argument} must have shape {shape or f'of {ndim} dims'}, got shape {tuple(value.shape)}")
    if dtypes is not None and value.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{argument} must have dtype {names}, got {value.dtype}")
    if device is not None and not _same_device(device, value.device):
        raise ValueError(f"{argument} must be on device {torch.device(device)}, got {value.device}")
    return value


def check_features(argument: str, value: object, width: int, *, like: Tensor, name: str = "width") -> Tensor:
    """``value`` as a module's input rows: a ``[T, width]`` tensor in the dtype and on the device of
    ``like`` (the module's weight). Metadata only, capture-safe. Under ``torch.autocast`` on
    ``like``'s device any floating dtype is accepted (autocast casts it at the projection).

    Args:
        name: what ``width`` is called in the module (``"dim"``, ``"hidden_size"``), for the message.

    Raises:
        TypeError: not a tensor, or a dtype other than ``like``'s.
        ValueError: not 2-D, a width other than ``width``, or another device than ``like``'s.
    """
    shape = f"[T, {width}]"
    dtypes = FLOATING_DTYPES if like.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(
        like.device.type) else (like.dtype,)
    check_tensor(argument, value, ndim=2, shape=shape, dtypes=dtypes, device=like.device)
    if value.shape[1] != width:
        raise ValueError(f"{argument} must have shape {shape} ({name}), got {tuple(value.shape)}")
    return value


def check_qkv(q: object, k: object, v: object, dtypes: Collection[torch.dtype]) -> None:
    """``q, k, v`` of one shape ``[T, H, D]`` with ``H >= 1`` and ``D >= 1`` (``T = 0`` is an
    empty batch), one dtype (one of ``dtypes``) and one device.

    Raises:
        TypeError: not tensors, or a dtype outside ``dtypes``, or dtypes that differ.
        ValueError: not 3-D, no heads or an empty head dim (``H = 0``, ``D = 0``: the softmax
            scale ``1 / sqrt(D)`` has no value), or shapes or devices that differ.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ndim=3, shape="[T, H, D]", dtypes=dtypes)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k, v must have one shape [T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] < 1 or q.shape[2] < 1:
        raise ValueError(
            f"q, k, v must have shape [T, H, D] with H >= 1 heads and head dim D >= 1, got {tuple(q.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


