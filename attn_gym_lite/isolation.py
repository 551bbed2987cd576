"""Run work in fresh processes, each leading its own session, with timeouts and a shared budget.

A CUDA fault poisons its process and some demonstrations *mean* to fail: a fresh interpreter keeps
one failure from taking the rest with it. A timeout ends the whole process group (``torchrun`` or
compile workers included), so no grandchild keeps a GPU or our pipes. Imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["IsolatedRunError", "ProcessRun", "run_isolated", "run_process_group"]

_MARKER = "@@attn_gym_lite.isolation.result@@ "


class IsolatedRunError(RuntimeError):
    """The child failed, timed out or printed no result; ``.stderr`` is the end of its stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message + (f"\n{stderr}" if stderr else ""))
        self.stderr = stderr


@dataclasses.dataclass(frozen=True)
class ProcessRun:
    """How a run ended: ``returncode`` is ``-N`` after signal ``N``; output is ``None`` when logged."""

    returncode: int
    timed_out: bool
    seconds: float
    stdout: str | None
    stderr: str | None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # every member has exited
        os.killpg(pgid, sig)


def _end_group(process: subprocess.Popen, grace_s: float) -> tuple[str | None, str | None]:
    """``SIGTERM`` to the group, ``grace_s`` for the leader to exit, ``SIGKILL`` to the rest; the output."""
    # The leader's pid names its group, which outlives the leader while any member lives: the
    # SIGKILL still reaches a grandchild after the leader has exited.
    _signal_group(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:  # the leader, or a member holding its pipes, is still there
        pass
    finally:
        _signal_group(process.pid, signal.SIGKILL)
    return process.communicate(timeout=grace_s)  # communicate keeps what it read so far


def run_process_group(command: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                      log: str | os.PathLike | None = None, grace_s: float = 10.0) -> ProcessRun:
    """Run ``command`` (no shell) leading a new session; on timeout, ``SIGTERM`` its whole group and
    ``SIGKILL`` it ``grace_s`` later. Output goes to ``log`` (better for chatty process trees: nothing
    waits on a full pipe) or into the result. A timeout is reported in the result, not raised."""
    began = time.perf_counter()
    with open(log, "w") if log is not None else contextlib.nullcontext() as sink:
        stdout = sink if log is not None else subprocess.PIPE
        stderr = subprocess.STDOUT if log is not None else subprocess.PIPE
        process = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, text=True, start_new_session=True)
        timed_out = False
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            out, err = _end_group(process, grace_s)
        except BaseException:  # KeyboardInterrupt and the like: leave nothing running behind
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return ProcessRun(process.returncode, timed_out, time.perf_counter() - began, out, err)


def run_isolated(function: Callable[..., Any], *args: Any, timeout_s: float = 600,
                 env: dict[str, str] | None = None) -> Any:
    """``function(*args)`` in a new Python process (its own session); its return value through JSON.

    The child imports the module-level ``function`` by name, calls it and prints its result after a
    marker line, so anything else it prints is ignored. :class:`IsolatedRunError` when it exits
    non-zero, times out (see :func:`run_process_group`) or prints no result.
    """
    module, name = function.__module__, function.__qualname__
    command = [sys.executable, "-m", __name__, module, name, json.dumps(list(args))]
    done = run_process_group(command, timeout_s=timeout_s, env=env)
    results = [line for line in (done.stdout or "").splitlines() if line.startswith(_MARKER)]
    if done.timed_out or done.returncode != 0 or not results:
        why = (f"timed out after {timeout_s} s" if done.timed_out
               else f"exited with code {done.returncode}" if done.returncode else "printed no result")
        raise IsolatedRunError(f"{module}.{name} {why}", (done.stderr or "")[-3000:])
    return json.loads(results[-1][len(_MARKER):])


def _main(argv: Sequence[str]) -> None:
    module, name, args = argv
    result = getattr(importlib.import_module(module), name)(*json.loads(args))
    print(_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
