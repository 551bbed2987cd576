"""attn_gym_lite.isolation: results come back through JSON, failures and hangs come back as errors,
a timeout ends the whole process group, parts share a time budget."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attn_gym_lite.isolation import (
    IsolatedRunError,
    describe_error,
    run_isolated,
    run_process_group,
    run_within_budget,
)


def test_returns_what_the_function_returns():
    assert run_isolated(math.factorial, 10) == 3628800
    assert run_isolated(math.comb, 10, 3) == 120


def test_a_failing_function_reports_its_traceback():
    with pytest.raises(IsolatedRunError, match="exited with code 1") as caught:
        run_isolated(math.factorial, -1)
    assert "Traceback" in caught.value.stderr and "ValueError" in caught.value.stderr


def test_a_hang_is_killed_at_the_timeout():
    start = time.perf_counter()
    with pytest.raises(IsolatedRunError, match="timed out after 1 s"):
        run_isolated(time.sleep, 30, timeout_s=1)
    assert time.perf_counter() - start < 20


def test_only_importable_module_level_functions():
    with pytest.raises(TypeError, match="module-level function"):
        run_isolated(lambda: 1)
    with pytest.raises(TypeError, match="module-level function"):
        run_isolated(IsolatedRunError.__init__)


# ---------------------------------------------------------------------------------------------
# The process group: a timeout ends the child and everything it started.


def spawn_a_sleeping_grandchild(pid_file: str) -> None:
    """Run in the child: start a grandchild that sleeps forever (holding our stdout), write its
    pid, then hang."""
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
    Path(pid_file).write_text(str(grandchild.pid))
    time.sleep(10**6)


def _child_env() -> dict[str, str]:
    # The child imports this file by the name pytest gave it: put its folder (and the repository
    # root, for a package-style name) on the child's path.
    here = Path(__file__).resolve().parent
    paths = [str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _gone(pid: int) -> bool:
    """The process no longer runs: it does not exist, or it is a zombie waiting to be reaped (in a
    container, PID 1 may never reap the orphans it inherits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_a_timeout_kills_the_grandchildren_too(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    start = time.perf_counter()
    with pytest.raises(IsolatedRunError, match=r"spawn_a_sleeping_grandchild timed out after 3 s"):
        run_isolated(spawn_a_sleeping_grandchild, str(pid_file), timeout_s=3, env=_child_env())
    # SIGTERM ends the sleepers at once: no grace period was waited out, and the parent did not
    # hang on the pipe the grandchild held.
    assert time.perf_counter() - start < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild), f"grandchild {grandchild} still runs"


def test_run_process_group_reports_a_timeout_and_a_signal(tmp_path):
    # A leader that ignores SIGTERM: the group gets SIGKILL after the grace period.
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    start = time.perf_counter()
    run = run_process_group([sys.executable, "-c", ignore], timeout_s=1.5, grace_s=0.5)
    assert run.timed_out and run.returncode == -signal.SIGKILL
    assert run.stdout == "up\n" and run.stderr == ""
    assert 1.5 <= run.seconds < 10 and time.perf_counter() - start < 10

    log = tmp_path / "child.log"
    run = run_process_group([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                            timeout_s=30, log=log)
    assert (run.returncode, run.timed_out, run.stdout, run.stderr) == (3, False, None, None)
    assert sorted(log.read_text().split()) == ["err", "out"]
    with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds > 0 and <= 1000000000, got 0"):
        run_process_group(["true"], timeout_s=0)
    with pytest.raises(TypeError, match="grace_s must be a number of seconds, got str"):
        run_process_group(["true"], timeout_s=1, grace_s="1")


# ---------------------------------------------------------------------------------------------
# A shared budget.


def test_parts_share_a_budget_and_a_failure_is_a_message():
    now = [100.0]
    limits = []

    def part(seconds_used, fail=False):
        def run(limit):
            limits.append(limit)
            now[0] += seconds_used
            if fail:
                raise RuntimeError("it broke")
            return seconds_used
        return run

    parts = {"a": part(100.0), "b": part(150.0, fail=True), "c": part(120.0), "d": part(1.0)}
    results, errors = run_within_budget(parts, timeout_s={"a": 150.0, "b": 150.0, "c": 150.0, "d": 90.0},
                                        budget_s=390.0, min_part_s=30.0, clock=lambda: now[0])
    # a: its timeout (150 < 390 left); b: 150 of 290 left; c: 140 left < 150; d: 20 left < 30, not run.
    assert limits == [150.0, 150.0, 140.0]
    assert results == {"a": 100.0, "c": 120.0}
    assert errors == {"b": "RuntimeError: it broke",
                      "d": "not run: 20 s left of the budget of 390 s (the parts before it used the rest)"}

    limits.clear()
    results, errors = run_within_budget({"x": part(500.0), "y": part(500.0)}, timeout_s=60.0, budget_s=None,
                                        clock=lambda: now[0])
    assert limits == [60.0, 60.0] and results == {"x": 500.0, "y": 500.0} and errors == {}

    with pytest.raises(ValueError, match=r"timeout_s must give a limit for every part, got none for \['y'\]"):
        run_within_budget({"x": part(1.0), "y": part(1.0)}, timeout_s={"x": 1.0}, budget_s=None)
    with pytest.raises(ValueError, match="budget_s must be a finite number of seconds > 0 and <= 1000000000, got -1"):
        run_within_budget({}, timeout_s=1.0, budget_s=-1)


def test_describe_error_is_type_and_message_optionally_cut():
    assert describe_error(ValueError("chunk_size must be one of (16, 32, 64), got 8\n")) == (
        "ValueError: chunk_size must be one of (16, 32, 64), got 8")
    assert describe_error(KeyError("x")) == "KeyError: 'x'"
    assert describe_error(RuntimeError()) == "RuntimeError:"
    long = IsolatedRunError("m.f exited with code 1", "E" * 5000)
    assert describe_error(long, max_chars=30) == "IsolatedRunError: m.f exited w"
    # A numpy integer is an integer (slicing takes it): the same text, as main accepted it.
    np = pytest.importorskip("numpy")
    assert describe_error(long, max_chars=np.int64(30)) == "IsolatedRunError: m.f exited w"
    assert describe_error(long) == "IsolatedRunError: m.f exited with code 1\n" + "E" * 5000


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("chunk_size too small",), TypeError, r"^error must be an exception, got str 'chunk_size too small'$"),
        ((ValueError("x"), -1), ValueError, r"^max_chars must be an int >= 0 or None, got -1$"),
        ((ValueError("x"), 1.5), TypeError, r"^max_chars must be an int >= 0 or None, got 1.5$"),
        ((ValueError("x"), True), TypeError, r"^max_chars must be an int >= 0 or None, got True$"),
    ],
)
def test_describe_error_checks_its_arguments(args, error, message):
    with pytest.raises(error, match=message):
        describe_error(*args)


