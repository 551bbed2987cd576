"""What the caching allocator did during a step, small enough to store in a recording.

:class:`record_memory_history` wraps ``torch.cuda.memory._record_memory_history`` /
``torch.cuda.memory._snapshot``: it records every allocation and free of the block (with the
Python stack of each allocation), can mark a moment inside it (:meth:`~record_memory_history.mark`),
and on exit stops recording and keeps this block's entries of the allocator's trace.

The reductions read those entries (dicts with ``action``, ``addr``, ``size``, optionally
``time_us`` and ``frames``, as ``torch.cuda.memory._snapshot()["device_traces"][device]`` holds
them) and work on any list in that form, from a GPU or not:

* :func:`find_blocks` picks out the allocations that hold given tensors at a marked moment (the
  gradients of a step, say), by address;
* :func:`allocation_timeline` turns the entries into allocated bytes over time, with the bytes
  of those tagged allocations alongside: a picture of memory over a step;
* :func:`allocation_sites` sums the allocated bytes per line of the package that asked for them.

An allocation counts from its ``alloc`` entry to its ``free_completed`` entry (the allocator's
own accounting: a block freed on a stream is not reusable until the stream's work is done).

Source: PyTorch, "Understanding CUDA Memory Usage" (``torch.cuda.memory._record_memory_history``,
``_snapshot``, ``torch/cuda/_memory_viz.py``); the seed article, "Crossing graph boundaries"
(gradients that exist twice at the optimizer boundary).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..checks import check_bool, check_choice, check_int, check_real

SIZE_ACTIONS = {"alloc": 1, "free_completed": -1}
SEGMENT_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
ALLOCATION_SITE_PACKAGE = "attn_gym_lite"


_DEVICE_EXPECTATION = "a CUDA device: an index (int >= 0), 'cuda', 'cuda:<index>', a CUDA torch.device or None"


def _cuda_device_index(device: object) -> int | None:
    """``device`` as a CUDA device index, or ``None`` for the current device (checked at entry)."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"device must be {_DEVICE_EXPECTATION}, got {type(device).__name__} {device!r}")
    if isinstance(device, int):
        return check_int("device", device, minimum=0)
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(f"device must be {_DEVICE_EXPECTATION}, got {device!r}") from None
    else:
        parsed = device
    if parsed.type != "cuda":
        raise ValueError(f"device must be {_DEVICE_EXPECTATION} (the allocator history is CUDA's), got {device!r}")
    return parsed.index


