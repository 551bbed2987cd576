"""attn_gym_lite: train on ragged (packed, variable-length) batches under CUDA graphs.

The package is built in layers; a module imports only from its own layer or those below it
(``tests/test_layers.py`` checks this, and that this list is its table):

0. :mod:`.checks` (argument checks), :mod:`.isolation` (a function in a fresh process), and this
   ``__init__`` (``__version__`` only);
1. :mod:`.ragged` (``cu_seqlens``), :mod:`.schedule` (grid arithmetic), :mod:`.regions`
   (``mark_kernels``);
2. :mod:`.ops`: attention (one entry point, several implementations), masking, short
   convolution, the Triton kernels;
3. :mod:`.data`: corpora, tokenizers, packing, loaders, bucket planning (CPU only);
4. :mod:`.models`: the modules the book trains;
5. :mod:`.graph`: capture, static inputs, graph buckets, training steps;
6. :mod:`.profiling` and :mod:`.testing` (exactness helpers);
7. :mod:`.book`: what only the book needs (plots, pitfall demos, recorded results);
8. :mod:`.bench`: the benchmark suites and their command line.

Importing the package imports none of them (the Triton kernels in particular must be defined
after ``TRITON_INTERPRET`` is set, if it is).
"""

__version__ = "0.2.0"