@pytest.mark.parametrize("command", ["echo hi", b"echo", [], None, ["echo", 3]])
def test_run_process_group_names_a_command_that_is_not_an_argument_list(command):
    """Before: a string was split into one-letter arguments ("echo hi" ran "e": FileNotFoundError
    'e'), [] failed inside subprocess with an IndexError, None with "not iterable"."""
    with pytest.raises(TypeError, match=r"command must be a non-empty list of str arguments"):
        run_process_group(command, timeout_s=5)


# ---------------------------------------------------------------------------------------------
# Arguments refused up front, by name (break-it round 8).


def test_times_may_be_numpy_numbers():
    """Before: a numpy float32 or int64 timeout (read from an array) was refused with a TypeError."""
    np = pytest.importorskip("numpy")
    run = run_process_group([sys.executable, "-c", "print('ok')"], timeout_s=np.float32(30), grace_s=np.int64(5))
    assert (run.returncode, run.timed_out, run.stdout) == (0, False, "ok\n")
    results, errors = run_within_budget({"a": lambda limit: limit}, timeout_s={"a": np.float32(2.5)},
                                        budget_s=np.int64(100), min_part_s=np.float64(1.0))
    assert results == {"a": 2.5} and errors == {}
    assert run_isolated(math.factorial, 5, timeout_s=np.int64(60)) == 120


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, r"timeout_s must be a number of seconds, got bool: True"),
        (float("nan"), ValueError, r"timeout_s must be a finite number of seconds > 0 and <= 1000000000, got nan"),
        (math.inf, ValueError, r"timeout_s must be a finite number of seconds > 0 and <= 1000000000, got inf"),
        (1j, TypeError, r"timeout_s must be a number of seconds, got complex"),
        # Reliability tail, round 3: past what Popen.communicate converts (OverflowError after the
        # child had started), and an int past float's range (OverflowError in the check itself).
        (1e10, ValueError, r"timeout_s must be a finite number of seconds > 0 and <= 1000000000, got 10000000000.0"),
        (10**400, ValueError, r"timeout_s must be a finite number of seconds > 0 and <= 1000000000, got 1000"),
    ],
)
def test_times_refused(value, error, message):
    with pytest.raises(error, match=message):
        run_process_group(["true"], timeout_s=value)