class record_memory_history:  # noqa: N801 -- a context manager, named like the torch call it wraps
    """Record the CUDA caching allocator's history for the block (CUDA only).

    Usage::

        with record_memory_history(max_entries=100_000) as history:
            grads = forward_backward()
            moment = history.mark()          # an index into history.entries
            ...
        history.entries                      # this block's trace entries, oldest first

    Args:
        max_entries: the allocator keeps at most this many entries (a ring buffer): a block that
            makes more raises on exit instead of returning a trace whose start was overwritten.
        stacks: ``"python"`` (Python frames only, cheap) or ``"all"`` (C++ frames too, slow to
            symbolize).
        device: the CUDA device: an index (int >= 0), ``"cuda"`` / ``"cuda:<index>"``, a CUDA
            ``torch.device``, or ``None`` (default; ``"cuda"`` without an index too): the current
            device at entry.

    Attributes:
        entries: after exit, the entries recorded inside the block (``list[dict]``).
        marks: the indices :meth:`mark` returned.

    Raises:
        TypeError: ``max_entries`` is not an int, ``device`` not an int, str, ``torch.device`` or
            ``None`` (a ``bool`` or ``float`` included) (at construction).
        ValueError: ``max_entries`` < 1, an unknown ``stacks``, a negative device index, a device
            string torch cannot parse, or a device that is not CUDA (``"cpu"``, ``"meta"``) (at
            construction); a device index past the last GPU (at entry).
        RuntimeError: no CUDA device (at entry); the block overflowed ``max_entries`` (at exit);
            the block entered a second time (nested: the inner exit would stop the outer
            recording; or after it ended: one object records one block, make a new one), or
            :meth:`mark` called outside the block.
    """

    def __init__(self, max_entries: int = 100_000, *, stacks: str = "python",
                 device: int | str | torch.device | None = None) -> None:
        self.max_entries = check_int("max_entries", max_entries, minimum=1)
        self.stacks = check_choice("stacks", stacks, ("python", "all"))
        self.device = _cuda_device_index(device)
        self.entries: list[dict] = []
        self.marks: list[int] = []
        self._start = 0
        self._state = "new"  # -> "recording" -> "done"

    def _trace(self) -> list[dict]:
        return torch.cuda.memory._snapshot()["device_traces"][self.device]

    def __enter__(self) -> record_memory_history:
        if self._state != "new":
            raise RuntimeError(
                f"record_memory_history: this recording is {'already on' if self._state == 'recording' else 'done'}; "
                f"one record_memory_history records one block: make a new one for another"
            )
        if not torch.cuda.is_available():
            raise RuntimeError("record_memory_history: the allocator history needs a CUDA device")
        if self.device is None:
            self.device = torch.cuda.current_device()
        count = torch.cuda.device_count()
        if self.device >= count:
            raise ValueError(f"device must be a CUDA device index in [0, {count - 1}] (this host has {count} "
                             f"GPU{'s' if count != 1 else ''}), got {self.device}")
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(
            "all", context="all", stacks=self.stacks, max_entries=self.max_entries)
        # An earlier recording in this process may have left entries: start after them.
        self._start = len(self._trace())
        self._state = "recording"
        return self

    def mark(self) -> int:
        """Index (into :attr:`entries`) of the next entry: everything before it happened before now.

        Cost: one full allocator snapshot (``torch.cuda.memory._snapshot()``: every segment, and
        every trace entry with its stack, turned into Python objects), so call it outside timed
        regions and not per kernel. The index is the trace's length, and no cheaper torch call
        gives it: ``memory_allocated()`` / ``memory_stats()`` count bytes and allocator events, not
        trace entries (a free is two entries, ``free_requested`` and ``free_completed``, and the
        trace is a ring buffer), and the public ``memory_snapshot()`` returns the segments only.

        Raises:
            RuntimeError: called outside the ``with`` block.
        """
        if self._state != "recording":
            raise RuntimeError(f"record_memory_history: mark() belongs inside the with block, but the recording is {self._state}")
        index = len(self._trace()) - self._start
        self.marks.append(index)
        return index

    def __exit__(self, *exc: object) -> None:
        self._state = "done"
        try:
            if exc[0] is None:
                torch.cuda.synchronize()  # frees queued on the stream complete before the snapshot
                trace = self._trace()
                if len(trace) >= self.max_entries:
                    raise RuntimeError(
                        f"record_memory_history: the block made {len(trace)} or more allocator entries, "
                        f"max_entries = {self.max_entries}; the oldest were overwritten: raise max_entries")
                self.entries = trace[self._start:]
        finally:
            torch.cuda.memory._record_memory_history(None)


#: The fields the reductions read, per action: the rest of an entry is never looked at.
_ADDRESSED_ACTIONS = ("alloc", "free_requested", "free_completed")
_SIZED_ACTIONS = ("alloc", "free_completed", *SEGMENT_ACTIONS)


def _check_natural(argument: str, value: object) -> int:
    if type(value) is int and value >= 0:  # the usual case, without a call
        return value
    return check_int(argument, value, minimum=0)


