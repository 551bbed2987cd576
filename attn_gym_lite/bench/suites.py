"""The benchmark suites: one entry per suite, what it measures, and the function that runs it.

Every suite is a function of no arguments returning a JSON-ready dict (a suite that also writes
files, the profiling and linear-attention traces, takes the output folder as ``out``). The CLI adds
provenance and writes ``<out>/<suite>.json``. The notebooks call the same functions for their live
GPU runs, so the numbers a reader measures and the recorded ones come from one piece of code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite: its CLI name, the module that runs it, the function in that module, and whether
    it needs CUDA (``packing-study`` runs on a CPU) or writes files beside its JSON."""

    name: str
    module: str
    function: str
    needs_cuda: bool = True
    writes_files: bool = False

    def load(self) -> Callable[..., dict]:
        """The suite's function (imports its module: suites are only imported when they run)."""
        import importlib

        return getattr(importlib.import_module(self.module), self.function)

    @property
    def summary(self) -> str:
        """The first paragraph of the suite's docstring (``--help`` prints it)."""
        import importlib
        import inspect

        doc = inspect.getdoc(importlib.import_module(self.module)) or ""
        return doc.split("\n\n")[0]


_BENCH = "attn_gym_lite.bench"
SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite("hello-world", f"{_BENCH}.hello_world", "hello_world_suite"),
        Suite("training-loop", f"{_BENCH}.training_loop", "training_loop"),
        Suite("pitfalls", f"{_BENCH}.pitfalls", "pitfalls_suite"),
        Suite("schedulers", f"{_BENCH}.schedulers", "schedulers_suite"),
        Suite("masking", f"{_BENCH}.masking", "masking_suite"),
        Suite("buckets", f"{_BENCH}.buckets", "buckets_suite"),
        Suite("packing-study", f"{_BENCH}.packing", "packing_study_suite", needs_cuda=False),
        Suite("profiling", f"{_BENCH}.profiling", "profiling_suite", writes_files=True),
        Suite("end-to-end", f"{_BENCH}.end_to_end", "end_to_end_suite"),
        Suite("linear-attention", f"{_BENCH}.linear_attention", "linear_attention_suite", writes_files=True),
        Suite("scale-out", f"{_BENCH}.scale_out", "scale_out_suite"),
    )
}
