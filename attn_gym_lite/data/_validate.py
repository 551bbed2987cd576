"""Argument checks shared by the data modules.

Every public function of :mod:`attn_gym_lite.data` checks its arguments when it is called (not
when its iterator is first advanced) and raises an error that names the argument, the expected
form and the value received.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path


def check_int(argument: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``argument``, the expectation and the value."""
    # bool is an Integral, but ``token_capacity=True`` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{argument} must be an int >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{argument} must be an int <= {maximum}, got {value}")
    return value


def check_capacities(token_capacity: object, sequence_capacity: object) -> tuple[int, int]:
    """Validate ``T >= 1`` and ``1 <= N <= T`` (a sequence holds at least one token)."""
    token_capacity = check_int("token_capacity", token_capacity, minimum=1)
    sequence_capacity = check_int(
        "sequence_capacity", sequence_capacity, minimum=1, maximum=token_capacity
    )
    return token_capacity, sequence_capacity


def check_path(argument: str, path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def check_file(argument: str, path: object) -> Path:
    path = check_path(argument, path)
    if not path.is_file():
        raise FileNotFoundError(f"{argument}={str(path)!r}: no such file")
    return path