def _check_entries(entries: object, where: str) -> list[dict]:
    """``entries`` as a list, after checking every field the reductions read.

    Each entry is a dict with an ``action``; ``alloc`` / ``free_requested`` / ``free_completed``
    entries have an int ``addr >= 0``, ``alloc`` / ``free_completed`` / ``segment_*`` entries an
    int ``size >= 0`` (bytes); a ``time_us``, where present, is a finite real number.
    """
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise TypeError(f"{where}: entries must be a list of allocator trace entries (dicts with an 'action'), "
                        f"got {type(entries).__name__}")
    for index, entry in enumerate(entries):
        name = f"{where}: entries[{index}]"
        if not isinstance(entry, dict):
            raise TypeError(f"{name} must be an allocator trace entry (a dict with an 'action'), "
                            f"got {type(entry).__name__} {entry!r:.60}")
        action = entry.get("action")
        if "action" not in entry:
            raise ValueError(f"{name} must have an 'action' (an allocator trace entry), got keys {sorted(map(str, entry))}")
        for key, actions in (("addr", _ADDRESSED_ACTIONS), ("size", _SIZED_ACTIONS)):
            if action in actions:
                if key not in entry:
                    raise ValueError(f"{name} (action {action!r}) must have {key!r}, got keys {sorted(map(str, entry))}")
                _check_natural(f"{name}[{key!r}]", entry[key])
        time_us = entry.get("time_us", 0)
        if not (type(time_us) in (int, float) and math.isfinite(time_us)):  # a call only off the usual case
            check_real(f"{name}['time_us']", time_us)
    return list(entries)


def find_blocks(entries: Sequence[dict], pointers: Iterable[int], alive_at: int, *, strict: bool = True) -> set[int]:
    """Indices of the ``alloc`` entries whose blocks hold ``pointers`` at moment ``alive_at``.

    For each pointer, the latest ``alloc`` before index ``alive_at`` whose ``[addr, addr + size)``
    holds it and that was not freed (``free_requested`` or ``free_completed``) before
    ``alive_at``. A tensor's ``data_ptr()`` may lie inside a block (a view), not only at its start.

    Args:
        entries: allocator trace entries, oldest first.
        pointers: device addresses (``tensor.data_ptr()``) of tensors alive at ``alive_at``.
        alive_at: an index into ``entries`` (:meth:`record_memory_history.mark`).
        strict: raise for a pointer in no such block; with ``False`` it is skipped.

    Returns: the set of entry indices (one per distinct block).

    Raises:
        TypeError: ``entries`` is not a list (a sequence) of dicts; an ``addr`` or ``size`` that is
            not an int, a ``time_us`` that is not a real number; ``pointers`` is not an iterable of
            ints (a tensor instead of its ``data_ptr()``, say), ``alive_at`` not an int, ``strict``
            not a bool. Messages name the entry (``entries[i]['size']``) or the pointer
            (``pointers[i]``).
        ValueError: an entry without ``action``, an ``alloc`` / ``free_*`` entry without
            ``addr``, an ``alloc`` / ``free_completed`` / ``segment_*`` entry without ``size``;
            a negative ``addr``, ``size`` or pointer; a NaN or infinite ``time_us``; ``alive_at``
            outside ``[0, len(entries)]``; a pointer lies in no block alive at ``alive_at`` (its
            tensor was allocated before the recording started).
    """
    entries = _check_entries(entries, "find_blocks")
    if isinstance(pointers, (str, bytes)) or not isinstance(pointers, Iterable):
        raise TypeError(f"pointers must be an iterable of ints (tensor.data_ptr() values), got {type(pointers).__name__} "
                        f"{pointers!r:.60}")
    pointers = [_check_natural(f"pointers[{i}]", pointer) for i, pointer in enumerate(pointers)]
    check_int("alive_at", alive_at, minimum=0, maximum=len(entries))
    check_bool("strict", strict)
    live: dict[int, int] = {}  # addr -> index of its alloc entry
    for index, entry in enumerate(entries[:alive_at]):
        if entry["action"] == "alloc":
            live[entry["addr"]] = index
        elif entry["action"] in ("free_requested", "free_completed"):
            live.pop(entry.get("addr"), None)
    found = set()
    for pointer in pointers:
        holders = [i for addr, i in live.items() if addr <= pointer < addr + entries[i]["size"]]
        if not holders and not strict:
            continue
        if not holders:
            raise ValueError(f"find_blocks: pointer {pointer:#x} lies in no block allocated in the recording and "
                             f"alive at entry {alive_at}; was its tensor allocated before the recording started?")
        found.add(max(holders))
    return found