def test_a_huge_grace_is_refused_before_anything_starts(tmp_path):
    """Reliability tail, round 3. Before: grace_s=1e10 passed the check; at the timeout,
    communicate(timeout=1e10) raised OverflowError before the SIGKILL, and the group (a shell that
    ignores SIGTERM and its sleep) kept running."""
    marker = tmp_path / "started"
    with pytest.raises(ValueError, match=r"^grace_s must be a finite number of seconds > 0 and <= 1000000000, got 10000000000.0$"):
        run_process_group(["sh", "-c", f"touch {marker}; trap '' TERM; sleep 30"], timeout_s=0.3, grace_s=1e10)
    assert not marker.exists()  # refused before the command started


def test_run_within_budget_refuses_parts_that_are_not_a_mapping_of_callables():
    """Before: a list of parts raised AttributeError ('list' object has no attribute 'items'); a
    part that cannot be called was recorded as that part's error after the parts before it ran."""
    ran = []
    with pytest.raises(TypeError, match=r"parts must be a mapping of part name \(str\) to a function of its limit \(s\), got list"):
        run_within_budget([lambda limit: 1], timeout_s=1.0, budget_s=None)
    with pytest.raises(TypeError, match=r"parts\['b'\] must be callable, got int: 3"):
        run_within_budget({"a": ran.append, "b": 3}, timeout_s=1.0, budget_s=None)
    assert ran == []  # refused before any part ran
    with pytest.raises(TypeError, match=r"parts must be keyed by part name \(str\), got int: 1"):
        run_within_budget({1: ran.append}, timeout_s=1.0, budget_s=None)
    with pytest.raises(TypeError, match=r"clock must be callable, got int: 3"):
        run_within_budget({"a": ran.append}, timeout_s=1.0, budget_s=None, clock=3)
    with pytest.raises(TypeError, match=r"describe must be callable, got str"):
        run_within_budget({"a": ran.append}, timeout_s=1.0, budget_s=None, describe="x")
    assert ran == []


class _NotJson:
    pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((_NotJson(),), r"args\[0\] must be JSON-ready \(None, bool, int, float, str, list, tuple or dict with str keys\), got _NotJson"),
        ((1, [2, {"x": {3}}]), r"args\[1\]\[1\]\['x'\] must be JSON-ready .*got set"),
        (({1: 2},), r"args\[0\] must be JSON-ready \(dict keys str\), got the key 1 \(int\)"),
    ],
)
def test_run_isolated_names_an_argument_json_cannot_carry(args, message):
    """Before: json's own 'Object of type _NotJson is not JSON serializable' (no argument named),
    and {1: 2} reached the child as {'1': 2}."""
    with pytest.raises(TypeError, match=message):
        run_isolated(math.factorial, *args)


