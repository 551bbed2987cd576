"""What the caching allocator did during a step, small enough to store in a recording: reductions of
its trace entries (dicts with ``action``, ``addr``, ``size``, maybe ``time_us`` and ``frames``). An
allocation counts from ``alloc`` to ``free_completed`` (a block freed on a stream is reusable only
once the stream's work is done)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

SIZE_ACTIONS = {"alloc": 1, "free_completed": -1}
SEGMENT_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
ALLOCATION_SITE_PACKAGE = "attn_gym_lite"
TOP_SITES = 10


class record_memory_history:  # noqa: N801 -- a context manager, named like the torch call it wraps
    """Record the CUDA caching allocator's history of the block on the current device: ``entries``
    after exit, ``mark()`` the index of the next entry. More than ``max_entries`` (the allocator's
    ring buffer) raises on exit: the start was overwritten."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self.entries: list[dict] = []
        self.marks: list[int] = []
        self._start = 0

    def _trace(self) -> list[dict]:
        return torch.cuda.memory._snapshot()["device_traces"][self.device]

    def __enter__(self) -> record_memory_history:
        self.device = torch.cuda.current_device()
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=self.max_entries)
        self._start = len(self._trace())  # an earlier recording in this process may have left entries
        return self

    def mark(self) -> int:
        """Index (into ``entries``) of the next entry. Costs a full allocator snapshot (no cheaper call
        gives the trace's length): call it outside timed regions."""
        index = len(self._trace()) - self._start
        self.marks.append(index)
        return index

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                torch.cuda.synchronize()  # frees queued on the stream complete before the snapshot
                trace = self._trace()
                if len(trace) >= self.max_entries:
                    raise RuntimeError(f"record_memory_history: the block made {len(trace)} or more allocator entries, "
                                       f"max_entries = {self.max_entries}; the oldest were overwritten: raise max_entries")
                self.entries = trace[self._start:]
        finally:
            torch.cuda.memory._record_memory_history(None)


def find_blocks(entries: Sequence[dict], pointers: Iterable[int], alive_at: int, *, strict: bool = True) -> set[int]:
    """Indices of the ``alloc`` entries whose blocks hold ``pointers`` (``data_ptr()`` values, maybe
    inside a block: a view) at moment ``alive_at`` (:meth:`record_memory_history.mark`). A pointer in
    no block alive then (allocated before the recording) raises, or is skipped with ``strict=False``.
    """
    live: dict[int, int] = {}  # addr -> index of its alloc entry
    for index, entry in enumerate(entries[:alive_at]):
        if entry["action"] == "alloc":
            live[entry["addr"]] = index
        elif entry["action"] in ("free_requested", "free_completed"):
            live.pop(entry.get("addr"), None)
    found = set()
    for pointer in pointers:
        holders = [i for addr, i in live.items() if addr <= pointer < addr + entries[i]["size"]]
        if holders:
            found.add(max(holders))
        elif strict:
            raise ValueError(f"find_blocks: pointer {pointer:#x} lies in no block allocated in the recording and "
                             f"alive at entry {alive_at}; was its tensor allocated before the recording started?")
    return found


def allocation_timeline(entries: Sequence[dict], tags: dict[str, Iterable[int]] | None = None, *,
                        max_points: int = 4000) -> dict[str, Any]:
    """Allocated (and reserved) bytes after each allocation and free, relative to the start, with the
    bytes of each tag's allocations (``tags``: name -> ``alloc`` entry indices, :func:`find_blocks`);
    thinned to about ``max_points`` points, keeping the first, the last and the peak. ``t`` is
    ``time_us`` from the first entry (where all have one) or the entry index."""
    if not all(isinstance(e, dict) for e in entries):
        raise TypeError("allocation_timeline: entries must be allocator trace entries (dicts with an 'action')")
    tags = {name: set(indices) for name, indices in (tags or {}).items()}
    for name, indices in tags.items():  # another entry's index would tag nothing, or the wrong size
        if not all(0 <= i < len(entries) and entries[i]["action"] == "alloc" for i in indices):
            raise ValueError(f"allocation_timeline: tags[{name!r}] must list indices of alloc entries, got {sorted(indices)}")
    timed = all(isinstance(e.get("time_us"), (int, float)) for e in entries)
    origin = entries[0].get("time_us", 0) if timed and entries else 0
    allocated = reserved = allocs = frees = 0
    owner: dict[int, str] = {}  # addr of a live tagged block -> its tag
    tagged = dict.fromkeys(tags, 0)
    points = []
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
        points.append((t, allocated, reserved, tuple(tagged.values()), index))
    if not points:
        raise ValueError("allocation_timeline: the entries have no alloc or free_completed entry")
    highest = max(range(len(points)), key=lambda i: points[i][1])
    peak = points[highest]
    if len(points) > max_points:
        stride = -(-len(points) // (max_points - 2))
        points = [points[i] for i in sorted({0, len(points) - 1, highest, *range(0, len(points), stride)})]
    return {"time": "µs" if timed else "entry", "t": [round(p[0], 3) for p in points], "entry": [p[4] for p in points],
            "allocated_bytes": [p[1] for p in points], "reserved_bytes": [p[2] for p in points],
            "tags": {name: [p[3][k] for p in points] for k, name in enumerate(tags)},
            "peak": {"t": round(peak[0], 3), "entry": peak[4], "allocated_bytes": peak[1],
                     "tags": {name: peak[3][k] for k, name in enumerate(tags)}},
            "tag_bytes": {name: sum(entries[i]["size"] for i in indices) for name, indices in tags.items()},
            "allocs": allocs, "frees": frees}


def _site(entry: dict) -> str:
    frames = entry.get("frames") or []
    for frame in frames:  # innermost first
        filename = str(frame.get("filename", ""))
        if ALLOCATION_SITE_PACKAGE in filename:
            return f"{filename[filename.rindex(ALLOCATION_SITE_PACKAGE):]}:{frame.get('line')} {frame.get('name')}"
    if frames:
        return f"{frames[0].get('filename')}:{frames[0].get('line')} {frames[0].get('name')}"
    return "(no Python frame)"


def allocation_sites(entries: Sequence[dict]) -> list[list]:
    """Bytes allocated per source line, the ``TOP_SITES`` most: ``[[site, bytes, allocations], ...]``;
    a site is the innermost frame in the package (``"attn_gym_lite/models/lm.py:88 loss"``), else the
    innermost frame, else ``"(no Python frame)"`` (no stacks, or a C++ thread such as autograd's)."""
    totals: dict[str, list[int]] = {}
    for entry in entries:
        if entry["action"] == "alloc":
            total = totals.setdefault(_site(entry), [0, 0])
            total[0] += entry["size"]
            total[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:TOP_SITES]
    return [[site, size, count] for site, (size, count) in ranked]
