"""The benchmark suites: each a function returning a JSON-ready dict (taking ``out`` if it also
writes files). The CLI adds provenance; the notebooks call the same functions for live runs.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite's CLI name, module, function and one-line description; how many GPUs it needs and
    whether it writes files beside its JSON."""

    name: str
    module: str
    function: str
    about: str
    gpus: int = 1  # 0: CPU only
    writes_files: bool = False

    def load(self) -> Callable[..., dict]:
        return getattr(importlib.import_module(self.module), self.function)  # imported when it runs

    @property
    def needs_cuda(self) -> bool:
        return self.gpus > 0

    @property
    def summary(self) -> str:
        """What ``--help`` prints: the description and what the suite runs on."""
        where = {0: "CPU only", 1: "one CUDA GPU"}.get(self.gpus, f"{self.gpus} CUDA GPUs")
        return f"{self.about} ({where})"


_BENCH = "attn_gym_lite.bench"
SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite("hello-world", f"{_BENCH}.hello_world", "hello_world_suite",
              "Chapter 2's first measurement: eager launches against one graph replay."),
        Suite("training-loop", f"{_BENCH}.training_loop", "training_loop",
              "Chapter 2's packed model trained eagerly and from one graph."),
        Suite("pitfalls", f"{_BENCH}.pitfalls", "pitfalls_suite", "Chapter 2's capture pitfalls, each run for real."),
        Suite("schedulers", f"{_BENCH}.schedulers", "schedulers_suite",
              "Chapter 4: ragged attention schedules replayed from graphs captured for the worst case."),
        Suite("masking", f"{_BENCH}.masking", "masking_suite",
              "Chapter 5: what inactive rows do without masks, and what the masks cost."),
        Suite("buckets", f"{_BENCH}.buckets", "buckets_suite",
              "Chapter 6: memory and time of graph buckets against one graph."),
        Suite("packing-study", f"{_BENCH}.packing", "packing_study_suite",
              "Chapter 7: packing policies on real document lengths, and the packer's speed.", gpus=0),
        Suite("profiling", f"{_BENCH}.profiling", "profiling_suite",
              "Chapter 3: a training step profiled eagerly and replayed, traces written beside the JSON.",
              writes_files=True),
        Suite("end-to-end", f"{_BENCH}.end_to_end", "end_to_end_suite",
              "Chapter 8: one model trained by every stack, at the chapter's size, with a T sweep."),
        Suite("end-to-end-large", f"{_BENCH}.end_to_end", "end_to_end_large_suite",
              "Chapter 8 at a matmul-bound model size, the fastest stacks of each kind."),
        Suite("linear-attention", f"{_BENCH}.linear_attention", "linear_attention_suite",
              "Chapter 9: KDA exactness and timings against fla, traces beside the JSON.", writes_files=True),
        Suite("notebooks", f"{_BENCH}.notebooks", "notebooks_suite",
              "Each chapter's notebook run top to bottom in GPU mode: its time and peak GPU memory.",
              writes_files=True),
        Suite("scale-out", f"{_BENCH}.scale_out", "scale_out_suite",
              "Chapter 10: data-parallel training, eager DDP against DDP captured per rank.", gpus=2),
    )
}
