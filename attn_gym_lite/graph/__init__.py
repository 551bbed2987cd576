"""The CUDA-graph machinery: capture and static inputs (:mod:`.capture`), graph buckets sharing one
pool (:mod:`.buckets`), and a training step at fixed capacity (:mod:`.training`)."""

from .buckets import GraphBuckets, StaleOutputError, private_pool_bytes
from .capture import StaticInputs, capture_graph, capture_options
from .training import FixedCapacityTrainer

__all__ = ["FixedCapacityTrainer", "GraphBuckets", "StaleOutputError", "StaticInputs", "capture_graph",
           "capture_options", "private_pool_bytes"]
