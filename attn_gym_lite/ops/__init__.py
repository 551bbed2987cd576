"""Ops on packed batches: attention (one entry point, several implementations), masks for inactive
capacity, the ragged short convolution, and the Triton kernels (:mod:`.kernels`)."""