def test_run_isolated_carries_tuples_as_lists_and_nested_values():
    assert run_isolated(math.fsum, (0.1, 0.2, 0.3)) == math.fsum([0.1, 0.2, 0.3])
    assert run_isolated(len, {"a": [1, None, True], "b": "x"}) == 2


def test_run_process_group_checks_env_and_log(tmp_path):
    """Before: env={'A': 1} failed inside subprocess ('expected str, bytes or os.PathLike object,
    not int'), env='x' with 'dictionary update sequence element #0'; a log that is a directory or
    in a missing folder gave the OS error without naming log."""
    with pytest.raises(TypeError, match=r"env must be a mapping of str to str or None, got 'A': 1"):
        run_process_group(["true"], timeout_s=5, env={"A": 1})
    with pytest.raises(TypeError, match=r"env must be a mapping of str to str or None, got str"):
        run_isolated(math.factorial, 3, env="x")
    with pytest.raises(FileNotFoundError, match=r"log='.*' is a directory, expected a file"):
        run_process_group(["true"], timeout_s=5, log=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"log='.*missing/x.log': no such folder"):
        run_process_group(["true"], timeout_s=5, log=tmp_path / "missing" / "x.log")
    with pytest.raises(TypeError, match=r"log must be a str or os.PathLike or None, got int"):
        run_process_group(["true"], timeout_s=5, log=3)


def test_what_the_os_cannot_take_is_named_before_anything_starts(tmp_path):
    """Reliability tail, round 3. Before: Popen's bare "illegal environment variable name" and
    "embedded null byte", open("")'s bare FileNotFoundError, and for a functools.partial the child
    failed after it had started ("module 'functools' has no attribute ''")."""
    import functools

    for kwargs, message in [
        ({"env": {"A=B": "1"}}, r"^env must map variable names \(non-empty, no '=' or NUL\) to values without NUL, got 'A=B': '1'$"),
        ({"env": {"A": "1\0"}}, r"^env must map variable names .*got 'A': '1\\x00'$"),
        ({"env": {"": "1"}}, r"^env must map variable names .*got '': '1'$"),
        ({"log": ""}, r"^log must be a file path or None, got an empty path ''$"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_process_group(["true"], timeout_s=5, **kwargs)
    with pytest.raises(ValueError, match=r"^command\[1\] must not contain a NUL character, got 'a\\x00b'$"):
        run_process_group(["echo", "a\0b"], timeout_s=5)
    with pytest.raises(TypeError, match=r"^function must be a module-level function, got functools.partial"):
        run_isolated(functools.partial(math.factorial, 3))


def test_run_within_budget_refuses_a_misspelt_limit_and_says_truly_why_nothing_ran():
    """Reliability tail, round 3. Before: a limit for a part that does not exist ({"a": 5,
    "typo": 9}) was ignored without a word, and budget_s=10 with min_part_s=15 recorded every part
    as "not run: 10 s left ... (the parts before it used the rest)", which was untrue: none ran. (A
    suite may be handed less time than a part needs, and records it: that stays legal.)"""
    ran = []
    with pytest.raises(ValueError, match=r"^timeout_s must name parts of parts \['a'\], got limits for \['typo'\]$"):
        run_within_budget({"a": ran.append}, timeout_s={"a": 5.0, "typo": 9.0}, budget_s=None)
    assert ran == []
    clock = iter([0.0, 0.0, 0.0]).__next__
    results, errors = run_within_budget({"a": ran.append, "b": ran.append}, timeout_s=5.0, budget_s=10.0,
                                        min_part_s=15.0, clock=clock)
    assert ran == [] and results == {}
    assert errors == {name: "not run: 10 s left of the budget of 10 s (the budget is below the 15 s a part needs to start)"
                      for name in ("a", "b")}
