"""Benchmark suites and the CLI that records them (``python -m attn_gym_lite.bench``)."""
