"""attn_gym_lite.isolation: results come back through JSON, failures and hangs come back as errors,
a timeout ends the whole process group, parts share a time budget."""

import math
import signal
import sys
import time
from pathlib import Path

import pytest

from attn_gym_lite.bench import harness
from attn_gym_lite.isolation import IsolatedRunError, run_isolated, run_process_group


def test_returns_what_the_function_returns_through_json():
    assert run_isolated(math.factorial, 10) == 3628800
    assert run_isolated(math.comb, 10, 3) == 120
    assert run_isolated(math.fsum, (0.1, 0.2, 0.3)) == math.fsum([0.1, 0.2, 0.3])  # a tuple arrives as a list


def test_a_failure_or_a_hang_is_an_isolated_run_error():
    with pytest.raises(IsolatedRunError, match="exited with code 1") as caught:
        run_isolated(math.factorial, -1)
    assert "Traceback" in caught.value.stderr and "ValueError" in caught.value.stderr
    start = time.perf_counter()
    with pytest.raises(IsolatedRunError, match="timed out after 1 s"):
        run_isolated(time.sleep, 30, timeout_s=1)
    assert time.perf_counter() - start < 20


def _gone(pid: int) -> bool:
    """The process no longer runs: it does not exist, or it is a zombie waiting to be reaped (in a
    container, PID 1 may never reap the orphans it inherits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_a_timeout_ends_the_grandchildren_too(tmp_path):
    """The child starts a grandchild that sleeps forever holding the child's stdout, then hangs."""
    pid_file = tmp_path / "grandchild.pid"
    child = (f"import subprocess, sys, time, pathlib; g = subprocess.Popen([sys.executable, '-c', "
             f"'import time; time.sleep(10**6)']); pathlib.Path({str(pid_file)!r}).write_text(str(g.pid)); time.sleep(10**6)")
    start = time.perf_counter()
    run = run_process_group([sys.executable, "-c", child], timeout_s=3)
    # SIGTERM ends the sleepers at once: no grace period was waited out, no hang on the held pipe.
    assert run.timed_out and time.perf_counter() - start < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild), f"grandchild {grandchild} still runs"


def test_run_process_group_reports_a_timeout_a_signal_and_an_exit_code(tmp_path):
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


def test_parts_share_a_budget_and_a_failure_is_a_message(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(harness, "monotonic", lambda: now[0])
    summary = lambda error: harness.error_text(error, summary=True)
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
    results, errors = harness.run_parts(parts, timeout_s={"a": 150.0, "b": 150.0, "c": 150.0, "d": 90.0},
                                        budget_s=390.0, min_part_s=30.0, describe=summary)
    # a: its timeout (150 < 390 left); b: 150 of 290 left; c: 140 left < 150; d: 20 left < 30, not run.
    assert limits == [150.0, 150.0, 140.0]
    assert results == {"a": 100.0, "c": 120.0}
    assert errors == {"b": "RuntimeError: it broke",
                      "d": "not run: 20 s left of the budget of 390 s (the parts before it used the rest)"}

    limits.clear()
    results, errors = harness.run_parts({"x": part(500.0), "y": part(500.0)}, timeout_s=60.0, budget_s=None)
    assert limits == [60.0, 60.0] and results == {"x": 500.0, "y": 500.0} and errors == {}
    # A budget below what a part needs to start runs nothing, and says so truly.
    results, errors = harness.run_parts({"a": limits.append}, timeout_s=5.0, budget_s=10.0, min_part_s=15.0)
    assert results == {} and errors == {"a": "not run: 10 s left of the budget of 10 s (the budget is below the 15 s "
                                              "a part needs to start)"}