def _check_tags(tags: object) -> dict[str, set[int]]:
    """``tags`` (name -> alloc entry indices, or ``None``) as a dict of sets, types checked."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise TypeError(f"tags must be a dict of tag name -> indices of alloc entries, or None, got "
                        f"{type(tags).__name__} {tags!r:.60}")
    checked = {}
    for name, indices in tags.items():
        if not isinstance(name, str):
            raise TypeError(f"tags' names must be str, got {type(name).__name__} {name!r}")
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Iterable):
            raise TypeError(f"tags[{name!r}] must be an iterable of alloc entry indices (find_blocks' result), "
                            f"got {type(indices).__name__} {indices!r:.60}")
        checked[name] = {check_int(f"tags[{name!r}][{k}]", i) for k, i in enumerate(indices)}
    return checked


def allocation_timeline(entries: Sequence[dict], tags: dict[str, Iterable[int]] | None = None, *,
                        max_points: int = 4000) -> dict[str, Any]:
    """Allocated (and reserved) bytes after each allocation and free, relative to the start.

    Args:
        entries: allocator trace entries, oldest first (``alloc`` / ``free_completed`` change the
            allocated bytes, ``segment_*`` the reserved bytes; other actions are ignored).
        tags: name -> indices of ``alloc`` entries (:func:`find_blocks`); each tag gets the bytes
            of its allocations alive at each point.
        max_points: longer timelines are thinned to about this many points, always keeping the
            first, the last and the peak.

    Returns:
        ``{"time": "µs" or "entry", "t": [...], "entry": [...], "allocated_bytes": [...],
        "reserved_bytes": [...], "tags": {name: [...]}, "peak": {"t", "entry", "allocated_bytes",
        "tags": {name: bytes}},
        "tag_bytes": {name: total size of its allocations}, "allocs": int, "frees": int}``.
        ``t`` is the entries' ``time_us`` minus the first one's where every entry has one,
        else the entry index; ``entry`` is always the index of the entry after which the point
        was taken (compare it with :meth:`record_memory_history.mark`). Bytes are relative to the start of ``entries`` (memory allocated
        before it is not in them) and can go negative where a block allocated before is freed.

    Raises:
        TypeError: ``entries`` is not a list of trace entries, or a field read is of the wrong
            type (as in :func:`find_blocks`); ``tags`` is not a dict (or ``None``), a tag name not
            a ``str``, a tag's indices not an iterable of ints; ``max_points`` not an int.
        ValueError: a malformed entry (as in :func:`find_blocks`); no ``alloc`` or
            ``free_completed`` entry; a tag index that is not that of an ``alloc`` entry;
            ``max_points`` < 3.
    """
    entries = _check_entries(entries, "allocation_timeline")
    check_int("max_points", max_points, minimum=3)
    tags = _check_tags(tags)
    for name, indices in tags.items():
        bad = [i for i in indices if not (0 <= i < len(entries) and entries[i]["action"] == "alloc")]
        if bad:
            first = sorted(bad)[0]
            found = (f"entry {first} is a {entries[first]['action']!r}" if 0 <= first < len(entries)
                     else f"entries has {len(entries)} entries")
            raise ValueError(f"allocation_timeline: tags[{name!r}] must list indices of alloc entries, got "
                             f"{sorted(bad)} ({found})")
    timed = all(isinstance(e.get("time_us"), (int, float)) for e in entries)
    origin = entries[0].get("time_us", 0) if timed and entries else 0
    allocated = reserved = 0
    owner: dict[int, str] = {}  # addr of a live tagged block -> its tag
    tagged = dict.fromkeys(tags, 0)
    points = []
    allocs = frees = 0
    for index, entry in enumerate(entries):
        action = entry["action"]
        if action in SEGMENT_ACTIONS:
            reserved += SEGMENT_ACTIONS[action] * entry["size"]
            continue
        if action not in SIZE_ACTIONS:
            continue
        allocated += SIZE_ACTIONS[action] * entry["size"]
        if action == "alloc":
            allocs += 1
            for name, indices in tags.items():
                if index in indices:
                    owner[entry["addr"]] = name
                    tagged[name] += entry["size"]
        else:
            frees += 1
            name = owner.pop(entry["addr"], None)
            if name is not None:
                tagged[name] -= entry["size"]
        t = entry["time_us"] - origin if timed else index
        points.append((t, allocated, reserved, tuple(tagged[name] for name in tags), index))
    if not points:
        raise ValueError("allocation_timeline: the entries have no alloc or free_completed entry")
    peak = max(range(len(points)), key=lambda i: points[i][1])
    if len(points) > max_points:
        stride = -(-len(points) // (max_points - 2))
        keep = sorted({0, len(points) - 1, peak, *range(0, len(points), stride)})
        peak_point = points[peak]
        points = [points[i] for i in keep]
    else:
        peak_point = points[peak]
    names = list(tags)
    return {
        "time": "µs" if timed else "entry",
        "t": [round(p[0], 3) for p in points],
        "entry": [p[4] for p in points],
        "allocated_bytes": [p[1] for p in points],
        "reserved_bytes": [p[2] for p in points],
        "tags": {name: [p[3][k] for p in points] for k, name in enumerate(names)},
        "peak": {"t": round(peak_point[0], 3), "entry": peak_point[4], "allocated_bytes": peak_point[1],
                 "tags": {name: peak_point[3][k] for k, name in enumerate(names)}},
        "tag_bytes": {name: sum(entries[i]["size"] for i in indices) for name, indices in tags.items()},
        "allocs": allocs,
        "frees": frees,
    }


def _site(entry: dict, package: str) -> str:
    frames = entry.get("frames") or []
    for frame in frames:  # innermost first
        filename = str(frame.get("filename", ""))
        if package in filename:
            path = filename[filename.rindex(package):]
            return f"{path}:{frame.get('line')} {frame.get('name')}"
    if frames:
        frame = frames[0]
        return f"{frame.get('filename')}:{frame.get('line')} {frame.get('name')}"
    return "(no Python frame)"


def allocation_sites(entries: Sequence[dict], *, top: int = 10, package: str = ALLOCATION_SITE_PACKAGE) -> list[list]:
    """Bytes allocated per source line, most first: ``[[site, bytes, allocations], ...]``.

    The site of an allocation is the innermost frame of its stack in ``package``
    (``"attn_gym_lite/models/lm.py:88 loss"``), else its innermost frame, else
    ``"(no Python frame)"`` (history recorded without stacks, or a free-standing C++ thread such
    as autograd's backward worker, whose allocations may carry no Python frame).

    Raises:
        TypeError: ``entries`` is not a list of trace entries, or a field read is of the wrong
            type (as in :func:`find_blocks`); ``top`` is not an int.
        ValueError: a malformed entry (as in :func:`find_blocks`); ``top`` < 1.
        TypeError: ``package`` is not a non-empty str (``""`` would match every file).
    """
    entries = _check_entries(entries, "allocation_sites")
    check_int("top", top, minimum=1)
    if not isinstance(package, str) or not package:
        raise TypeError(f"package must be a non-empty str (a path fragment such as 'attn_gym_lite'), got {package!r}")
    totals: dict[str, list[int]] = {}
    for entry in entries:
        if entry["action"] == "alloc":
            total = totals.setdefault(_site(entry, package), [0, 0])
            total[0] += entry["size"]
            total[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [[site, size, count] for site, (size, count) in ranked]
