"""run_isolated: results come back through JSON, failures and hangs come back as errors."""

import math
import time

import pytest

from attn_gym_lite.isolation import IsolatedRunError, run_isolated


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
