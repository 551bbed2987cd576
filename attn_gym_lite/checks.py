"""Argument checks: one helper per kind of argument, one message format for the whole package.

Every public function checks its arguments when it is called and raises an error of the form

    ``<argument> must be <expectation>, got <value>``

``TypeError`` when the value has the wrong type, ``ValueError`` when it has the right type but is
out of range or malformed. The checks here read only Python values and tensor *metadata* (type,
dtype, device, shape, strides), never tensor contents, so they are safe inside a CUDA graph
capture; the one exception, :func:`check_cu_seqlens_values`, says so.

This module is the bottom layer of the package: it imports nothing from it.
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

__all__ = [
    "check_bool",
    "host_values",
    "tensor_metadata",
    "check_capacities",
    "check_choice",
    "check_choices",
    "check_cu_seqlens",
    "check_cu_seqlens_values",
    "check_device",
    "check_factory",
    "check_host_cu_seqlens_values",
    "check_features",
    "check_file",
    "check_fill",
    "check_folder",
    "check_int",
    "check_int_sequence",
    "check_keys",
    "check_path",
    "check_qkv",
    "check_real",
    "check_subset",
    "check_tensor",
]

#: cu_seqlens is int32, so no batch may hold more tokens than this.
INT32_MAX = torch.iinfo(torch.int32).max
#: The floating dtypes a tensor argument may have where any of them will do (``dtypes=`` of
#: :func:`check_tensor`).
FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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


def host_values(argument: str, value: Tensor) -> Tensor:
    """A copy of ``value`` on the host as int64, for checks and host-side arithmetic.

    The one place the package reads a tensor's values to the host, so every reader refuses the
    same inputs the same way: a meta tensor (shape only, no values) and a CUDA tensor while the
    current stream is capturing (reading it would synchronise with the device).

    Raises:
        ValueError: ``value`` is a meta tensor.
        RuntimeError: ``value`` is on CUDA and the current stream is capturing.
    """
    if value.is_meta:
        raise ValueError(
            f"{argument} must hold values (its entries are read on the host), got a meta tensor of shape {tuple(value.shape)}"
        )
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{argument}'s values are read on the host, which cannot happen during CUDA graph capture; "
            "validate the batch before capturing or replaying"
        )
    return value.detach().cpu().to(torch.int64)


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


def check_fill(argument: str, value: object, dtype: torch.dtype) -> object:
    """``value`` if a tensor of ``dtype`` can hold it: the fill of a new tensor, never silently
    changed (a ``-1`` stored as 255 in uint8, a ``0.5`` truncated to 0 in int32).

    Integer dtypes take an integral value (an ``int``, or a ``float`` such as ``2.0``) in the
    dtype's range; bool takes ``True``/``False`` (or 0/1); floating dtypes a real number whose
    magnitude is at most the dtype's largest finite value, or a non-finite one (NaN and ±inf are
    fills like any other; other values are rounded to the dtype, as any cast does); complex
    dtypes any number, each part so bounded.

    Raises:
        TypeError: ``value`` is not a number, or is complex for a real ``dtype``.
        ValueError: it is out of ``dtype``'s range, or not integral (or NaN/inf) for an integer
            or bool ``dtype``.
    """
    if not isinstance(value, numbers.Number):
        raise TypeError(f"{argument} must be a number (a fill for {dtype}), got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real) and not dtype.is_complex:
        raise TypeError(f"{argument} must be a real number (a fill for {dtype}), got {value!r}")
    if dtype.is_complex or dtype.is_floating_point:
        largest = torch.finfo(dtype).max
        parts = (complex(value).real, complex(value).imag)
        if any(math.isfinite(part) and abs(part) > largest for part in parts):
            raise ValueError(f"{argument} must be within {dtype}'s range (magnitude <= {largest:g}), got {value!r}")
        return value
    lowest, highest = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    if not isinstance(value, numbers.Integral):
        real = float(value)
        if not (math.isfinite(real) and real.is_integer()):
            raise ValueError(f"{argument} must be an integral value in [{lowest}, {highest}] (a fill for {dtype}), "
                             f"got {value!r}")
    if not lowest <= int(value) <= highest:
        raise ValueError(f"{argument} must be an integral value in [{lowest}, {highest}] (a fill for {dtype}), "
                         f"got {value!r}")
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


def _same_device(expected: torch.device | str, actual: torch.device) -> bool:
    # torch.device("cuda") carries no index and matches any CUDA device.
    expected = torch.device(expected)
    return actual.type == expected.type and expected.index in (None, actual.index)


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


def check_cu_seqlens(cu_seqlens: object, *, device: torch.device | str | None = None,
                     sequence_capacity: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The layout rules every consumer of ``cu_seqlens`` shares (metadata only, capture-safe).

    ``cu_seqlens`` must be a 1-D, contiguous int32 tensor of ``N + 1 >= 2`` entries on
    ``device``. Contiguity matters because kernels read it through its data pointer: a strided
    view (``x[:, 0]``) would be read as if it were dense.

    Args:
        device: if given, the device it must be on (``"cuda"`` matches any GPU).
        sequence_capacity: if given, ``N``: it must have exactly ``N + 1`` entries.

    Raises:
        TypeError: not a tensor, or not int32.
        ValueError: wrong device, not 1-D, fewer than 2 entries, not contiguous, or not
            ``N + 1`` entries.

    Source: FlashAttention's varlen convention (int32 prefix sums).
    """
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor of int32 prefix sums, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(
            f"{argument} must have dtype torch.int32 (FlashAttention varlen convention), got {cu_seqlens.dtype}"
        )
    if device is not None and not _same_device(device, cu_seqlens.device):
        raise ValueError(f"{argument} must be on device {torch.device(device)}, got {cu_seqlens.device}")
    if cu_seqlens.ndim != 1:
        raise ValueError(f"{argument} must be 1-D with shape [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.numel() < 2:
        raise ValueError(
            f"{argument} must have at least 2 entries (shape [N + 1] with N >= 1), got shape {tuple(cu_seqlens.shape)}"
        )
    if not cu_seqlens.is_contiguous():
        raise ValueError(
            f"{argument} must be contiguous (kernels read it through its data pointer), got stride "
            f"{cu_seqlens.stride()}; pass {argument}.contiguous()"
        )
    if sequence_capacity is not None and cu_seqlens.numel() != sequence_capacity + 1:
        raise ValueError(
            f"{argument} must have N + 1 = {sequence_capacity + 1} entries, got {cu_seqlens.numel()}"
        )
    return cu_seqlens


def check_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                            max_seqlen: int | None = None, argument: str = "cu_seqlens") -> Tensor:
    """The value rules: starts at 0, never decreases, ends at ``L <= T``, no sequence longer
    than ``max_seqlen``. Layout first (:func:`check_cu_seqlens`).

    Eager only: it reads ``cu_seqlens`` on the host (a device sync for a CUDA tensor), so it
    refuses to run while the current CUDA stream is capturing.

    Returns:
        The values it checked: the int64 host copy of :func:`host_values` (``[N + 1]``), for a
        caller that needs them too without reading the device a second time.

    Raises:
        TypeError / ValueError: the layout errors; ``cu_seqlens[0] != 0``; a decrease; ``L > T``;
            a sequence longer than ``max_seqlen`` (the message names ``max_seqlen``).
        ValueError: a meta tensor (it has no values to check).
        RuntimeError: called during CUDA graph capture.
    """
    check_cu_seqlens(cu_seqlens, argument=argument)
    if token_capacity is not None:
        token_capacity = check_int("token_capacity", token_capacity, minimum=0)
    if max_seqlen is not None:
        max_seqlen = check_int("max_seqlen", max_seqlen, minimum=0)
    host = host_values(argument, cu_seqlens)
    if host[0] != 0:
        raise ValueError(f"{argument}[0] must be 0, got {int(host[0])}")
    steps = host.diff()
    drops = torch.nonzero(steps < 0).flatten()
    if drops.numel() > 0:
        i = int(drops[0]) + 1
        raise ValueError(
            f"{argument} must be non-decreasing, but {argument}[{i}] = {int(host[i])} "
            f"< {argument}[{i - 1}] = {int(host[i - 1])}"
        )
    active_tokens = int(host[-1])
    if token_capacity is not None and active_tokens > token_capacity:
        raise ValueError(
            f"{argument}[-1] (active tokens L) must be <= token_capacity T = {token_capacity}, got L = {active_tokens}"
        )
    if max_seqlen is not None:
        longest_index = int(steps.argmax())
        longest = int(steps[longest_index])
        if longest > max_seqlen:
            raise ValueError(
                f"max_seqlen must be >= the longest sequence, got max_seqlen = {max_seqlen} "
                f"but sequence {longest_index} has length {longest}"
            )
    return host


def check_host_cu_seqlens_values(cu_seqlens: Tensor, *, token_capacity: int | None = None,
                                 max_seqlen: int | None = None, argument: str = "cu_seqlens") -> None:
    """:func:`check_cu_seqlens_values` where it costs no device sync: ``cu_seqlens`` is a CPU
    tensor (Triton's interpreter, CPU models) and ``torch.compile`` is not tracing. A no-op for a
    tensor on another device (CUDA: the read would synchronise; its consumers' kernels clamp
    instead) and for a non-tensor (the layout check that follows names it). Capture-safe: a CPU
    tensor is never part of a CUDA graph, and a CUDA one is not read.

    Raises:
        ValueError: a CPU ``cu_seqlens`` breaking a value rule (the messages of
            :func:`check_cu_seqlens_values`).
    """
    if isinstance(cu_seqlens, Tensor) and cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        check_cu_seqlens_values(cu_seqlens, token_capacity=token_capacity, max_seqlen=max_seqlen, argument=argument)
