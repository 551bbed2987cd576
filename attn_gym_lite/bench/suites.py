"""The benchmark suites: each a function returning a JSON-ready dict (taking ``out`` if it also
writes files). The CLI adds provenance; the notebooks call the same functions for live runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite's CLI name, module and function; whether it needs CUDA or writes files beside its JSON."""

    name: str
    module: str
    function: str
    needs_cuda: bool = True
    writes_files: bool = False

    def load(self) -> Callable[..., dict]:
        return getattr(importlib.import_module(self.module), self.function)  # imported when it runs

    @property
    def summary(self) -> str:
        """The first paragraph of the suite module's docstring (``--help`` prints it)."""
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
        Suite("end-to-end-large", f"{_BENCH}.end_to_end", "end_to_end_large_suite"),
        Suite("linear-attention", f"{_BENCH}.linear_attention", "linear_attention_suite", writes_files=True),
        Suite("scale-out", f"{_BENCH}.scale_out", "scale_out_suite"),
    )
}
