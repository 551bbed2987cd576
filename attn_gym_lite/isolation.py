"""Run a function in a fresh Python process and get its JSON result back: one harness for every
measurement that must not share a process with the others.

Why a process: a CUDA fault (an illegal memory access, a device assert) poisons the process that
hits it, and some demonstrations *mean* to fail, or to leave memory in a state nothing after them
should inherit. A fresh interpreter per run keeps one failure from taking the rest with it, and a
timeout keeps one hang from stopping a whole recording.

Protocol: the child imports ``module``, calls ``module.<function>(*args)`` and writes its result as
one JSON line after a marker on stdout, so that anything else the function prints is ignored.

This module imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["IsolatedRunError", "run_isolated"]

_MARKER = "@@attn_gym_lite.isolation.result@@ "


class IsolatedRunError(RuntimeError):
    """The child process failed, timed out, or printed no result. ``.stderr`` holds the end of its
    standard error (the traceback, if any)."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message + (f"\n{stderr}" if stderr else ""))
        self.stderr = stderr


def run_isolated(function: Callable[..., Any], *args: Any, timeout_s: float = 600,
                 env: dict[str, str] | None = None) -> Any:
    """``function(*args)`` in a new Python process; its JSON-ready return value.

    Args:
        function: a module-level function (it is imported again in the child by module and name).
        args: JSON-serialisable positional arguments.
        timeout_s: seconds before the child is killed (> 0).
        env: the child's environment (default: this process's).

    Returns:
        What ``function`` returned, through ``json.dumps`` / ``json.loads``.

    Raises:
        TypeError: ``function`` is not a module-level function, or ``args`` are not JSON-ready.
        IsolatedRunError: the child exited non-zero, timed out or printed no result.
    """
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not callable(function) or module is None or "." in name or "<" in name:
        raise TypeError(f"function must be a module-level function, got {function!r}")
    if module == "__main__":
        raise TypeError(f"function must live in an importable module, not __main__, got {name}")
    command = [sys.executable, "-m", __name__, module, name, json.dumps(list(args))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as expired:
        tail = (expired.stderr or b"")[-3000:]
        raise IsolatedRunError(f"{module}.{name} timed out after {timeout_s} s",
                               tail.decode(errors="replace") if isinstance(tail, bytes) else tail) from None
    if done.returncode != 0:
        raise IsolatedRunError(f"{module}.{name} exited with code {done.returncode}", done.stderr[-3000:])
    results = [line for line in done.stdout.splitlines() if line.startswith(_MARKER)]
    if not results:
        raise IsolatedRunError(f"{module}.{name} printed no result", done.stderr[-3000:])
    return json.loads(results[-1][len(_MARKER):])


def _main(argv: Sequence[str]) -> None:
    import importlib

    module, name, args = argv
    result = getattr(importlib.import_module(module), name)(*json.loads(args))
    print(_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
