"""What every benchmark suite shares: timing a step, running parts within a time budget, turning
an error into a string of the JSON record, and a run's tokens per second with their spread.

A suite declares its parts (functions returning JSON-ready dicts) and hands them to
:func:`run_parts`; one part failing, timing out or finding no time left is an entry of ``errors``,
never a crash of the suite.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator, Sequence
from time import monotonic
from typing import Any

from ..isolation import run_isolated
from .timing import cuda_event_us, median, percentiles


def error_text(error: BaseException, max_chars: int = 3000, *, summary: bool = False) -> str:
    """The error as a record keeps it: the end of its traceback, or with ``summary`` its
    ``"Type: message"`` from the start (an isolated part's message carries the child's stderr)."""
    if summary:
        return f"{type(error).__name__}: {error}".strip()[:max_chars]
    return "".join(traceback.format_exception(error))[-max_chars:]


@contextlib.contextmanager
def recorded(errors: dict, key: str, describe: Callable[[BaseException], str] = error_text) -> Iterator[None]:
    """Record an exception raised in the block as ``errors[key]`` instead of raising it."""
    try:
        yield
    except Exception as error:  # one case failing is a result; the suite goes on
        errors[key] = describe(error)


def device_us(fn: Callable[[], object], iters: int) -> float:
    """Median device µs of ``fn()`` (e.g. a graph's ``replay``) over ``iters`` CUDA-event timings."""
    return median(cuda_event_us(fn, iters))


def isolated(function: Callable[..., Any], *args: Any) -> Callable[[float], Any]:
    """A part that runs ``function(*args)`` in a fresh process with the part's time limit (a CUDA
    fault poisons the process it happens in, so the other parts stay measurable)."""
    return lambda limit: run_isolated(function, *args, timeout_s=limit)


def run_parts(parts: dict[str, Callable[[float], Any]], *, timeout_s: float | dict[str, float] = 600.0,
              budget_s: float | None = None, min_part_s: float = 15.0,
              describe: Callable[[BaseException], str] = error_text) -> tuple[dict[str, Any], dict[str, str]]:
    """Run named parts in order, each called with its time limit in seconds: its timeout, cut to
    what is left of ``budget_s`` (counted from this call; ``None``: no bound). A part with less
    than ``min_part_s`` left is not started. Returns ``(results, errors)``; every part is in one.
    """
    began, results, errors, started = monotonic(), {}, {}, False
    for name, part in parts.items():
        limit = timeout_s[name] if isinstance(timeout_s, dict) else timeout_s
        if budget_s is not None:
            left = budget_s - (monotonic() - began)
            if left < min_part_s:
                why = ("the parts before it used the rest" if started
                       else f"the budget is below the {min_part_s:g} s a part needs to start")
                errors[name] = f"not run: {max(left, 0.0):.0f} s left of the budget of {budget_s:.0f} s ({why})"
                continue
            limit = min(limit, left)
        started = True
        with recorded(errors, name, describe):
            results[name] = part(limit)
    return results, errors


def throughput(active_tokens: Sequence[int], step_ms: Sequence[float]) -> dict:
    """Timed steps as tokens per second: each step's tokens over its time, their median and
    p10/p50/p90, and all the tokens over all the time."""
    tokens, step_ms = [int(t) for t in active_tokens], [float(ms) for ms in step_ms]
    rates = [t / (ms / 1e3) for t, ms in zip(tokens, step_ms, strict=True)]
    return {"timed_steps": len(rates), "step_ms": step_ms, "median_step_ms": median(step_ms),
            "tokens_per_s_steps": rates, "tokens_per_s": median(rates),
            "tokens_per_s_spread": percentiles(rates), "tokens_per_s_overall": sum(tokens) / (sum(step_ms) / 1e3)}
