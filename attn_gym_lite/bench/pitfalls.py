"""Benchmark suite ``pitfalls``: every pitfall of :mod:`attn_gym_lite.book.pitfalls`, run for real."""

from __future__ import annotations

from ..book.pitfalls import PITFALLS, run_pitfall


def pitfalls_suite() -> dict:
    """Every pitfall of :mod:`attn_gym_lite.book.pitfalls`, each in a fresh process."""
    return {"pitfalls": [run_pitfall(name) for name in PITFALLS]}
