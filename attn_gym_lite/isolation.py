"""Run work in fresh processes, each in its own session, with timeouts and a shared time budget:
one harness for every measurement that must not share a process with the others.

Why a process: a CUDA fault (an illegal memory access, a device assert) poisons the process that
hits it, and some demonstrations *mean* to fail, or to leave memory in a state nothing after them
should inherit. A fresh interpreter per run keeps one failure from taking the rest with it, and a
timeout keeps one hang from stopping a whole recording.

Why a session: the process started may start others (``torchrun`` starts one worker per rank,
``torch.compile`` starts compile workers). Each run is the leader of a new session and process
group, and a timeout ends the whole group (``SIGTERM``, then ``SIGKILL``), not just the leader, so
no grandchild is left holding a GPU or the pipes this process reads.

* :func:`run_process_group`: a command line, with a timeout, its output captured or written to
  a log file; a timeout is reported, not raised.
* :func:`run_isolated`: a module-level Python function in a fresh interpreter; its JSON result.
  Protocol: the child imports ``module``, calls ``module.<function>(*args)`` and writes its
  result as one JSON line after a marker on stdout, so anything else the function prints is
  ignored.
* :func:`run_within_budget`: named parts one after another within a shared budget of seconds,
  each part's timeout cut to what is left; failures become messages.
* :func:`describe_error`: an exception as the one-line ``"<type>: <message>"`` those messages are.

This module imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["IsolatedRunError", "ProcessRun", "describe_error", "run_isolated", "run_process_group", "run_within_budget"]

_MARKER = "@@attn_gym_lite.isolation.result@@ "


class IsolatedRunError(RuntimeError):
    """The child process failed, timed out, or printed no result. ``.stderr`` holds the end of its
    standard error (the traceback, if any)."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message + (f"\n{stderr}" if stderr else ""))
        self.stderr = stderr


@dataclasses.dataclass(frozen=True)
class ProcessRun:
    """How a :func:`run_process_group` run ended.

    Attributes:
        returncode: the leader's exit status; ``-N`` when signal ``N`` ended it (as
            :mod:`subprocess` reports), e.g. ``-15`` after a timeout's ``SIGTERM``.
        timed_out: the timeout expired and the process group was ended.
        seconds: wall-clock time from start to the group's end (s).
        stdout, stderr: the captured output (text), or ``None`` when it went to a log file.
    """

    returncode: int
    timed_out: bool
    seconds: float
    stdout: str | None
    stderr: str | None


# The checks below follow the message formats of attn_gym_lite.checks, inline: this module
# imports nothing from the package (and so not torch).


#: The longest wait a timeout may ask for (seconds, about 31 years): well inside what
#: ``Popen.communicate`` and ``wait`` can convert (1e10 raised OverflowError there, after the child
#: had started, and left its process group running).
MAX_SECONDS = 1e9


def _check_seconds(name: str, value: object) -> float:
    # Any real number (numpy's float32 and int64 included: a timeout read from an array), not a bool.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}: {value!r:.40}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past float's range (10**400)
        seconds = math.inf
    if not (seconds > 0 and seconds <= MAX_SECONDS):
        raise ValueError(f"{name} must be a finite number of seconds > 0 and <= {MAX_SECONDS:.0f}, got {value!r:.40}")
    return seconds


def _check_callable(name: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}: {value!r:.60}")


def _check_env(env: object) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of str to str or None, got {type(env).__name__}: {env!r:.60}")
    bad = [(key, value) for key, value in env.items() if not (isinstance(key, str) and isinstance(value, str))]
    if bad:
        raise TypeError(f"env must be a mapping of str to str or None, got {bad[0][0]!r}: {bad[0][1]!r:.60}")
    # What the OS cannot hold (Popen's bare "illegal environment variable name" / "embedded null byte").
    bad = [(key, value) for key, value in env.items() if not key or "=" in key or "\0" in key or "\0" in value]
    if bad:
        raise ValueError(f"env must map variable names (non-empty, no '=' or NUL) to values without NUL, got "
                         f"{bad[0][0]!r}: {bad[0][1]!r:.60}")
    return dict(env)


def _check_log(log: object) -> str | os.PathLike | None:
    if log is None:
        return None
    if not isinstance(log, (str, os.PathLike)):
        raise TypeError(f"log must be a str or os.PathLike or None, got {type(log).__name__}")
    path = os.fspath(log)
    if not path:  # open("") raised a bare FileNotFoundError: ''
        raise ValueError("log must be a file path or None, got an empty path ''")
    if os.path.isdir(path):
        raise FileNotFoundError(f"log={str(path)!r} is a directory, expected a file")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"log={str(path)!r}: no such folder {folder!r}")
    return log


def _check_json(name: str, value: object) -> None:
    """``value`` goes through ``json.dumps`` / ``json.loads`` unchanged but for tuples (lists)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(f"{name}[{index}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            # json.dumps writes an int key as a str: the child would get {"1": ...} for {1: ...}.
            if not isinstance(key, str):
                raise TypeError(f"{name} must be JSON-ready (dict keys str), got the key {key!r} "
                                f"({type(key).__name__})")
            _check_json(f"{name}[{key!r}]", item)
        return
    raise TypeError(f"{name} must be JSON-ready (None, bool, int, float, str, list, tuple or dict "
                    f"with str keys), got {type(value).__name__}: {value!r:.60}")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # every member has exited (and been reaped)
        pass


def _end_group(process: subprocess.Popen, grace_s: float) -> tuple[str | None, str | None]:
    """``SIGTERM`` to the process group, up to ``grace_s`` for the leader to exit (its pipes
    drained meanwhile), then ``SIGKILL`` to whatever is left of the group; the rest of the output."""
    # The leader's pid names its group (start_new_session). The group outlives the leader while any
    # member lives, so the SIGKILL below still reaches a grandchild after the leader has exited.
    _signal_group(process.pid, signal.SIGTERM)
    drained = False
    try:
        out, err = process.communicate(timeout=grace_s)
        drained = True
    except subprocess.TimeoutExpired:  # the leader, or a member holding its pipes, is still there
        pass
    finally:  # whatever happened while waiting, nothing of the group is left running
        _signal_group(process.pid, signal.SIGKILL)  # members that ignored SIGTERM or outlived the leader
    if not drained:  # communicate keeps what it read so far: this returns all of the output
        out, err = process.communicate(timeout=grace_s)
    return out, err


def run_process_group(command: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                      log: str | os.PathLike | None = None, grace_s: float = 10.0) -> ProcessRun:
    """Run ``command`` as the leader of a new session; end its whole process group on timeout.

    Args:
        command: the program and its arguments (no shell).
        timeout_s: seconds before the group is ended (> 0): ``SIGTERM`` to every process in it,
            up to ``grace_s`` for the leader to exit, then ``SIGKILL`` to every one left.
        env: the child's environment (default: this process's).
        log: a file for the child's stdout and stderr together (created or truncated); ``None``
            captures them (text) into the result instead. A log file is the better choice for
            processes whose children write a lot: nothing waits on a full pipe.
        grace_s: seconds between ``SIGTERM`` and ``SIGKILL`` (> 0).

    Returns:
        A :class:`ProcessRun`. A timeout is reported there (``timed_out``), not raised.

    Raises:
        TypeError: ``command`` is not a non-empty list of str (or path) arguments: a single string
            (``"python -c ..."``) is refused, not split into letters.
        TypeError, ValueError: ``timeout_s`` or ``grace_s`` is not a real number in ``(0, 1e9]`` (a
            bool is refused; numpy numbers are taken).
        TypeError: ``env`` is not ``None`` or a mapping of str to str; ``log`` is not ``None``,
            a str or an ``os.PathLike``.
        ValueError: a ``command`` argument holds a NUL character; an ``env`` name is empty or holds
            ``=`` or NUL, or a value holds NUL; ``log`` is an empty path.
        FileNotFoundError: ``log`` is a directory, or its folder does not exist.
        OSError: the command could not be started (e.g. ``FileNotFoundError``).
        subprocess.TimeoutExpired: the leader did not exit even ``grace_s`` after ``SIGKILL`` (a
            process stuck in the kernel).
    """
    # A string would be split into one-letter arguments by list(): "python -c ..." ran "p".
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence) or not command or not all(
            isinstance(part, (str, os.PathLike)) for part in command):
        raise TypeError(f"command must be a non-empty list of str arguments (the program first, no shell), got {command!r:.80}")
    nul = [i for i, part in enumerate(command) if "\0" in os.fsdecode(part)]
    if nul:  # Popen's bare "embedded null byte"
        raise ValueError(f"command[{nul[0]}] must not contain a NUL character, got {command[nul[0]]!r:.60}")
    timeout_s, grace_s = _check_seconds("timeout_s", timeout_s), _check_seconds("grace_s", grace_s)
    env, log = _check_env(env), _check_log(log)
    began = time.perf_counter()
    with open(log, "w") if log is not None else contextlib.nullcontext() as sink:
        stdout = sink if log is not None else subprocess.PIPE
        stderr = subprocess.STDOUT if log is not None else subprocess.PIPE
        process = subprocess.Popen(list(command), env=env, stdout=stdout,
                                   stderr=stderr, text=True, start_new_session=True)
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
    return ProcessRun(returncode=process.returncode, timed_out=timed_out, seconds=time.perf_counter() - began,
                      stdout=out, stderr=err)


def run_isolated(function: Callable[..., Any], *args: Any, timeout_s: float = 600,
                 env: dict[str, str] | None = None) -> Any:
    """``function(*args)`` in a new Python process (its own session); its JSON-ready return value.

    Args:
        function: a module-level function (it is imported again in the child by module and name).
        args: JSON-ready positional arguments (checked before the child starts).
        timeout_s: seconds before the child and every process it started are ended (> 0; see
            :func:`run_process_group`).
        env: the child's environment (default: this process's).

    Returns:
        What ``function`` returned, through ``json.dumps`` / ``json.loads``.

    Raises:
        TypeError: ``function`` is not a module-level function, or an argument is not JSON-ready
            (the message names it, e.g. ``args[1]['x']``): only ``None``, bool, int, float, str,
            list, tuple (it arrives as a list) and dict with str keys (``json.dumps`` would turn
            an int key into a str) go through; ``env`` is not a mapping of str to str.
        TypeError, ValueError: ``timeout_s`` is not a finite real number in (0, 1e9] (:data:`MAX_SECONDS`).
        IsolatedRunError: the child exited non-zero, timed out (the message says ``timed out
            after <timeout_s> s``) or printed no result.
    """
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    # No name (a functools.partial, a callable instance): the child could not import it, and
    # failed with "module 'functools' has no attribute ''" after it had started.
    if not callable(function) or module is None or not name or "." in name or "<" in name:
        raise TypeError(f"function must be a module-level function, got {function!r}")
    if module == "__main__":
        raise TypeError(f"function must live in an importable module, not __main__, got {name}")
    for index, arg in enumerate(args):
        _check_json(f"args[{index}]", arg)
    command = [sys.executable, "-m", __name__, module, name, json.dumps(list(args))]
    done = run_process_group(command, timeout_s=timeout_s, env=env)
    stderr_tail = (done.stderr or "")[-3000:]
    if done.timed_out:
        raise IsolatedRunError(f"{module}.{name} timed out after {timeout_s} s", stderr_tail)
    if done.returncode != 0:
        raise IsolatedRunError(f"{module}.{name} exited with code {done.returncode}", stderr_tail)
    results = [line for line in (done.stdout or "").splitlines() if line.startswith(_MARKER)]
    if not results:
        raise IsolatedRunError(f"{module}.{name} printed no result", stderr_tail)
    return json.loads(results[-1][len(_MARKER):])


def describe_error(error: BaseException, max_chars: int | None = None) -> str:
    """``"<exception type>: <message>"``, stripped, for a result that records a failure as text.

    Args:
        error: the exception.
        max_chars: keep at most this many characters, from the start (``None``: all of them);
            e.g. to bound a JSON record, as an :class:`IsolatedRunError` carries the end of the
            child's standard error.

    Returns:
        The text, e.g. ``"ValueError: chunk_size must be one of (16, 32, 64), got 8"``.

    Raises:
        TypeError: ``error`` is not an exception (a ``BaseException``), or ``max_chars`` is
            neither ``None`` nor an integer (``numbers.Integral``, numpy's included; not a bool).
        ValueError: ``max_chars`` < 0.
    """
    if not isinstance(error, BaseException):
        raise TypeError(f"error must be an exception, got {type(error).__name__} {error!r:.60}")
    # The message format of attn_gym_lite.checks.check_int, inline: this module imports nothing
    # from the package (and so not torch).
    if max_chars is not None:
        # Any integer slicing takes (numpy's too), not a bool.
        if isinstance(max_chars, bool) or not isinstance(max_chars, numbers.Integral):
            raise TypeError(f"max_chars must be an int >= 0 or None, got {max_chars!r}")
        max_chars = int(max_chars)
        if max_chars < 0:
            raise ValueError(f"max_chars must be an int >= 0 or None, got {max_chars}")
    text = f"{type(error).__name__}: {error}".strip()
    return text if max_chars is None else text[:max_chars]


def run_within_budget(parts: Mapping[str, Callable[[float], Any]], *, timeout_s: float | Mapping[str, float],
                      budget_s: float | None, min_part_s: float = 15.0,
                      clock: Callable[[], float] = time.monotonic,
                      describe: Callable[[BaseException], str] = describe_error) -> tuple[dict[str, Any], dict[str, str]]:
    """Run named parts one after another, each with a time limit, all within one budget.

    Each part is called with its limit in seconds, ``min(its timeout, what is left of the
    budget)``, and must keep to it itself (e.g. ``lambda limit: run_isolated(f, timeout_s=limit)``);
    a part that overruns its limit (or a process's grace period after it) eats into the parts
    after it. A part with less than ``min_part_s`` left is not started.

    Args:
        parts: name -> function of one float (its limit, s), in the order to run.
        timeout_s: every part's limit (s, > 0), or a limit per part name (every part named).
        budget_s: seconds for all the parts, counted from this call (> 0), or ``None`` for no
            bound (each part then gets its timeout).
        min_part_s: the least time (s, > 0) worth starting a part with.
        clock: seconds, monotonic (a test may pass a fake).
        describe: turns a part's exception into its message (default :func:`describe_error`).

    Returns:
        ``(results, errors)``: ``results[name]`` is what a part returned; ``errors[name]`` is
        ``describe(exception)`` for a part that raised, or ``"not run: <s> s left of the budget of
        <budget_s> s (the parts before it used the rest)"`` for one not started. Every part is in
        exactly one of the two.

    Raises:
        TypeError: ``parts`` is not a mapping of str to callables (a list of functions is refused,
            and so is a part that cannot be called: before any part runs), or ``clock`` or
            ``describe`` cannot be called.
        TypeError, ValueError: a time that is not a finite real number in (0, 1e9] (not a bool; numpy
            numbers are taken); ``timeout_s`` a mapping that does not name every part, or names
            one that is not in ``parts``.
    """
    if not isinstance(parts, Mapping):
        raise TypeError(f"parts must be a mapping of part name (str) to a function of its limit (s), "
                        f"got {type(parts).__name__}: {parts!r:.60}")
    for name, part in parts.items():
        if not isinstance(name, str):
            raise TypeError(f"parts must be keyed by part name (str), got {type(name).__name__}: {name!r}")
        _check_callable(f"parts[{name!r}]", part)
    _check_callable("clock", clock)
    _check_callable("describe", describe)
    if not isinstance(timeout_s, Mapping):
        _check_seconds("timeout_s", timeout_s)
    began = clock()
    limits = {name: timeout_s for name in parts} if not isinstance(timeout_s, Mapping) else dict(timeout_s)
    missing = [name for name in parts if name not in limits]
    if missing:
        raise ValueError(f"timeout_s must give a limit for every part, got none for {missing}")
    # A limit for no part is a misspelt name (its part then runs with no limit of its own).
    unknown = [name for name in limits if name not in parts]
    if unknown:
        raise ValueError(f"timeout_s must name parts of parts {list(parts)}, got limits for {unknown}")
    for name in parts:
        _check_seconds(f"timeout_s[{name!r}]" if isinstance(timeout_s, Mapping) else "timeout_s", limits[name])
    if budget_s is not None:
        _check_seconds("budget_s", budget_s)
    _check_seconds("min_part_s", min_part_s)

    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    started = False
    for name, part in parts.items():
        limit = float(limits[name])
        if budget_s is not None:
            left = budget_s - (clock() - began)
            if left < min_part_s:
                # Say why truly: a budget below min_part_s from the start runs nothing, and then no
                # part before it "used the rest" (as every record said).
                why = ("the parts before it used the rest" if started
                       else f"the budget is below the {min_part_s:g} s a part needs to start")
                errors[name] = f"not run: {max(left, 0.0):.0f} s left of the budget of {budget_s:.0f} s ({why})"
                continue
            limit = min(limit, left)
        started = True
        try:
            results[name] = part(limit)
        except Exception as error:  # one part's failure is a result, not a crash
            errors[name] = describe(error)
    return results, errors


def _main(argv: Sequence[str]) -> None:
    import importlib

    module, name, args = argv
    result = getattr(importlib.import_module(module), name)(*json.loads(args))
    print(_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
